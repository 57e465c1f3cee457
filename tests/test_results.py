"""Results people can compare: per-position counts, bootstrap intervals, provenance."""

import csv
import io
import json

import numpy as np
import pytest

from specjax.bench import metrics, provenance
from specjax.harness import report


def test_bootstrap_of_equal_prompts_has_zero_width():
  units = np.tile([[6.0, 2.0]], (7, 1))  # every prompt: 6 tokens in 2 calls
  assert metrics.bootstrap_ci(units, lambda t: t[..., 0] / t[..., 1]) == [3.0, 3.0]
  assert metrics.bootstrap_ci(units[:1], lambda t: t[..., 0] / t[..., 1]) == [3.0, 3.0]
  assert metrics.bootstrap_ci(np.zeros((0, 2)), lambda t: t[..., 0]) is None
  assert metrics.bootstrap_ci(np.zeros((3, 2)), lambda t: t[..., 0] / t[..., 1]) is None  # 0/0


def test_bootstrap_of_two_prompts_by_hand():
  # Two prompts, a mean: a resample of 2 is {1, 1}, {1, 3} or {3, 3} (1/4, 1/2, 1/4), so the
  # 2.5th and 97.5th percentiles of 1000 resamples are 1 and 3.
  mean = lambda t: t[..., 0] / t[..., 1]
  assert metrics.bootstrap_ci([[1.0, 1.0], [3.0, 1.0]], mean) == [1.0, 3.0]


def test_bootstrap_is_the_percentiles_of_resampled_ratios_and_deterministic():
  rng = np.random.default_rng(5)
  units = np.stack([rng.integers(5, 50, 30), rng.integers(1, 20, 30)], -1).astype(float)
  ratio = lambda t: t[..., 0] / t[..., 1]
  ci = metrics.bootstrap_ci(units, ratio, resamples=200, seed=3)
  # The same by hand: each resample's ratio of totals, one at a time.
  picks = np.random.default_rng(3).integers(0, 30, (200, 30))
  values = [units[p, 0].sum() / units[p, 1].sum() for p in picks]
  assert ci == pytest.approx(list(np.percentile(values, [2.5, 97.5])), rel=1e-12)
  assert ci[0] < ratio(units.sum(0)) < ci[1]  # contains the point estimate
  assert metrics.bootstrap_ci(units, ratio, resamples=200, seed=3) == ci
  assert metrics.bootstrap_ci(units, ratio, resamples=200, seed=4) != ci


def _rec(k, category, new, ms, accepted, drafted, gamma, batch, prompt=None):
  return {
    'id': prompt or f'p{k}',
    'category': category,
    'tokens': [1] * new,
    'new_tokens': new,
    'target_calls': len(accepted) + 1,
    'accepted': accepted,
    'drafted': drafted,
    'gamma': gamma,
    'batch': batch,
    'prefill_ms': 1.0,
    'decode_ms': ms - 1.0,
    'batch_steps': len(accepted),
    'switches': 0,
    'latency_ms': ms,
  }


def _records():
  """Five prompts (the first of two turns), batches of two rows sharing their time."""
  base, spec = [], []
  rows = [  # category, id, (ar tokens, ms), (accepted, drafted per iteration)
    ('a', 'p0', (8, 80.0), ([2, 0, 1], [2, 2, 2])),
    ('a', 'p0', (6, 80.0), ([1, 2], [2, 2])),  # p0's second turn, in its own batch
    ('a', 'p1', (6, 60.0), ([2, 2], [2, 2])),
    ('b', 'p2', (5, 60.0), ([0, 0, 0, 1], [2, 2, 0, 2])),  # a batch's rows share its time
    ('b', 'p3', (9, 90.0), ([2, 1, 2], [2, 2, 2])),
    ('b', 'p4', (4, 90.0), ([1], [2])),
  ]
  batches = [0, 1, 2, 2, 3, 3]
  for (cat, pid, (n, ms), (acc, dra)), batch in zip(rows, batches):
    base.append(_rec(0, cat, n, ms, [0] * (n - 1), [0] * (n - 1), 0, batch, pid))
    new = 1 + sum(a + 1 for a in acc)
    spec.append(_rec(0, cat, new, ms / 2, acc, dra, 2, batch, pid))
  return {'autoregressive': base, 'draft@2': spec}


