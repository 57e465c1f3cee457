"""Verifiers: given target and draft distributions along a drafted block, decide how
many draft tokens to keep and which token comes next, so that the output is distributed
exactly as the (warped) target's.

Every verifier has the signature

    verify(p[B, K+1, V], q[B, K, V], draft[B, K], key) -> (accepted[B], next_token[B])

where p[:, i] is the target's distribution for the token after i draft tokens (so
p[:, K] is the bonus position), q[:, i] the draft's distribution that draft[:, i] was
drawn from (one-hot for deterministic drafters). Each is built from a deterministic
`Plan` (acceptance thresholds and the distribution of the next token for every
possible stopping point) and one tiny random draw, so tests can enumerate a plan
exactly and check the draw statistically. The registry (specjax/registry.py VERIFIERS)
names them; each module's `VERIFIER` bundles its function and plan. Imports only core.
"""

from specjax.verify.block import block_plan, block_verify
from specjax.verify.common import Plan, Verifier, stop_distribution
from specjax.verify.greedy import greedy_plan, greedy_verify
from specjax.verify.rejection import rejection_plan, rejection_verify

__all__ = [
  'Plan',
  'Verifier',
  'stop_distribution',
  'block_plan',
  'block_verify',
  'greedy_plan',
  'greedy_verify',
  'rejection_plan',
  'rejection_verify',
]
