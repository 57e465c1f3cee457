"""The DSpark drafter: a DFlash block drafter (drafters/dflash.py) with DSpark's Markov
and confidence heads (specjax/models/dspark.py).

One block forward gives every position's state; the Markov head then draws the chain in
order, each position's distribution shifted by the token drawn before it, and the
confidence head says how likely each drafted token is to survive verification
(`confidences`: what scheduled verification reads). Everything else (the ring of target
features, catch-up, rollback, sharding) is the DFlash drafter's.

Draft specs: `dspark` (the drafter shipped for SmolLM2-135M-Instruct: the DFlash block
`dflash` loads, with heads trained on it), `dspark:random[,block=B,layers=N,seed=S,rank=R]`
(untrained: its Markov bias starts at zero, so it drafts as the DFlash block it
extends) or `dspark:DIR` (a DFlash checkpoint whose config.json carries `markov_rank`,
with the heads' tensors in DeepSpec's names: specjax/checkpoints/dspark.py; the
trainer's kind 'dspark' writes one).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from specjax.checkpoints import dspark as dspark_ckpt
from specjax.core.contract import ConfidenceDrafter, DraftKind
from specjax.drafters import dflash as dflash_drafter
from specjax.drafters.dflash import DFlashDrafter, DFlashState
from specjax.drafters.eagle import to_full_vocab
from specjax.models import dflash as dflash_model
from specjax.models import dspark as dspark_model

DEFAULT_RANK = 64


@dataclasses.dataclass(frozen=True)
class DSparkDrafter(DFlashDrafter, ConfidenceDrafter):
  """params {'block': DFlash's, 'embed': the target's [V, D], 'heads': models/dspark's}."""

  name: str = dataclasses.field(default='DSpark block drafter', compare=False)
  kind = 'DSpark'

  def _block(self, params, draft_state: DFlashState, state, gamma: int):
    """(cache caught up, base logits [B, gamma, K], final states [B, gamma, D])."""
    block = params['block']
    cache = self.context(params, draft_state, state, gamma)
    states = dflash_model.block_states(
      block, params['embed'], state.last_tokens, cache, self.cfg, gamma
    )
    return cache, dflash_model.head_logits(block, states), states

  def propose(self, params, draft_state: DFlashState, state, key, gamma, sampling):
    cache, base, _ = self._block(params, draft_state, state, gamma)
    ids = jnp.asarray(params['block']['vocab_ids'])
    picks, q = dspark_model.chain(params['heads'], base, state.last_tokens, ids, key, sampling)
    return ids[picks], to_full_vocab(q, ids, self.vocab_size), draft_state.replace(cache=cache)

  def child_logits(self, params, logits, parents):
    """The Markov head on a tree: a node's children are drawn from its depth's block
    logits shifted by the node's own token."""
    return dspark_model.step(params['heads'], logits, parents)

  def confidences(self, params, draft_state: DFlashState, state, gamma):
    """(each of the first gamma block positions' survival probability [B, gamma], given
    the positions before it survived; the draft state with its cache caught up, as a
    proposal would leave it). From the block's states alone, before anything is drawn:
    a verification length chosen from them keeps sampling lossless (models/dspark.py)."""
    cache, _, states = self._block(params, draft_state, state, gamma)
    return dspark_model.confidence(params['heads'], states), draft_state.replace(cache=cache)


# The shipped block drafter carries DSpark's heads: `dflash` reads its block, `dspark` all.
SHIPPED = dflash_drafter.SHIPPED
USAGE = (
  'dspark (the drafter shipped for SmolLM2-135M-Instruct), '
  'dspark:random[,block=B,layers=N,seed=S,rank=R] (untrained) or dspark:<directory> (a '
  'DFlash checkpoint with DSpark heads)'
)
OPTIONS = {**dflash_drafter.RANDOM_OPTIONS, 'rank': ('rank', int)}


@dataclasses.dataclass(frozen=True)
class Settings(dflash_drafter.RandomSettings):
  rank: int = DEFAULT_RANK


def _parse(spec):
  if len(spec.args) > 1 or (spec.args and spec.args[0] != 'random' and spec.options):
    raise spec.error(USAGE)
  if spec.args and spec.args[0] != 'random':
    if not dspark_ckpt.is_dspark_dir(spec.args[0]):
      raise ValueError(
        f'draft {spec.text!r}: no DSpark drafter at {spec.args[0]} (a DFlash checkpoint '
        'whose config.json carries markov_rank, with the heads; a plain DFlash one loads '
        'as dflash:DIR)'
      )
    return spec.args[0]
  if not spec.args:
    if spec.options or not dspark_ckpt.is_dspark_dir(SHIPPED):
      raise spec.error(USAGE)
    return SHIPPED
  settings = Settings(**spec.option_dict(OPTIONS, USAGE))
  if settings.block < 2 or settings.layers < 1 or settings.rank < 1:
    raise ValueError(f'draft {spec.text!r}: needs block >= 2, layers >= 1, rank >= 1')
  return settings


def _build(settings, target, dtype):
  if not isinstance(settings, Settings):  # a directory
    cfg, block, heads, _ = dspark_ckpt.load(settings)
    params = dflash_drafter.draft_params(cfg, block, settings, target, dtype)
    rank = heads['w1'].shape[1]
    name = f'DSpark block drafter (blocks of {cfg.block_size}, rank {rank}, target layers '
    name += f'{list(cfg.capture)})'
    return DSparkDrafter(cfg, name=name), {**params, 'heads': heads}
  drafter, params = dflash_drafter.DFLASH.build(settings, target, dtype)
  cfg = drafter.cfg
  key = jax.random.fold_in(jax.random.key(settings.seed), 1)
  heads = dspark_model.init_params(cfg.vocab_size, cfg.draft_vocab, cfg.d_model, settings.rank, key)
  name = f'DSpark block drafter (untrained, blocks of {cfg.block_size}, rank {settings.rank})'
  return DSparkDrafter(cfg, name=name), {**params, 'heads': heads}


DSPARK = DraftKind(
  usage=USAGE,
  parse=_parse,
  build=_build,
  classes=(DSparkDrafter,),
  scheduled=True,
  partition_rules=dflash_drafter.DFLASH.partition_rules,
  resync=dflash_drafter.resyncing,
)