def test_position_counts_and_intervals_in_the_summary():
  records = _records()
  summaries, cats = metrics.summarize(records, {'autoregressive': 1.0, 'draft@2': 1.0})
  assert cats == ['a', 'b']
  m = summaries['draft@2']
  # 14 iterations drafted (2 tokens each); position 1 was accepted where accepted >= 1 (11
  # times), position 2 where accepted >= 2 (6).
  assert m.proposed_by_position == [14, 14] and m.accepted_by_position == [11, 6]
  assert m.acceptance_by_position == [11 / 14, 6 / 14]
  assert m.categories['a'].proposed_by_position == [7, 7]
  assert m.categories['a'].accepted_by_position == [6, 4]
  base = summaries['autoregressive']
  assert base.proposed_by_position == [] and base.acceptance_rate_ci95 is None
  assert base.speedup_ci95 == [1.0, 1.0]
  for sub in (m, *m.categories.values()):
    for name in metrics.CI_FIGURES:
      lo, hi = getattr(sub, f'{name}_ci95')
      assert lo <= getattr(sub, name) + 1e-12 and getattr(sub, name) <= hi + 1e-12, name
  # Column totals of the prompts give back the run's figures (batch times shared out).
  units = metrics.prompt_units(records['draft@2'], records['autoregressive'])
  assert units.shape == (5, len(metrics.UNIT_COLUMNS))  # p0's two turns are one prompt
  totals = units.sum(0)
  for name, figure in metrics.CI_FIGURES.items():
    assert figure(totals) == pytest.approx(getattr(m, name), rel=1e-12), name
  sub = metrics.prompt_units(records['draft@2'][3:], records['autoregressive'][3:])
  assert metrics.CI_FIGURES['speedup'](sub.sum(0)) == pytest.approx(m.categories['b'].speedup)
  # Uncompared runs: no speedup intervals, acceptance intervals still.
  alone, _ = metrics.summarize({'draft@2': records['draft@2']}, {'draft@2': 1.0})
  assert alone['draft@2'].speedup_ci95 is None and alone['draft@2'].alpha_ci95 is not None


def test_results_json_csv_and_table_carry_them():
  records = _records()
  summaries, cats = metrics.summarize(records, {'autoregressive': 1.0, 'draft@2': 1.0})
  summary = {
    'temperature': 0.0,
    'methods': {name: json.loads(json.dumps(m.to_json())) for name, m in summaries.items()},
  }
  back = metrics.Summary.from_json(summary['methods']['draft@2'])
  assert (
    back.accepted_by_position == [11, 6] and back.speedup_ci95 == summaries['draft@2'].speedup_ci95
  )
  old = {k: v for k, v in summary['methods']['draft@2'].items() if not k.endswith('_ci95')}
  assert metrics.Summary.from_json(old).speedup_ci95 is None  # an older results.json reads
  out = io.StringIO()
  report.write_csv(out, summary)
  rows = list(csv.DictReader(io.StringIO(out.getvalue())))
  assert list(rows[0])[:5] == ['method', 'category', 'gamma', 'acceptance_rate', 'tokens_per_call']
  spec = [r for r in rows if r['method'] == 'draft@2']
  assert [r['category'] for r in spec] == ['all', 'a', 'b']
  assert spec[0]['accepted_by_position'] == '11/14;6/14'
  assert spec[1]['accepted_by_position'] == '6/7;4/7'
  counts = [tuple(map(int, cell.split('/'))) for cell in spec[0]['accepted_by_position'].split(';')]
  assert counts == [(11, 14), (6, 14)]
  m = summaries['draft@2']
  assert float(spec[0]['speedup_ci95_lo']) == m.speedup_ci95[0]
  assert float(spec[0]['alpha_ci95_hi']) == m.alpha_ci95[1]
  ar = [r for r in rows if r['method'] == 'autoregressive'][0]
  assert ar['accepted_by_position'] == '' and ar['acceptance_rate_ci95_lo'] == ''
  table = report.format_table(summary)
  lo, hi = m.speedup_ci95
  assert f'{m.speedup:.2f}x [{lo:.2f}, {hi:.2f}]' in table
  assert '1.00x [1.00, 1.00]' in table and 'bootstrap interval' in table


def test_speedup_plot_draws_intervals(tmp_path):
  records = _records()
  summaries, _ = metrics.summarize(records, {'autoregressive': 1.0, 'draft@2': 1.0})
  summary = {'methods': {name: m.to_json() for name, m in summaries.items()}}
  paths = report.plot_all(tmp_path, records, summary)
  assert tmp_path / 'speedup_vs_gamma.png' in paths
  curve = report.acceptance_by_position(records['draft@2'])
  assert curve.tolist() == pytest.approx([11 / 14, 6 / 14])
  bars = report._bars([2.0, 1.5], [[1.5, 2.5], None])
  assert bars.tolist() == [[0.5, 0.0], [0.5, 0.0]]


def test_provenance_names_the_accelerator_and_the_switches(monkeypatch):
  monkeypatch.setenv('SPECJAX_CPU_ISA', 'avx2')
  monkeypatch.setenv('XLA_FLAGS', '--xla_cpu_multi_thread_eigen=false')
  monkeypatch.delenv('SPECJAX_CPU_KERNELS', raising=False)
  env = provenance.environment()
  assert env['SPECJAX_CPU_ISA'] == 'avx2' and 'SPECJAX_CPU_KERNELS' not in env
  assert env['XLA_FLAGS'] == '--xla_cpu_multi_thread_eigen=false'
  assert provenance.environment({'SPECJAX_OFFLINE': '1'}) == {
    'XLA_FLAGS': None,
    'JAX_PLATFORMS': None,
    'SPECJAX_OFFLINE': '1',
  }
  acc = provenance.accelerator()
  import jax

  assert acc['backend'] == jax.default_backend()
  assert acc['device_count'] == len(jax.devices()) >= 1
  assert acc['device_kind'] == jax.devices()[0].device_kind
  assert sum(acc['devices'].values()) == acc['device_count']
  full = provenance.provenance()
  assert full['accelerator'] == acc and full['environment']['SPECJAX_CPU_ISA'] == 'avx2'
  assert {'jax', 'jaxlib'} <= set(full['packages'])
  json.dumps(full)
