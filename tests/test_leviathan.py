"""Leviathan et al.'s analytic model, and its analysis of a run's results.json."""

import numpy as np
import pytest

from specjax.bench import leviathan


def test_paper_formulas():
  # E = (1 - a^(g+1)) / (1 - a); S = E / (g c + 1): the paper's closed forms.
  a, g, c = 0.8, 4, 0.05
  e = (1 - a ** (g + 1)) / (1 - a)
  assert leviathan.paper_speedup(a, g, c) == pytest.approx(e / (g * c + 1))
  assert leviathan.paper_speedup(0.0, 3, 0.1) == pytest.approx(1 / 1.3)  # nothing accepted
  assert leviathan.paper_speedup(1.0, 3, 0.0) == pytest.approx(4.0)  # everything, free draft


def _method(gamma, alpha, drafted, tpc, speedup, categories=None):
  return {
    'gamma': gamma,
    'adaptive': None,
    'tree': None,
    'alpha': alpha,
    'drafted_tokens': drafted,
    'tokens_per_call': tpc,
    'speedup': speedup,
    'decode_speedup': speedup * 1.1,
    'categories': categories or {},
  }


def test_analyse_pools_alpha_and_predicts_from_measured_costs():
  cat = lambda g, a: {'code': _method(g, a, 10, 2.0, 1.5), 'prose': _method(g, 0.2, 30, 1.2, 0.9)}
  summary = {
    'methods': {
      'autoregressive': {'gamma': 0},
      'd@1': _method(1, 0.5, 100, 1.5, 1.1, cat(1, 0.9)),
      'd@4': _method(4, 0.7, 300, 2.5, 1.3, cat(4, 0.7)),
      'd@adaptive': {**_method(2, 0.6, 50, 2.0, 1.2), 'adaptive': True},
    },
    'costs': {
      'd': {
        'target_ms': 10.0,
        'c': 0.1,
        'draft_ms': {'1': 1.0, '4': 4.0},
        'verify_ms': {'1': 11.0, '4': 14.0},
      }
    },
  }
  curves = {cv.category: cv for cv in leviathan.analyse(summary)}
  assert set(curves) == {'all', 'code', 'prose'}
  every = curves['all']
  assert every.gammas == [1, 4]  # the adaptive method is not a point on the curve
  assert every.alpha == pytest.approx((0.5 * 100 + 0.7 * 300) / 400)
  assert curves['code'].alpha == pytest.approx(0.8)
  # specjax's model: E / (draft + verify) in target steps, here (4 + 14) / 10 at gamma 4
  e4 = (1 - every.alpha**5) / (1 - every.alpha)
  assert every.model_speedup[1] == pytest.approx(e4 / 1.8)
  e, s = every.paper(np.array([4]))
  assert s[0] == pytest.approx(e4 / 1.4)
  assert '| d | code |' in leviathan.table(list(curves.values()))


def test_analyse_needs_measured_costs():
  summary = {'methods': {'autoregressive': {}, 'd@2': _method(2, 0.5, 10, 1.5, 1.0)}}
  with pytest.raises(ValueError, match='no measured costs for draft .d.'):
    leviathan.analyse(summary)
