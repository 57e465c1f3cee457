"""Leviathan et al. 2023's analysis applied to a specjax run: alpha per task, and their
expected-tokens and walltime-speedup curves over gamma beside the measured points.

The paper's model (its section 3): each draft token is accepted independently with
probability alpha, so an iteration of gamma draft tokens emits

  E(alpha, gamma) = (1 - alpha^(gamma + 1)) / (1 - alpha)

tokens, and, with c the draft step's cost over the target step's and the verification
forward costing one target step, the walltime improvement is

  S(alpha, gamma, c) = E(alpha, gamma) / (gamma c + 1).

`analyse` takes a results.json of `python -m specjax.run` (a gamma sweep with the cost
measurement on) and returns, per draft and category: alpha (specjax's maximum-likelihood
per-token estimate, pooled over gammas), c, and at each gamma the measured tokens per call
and speedup beside E and S, and beside specjax's own cost model, which uses the measured
verification cost of gamma + 1 tokens instead of the paper's one step.
"""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np

from specjax.control import cost_model


def paper_speedup(alpha, gamma, c):
  """S(alpha, gamma, c) = E(alpha, gamma) / (gamma c + 1): the paper's walltime model."""
  return cost_model.expected_tokens(alpha, gamma) / (np.asarray(gamma) * c + 1.0)


@dataclasses.dataclass
class Curve:
  """One draft on one category: its alpha and c, and what was measured at each gamma."""

  draft: str
  category: str
  alpha: float
  c: float
  gammas: list[int]
  tokens_per_call: list[float]  # measured
  speedup: list[float]  # measured end to end (decode and prefill), over autoregressive
  decode_speedup: list[float]  # measured, decode only
  model_speedup: list[float]  # specjax's cost model with the measured verify costs

  def paper(self, gammas) -> tuple[np.ndarray, np.ndarray]:
    """The paper's E and S at `gammas` from this curve's alpha and c."""
    g = np.asarray(gammas)
    return cost_model.expected_tokens(self.alpha, g), paper_speedup(self.alpha, g, self.c)


def _methods_by_draft(summary: dict) -> dict[str, dict[int, dict]]:
  """{draft: {gamma: method summary}} for the run's fixed-gamma chain methods."""
  out: dict[str, dict[int, dict]] = {}
  for name, m in summary['methods'].items():
    if name == 'autoregressive' or m.get('adaptive') or m.get('tree') or not m.get('gamma'):
      continue
    draft = name.rsplit('@', 1)[0]
    out.setdefault(draft, {})[int(m['gamma'])] = m
  return out


def analyse(summary: dict) -> list[Curve]:
  """A Curve per draft and category ('all' first) of a results.json's content.

  Raises:
    ValueError: no fixed-gamma methods, or no measured costs for a draft (run with
      measure_costs=True, the default of workload runs).
  """
  by_draft = _methods_by_draft(summary)
  if not by_draft:
    raise ValueError('the run has no fixed-gamma speculative methods: nothing to compare')
  curves = []
  for draft, methods in sorted(by_draft.items()):
    costs = summary.get('costs', {}).get(draft)
    if not costs:
      raise ValueError(
        f'the run has no measured costs for draft {draft!r}: rerun with '
        '--config.measure_costs=True to get c and the verification costs'
      )
    measured = cost_model.Costs.from_json(costs)
    c = float(costs['c'])
    gammas = sorted(methods)
    categories = ['all', *sorted(methods[gammas[0]].get('categories', {}))]
    categories = categories if len(categories) > 2 else ['all']  # one category is 'all'
    for cat in categories:
      rows = [methods[g] if cat == 'all' else methods[g]['categories'][cat] for g in gammas]
      drafted = np.array([r['drafted_tokens'] for r in rows], np.float64)
      alphas = np.array([r['alpha'] or 0.0 for r in rows], np.float64)
      alpha = float(np.sum(alphas * drafted) / max(np.sum(drafted), 1.0))
      model = []
      for g in gammas:
        draft_cost, verify_cost = measured.units(g)  # (the loop's own work included)
        model.append(float(cost_model.predicted_speedup(alpha, g, draft_cost, verify_cost)))
      curves.append(
        Curve(
          draft=draft,
          category=cat,
          alpha=alpha,
          c=c,
          gammas=gammas,
          tokens_per_call=[float(r['tokens_per_call']) for r in rows],
          speedup=[float(r['speedup']) for r in rows],
          decode_speedup=[float(r['decode_speedup']) for r in rows],
          model_speedup=model,
        )
      )
  return curves


def table(curves: list[Curve]) -> str:
  """A markdown table: per draft, category and gamma, measured against the paper's model."""
  lines = [
    '| draft | category | alpha | c | gamma | tokens/call | E(alpha, gamma) '
    '| speedup (decode) | S(alpha, gamma, c) | cost model |',
    '|---|---|---|---|---|---|---|---|---|---|',
  ]
  for cv in curves:
    e, s = cv.paper(cv.gammas)
    for i, g in enumerate(cv.gammas):
      lines.append(
        f'| {cv.draft} | {cv.category} | {cv.alpha:.2f} | {cv.c:.3f} | {g} '
        f'| {cv.tokens_per_call[i]:.2f} | {e[i]:.2f} | {cv.decode_speedup[i]:.2f}x '
        f'| {s[i]:.2f}x | {cv.model_speedup[i]:.2f}x |'
      )
  return '\n'.join(lines)


def plot(curves: list[Curve], path: str | pathlib.Path, title: str = '') -> pathlib.Path:
  """Two panels like the paper's figures: expected tokens per call and walltime speedup over
  gamma, the paper's curves (lines, from alpha and c) beside the measured points."""
  from matplotlib.figure import Figure  # no pyplot: a notebook's backend stays as it is

  path = pathlib.Path(path)
  fig = Figure(figsize=(11, 4.2))
  ax_e, ax_s = fig.subplots(1, 2)
  top = max(max(cv.gammas) for cv in curves)
  grid = np.arange(0, top + 1)
  for i, cv in enumerate(curves):
    color = f'C{i % 10}'
    label = f'{cv.draft}, {cv.category} (alpha {cv.alpha:.2f}, c {cv.c:.2f})'
    e, s = cv.paper(grid)
    ax_e.plot(grid, e, color=color, label=label)
    ax_e.plot(cv.gammas, cv.tokens_per_call, 'o', color=color)
    ax_s.plot(grid, s, color=color)
    ax_s.plot(cv.gammas, cv.decode_speedup, 'o', color=color)
    ax_s.plot(cv.gammas, cv.model_speedup, 'x', color=color)
  ax_s.axhline(1.0, color='grey', lw=0.8, ls='--')
  ax_e.set(xlabel='gamma (draft tokens per call)', ylabel='tokens per target call')
  ax_s.set(xlabel='gamma (draft tokens per call)', ylabel='speedup over autoregressive')
  ax_e.set_title('E(alpha, gamma): lines; measured: dots', fontsize=9)
  ax_s.set_title('S(alpha, gamma, c): lines; measured decode: dots; cost model: x', fontsize=9)
  ax_e.legend(fontsize=7)
  if title:
    fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=120)
  return path
