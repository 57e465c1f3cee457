"""What a run writes and prints: results.json, results.csv, generations.jsonl, PNG plots,
and the text tables. Everything reads the typed summaries of specjax/bench/metrics.py."""

from __future__ import annotations

import csv
import io
import json
import os
import pathlib

import numpy as np

from specjax.bench import metrics, provenance, tables
from specjax.bench.metrics import Summary

COLUMNS = (
  'method',
  'category',
  'gamma',
  'acceptance_rate',
  'tokens_per_call',
  'tokens_per_second',
  'speedup',
  'decode_speedup',
  'predicted_speedup',
  'latency_ms_p50',
  'latency_ms_p90',
  'latency_ms_p99',
  'ms_per_token_p99',
  'zero_accept_fraction',
  'greedy_mismatches',
  'new_tokens',
  # Added after the columns above (readers that index columns keep working):
  'alpha',
  *(f'{name}_ci95_{end}' for name in metrics.CI_FIGURES for end in ('lo', 'hi')),
  'accepted_by_position',
)


def position_cell(m: Summary) -> str | None:
  """'a1/p1;a2/p2;...': per draft position, iterations that accepted / proposed a token
  there (None without positions, e.g. autoregressive decoding)."""
  if not m.proposed_by_position:
    return None
  return ';'.join(f'{a}/{p}' for a, p in zip(m.accepted_by_position, m.proposed_by_position))


def _row(method: str, category: str, m: Summary) -> dict:
  row = {k: getattr(m, k) for k in COLUMNS if hasattr(m, k)}
  row.update(method=method, category=category)
  for q in ('p50', 'p90', 'p99'):
    row[f'latency_ms_{q}'] = m.latency_ms[q]
  row['ms_per_token_p99'] = m.latency_ms_per_token['p99']
  for name in metrics.CI_FIGURES:
    ci = getattr(m, f'{name}_ci95') or (None, None)
    row[f'{name}_ci95_lo'], row[f'{name}_ci95_hi'] = ci
  row['accepted_by_position'] = position_cell(m)
  return row


def write_csv(out, summary: dict) -> None:
  """One row per method overall ('all') and per category, to the text stream `out`."""
  writer = csv.DictWriter(out, fieldnames=COLUMNS)
  writer.writeheader()
  for name, data in summary['methods'].items():
    m = Summary.from_json(data)
    writer.writerow(_row(name, 'all', m))
    for cat, sub in m.categories.items():
      writer.writerow(_row(name, cat, sub))


def results(
  config,
  model: str,
  drafts,
  summaries: dict[str, Summary],
  categories,
  costs,
  num_prompts: int,
  records=None,
) -> dict:
  """results.json's content: the run's settings, per-method summaries, costs, provenance
  (`records`, {method: records}, give the best-gamma advice per-position acceptance)."""
  return {
    'model': model,
    'drafts': drafts,
    'verifier': config.verifier,
    'temperature': config.temperature,
    'batch_size': config.batch_size,
    'num_prompts': num_prompts,
    'methods': {name: m.to_json() for name, m in summaries.items()},
    'costs': {spec: c.to_json() for spec, c in costs.items()},
    'best_gamma': metrics.best_gamma_per_category(summaries, costs, categories, records),
    'provenance': provenance.provenance(),
  }


PARTIAL = 'generations.partial.jsonl'  # records appended as each batch finishes


def write_atomic(path: pathlib.Path, text: str) -> None:
  """Writes `text` to a temporary file beside `path` and renames it over `path`: a reader
  (or a crash) never sees half a file."""
  tmp = path.with_name(f'.{path.name}.{os.getpid()}.tmp')
  with open(tmp, 'w', newline='') as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def append_records(out_dir: pathlib.Path, records: list[dict]) -> None:
  """Appends finished records to generations.partial.jsonl (flushed to disk): what an
  interrupted run keeps."""
  lines = ''.join(json.dumps(r, ensure_ascii=False) + '\n' for r in records)
  with open(out_dir / PARTIAL, 'a') as f:
    f.write(lines)  # one write: an interruption leaves all of it or a cut last line
    f.flush()
    os.fsync(f.fileno())


def write_results(out_dir: pathlib.Path, config, records, summary: dict) -> None:
  """config.json, generations.jsonl (every text), results.json, results.csv and the plots,
  each written atomically; the partial records are removed once the full ones are down."""
  write_atomic(out_dir / 'config.json', config.to_json_best_effort(indent=2))
  lines = (json.dumps(r, ensure_ascii=False) + '\n' for recs in records.values() for r in recs)
  write_atomic(out_dir / 'generations.jsonl', ''.join(lines))
  write_atomic(out_dir / 'results.json', json.dumps(summary, indent=2))
  table = io.StringIO()
  write_csv(table, summary)
  write_atomic(out_dir / 'results.csv', table.getvalue())
  plot_all(out_dir, records, summary)
  (out_dir / PARTIAL).unlink(missing_ok=True)


