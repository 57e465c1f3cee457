r"""Self-consistency: N sampled answers per prompt, decoded as one batch, and a majority vote.

  python -m specjax.self_consistency --config configs/self_consistency.py
  python -m specjax.self_consistency --config configs/self_consistency.py:tiny --workdir runs/sc

Every prompt is repeated N times in one batch (rows grouped: N consecutive rows share a
prompt) and decoded at temperature > 0 twice, with the same seed: with consensus drafts
(each path drafts from the other N - 1, `specjax/drafters/consensus.py`) and plain
batched autoregressive decoding; optionally a third time with each path doing prompt
lookup over its own context alone. The final answer of every path is extracted (the
last number, or a \boxed{} / "answer is" answer) and voted on. Written to the work dir:
results.json (per prompt: answers, the vote, tokens per target call, tokens/s and the
speedup of consensus drafting over plain decoding of the same N paths) and texts.jsonl
(every generated text).
"""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Sequence

import ml_collections
import numpy as np

from specjax import config_lib, registry
from specjax.bench import metrics
from specjax.checkpoints import loader
from specjax.core.sampling import SamplingConfig
from specjax.data import prompts as prompts_lib
from specjax.decode.engine import Engine, GenerationOutput
from specjax.decode.method import Method
from specjax.drafters import ConsensusDrafter, NgramDrafter
from specjax.harness import run_lib

_NUMBER = re.compile(r'-?\d[\d,]*(?:\.\d+)?(?:/\d+)?')
_MARKED = (
  re.compile(r'\\boxed\{([^{}]*)\}'),
  re.compile(r'answer\s*(?:is|:)\s*\**\s*\$?\s*(-?[\d,./]+)', re.IGNORECASE),
)


def normalize_number(text: str) -> str:
  """'1,000.0' -> '1000'; '3.50' -> '3.5'; '6/4' stays a fraction string."""
  text = text.replace(',', '').rstrip('.')
  if '/' in text:
    return text
  try:
    value = float(text)
  except ValueError:
    return text
  return str(int(value)) if value == int(value) else repr(value)


def extract_answer(text: str) -> str | None:
  """The final answer of a math solution: a \\boxed{} or 'answer is' value, else the last
  number in the text; None when the text has no number."""
  for pattern in _MARKED:
    found = pattern.findall(text)
    if found:
      numbers = _NUMBER.findall(found[-1])
      return normalize_number(numbers[-1]) if numbers else found[-1].strip()
  numbers = _NUMBER.findall(text)
  return normalize_number(numbers[-1]) if numbers else None


def majority_vote(answers: Sequence[str | None]) -> tuple[str | None, int]:
  """(most frequent non-None answer, its count); ties go to the answer seen first."""
  counts = collections.Counter(a for a in answers if a is not None)
  if not counts:
    return None, 0
  top = max(counts.values())
  winner = next(a for a in answers if a is not None and counts[a] == top)
  return winner, top


def run_paths(
  engine: Engine,
  prompt: Sequence[int],
  n: int,
  max_new: int,
  sampling: SamplingConfig,
  seed: int = 0,
  gamma: int = 0,
  verifier: str = 'rejection',
) -> GenerationOutput:
  """Decodes n paths of one prompt as one batch of n copies."""
  return engine.generate(
    [list(prompt)] * n,
    Method.chain(gamma, verifier),
    max_new_tokens=max_new,
    sampling=sampling,
    seed=seed,
  )


def method_stats(out: GenerationOutput) -> dict:
  """One method's figures on one prompt's N paths (specjax.bench.metrics.Summary)."""
  m = metrics.summarize_output(out)
  return {
    'tokens': m.new_tokens,
    'target_calls': out.target_calls,
    'tokens_per_call': m.tokens_per_call,
    'seconds': out.prefill_seconds + out.decode_seconds,
    'tokens_per_second': m.tokens_per_second,
    'acceptance_rate': m.acceptance_rate,
    'alpha': m.alpha,
    'compile_seconds': m.compile_seconds,
  }


def validate(c: ml_collections.ConfigDict) -> None:
  config_lib.check(c.n >= 2, 'n', c.n, 'an integer >= 2 (paths per prompt)')
  dtypes = sorted(loader.DTYPES)
  config_lib.check(
    c.get('dtype', 'float32') in loader.DTYPES, 'dtype', c.get('dtype'), f'one of {dtypes}'
  )
  config_lib.check(c.gamma >= 1, 'gamma', c.gamma, 'an integer >= 1')
  config_lib.check(
    c.temperature > 0,
    'temperature',
    c.temperature,
    '> 0: self-consistency samples different paths (at 0 all N are the same)',
  )
  config_lib.check(c.num_prompts >= 1, 'num_prompts', c.num_prompts, 'an integer >= 1')
  config_lib.check(c.max_new_tokens >= 1, 'max_new_tokens', c.max_new_tokens, 'an integer >= 1')
  verifiers = [n for n in registry.VERIFIERS.names if not registry.VERIFIERS.get(n).greedy_only]
  config_lib.check(c.verifier in verifiers, 'verifier', c.verifier, f'one of {verifiers}')
  SamplingConfig(c.temperature, c.top_k, c.top_p)


