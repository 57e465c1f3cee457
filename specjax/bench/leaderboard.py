"""Spec-Bench's leaderboard from a run's records: results_specbench.md and a bar chart per method.

  python -m specjax.bench.leaderboard OUT RUN [RUN ...]   # one leaderboard from several runs

(several runs: e.g. one per category, so that a long benchmark resumes category by category;
experiments/specbench/run_full.sh).

Spec-Bench reports, per method and category, the speedup over autoregressive decoding and
"#Mean Accepted Tokens": tokens per target forward pass, the bonus token included (specjax's
tokens per call, the prefill counting as one call). Its leaderboard pools MT-bench's 8
categories into "Multi-turn Conversation" and adds the overall figures; the fine table keeps
the 13 categories. Every figure pools the records of its group (every turn of every question):
tokens over target calls, and tokens per second (prefill included, each turn's whole
generation as Spec-Bench times it) over autoregressive decoding's on the same records.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
from collections.abc import Mapping, Sequence

import ml_collections

from specjax.bench import metrics, specbench_answers, tables
from specjax.data import specbench

BASELINE = 'autoregressive'
OVERALL = 'Overall'
MAT = '#Mean Accepted Tokens'


def group_figures(records: Mapping[str, list[dict]], categories: Sequence[str]) -> dict:
  """{method: {'speedup', 'decode_speedup', 'tokens_per_call', 'records'}} over the records
  whose category is one of `categories` (None figures when there are none)."""
  base = records[BASELINE]
  pick = [k for k, r in enumerate(base) if r['category'] in categories]
  out = {}
  if not pick:
    return {name: None for name in records}
  ref = metrics.summarize_method([base[k] for k in pick], [base[k] for k in pick])
  for name, recs in records.items():
    m = metrics.summarize_method([recs[k] for k in pick], [base[k] for k in pick])
    out[name] = {
      'speedup': metrics.safe_ratio(m.tokens_per_second, ref.tokens_per_second),
      'decode_speedup': metrics.safe_ratio(
        m.decode_tokens_per_second, ref.decode_tokens_per_second
      ),
      'tokens_per_call': m.tokens_per_call,
      'records': len(pick),
    }
  return out


def leaderboard(records: Mapping[str, list[dict]]) -> dict:
  """{column: group_figures} for Spec-Bench's leaderboard columns, the 13 categories (and
  any other category of the run, after them) and 'Overall'."""
  seen = list(dict.fromkeys(r['category'] for r in records[BASELINE]))
  fine = [c for c in specbench.CATEGORIES if c in seen] + [
    c for c in seen if c not in specbench.CATEGORIES
  ]
  out = {'columns': {}, 'categories': {}}
  for column, cats in specbench.LEADERBOARD.items():
    out['columns'][column] = group_figures(records, cats)
  out['columns'][OVERALL] = group_figures(records, seen)
  for cat in fine:
    out['categories'][cat] = group_figures(records, (cat,))
  return out


def _x(value: float | None) -> str | None:
  return None if value is None else f'{value:.2f}x'


def markdown(records: Mapping[str, list[dict]], summary: Mapping, config) -> str:
  """results_specbench.md: the leaderboard, mean accepted tokens by column, the 13 categories."""
  board = leaderboard(records)
  columns = [c for c in specbench.LEADERBOARD]
  methods = list(records)
  base = records[BASELINE]
  questions = len({(r['category'], r['id']) for r in base})
  lines = [
    '# Spec-Bench',
    '',
    f'Model {summary["model"]}; {questions} questions, {len(base)} turns; '
    f'max_new_tokens {config.max_new_tokens}, temperature {config.temperature}, '
    f'batch {config.batch_size}, verifier {config.verifier}. Speedup: tokens per second of '
    "each turn's whole generation (prefill included) over autoregressive decoding on the same "
    f'turns; {MAT}: tokens per target forward pass (bonus token included). Multi-turn '
    "Conversation pools MT-bench's 8 categories; every figure pools all turns.",
    '',
    '## Leaderboard (speedup over autoregressive)',
    '',
  ]
  rows = []
  for name in methods:
    row = [name] + [_fig(board['columns'][c], name, 'speedup') for c in columns]
    overall = board['columns'][OVERALL][name]
    rows.append(row + [overall['tokens_per_call'], _x(overall['speedup'])])
  lines.append(tables.markdown_table(['Method', *columns, MAT, 'Overall'], rows))
  lines += ['', f'## {MAT} (tokens per target call)', '']
  rows = [
    [name] + [_fig(board['columns'][c], name, 'tokens_per_call') for c in [*columns, OVERALL]]
    for name in methods
  ]
  lines.append(tables.markdown_table(['Method', *columns, 'Overall'], rows))
  lines += ['', '## By category (speedup / decode-loop speedup / tokens per call)', '']
  header = ['Category', 'turns'] + methods
  rows = []
  for cat, figs in [*board['categories'].items(), (OVERALL, board['columns'][OVERALL])]:
    cells = []
    for name in methods:
      f = figs[name]
      cells.append(f'{f["speedup"]:.2f}x / {f["decode_speedup"]:.2f}x / {f["tokens_per_call"]:.2f}')
    rows.append([cat, figs[BASELINE]['records'], *cells])
  lines.append(tables.markdown_table(header, rows))
  return '\n'.join(lines) + '\n'


def _fig(figs: Mapping, name: str, key: str):
  f = figs.get(name)
  if f is None:
    return None
  return _x(f[key]) if key == 'speedup' else f[key]


def _file_name(method: str) -> str:
  return 'specbench_' + re.sub(r'[^A-Za-z0-9._-]+', '_', method) + '.png'


def plot(out_dir: pathlib.Path, records: Mapping[str, list[dict]]) -> list[pathlib.Path]:
  """specbench_<method>.png per speculative method (every method when only the baseline ran):
  its speedup per leaderboard column and overall, each bar labelled with its tokens per call."""
  from matplotlib.figure import Figure  # no pyplot: a notebook's backend stays as it is

  board = leaderboard(records)
  columns = [c for c in [*specbench.LEADERBOARD, OVERALL] if board['columns'][c][BASELINE]]
  methods = [name for name in records if name != BASELINE] or [BASELINE]
  paths = []
  for name in methods:
    speed = [board['columns'][c][name]['speedup'] for c in columns]
    tpc = [board['columns'][c][name]['tokens_per_call'] for c in columns]
    fig = Figure(figsize=(8, 4))
    ax = fig.subplots()
    colors = ['tab:blue'] * (len(columns) - 1) + ['tab:orange']
    bars = ax.bar(range(len(columns)), speed, color=colors)
    for bar, t in zip(bars, tpc):
      ax.annotate(
        f'{t:.2f} tok/call',
        (bar.get_x() + bar.get_width() / 2, bar.get_height()),
        ha='center',
        va='bottom',
        fontsize=7,
      )
    ax.axhline(1.0, color='gray', linestyle='--', linewidth=1)
    ax.set_xticks(range(len(columns)), [c.replace(' ', '\n', 1) for c in columns], fontsize=7)
    ax.set(ylabel='speedup over autoregressive', title=f'Spec-Bench: {name}')
    fig.tight_layout()
    path = out_dir / _file_name(name)
    fig.savefig(path, dpi=110)
    paths.append(path)
  return paths


def write(out_dir: pathlib.Path, records, summary, config) -> list[pathlib.Path]:
  """results_specbench.md, the bar charts and Spec-Bench's own answer files
  (specbench_answers/<method>.jsonl, specbench_answers.py); returns their paths."""
  path = out_dir / 'results_specbench.md'
  path.write_text(markdown(records, summary, config))
  answers = specbench_answers.write(out_dir, records, summary['model'])
  return [path, *plot(out_dir, records), *answers]


MERGE_KEYS = ('model', 'max_new_tokens', 'temperature', 'batch_size', 'verifier')


def _read_json(path: pathlib.Path, text: str | None = None, line: int | None = None) -> dict:
  """A JSON object from a file (or one line of it), a ValueError naming where if it is not."""
  where = f'{path} line {line}' if line else str(path)
  try:
    obj = json.loads(path.read_text() if text is None else text)
  except json.JSONDecodeError as e:
    raise ValueError(f'{where}: not valid JSON ({e})') from None
  if not isinstance(obj, dict) or (line and 'method' not in obj):
    raise ValueError(f'{where}: expected a JSON object as python -m specjax.run writes')
  return obj


def merge(runs: Sequence[str | pathlib.Path]) -> tuple[dict[str, list[dict]], dict, object]:
  """(records, summary, config) of several runs of `python -m specjax.run` as one workload.

  The runs must share the model, max_new_tokens, temperature, batch size, verifier and
  methods (an error names the run and the field that differs). Batch numbers are renumbered
  so every run's batches stay distinct (a batch's decode time is counted once).

  Raises:
    ValueError: a run without generations.jsonl or config.json, or runs that differ.
  """
  if not runs:
    raise ValueError('no runs to merge')
  records: dict[str, list[dict]] = {}
  first = None
  offset = 0
  for run in map(pathlib.Path, runs):
    missing = [f for f in ('config.json', 'generations.jsonl') if not (run / f).is_file()]
    if missing:
      raise ValueError(
        f'{run}: no {", ".join(missing)} (expected a python -m specjax.run work directory)'
      )
    config = _read_json(run / 'config.json')
    recs: dict[str, list[dict]] = {}
    lines = (run / 'generations.jsonl').read_text().splitlines()
    for n, line in enumerate(lines, 1):
      r = _read_json(run / 'generations.jsonl', line, n)
      recs.setdefault(r['method'], []).append(r)
    setting = {k: config.get(k) for k in MERGE_KEYS} | {'methods': list(recs)}
    if first is None:
      first = (run, setting)
    else:
      for key, value in setting.items():
        if value != first[1][key]:
          raise ValueError(
            f'{run}: {key} is {value!r}, but {first[0]} has {first[1][key]!r}: '
            'only runs of one setting make one leaderboard'
          )
    batches = max((r['batch'] for rs in recs.values() for r in rs), default=-1) + 1
    for name, rs in recs.items():
      records.setdefault(name, []).extend({**r, 'batch': r['batch'] + offset} for r in rs)
    offset += batches
  if BASELINE not in records:
    raise ValueError(f'{first[0]}: no {BASELINE} records: the leaderboard needs the baseline')
  config = ml_collections.ConfigDict({k: first[1][k] for k in MERGE_KEYS})
  return records, {'model': first[1]['model']}, config


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description='One Spec-Bench leaderboard from several runs.')
  parser.add_argument('out', help='directory for results_specbench.md and the charts')
  parser.add_argument('runs', nargs='+', help='python -m specjax.run work directories')
  args = parser.parse_args(argv)
  try:
    records, summary, config = merge(args.runs)
  except ValueError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  print(markdown(records, summary, config))
  for path in write(out, records, summary, config):
    print(f'wrote {path}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
