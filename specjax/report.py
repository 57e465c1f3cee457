"""Results people would rather look at: a CSV table and PNG plots beside results.json."""

from __future__ import annotations

import csv
import pathlib

import numpy as np

COLUMNS = ('method', 'category', 'gamma', 'acceptance_rate', 'tokens_per_call',
           'tokens_per_second', 'speedup', 'latency_ms_p50', 'latency_ms_p90', 'latency_ms_p99',
           'greedy_mismatches', 'new_tokens')


def _row(method: str, category: str, m: dict) -> dict:
  row = {k: m.get(k) for k in COLUMNS if k in m}
  row.update(method=method, category=category)
  for q in ('p50', 'p90', 'p99'):
    row[f'latency_ms_{q}'] = m['latency_ms'][q]
  return row


def write_csv(path: pathlib.Path, summary: dict) -> None:
  """One row per method overall ('all') and per category."""
  with open(path, 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=COLUMNS)
    writer.writeheader()
    for name, m in summary['methods'].items():
      writer.writerow(_row(name, 'all', m))
      for cat, sub in m.get('categories', {}).items():
        writer.writerow(_row(name, cat, sub))


def acceptance_by_position(recs: list[dict]) -> np.ndarray:
  """P(the i-th draft token is accepted), i = 1..gamma, over iterations that drafted."""
  gamma = recs[0]['gamma']
  kept = [a for r in recs for a, d in zip(r['accepted'], r['drafted']) if d > 0]
  if not kept:
    return np.zeros(gamma)
  kept = np.array(kept)
  return np.array([(kept >= i).mean() for i in range(1, gamma + 1)])


def plot_all(out_dir: pathlib.Path, records: dict, summary: dict) -> list[pathlib.Path]:
  """acceptance_by_position.png, speedup_vs_gamma.png and latency_cdf.png."""
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt

  paths = []
  spec = {name: recs for name, recs in records.items() if recs[0]['gamma'] > 0}

  fig, ax = plt.subplots(figsize=(6, 4))
  for name, recs in spec.items():
    curve = acceptance_by_position(recs)
    ax.plot(range(1, len(curve) + 1), curve, marker='o', label=name)
  ax.set(xlabel='draft position', ylabel='P(accepted)', ylim=(0, 1.02),
         title='Acceptance by draft position')
  if spec:
    ax.legend(fontsize=7)
  paths.append(_save(fig, out_dir / 'acceptance_by_position.png'))

  fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
  drafts = {}
  for name, m in summary['methods'].items():
    if m['gamma']:
      drafts.setdefault(name.rsplit(' gamma=', 1)[0], []).append(
          (m['gamma'], m['speedup'], m['tokens_per_call']))
  for draft, points in drafts.items():
    g, speed, tpc = zip(*sorted(points))
    left.plot(g, speed, marker='o', label=draft)
    right.plot(g, tpc, marker='o', label=draft)
  left.axhline(1.0, color='gray', linestyle='--', linewidth=1)
  left.set(xlabel='gamma', ylabel='speedup over autoregressive', title='Speedup')
  right.set(xlabel='gamma', ylabel='tokens per target call', title='Tokens per call')
  if drafts:
    left.legend(fontsize=7)
  paths.append(_save(fig, out_dir / 'speedup_vs_gamma.png'))

  fig, ax = plt.subplots(figsize=(6, 4))
  for name, recs in records.items():
    lat = np.sort([r['latency_ms'] for r in recs])
    ax.step(lat, np.arange(1, len(lat) + 1) / len(lat), where='post', label=name)
  ax.set(xlabel='request latency (ms)', ylabel='fraction of requests', title='Latency CDF')
  ax.legend(fontsize=7)
  paths.append(_save(fig, out_dir / 'latency_cdf.png'))
  return paths


def _save(fig, path: pathlib.Path) -> pathlib.Path:
  import matplotlib.pyplot as plt
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path