def show_texts(say, records, greedy: bool) -> None:
  """Each prompt's autoregressive text, and whether every other method's is the same."""
  base = records['autoregressive']
  for k, r in enumerate(base):
    say(f'--- [{r["category"]}] {r["prompt"][:200]}\n{r["output"]}\n')
    for name, recs in records.items():
      if name == 'autoregressive':
        continue
      if recs[k]['tokens'] == r['tokens']:
        say(f'    {name}: identical output')
      elif greedy:
        say(f'    {name}: DIFFERENT output (near-tie?):\n{recs[k]["output"]}')
      else:
        say(f'    {name} (a different sample):\n{recs[k]["output"]}')


TABLE_NOTE = (
  '(accept: accepted / drafted tokens; alpha: per-token acceptance probability; '
  'speedup: end to end, prefill included; [lo, hi]: 95% bootstrap interval over prompts; '
  'predicted: the cost model on the decode loop, compare with decode_speedup in results.json)'
)


def with_ci(value: float | None, ci, unit: str = '') -> str | None:
  """'1.89x [1.71, 2.05]': a figure and its interval (the figure alone without one)."""
  if value is None:
    return None
  text = f'{value:.2f}{unit}'
  return text if not ci else f'{text} [{ci[0]:.2f}, {ci[1]:.2f}]'


def format_table(summary: dict) -> str:
  greedy = summary['temperature'] == 0
  header = ['method', 'accept', 'alpha', 'tok/call', 'tok/s', 'speedup', 'predicted']
  header += ['p50 ms', 'p99 ms', 'ms/tok p99', 'mismatch']
  rows = []
  for name, data in summary['methods'].items():
    m = Summary.from_json(data)
    rows.append(
      [
        name,
        with_ci(m.acceptance_rate, m.acceptance_rate_ci95),
        m.alpha,
        m.tokens_per_call,
        m.tokens_per_second,
        with_ci(m.speedup, m.speedup_ci95, 'x'),
        None if m.predicted_speedup is None else f'{m.predicted_speedup:.2f}x',
        m.latency_ms['p50'],
        m.latency_ms['p99'],
        m.latency_ms_per_token['p99'],
        m.greedy_mismatches if greedy else None,
      ]
    )
  formats = {'tok/s': '.1f', 'p50 ms': '.0f', 'p99 ms': '.0f', 'ms/tok p99': '.1f'}
  return tables.text_table(header, rows, formats) + '\n' + TABLE_NOTE


def format_best_gamma(summary: dict) -> str:
  lines = []
  for spec, cats in summary.get('best_gamma', {}).items():
    parts = [
      f'{cat}: '
      + ('off' if b['gamma'] == 0 else f'gamma={b["gamma"]} ({b["predicted_speedup"]:.2f}x)')
      + f' at alpha {b["alpha"]:.2f}'
      for cat, b in cats.items()
    ]
    lines.append(f'best gamma by the cost model, {spec}: ' + '; '.join(parts))
  return '\n'.join(lines)


def format_levels(summary: dict) -> str:
  """A line per multi-level method: its levels as the run counted them (Summary.levels)."""
  lines = []
  for name, data in summary['methods'].items():
    lv = data.get('levels')
    if lv:
      lines.append(
        f'levels of {name}: the lower level proposed at {lv["hit"]:.0%} of the upper '
        f"model's steps after a proposal's first, which kept {lv['alpha_lower']:.2f} of its "
        f'tokens (per token, k = {lv["k"]}); steps per proposal: '
        f'{lv["narrow_per_proposal"]:.2f} narrow + {lv["wide_per_proposal"]:.2f} wide counted, '
        f'{lv["expected_narrow_per_proposal"]:.2f} + {lv["expected_wide_per_proposal"]:.2f} '
        'expected from those rates'
      )
  return '\n'.join(lines)


def acceptance_by_position(recs: list[dict]) -> np.ndarray:
  """P(the i-th draft token is accepted | drafted), i = 1..gamma (nan where never drafted):
  metrics.position_counts' ratio, as results.json's acceptance_by_position."""
  proposed, accepted = (np.asarray(c, np.float64) for c in metrics.position_counts(recs))
  return np.where(proposed > 0, accepted / np.maximum(proposed, 1), np.nan)


def plot_all(out_dir: pathlib.Path, records: dict, summary: dict) -> list[pathlib.Path]:
  """acceptance_by_position.png, speedup_vs_gamma.png (speedups and tokens per call with
  their bootstrap intervals as error bars), latency_cdf.png, and adaptive_gamma.png when
  adaptive methods ran."""
  from matplotlib.figure import Figure  # no pyplot: a notebook's backend stays as it is

  paths = [_save(_acceptance_figure(Figure, records), out_dir / 'acceptance_by_position.png')]
  if 'autoregressive' in summary['methods']:  # speedups need the baseline
    fig = _speedup_figure(Figure, summary)
    paths.append(_save(fig, out_dir / 'speedup_vs_gamma.png'))
  adaptive = [name for name in records if name.endswith('@adaptive')]
  if adaptive:
    fig = _adaptive_figure(Figure, records, adaptive)
    paths.append(_save(fig, out_dir / 'adaptive_gamma.png'))
  paths.append(_save(_latency_figure(Figure, records), out_dir / 'latency_cdf.png'))
  return paths


