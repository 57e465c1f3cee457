"""An independent draft model in the model contract, with its own KV cache.

The draft cache holds the prompt and every emitted token except the last two. Each
proposal first feeds those two tokens (re-writing the older one's slot, which already
holds the same values), then one drafted token per step. After the verifier keeps k
draft tokens, the cache is valid up to exactly that point, so a rollback is only
setting lengths = prompt + emitted - 2, whatever k was (all gamma kept included).

Under adaptive control some iterations are plain target steps that skip the draft, so
the draft cache falls behind. A drafter made with `resync=W` (W > 0) then first feeds the
missing tokens, 16 at a time, only on iterations where a row lags, so drafting resumes
from a complete cache. The cache length always records
how far the cache is actually filled, so the lag is known without extra state.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from specjax.checkpoints import loader
from specjax.core import contract
from specjax.core import sampling as sampling_lib
from specjax.core.contract import DraftKind, TargetOut, TreeDrafter
from specjax.drafters import tree_build
from specjax.models import llama, quant
from specjax.models.kv_cache import KVCache


@struct.dataclass
class ModelDraftState:
  cache: KVCache
  last_prompt_token: jax.Array  # [B]: the token before the first emitted one


def last_two_tokens(draft_state: ModelDraftState, state) -> jax.Array:
  """[B, 2]: the last two tokens of prompt + emitted text."""
  n = state.num_generated
  prev = jnp.take_along_axis(state.tokens, jnp.maximum(n - 2, 0)[:, None], axis=1)[:, 0]
  prev = jnp.where(n >= 2, prev, draft_state.last_prompt_token)
  return jnp.stack([prev, state.last_tokens], axis=1)


CATCH_UP = 16  # tokens a catch-up forward feeds (ModelDrafter.caught_up)


@dataclasses.dataclass(frozen=True)
class ModelDrafter(TreeDrafter):
  """Drafts with a model `cfg` of any family (params passed separately).

  `layers`, if set, runs only those layers of the model: with the target's own
  parameters that is self-speculative decoding by layer skipping (Draft & Verify,
  Zhang et al. 2023), the draft sharing every weight with the target.
  """

  cfg: llama.LlamaConfig
  name: str = dataclasses.field(default='draft model', compare=False)
  layers: tuple[int, ...] | None = None
  resync: int = 0  # > 0: a proposal first catches up on tokens skipped by plain steps

  def __post_init__(self):
    if self.layers is not None and (
      not self.layers
      or any(not 0 <= i < self.cfg.n_layers for i in self.layers)
      or list(self.layers) != sorted(set(self.layers))
    ):
      raise ValueError(
        f'draft layers must be increasing indices in [0, {self.cfg.n_layers}), got {self.layers}'
      )

  @property
  def vocab_size(self) -> int:
    return self.cfg.vocab_size

  def init(
    self, params, prompt_tokens, prompt_lens, cache_size, constrain=None, target=TargetOut()
  ):
    del target  # a prefill of its own
    model = self.cfg.family
    cache = model.init_cache(self.cfg, prompt_tokens.shape[0], cache_size, params['embed'].dtype)
    if constrain is not None:
      cache = constrain(cache)
    cache = model.forward(params, prompt_tokens, cache, self.cfg, self.layers, head=False).cache
    last = jnp.take_along_axis(prompt_tokens, (prompt_lens - 1)[:, None], axis=1)[:, 0]
    return ModelDraftState(cache=cache.with_lengths(prompt_lens - 1), last_prompt_token=last)

  def forward(self, params, tokens, cache):
    """The draft model: tokens[B, T] -> (logits[B, T, V'], cache). Subclasses may narrow V'."""
    return self.cfg.family.forward(params, tokens, cache, self.cfg, self.layers)[:2]

  def caught_up(self, params, draft_state, state) -> KVCache:
    """The draft cache holding the whole text but its last two tokens, every row (after
    plain steps that skipped the draft under adaptive control, `resync`): forwards of
    CATCH_UP tokens in a while_loop, none when no row lags. Not a lax.switch between a
    catch-up and the in-step path: XLA copies a cache through a branch, and that copy cost
    a quantized draft's every proposal 5% (issue 27)."""
    want = state.prompt_lens + state.num_generated - 2  # the filled length in step
    w = CATCH_UP

    def feed(cache):
      start = jnp.minimum(cache.lengths, want)  # rows in step refeed, then stay at `want`
      absolute = start[:, None] + jnp.arange(w)
      emitted = jnp.take_along_axis(
        state.tokens,
        jnp.clip(absolute - state.prompt_lens[:, None], 0, state.tokens.shape[1] - 1),
        axis=1,
      )
      chunk = jnp.where(
        absolute == state.prompt_lens[:, None] - 1, draft_state.last_prompt_token[:, None], emitted
      )
      cache = self.cfg.family.forward(
        params, chunk, cache.with_lengths(start), self.cfg, self.layers, head=False
      ).cache
      return cache.with_lengths(jnp.minimum(start + w, want))

    return jax.lax.while_loop(lambda c: jnp.any(c.lengths < want), feed, draft_state.cache)

  def first_logits(self, params, draft_state, state):
    """The draft's logits after the last emitted token, and its cache filled up to it:
    feeds the last two tokens (see the module docstring), with `resync` after catching up
    on any the draft skipped."""
    cache = self.caught_up(params, draft_state, state) if self.resync else draft_state.cache
    logits, cache = self.forward(params, last_two_tokens(draft_state, state), cache)
    return logits[:, -1], cache

  def propose(self, params, draft_state, state, key, gamma, sampling):
    logits, cache = self.first_logits(params, draft_state, state)
    tokens, dists = [], []
    for i, k in enumerate(jax.random.split(key, gamma)):
      dists.append(sampling_lib.probabilities(logits, sampling))
      tokens.append(sampling_lib.sample(logits, k, sampling))
      if i + 1 < gamma:
        logits, cache = self.forward(params, tokens[-1][:, None], cache)
        logits = logits[:, 0]
    return (jnp.stack(tokens, 1), jnp.stack(dists, 1), draft_state.replace(cache=cache))

  # Token trees (drafters/tree_build.py): after a context of c tokens, node i at depth d
  # sits at position c - 1 + d; nodes with children are fed to the draft, at draft-cache
  # slots recorded in TreeDraft.cache_slots, to give their children.

  def check_tree(self, spec) -> None:
    tree_build.check_tree(self.name, spec)

  def _forward_masked(self, params, tokens, cache, positions, slots, mask):
    """The draft on tree nodes: (logits [B, T, V'] over the draft's vocabulary, cache)."""
    at = contract.At(positions, slots, mask)
    return self.cfg.family.forward(params, tokens, cache, self.cfg, self.layers, at=at)[:2]

  def _vocab_ids(self, params):
    """The target id of each draft-vocabulary index (None: the draft has the full one)."""
    del params
    return None

  def propose_tree(self, params, draft_state, state, key, spec, sampling):
    logits, cache = self.first_logits(params, draft_state, state)  # cache holds the context
    c = cache.lengths

    def feed(cache, tokens, parent_states, positions, slots, mask):
      out, cache = self._forward_masked(params, tokens, cache, positions, slots, mask)
      return out, parent_states, cache

    ids = self._vocab_ids(params)
    extra = {} if ids is None else {'ids': ids, 'vocab': self.cfg.vocab_size}
    args = (feed, cache, logits, jnp.zeros((c.shape[0], 0), logits.dtype), c, cache.cache_size)
    if spec.shape is not None:
      draft, cache = tree_build.static_tree(*args, spec.shape, key, sampling, **extra)
    else:
      draft, cache = tree_build.dynamic_tree(*args, spec, sampling, **extra)
    filled = c + spec.nodes  # past every node: update trims to the accepted path
    return draft, draft_state.replace(cache=cache.with_lengths(filled))

  def accept_path(self, draft_state, draft, path, accepted):
    """Moves the accepted nodes' keys and values to the slots after the context."""
    c = draft_state.cache.lengths - draft.size  # propose_tree left lengths at c + N
    nodes = path[:, 1:]  # [B, D]
    src = jnp.take_along_axis(draft.cache_slots, jnp.maximum(nodes - 1, 0), axis=1)
    dst = c[:, None] + jnp.arange(nodes.shape[1], dtype=jnp.int32)
    src = jnp.where(src >= 0, src, dst)  # nodes never fed (leaves): nothing to move
    cache = self.cfg.family.move_slots(draft_state.cache, src, dst)
    return draft_state.replace(cache=cache)

  def update(self, draft_state, state, target=TargetOut()):
    del target
    # After a proposal the cache is filled past this point; after a skipped one it may lag.
    lengths = jnp.minimum(draft_state.cache.lengths, state.prompt_lens + state.num_generated - 2)
    return draft_state.replace(cache=draft_state.cache.with_lengths(lengths))


def truncated_target(cfg: llama.LlamaConfig, params, num_layers: int):
  """(cfg, params) of the target's first `num_layers` layers, sharing its embeddings.

  An untrained stand-in draft until a distilled one exists: cheap to build, poor at
  agreeing with the target.
  """
  if not 1 <= num_layers < cfg.n_layers:
    raise ValueError(f'a truncated draft needs 1 <= layers < {cfg.n_layers}, got {num_layers}')
  draft_cfg = dataclasses.replace(
    cfg,
    n_layers=num_layers,
    name=f'{cfg.name}[:{num_layers}]',
    layer_types=cfg.layer_types[:num_layers],
  )
  draft_params = {k: v for k, v in params.items() if k != 'layers'}
  draft_params['layers'] = params['layers'][:num_layers]
  return draft_cfg, draft_params


def parse_layers(text: str, n_layers: int | None = None) -> tuple[int, ...]:
  """'0-11,20-29' -> (0, 1, ..., 11, 20, ..., 29), checked against n_layers when given."""
  layers = []
  try:
    for part in text.split(','):
      lo, _, hi = part.partition('-')
      layers += range(int(lo), int(hi or lo) + 1)
  except ValueError:
    raise ValueError(f'layer list {text!r}: expected ranges like 0-11,20-29') from None
  if not layers or min(layers) < 0 or len(set(layers)) != len(layers):
    raise ValueError(f'layer list {text!r}: expected distinct layers >= 0')
  if n_layers is not None and max(layers) >= n_layers:
    raise ValueError(f'layer list {text!r}: expected distinct layers in [0, {n_layers})')
  return tuple(sorted(layers))


def _parse_layers(spec) -> tuple[str, tuple[int, ...]]:
  if spec.options or not spec.args:
    raise spec.error(LAYERS.usage)
  text = ','.join(spec.args)
  try:
    return text, parse_layers(text)
  except ValueError as e:
    raise ValueError(f'draft {spec.text!r}: {e}') from None


def _build_layers(settings, target, dtype):
  text, _ = settings
  layers = parse_layers(text, target.cfg.n_layers)
  name = f'target with {len(layers)} of {target.cfg.n_layers} layers ({text})'
  return ModelDrafter(target.cfg, name=name, layers=layers), target.params


def _parse_truncated(spec) -> int:
  if spec.options or len(spec.args) != 1 or not spec.args[0].isdigit():
    raise spec.error(TRUNCATED.usage)
  return int(spec.args[0])


def _build_truncated(num_layers, target, dtype):
  cfg, params = truncated_target(target.cfg, target.params, num_layers)
  return ModelDrafter(cfg, name=f'target truncated to {num_layers} layers (untrained)'), params


def _parse_model(spec) -> str:
  text = spec.args[0] if spec.kind == 'model' and len(spec.args) == 1 else spec.text
  loader.check_model_spec(text)
  return text


@dataclasses.dataclass(frozen=True)
class PaddedVocabDrafter(ModelDrafter):
  """A draft model whose vocabulary rows are a prefix of the target's: one tokenizer, the
  embedding padded to different sizes (Qwen2.5-0.5B's 151936 rows against 7B's 152064,
  Gemma 3 270M's 262144 against 4B's 262208). Its logits are padded to the target's
  `target_vocab` with -1e30: ids past its rows are never proposed (q = 0, still lossless)."""

  target_vocab: int = 0

  @property
  def vocab_size(self) -> int:
    return self.target_vocab

  def _pad(self, logits):
    extra = self.target_vocab - logits.shape[-1]
    return jnp.pad(logits, [(0, 0)] * (logits.ndim - 1) + [(0, extra)], constant_values=-1e30)

  def forward(self, params, tokens, cache):
    logits, cache = super().forward(params, tokens, cache)
    return self._pad(logits), cache

  def _forward_masked(self, params, tokens, cache, positions, slots, mask):
    logits, cache = super()._forward_masked(params, tokens, cache, positions, slots, mask)
    return self._pad(logits), cache


def _build_model(text, target, dtype):
  """Any model with the target's vocabulary and tokenizer, as an independent draft (a
  vocabulary padded to fewer rows than the target's, with every id of its tokenizer, too)."""
  draft = loader.load_model(text, dtype)
  padded = draft.tokenizer.vocab_size <= draft.cfg.vocab_size < target.cfg.vocab_size
  if draft.cfg.vocab_size != target.cfg.vocab_size and not padded:
    raise ValueError(
      f'draft {text!r} has a vocabulary of {draft.cfg.vocab_size} tokens but the '
      f'target {target.source!r} has {target.cfg.vocab_size}: they must share one (or the '
      f"draft's rows be a prefix of the target's holding all {draft.tokenizer.vocab_size} ids "
      'of its tokenizer)'
    )
  probe = 'Hello, world! def f(x): return x ** 2  # 12345'
  if draft.tokenizer.encode(probe) != target.tokenizer.encode(probe):
    raise ValueError(
      f'draft {text!r} tokenizes text differently from the target '
      f'{target.source!r}: they must share one tokenizer'
    )
  if padded:
    rows = target.cfg.vocab_size
    name = f'draft model {text} (vocabulary {draft.cfg.vocab_size} padded to {rows})'
    return PaddedVocabDrafter(draft.cfg, name=name, target_vocab=rows), draft.params
  return ModelDrafter(draft.cfg, name=f'draft model {text}'), draft.params


def resyncing(drafter: ModelDrafter, window: int) -> ModelDrafter:
  """A draft model that catches up on up to `window` tokens plain steps skipped."""
  return dataclasses.replace(drafter, resync=window)


LAYERS = DraftKind(
  usage='layers:<ranges of the target layers to run, e.g. 0-11,20-29>',
  parse=_parse_layers,
  build=_build_layers,
  resync=resyncing,
)
TRUNCATED = DraftKind(
  usage='truncated:<number of layers>',
  parse=_parse_truncated,
  build=_build_truncated,
  resync=resyncing,
)
MODEL = DraftKind(
  usage='a model spec (an asset name, a .gguf file, a Hugging Face directory or hf:<org>/<name>)',
  parse=_parse_model,
  build=_build_model,
  classes=(ModelDrafter,),
  resync=resyncing,
)


QUANTIZED_USAGE = (
  "quantized (the target in its GGUF file's own q4_1/q8_0 blocks, else rounded to q8_0, "
  'with 8-bit integer products) or quantized:q8_0; layout=rows keeps q4_1 weights in row '
  'order (default: groups of 8 rows, the faster kernel)'
)


def _parse_quantized(spec) -> tuple[str, bool]:
  options = dict(spec.options)
  if (
    len(spec.args) > 1
    or (spec.args and spec.args[0] != 'q8_0')
    or set(options) - {'layout'}
    or options.get('layout', 'rows8') not in ('rows', 'rows8')
  ):
    raise spec.error(QUANTIZED_USAGE)
  return (spec.args[0] if spec.args else 'auto'), options.get('layout', 'rows8') == 'rows8'


def quantized_params(target, fmt: str = 'auto'):
  """The target's parameters with its matrices as block-quantized weights (models/quant.py).

  'auto' takes the q4_1 / q8_0 blocks stored in the target's GGUF file, exactly, where it
  has them, and rounds every other matrix to q8_0; 'q8_0' rounds all of them.
  """
  from specjax.checkpoints import gguf

  stored = {}
  if fmt == 'auto' and str(target.source).endswith('.gguf'):
    stored = gguf.load_gguf_blocks(target.source, target.cfg)
  params = quant.quantize_params(target.params, keep=stored)
  return params, sorted({w.fmt for w in stored.values()})


@dataclasses.dataclass(frozen=True)
class QuantizedDrafter(ModelDrafter):
  """The target's own architecture with block-quantized weights (models/quant.py).

  It starts from the target's KV cache of the prompt instead of a prefill of its own (a
  prompt is too many rows for the 8-bit kernel; expanding the weights for it cost more
  than the target's prefill), then writes its own keys and values for what follows.
  """

  def init(
    self, params, prompt_tokens, prompt_lens, cache_size, constrain=None, target=TargetOut()
  ):
    if target.cache is None:  # called without the target's prefill: one of its own
      return super().init(params, prompt_tokens, prompt_lens, cache_size, constrain)
    last = jnp.take_along_axis(prompt_tokens, (prompt_lens - 1)[:, None], axis=1)[:, 0]
    return ModelDraftState(cache=target.cache.with_lengths(prompt_lens - 1), last_prompt_token=last)


def _build_quantized(settings, target, dtype):
  fmt, rows8 = settings
  try:
    params, stored = quantized_params(target, fmt)
  except ValueError as e:
    raise ValueError(f'draft quantized: cannot quantize {target.source}: {e}') from None
  params = quant.for_kernels(params, rows8)  # q|k|v joined; q4_1 layers in groups of 8 rows
  leaves = jax.tree_util.tree_leaves(params, is_leaf=lambda x: hasattr(x, 'fmt'))
  kinds = '/'.join(sorted({x.fmt for x in leaves if hasattr(x, 'fmt')}))
  origin = 'as stored in its GGUF file' if stored else 'rounded from float32'
  grouped = any(getattr(x, 'rows8', False) for x in leaves)
  layout = ', q4_1 in groups of 8 rows' if grouped else ''
  name = f'target quantized ({kinds} weights {origin}, 8-bit activations{layout})'
  return QuantizedDrafter(target.cfg, name=name), params


QUANTIZED = DraftKind(
  usage=QUANTIZED_USAGE, parse=_parse_quantized, build=_build_quantized, resync=resyncing
)
