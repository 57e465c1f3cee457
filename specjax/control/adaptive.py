"""Adaptive draft length: pick gamma every iteration, 0 (plain decoding) included.

The controller keeps exponentially decayed counts of draft-token successes and failures
per draft position: an iteration that drafted gamma tokens and kept k of them is a
success at positions 1..k and, if k < gamma, a failure at position k + 1 (later
positions were not tried). Each position's acceptance is a posterior mean shrunk toward
the pooled rate (successes / (successes + failures) over all positions, itself with a
Beta prior of mean `prior_alpha` and weight `prior_weight`), so positions never tried
take the pooled rate. The expected tokens of a gamma are then 1 + sum_k prod_{j<=k} a_j:
no geometric assumption, so prompt lookup's bimodal runs (a copied span kept whole, or a
miss at once) are predicted right. Each iteration the controller predicts the speedup of
every compiled gamma from those and the measured costs (`specjax/control/cost_model.py`)
and moves to the best one only when it beats the current choice by a factor
1 + `hysteresis`: speculation turns off when the best draft length no longer pays by
that margin, and back on only when one pays by it, so estimates hovering near
break-even do not flap.

While off, nothing is learned, so after `probe_every` plain steps the controller runs
one speculative iteration at the smallest draft length (a probe); probes are how it
notices that drafts pay again. Each probe that leaves it off doubles the wait before the
next (up to `probe_every * probe_backoff` steps), so a draft that never pays costs
little more than plain decoding; a probe that kept all its draft tokens, or turning on,
resets the wait. Everything is jnp code inside the jitted loop: no host decision.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from specjax.control import cost_model


@dataclasses.dataclass(frozen=True)
class AdaptiveConfig:
  """Static controller settings (a jit static argument, so it must stay hashable).

  gammas: the speculative draft lengths compiled into the loop; 0 is always added.
  draft_cost, verify_cost: per gamma, in units of one plain target step (measured with
    `specjax.bench.costs.measure`); the defaults describe a free draft.
  """

  gammas: tuple[int, ...] = (1, 2, 4)
  draft_cost: tuple[float, ...] | None = None
  verify_cost: tuple[float, ...] | None = None
  decay: float = 0.9  # weight of older evidence per observed iteration
  prior_alpha: float = 0.5
  prior_weight: float = 0.5
  hysteresis: float = 0.1
  probe_every: int = 16
  probe_backoff: int = 8  # the wait between probes grows up to probe_every * probe_backoff
  probe_largest: bool = False  # probe with the largest gamma (more evidence, dearer)
  start_on: bool = True  # start at the best predicted gamma under the prior (else off)

  def __post_init__(self):
    gammas = tuple(self.gammas)
    if (
      not gammas
      or any(not isinstance(g, int) or g < 1 for g in gammas)
      or (list(gammas) != sorted(set(gammas)))
    ):
      raise ValueError(f'adaptive gammas must be increasing integers >= 1, got {self.gammas}')
    object.__setattr__(self, 'gammas', gammas)
    for name in ('draft_cost', 'verify_cost'):
      value = getattr(self, name)
      if value is None:
        value = tuple(0.0 for _ in gammas) if name == 'draft_cost' else tuple(1.0 for _ in gammas)
      value = tuple(float(v) for v in value)
      if len(value) != len(gammas) or any(v < 0 for v in value):
        raise ValueError(
          f'adaptive {name} needs one non-negative cost per gamma {gammas}, '
          f'got {getattr(self, name)}'
        )
      object.__setattr__(self, name, value)
    if not 0 < self.decay <= 1:
      raise ValueError(f'adaptive decay must lie in (0, 1], got {self.decay}')
    if not 0 <= self.prior_alpha <= 1 or self.prior_weight <= 0:
      raise ValueError('adaptive prior needs 0 <= prior_alpha <= 1 and prior_weight > 0')
    if self.hysteresis < 0 or self.probe_every < 1 or self.probe_backoff < 1:
      raise ValueError('adaptive hysteresis must be >= 0, probe_every and probe_backoff >= 1')

  @classmethod
  def from_costs(cls, costs, gammas=None, **kwargs) -> AdaptiveConfig:
    """Settings with the measured `costs` (a specjax.control.cost_model.Costs)."""
    gammas = tuple(gammas or sorted(costs.draft_ms))
    units = [costs.units(g) for g in gammas]
    return cls(
      gammas=gammas,
      draft_cost=tuple(round(d, 4) for d, _ in units),
      verify_cost=tuple(round(v, 4) for _, v in units),
      **kwargs,
    )

  @property
  def max_wait(self) -> int:
    """The most plain steps in a row (a draft model's cache may lag this far behind)."""
    return self.probe_every * self.probe_backoff

  @property
  def choices(self) -> tuple[int, ...]:
    """Branch index -> gamma."""
    return (0, *self.gammas)


@struct.dataclass
class ControlState:
  successes: jax.Array  # [G] float32 per draft position (G = max gamma), decayed
  failures: jax.Array  # [G] float32, decayed
  choice: jax.Array  # [] int32 index into config.choices: the current setting
  since_probe: jax.Array  # [] int32 plain steps since the last speculative iteration
  wait: jax.Array  # [] int32 plain steps before the next probe
  switches: jax.Array  # [] int32 changes of setting so far
  toggles: jax.Array  # [] int32 of which between off (gamma 0) and on


def pooled_alpha(config: AdaptiveConfig, ctrl: ControlState) -> jax.Array:
  """Posterior mean acceptance over every position (the geometric model's alpha)."""
  s, f = jnp.sum(ctrl.successes), jnp.sum(ctrl.failures)
  return (s + config.prior_alpha * config.prior_weight) / (s + f + config.prior_weight)


def alpha(config: AdaptiveConfig, ctrl: ControlState) -> jax.Array:
  """[G] posterior mean acceptance per draft position, shrunk toward the pooled rate."""
  pooled = pooled_alpha(config, ctrl)
  w = config.prior_weight
  return (ctrl.successes + pooled * w) / (ctrl.successes + ctrl.failures + w)


def predicted(config: AdaptiveConfig, a: jax.Array) -> jax.Array:
  """Predicted speedup per choice (choice 0, plain decoding, is 1) from per-position
  acceptance a[G]."""
  runs = 1.0 + jnp.cumsum(jnp.cumprod(a))  # expected tokens of gamma = 1..G
  tokens = runs[jnp.asarray(config.gammas) - 1]
  draft, verify = jnp.asarray(config.draft_cost), jnp.asarray(config.verify_cost)
  return jnp.concatenate([jnp.ones((1,)), cost_model.speedup(tokens, draft, verify)])


def _decide(config: AdaptiveConfig, choice: jax.Array, a: jax.Array) -> jax.Array:
  """The hysteresis rule: move to the best choice only if it beats the current by the margin."""
  pred = predicted(config, a)
  best = jnp.argmax(pred).astype(jnp.int32)
  better = pred[best] > pred[choice] * (1 + config.hysteresis)
  return jnp.where(better, best, choice)


def init(config: AdaptiveConfig) -> ControlState:
  zeros = jnp.zeros((max(config.gammas),), jnp.float32)
  ctrl = ControlState(
    successes=zeros,
    failures=zeros,
    choice=jnp.zeros((), jnp.int32),
    since_probe=jnp.zeros((), jnp.int32),
    wait=jnp.asarray(config.probe_every, jnp.int32),
    switches=jnp.zeros((), jnp.int32),
    toggles=jnp.zeros((), jnp.int32),
  )
  if config.start_on:
    best = jnp.argmax(predicted(config, alpha(config, ctrl))[1:]).astype(jnp.int32) + 1
    ctrl = ctrl.replace(choice=best)
  return ctrl


def choose(config: AdaptiveConfig, ctrl: ControlState) -> jax.Array:
  """The branch to run this iteration: the current choice, or a probe when off for long."""
  probe = jnp.int32(len(config.gammas) if config.probe_largest else 1)
  due = (ctrl.choice == 0) & (ctrl.since_probe >= ctrl.wait)
  return jnp.where(due, probe, ctrl.choice)


def update(
  config: AdaptiveConfig,
  ctrl: ControlState,
  ran: jax.Array,
  accepted: jax.Array,
  drafted: jax.Array,
) -> ControlState:
  """Folds in one iteration (per-row accepted/drafted; drafted 0 = no draft) and re-decides."""
  tried = drafted > 0
  observed = jnp.any(tried)
  k = jnp.arange(1, max(config.gammas) + 1)[None]  # draft positions
  at = tried[:, None] & (drafted[:, None] >= k) & (accepted[:, None] >= k - 1)  # [B, G] tried
  kept = at & (accepted[:, None] >= k)
  s_k = jnp.sum(kept, axis=0).astype(jnp.float32)
  f_k = jnp.sum(at & ~kept, axis=0).astype(jnp.float32)
  s, f = jnp.sum(s_k), jnp.sum(f_k)
  # Evidence ages with time, not only with observations: after a gap of plain steps a
  # probe weighs more against the stale counts.
  age = 1.0 + ctrl.since_probe.astype(jnp.float32) / config.probe_every
  decay = jnp.where(observed, config.decay**age, 1.0)
  successes = decay * ctrl.successes + s_k
  failures = decay * ctrl.failures + f_k
  ctrl = ctrl.replace(
    successes=successes, failures=failures, since_probe=jnp.where(ran == 0, ctrl.since_probe + 1, 0)
  )
  new = _decide(config, ctrl.choice, alpha(config, ctrl))
  probed = (ctrl.choice == 0) & (ran != 0)
  # A probe that kept every draft token asks for another soon; one that failed backs off.
  clean = (f == 0) & (s > 0)
  backoff = jnp.where(clean, config.probe_every, jnp.minimum(2 * ctrl.wait, config.max_wait))
  wait = jnp.where(new != 0, config.probe_every, jnp.where(probed, backoff, ctrl.wait))
  return ctrl.replace(
    choice=new,
    wait=wait.astype(jnp.int32),
    switches=ctrl.switches + (new != ctrl.choice),
    toggles=ctrl.toggles + ((new == 0) != (ctrl.choice == 0)),
  )


def simulate(config: AdaptiveConfig, accept_prob, key: jax.Array, batch: int = 1):
  """Runs the controller on synthetic acceptance: accept_prob[t] is iteration t's alpha.

  Each draft token is accepted with that probability until the first rejection.
  Returns the gamma run at each iteration ([T] int32) and the final state; used by the
  tests and to tune the settings without a model.
  """
  choices = jnp.asarray(config.choices)

  def body(ctrl, inputs):
    p, k = inputs
    ran = choose(config, ctrl)
    gamma = choices[ran]
    draws = jax.random.uniform(k, (batch, max(config.gammas)))
    ok = (draws < p) & (jnp.arange(max(config.gammas)) < gamma)
    accepted = jnp.sum(jnp.cumprod(ok, axis=1), axis=1)
    drafted = jnp.full((batch,), gamma)
    return update(config, ctrl, ran, accepted, drafted), gamma

  accept_prob = jnp.asarray(accept_prob, jnp.float32)
  keys = jax.random.split(key, accept_prob.shape[0])
  ctrl, gammas = jax.lax.scan(body, init(config), (accept_prob, keys))
  return gammas, ctrl
