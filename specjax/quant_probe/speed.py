"""What a candidate would give as a draft of the reference on this machine.

A file whose matrices are q4_1 or q8_0 runs on specjax's CPU kernels as the `quantized`
draft does (its blocks exactly as stored, any other matrix rounded to q8_0, 8-bit
activations). Its cost is timed against the reference's: one plain reference step, one
(gamma + 1)-token verification and gamma proposals of the candidate, interleaved in rounds
(bench/costs.measure_drafts, the fastest of `repeats`). The speedup it would give is the
tokens per call the probe measured over that cost, in plain reference steps (Costs.units):

    speedup = tokens_per_call / (draft(gamma) + verify(gamma))

at the probe's gamma, greedy and at T = 1. A kernel's time depends on the types and shapes
of a file's tensors, not on their values, so files with the same types are timed once.
Other types (q4_0, q5_*, k-quants) have no kernel here: the probe ran them dequantised,
which measures their agreement but not their speed.
"""

from __future__ import annotations

import pathlib

from specjax.bench import costs as costs_lib
from specjax.checkpoints import gguf as gguf_lib
from specjax.control import cost_model
from specjax.models import quant


def layout(path: pathlib.Path, cfg) -> tuple[dict, tuple]:
  """(the file's q4_1 / q8_0 matrices as BlockWeights, a key of their types and places)."""
  stored = gguf_lib.load_gguf_blocks(path, cfg)
  return stored, tuple(sorted((str(k), w.fmt) for k, w in stored.items()))


class Timer:
  """Times candidates as drafts of one reference (`ref`: a loaded model) at `gamma`."""

  def __init__(self, ref, gamma: int, cache_size: int, repeats: int = 5):
    self.ref, self.gamma, self.cache_size, self.repeats = ref, gamma, cache_size, repeats
    self.seen: dict[tuple, dict] = {}

  def costs(self, path: pathlib.Path, kind: str, cand) -> dict:
    """{'draft', 'verify'} in reference steps (or {'why'} where there is no kernel)."""
    if kind.lower() not in quant.FORMATS:
      return {'why': f'no kernel for {kind} here: ran dequantised, speed not measured'}
    stored, key = layout(path, cand.cfg)
    if key not in self.seen:
      from specjax.drafters.model import QuantizedDrafter

      params = quant.for_kernels(quant.quantize_params(cand.params, keep=stored))
      drafter = QuantizedDrafter(cand.cfg, name=path.name)
      g = self.gamma
      step, out = costs_lib.measure_drafts(
        self.ref.params,
        self.ref.cfg,
        {'candidate': (drafter, params, (g,))},
        batch=1,
        cache_size=self.cache_size,
        repeats=self.repeats,
      )
      draft, verify = out['candidate'].units(g)
      self.seen[key] = {'target_ms': step, 'draft': draft, 'verify': verify, 'timed': path.name}
    return dict(self.seen[key])


def speedups(costs: dict, figures: dict) -> dict:
  """Each category's figures with the speedup they give at these costs (None: not timed)."""
  for a in figures.values():
    for how in ('greedy', 't1'):
      a[f'speedup_{how}'] = (
        None
        if 'draft' not in costs
        else cost_model.speedup(a[f'tokens_per_call_{how}'], costs['draft'], costs['verify'])
      )
  return figures
