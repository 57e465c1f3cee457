"""Spec-Bench's answer files from a run's records, and Spec-Bench's speed figures from them.

Spec-Bench (github.com/hemingkx/Spec-Bench) writes one answer file per method
(`evaluation/eval.py`, called by each `evaluation/inference_*.py`): a JSON line per question,

  {"question_id", "category", "answer_id", "model_id", "tstamp",
   "choices": [{"index": 0, "turns": [answer per turn], "decoding_steps": [...],
                "new_tokens": [...], "wall_time": [seconds...], "accept_lengths": [...]}]}

with a list entry per turn, except accept_lengths: the tokens each target forward emitted,
every turn's appended. `evaluation/speed.py` reads a method's file and the baseline's
(autoregressive decoding) and reports the speedup (the mean over questions of tokens / wall
time, over the baseline's mean) and "#Mean accepted tokens" (the mean of accept_lengths).

`write` puts `specbench_answers/<method>.jsonl` beside a Spec-Bench run's results, so
Spec-Bench's own scripts can read specjax's runs; `speed` is speed.py's computation.

What each field holds here: `decoding_steps` the turn's target forwards (the prefill counts
as one: specjax's target_calls), `new_tokens` its generated tokens, `wall_time` its prefill
and decoding time (a row of a batch reports its batch's time: Spec-Bench decodes one question
at a time), `accept_lengths` the tokens of each forward: 1 for the prefill, then accepted + 1
per iteration (the last cut, as Spec-Bench's PLD does, to what the turn kept), so that they
add up to new_tokens. The mean of accept_lengths is then specjax's tokens_per_call. The
speedup is a mean of per-question ratios, where specjax's `speedup` is a ratio of totals
(tokens over time, all prompts pooled): the two agree when every question takes the same
time; `speed(..., pooled=True)` gives specjax's.
"""

from __future__ import annotations

import json
import pathlib
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from specjax.data import specbench

FOLDER = 'specbench_answers'
BASELINE = 'autoregressive'


def accept_lengths(rec: Mapping) -> list[int]:
  """Tokens emitted by each target forward of a record: 1 (the prefill), then accepted + 1
  per iteration, the last adjusted so they add up to the record's new_tokens."""
  lengths = [1] + [a + 1 for a in rec['accepted']]
  lengths[-1] += rec['new_tokens'] - sum(lengths)
  return lengths


def _question_id(text: str):
  return int(text) if text.isdigit() else text


def answers(records: Sequence[Mapping], model_id: str, tstamp: float | None = None) -> list[dict]:
  """One method's records (every turn of every question, in run order) as Spec-Bench
  answer lines, one per question, in the order questions first appear."""
  tstamp = time.time() if tstamp is None else tstamp
  questions: dict = {}
  for r in records:
    key = (r['category'], r['id'])
    if key not in questions:
      questions[key] = {'index': 0, 'turns': [], 'decoding_steps': [], 'new_tokens': []}
      questions[key] |= {'wall_time': [], 'accept_lengths': []}
    choice = questions[key]
    choice['turns'].append(r.get('output', '').strip())
    choice['decoding_steps'].append(r['target_calls'])
    choice['new_tokens'].append(r['new_tokens'])
    choice['wall_time'].append(r['latency_ms'] / 1e3)
    choice['accept_lengths'] += accept_lengths(r)
  return [
    {
      'question_id': _question_id(str(qid)),
      'category': category,
      'answer_id': uuid.uuid4().hex[:22],
      'model_id': model_id,
      'choices': [choice],
      'tstamp': tstamp,
    }
    for (category, qid), choice in questions.items()
  ]


def file_name(method: str) -> str:
  """'ngram@4' -> 'ngram@4.jsonl' ('truncated:1@4' -> 'truncated_1@4.jsonl')."""
  return re.sub(r'[^A-Za-z0-9._@-]+', '_', method) + '.jsonl'


def write(out_dir, records: Mapping[str, list[dict]], model: str) -> list[pathlib.Path]:
  """specbench_answers/<method>.jsonl per method (autoregressive decoding's is the baseline
  speed.py compares with); returns their paths."""
  folder = pathlib.Path(out_dir) / FOLDER
  folder.mkdir(exist_ok=True)
  tstamp = time.time()
  paths = []
  for method, recs in records.items():
    model_id = f'{model.rsplit("/", 1)[-1]}-{method}'
    lines = answers(recs, model_id, tstamp)
    path = folder / file_name(method)
    path.write_text(''.join(json.dumps(a, ensure_ascii=False) + '\n' for a in lines))
    paths.append(path)
  return paths


def read(path: str | pathlib.Path) -> list[dict]:
  return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines() if line]


def select(lines: Iterable[Mapping], task: str = 'overall') -> list[Mapping]:
  """speed.py's tasks: 'overall', 'mt_bench' (MT-bench's 8 categories) or one category."""
  if task == 'overall':
    return list(lines)
  cats = specbench.MT_BENCH if task == 'mt_bench' else (task,)
  return [a for a in lines if a['category'] in cats]


def speed(
  lines: Iterable[Mapping],
  baseline: Iterable[Mapping],
  task: str = 'overall',
  baseline_tokens: Callable[[str], int] | None = None,
  pooled: bool = False,
) -> dict[str, float]:
  """Spec-Bench's evaluation/speed.py over answer lines: {'tokens_per_second' (the mean
  over questions of the question's tokens / its wall time, turns summed),
  'baseline_tokens_per_second', 'speedup' (their ratio), 'mean_accepted_tokens' (the mean
  of every accept_lengths entry)}.

  speed.py counts the baseline's tokens by tokenizing its answer texts again (the
  tokenizer's ids minus the BOS token): pass that as `baseline_tokens` (text -> tokens);
  by default the baseline's own new_tokens are used, exact where the text would be
  re-tokenized differently. `pooled`: tokens per second as the ratio of total tokens to
  total wall time instead (specjax's speedup, for batch size 1).
  """

  def rate(picked, tokens_of) -> float:
    tokens = [sum(tokens_of(a['choices'][0])) for a in picked]
    seconds = [sum(a['choices'][0]['wall_time']) for a in picked]
    if pooled:
      return sum(tokens) / sum(seconds)
    return float(np.mean([t / s for t, s in zip(tokens, seconds)]))

  picked = select(lines, task)
  ours = rate(picked, lambda c: c['new_tokens'])
  if baseline_tokens is None:
    theirs = rate(select(baseline, task), lambda c: c['new_tokens'])
  else:
    theirs = rate(select(baseline, task), lambda c: [baseline_tokens(t) for t in c['turns']])
  lengths = [n for a in picked for n in a['choices'][0]['accept_lengths']]
  return {
    'tokens_per_second': ours,
    'baseline_tokens_per_second': theirs,
    'speedup': ours / theirs,
    'mean_accepted_tokens': float(np.mean(lengths)),
  }