def _acceptance_figure(Figure, records: dict):
  spec = {name: recs for name, recs in records.items() if recs[0]['gamma'] > 0}
  fig = Figure(figsize=(6, 4))
  ax = fig.subplots()
  for name, recs in spec.items():
    curve = acceptance_by_position(recs)
    ax.plot(range(1, len(curve) + 1), curve, marker='o', label=name)
  ax.set(
    xlabel='draft position',
    ylabel='P(accepted)',
    ylim=(0, 1.02),
    title='Acceptance by draft position',
  )
  if spec:
    ax.legend(fontsize=7)
  return fig


def _speedup_figure(Figure, summary: dict):
  fig = Figure(figsize=(10, 4))
  left, right = fig.subplots(1, 2)
  drafts, adaptive = {}, {}
  for name, data in summary['methods'].items():
    m = Summary.from_json(data)
    draft, _, setting = name.rpartition('@')
    if setting.isdigit():
      drafts.setdefault(draft, []).append((int(setting), m))
    elif setting == 'adaptive':
      adaptive[draft] = m
  for draft, points in drafts.items():
    points.sort(key=lambda p: p[0])
    g = [p[0] for p in points]
    ms = [p[1] for p in points]
    speed = [m.speedup for m in ms]
    tpc = [m.tokens_per_call for m in ms]
    bars = _bars(speed, [m.speedup_ci95 for m in ms])
    line = left.errorbar(g, speed, bars, marker='o', capsize=3, label=draft)[0]
    bars = _bars(tpc, [m.tokens_per_call_ci95 for m in ms])
    right.errorbar(g, tpc, bars, marker='o', capsize=3, label=draft)
    if draft in adaptive:
      _adaptive_line(left, adaptive[draft], draft, line.get_color())
  for draft, m in adaptive.items():
    if draft not in drafts:
      _adaptive_line(left, m, draft)
  left.axhline(1.0, color='gray', linestyle='--', linewidth=1)
  left.set(xlabel='gamma', ylabel='speedup over autoregressive', title='Speedup')
  right.set(xlabel='gamma', ylabel='tokens per target call', title='Tokens per call')
  if drafts:
    left.legend(fontsize=7)
  return fig


def _adaptive_figure(Figure, records: dict, adaptive: list[str]):
  fig = Figure(figsize=(10, 2.2 * len(adaptive)))
  axes = fig.subplots(len(adaptive), 1, squeeze=False)
  for ax, name in zip(axes[:, 0], adaptive):
    seq, bounds = [], []
    for r in records[name]:  # requests in order; drafted 0 = a plain step
      seq += r['drafted']
      bounds.append(len(seq))
    ax.step(range(len(seq)), seq, where='post', linewidth=0.8)
    for b in bounds[:-1]:
      ax.axvline(b, color='gray', linewidth=0.3)
    ax.set(
      ylabel='gamma',
      title=f'{name}: draft length per iteration (0 = plain step; gray lines separate requests)',
    )
  axes[-1, 0].set_xlabel('iteration')
  return fig


def _latency_figure(Figure, records: dict):
  fig = Figure(figsize=(6, 4))
  ax = fig.subplots()
  for name, recs in records.items():
    lat = np.sort([r['latency_ms'] for r in recs])
    ax.step(lat, np.arange(1, len(lat) + 1) / len(lat), where='post', label=name)
  ax.set(xlabel='request latency (ms)', ylabel='fraction of requests', title='Latency CDF')
  ax.legend(fontsize=7)
  return fig


def _bars(values, cis) -> np.ndarray:
  """[2, n] error bar lengths below and above each value from its [lo, hi] (0 without one)."""
  out = np.zeros((2, len(values)))
  for i, (v, ci) in enumerate(zip(values, cis)):
    if ci and v is not None and np.isfinite(v):
      out[:, i] = max(v - ci[0], 0.0), max(ci[1] - v, 0.0)
  return out


def _adaptive_line(ax, m: Summary, draft: str, color=None) -> None:
  """An adaptive method's speedup as a dotted line, its bootstrap interval as a band."""
  line = ax.axhline(m.speedup, color=color, linestyle=':', label=f'{draft} adaptive')
  if m.speedup_ci95:
    ax.axhspan(*m.speedup_ci95, color=line.get_color(), alpha=0.12, linewidth=0)


def _save(fig, path: pathlib.Path) -> pathlib.Path:
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  return path