def build_engines(c, model) -> dict[str, Engine]:
  """'consensus' (always), 'ngram' (if asked); gamma 0 runs on the consensus engine."""
  vocab = model.cfg.vocab_size
  drafter = ConsensusDrafter(
    vocab, group=c.n, k=c.k, max_mismatches=c.max_mismatches, n_max=c.n_max, proposal=c.proposal
  )
  eos = model.tokenizer.eos_id
  engines = {
    'consensus': Engine(
      model.params, model.cfg, eos_id=eos, cache_size=c.cache_size, drafter=drafter
    )
  }
  if c.compare_ngram:  # shares the first engine's device arrays
    engines['ngram'] = Engine(
      engines['consensus'].params,
      model.cfg,
      eos_id=eos,
      cache_size=c.cache_size,
      drafter=NgramDrafter(vocab, n_max=c.n_max),
    )
  return engines


def solve(engines, prompt: prompts_lib.Prompt, ids, c, sampling, seed, tokenizer) -> tuple:
  """One prompt: every method's N paths, the consensus paths' answers and vote."""
  outs = {
    'consensus': run_paths(
      engines['consensus'], ids, c.n, c.max_new_tokens, sampling, seed, c.gamma, c.verifier
    )
  }
  if c.compare_plain:
    outs['autoregressive'] = run_paths(
      engines['consensus'], ids, c.n, c.max_new_tokens, sampling, seed
    )
  if 'ngram' in engines:
    outs['ngram'] = run_paths(
      engines['ngram'], ids, c.n, c.max_new_tokens, sampling, seed, c.gamma, c.verifier
    )
  texts = [tokenizer.decode(t) for t in outs['consensus'].tokens]
  answers = [extract_answer(t) for t in texts]
  vote, count = majority_vote(answers)
  stats = {name: method_stats(out) for name, out in outs.items()}
  record = {
    'id': prompt.id,
    'category': prompt.category,
    'answers': answers,
    'vote': vote,
    'vote_count': count,
    'methods': stats,
  }
  if 'autoregressive' in stats:
    base = stats['autoregressive']['tokens_per_second']
    record['speedup'] = {k: s['tokens_per_second'] / base for k, s in stats.items()}
  texts_out = [
    {'id': prompt.id, 'method': name, 'path': i, 'text': tokenizer.decode(t)}
    for name, out in outs.items()
    for i, t in enumerate(out.tokens)
  ]
  return record, texts_out


def summarize(records) -> dict:
  methods = records[0]['methods']
  out = {}
  for name in methods:
    tokens = sum(r['methods'][name]['tokens'] for r in records)
    seconds = sum(r['methods'][name]['seconds'] for r in records)
    out[name] = {
      'tokens_per_call_mean': float(
        np.mean([r['methods'][name]['tokens_per_call'] for r in records])
      ),
      'tokens_per_second': tokens / max(seconds, 1e-9),
    }
  if 'autoregressive' in out:
    base = out['autoregressive']['tokens_per_second']
    for s in out.values():
      s['speedup'] = s['tokens_per_second'] / base
  if 'ngram' in out:
    out['consensus']['tokens_per_call_vs_ngram'] = (
      out['consensus']['tokens_per_call_mean'] / out['ngram']['tokens_per_call_mean']
    )
  return out


def main(config: ml_collections.ConfigDict, workdir: str | None = None, say=print) -> dict:
  """Runs self-consistency on config's prompts; returns (and writes) the results."""
  c = config
  validate(c)
  out_dir = run_lib.make_workdir(workdir)
  model = loader.load_model(c.model, c.get('dtype', 'float32'))
  sampling = SamplingConfig(c.temperature, c.top_k, c.top_p)
  prompts = (
    [prompts_lib.Prompt('prompt', c.prompt, 'prompt')]
    if c.prompt
    else prompts_lib.load_prompts(c.prompts, c.num_prompts)
  )
  engines = build_engines(c, model)
  records, texts = [], []
  for i, prompt in enumerate(prompts):
    ids = model.tokenizer.encode_chat(prompt.text)
    record, paths = solve(engines, prompt, ids, c, sampling, c.seed + i, model.tokenizer)
    records.append(record)
    texts += paths
    cons = record['methods']['consensus']
    say(
      f'[{prompt.id}] vote {record["vote"]!r} ({record["vote_count"]}/{c.n}); consensus '
      f'{cons["tokens_per_call"]:.2f} tokens/call'
      + (f', {record["speedup"]["consensus"]:.2f}x plain' if 'speedup' in record else '')
    )
  results = {
    'config': c.to_dict(),
    'model': model.source,
    'drafter': engines['consensus'].drafter.name,
    'prompts': records,
    'summary': summarize(records),
  }
  (out_dir / 'results.json').write_text(json.dumps(results, indent=1))
  with open(out_dir / 'texts.jsonl', 'w') as f:
    f.writelines(json.dumps(t) + '\n' for t in texts)
  say(f'summary: {json.dumps(results["summary"])}')
  say(f'wrote {out_dir / "results.json"} and {out_dir / "texts.jsonl"}')
  return results


if __name__ == '__main__':
  config_lib.run_cli(main, 'configs/self_consistency.py')
