"""The run config's fields, their checks, and the method grammar: validation before work.

`validate(config)` checks every field of a `python -m specjax.run` config (unknown and
missing fields included, with the closest known names), every draft spec, method name,
verifier and sampling setting, before any model loads or any cost is measured; each
error is one line naming the field, the value and what was expected.

Methods are named 'autoregressive', '<draft>@<gamma>' (a fixed draft length),
'<draft>@adaptive', '<draft>@scheduled' (adaptive, each iteration's length from the
draft's confidence head: control/scheduled.py) or '<draft>@<tree>' (a token tree:
'dynamic:16-6-4' or a static shape such as '4x2x1x1'; specjax/core/tree.py);
`build_methods` expands config.drafts x (config.gammas, adaptive, config.trees).
"""

from __future__ import annotations

import difflib

import jax
import ml_collections

from specjax import config_lib, registry
from specjax.checkpoints import loader
from specjax.core import tree as tree_lib
from specjax.core.sampling import SamplingConfig
from specjax.decode.method import AUTOREGRESSIVE, Method
from specjax.models import sharding

# Every field of a run config (configs/smollm2.py), with what it holds.
FIELDS = {
  'model': 'target: asset name, .gguf file, Hugging Face directory, hf:<org>/<name>, or tiny',
  'dtype': f'parameter dtype, one of {sorted(loader.DTYPES)}',
  'prompt': 'one chat prompt (overrides prompts)',
  'prompts': 'prompt set: humaneval, mtbench, mtbench:<category>, code_edit, a JSONL file, or '
  'specbench[:<category>|:<path>[:<category>]] (every turn; specjax/data/specbench.py)',
  'num_prompts': 'how many prompts of the set (Spec-Bench: how many of each category)',
  'batch_size': 'rows per batch',
  'max_new_tokens': 'new tokens per prompt',
  'cache_size': 'the most KV slots a row may use',
  'temperature': 'sampling temperature (0: greedy)',
  'top_k': 'top-k restriction (0: none)',
  'top_p': 'nucleus restriction (1: none)',
  'seed': 'PRNG seed',
  'mesh': 'device mesh: data and model axis sizes',
  'drafts': 'draft specs (specjax/registry.py)',
  'verifier': f'one of {list(registry.VERIFIERS.names)}',
  'gammas': 'fixed draft lengths',
  'adaptive_gammas': 'draft lengths adaptive control chooses from (with 0)',
  'adaptive_trees': 'static tree shapes adaptive control also chooses from (e.g. 4x2x1)',
  'trees': 'token trees every draft also runs (dynamic:SIZE-DEPTH-WIDTH, or a shape like 4x2x1)',
  'methods': 'a comma-separated subset of the methods, or others in the same syntax',
  'measure_costs': 'time draft and verify steps before decoding (adaptive methods always do)',
  'quick': 'one --config.prompt: autoregressive and quick_method only, a short verdict',
  'quick_method': 'the speculative method a quick one-prompt run compares (e.g. ngram@2)',
  'strict': 'a draft handing the verifier broken probabilities is an error, not a warning',
  'resume': 'finish the interrupted run in --workdir (its finished prompts are not rerun)',
}


def check_fields(config: ml_collections.ConfigDict, known) -> None:
  """Unknown or missing top-level fields are an error naming them (closest known names)."""
  have = set(config.keys())
  for name in sorted(have - set(known)):
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.5)
    hint = f'; did you mean {" or ".join(close)}?' if close else ''
    raise ValueError(f'config.{name}: unknown field{hint} (known: {", ".join(known)})')
  missing = sorted(set(known) - have)
  if missing:
    raise ValueError(f'config is missing the fields {", ".join(missing)}')


def _check_int(config, field: str, low: int) -> None:
  value = config[field]
  config_lib.check(
    isinstance(value, int) and not isinstance(value, bool) and value >= low,
    field,
    value,
    f'an integer >= {low}',
  )


def validate(config: ml_collections.ConfigDict) -> list[Method]:
  """Checks the whole run config; returns the methods it runs (see build_methods)."""
  c = config
  check_fields(c, FIELDS)
  _check_sizes(c)
  check_mesh(c)
  _check_lists(c)
  config_lib.check(
    c.verifier in registry.VERIFIERS, 'verifier', c.verifier, f'one of {registry.VERIFIERS.names}'
  )
  if c.prompt and not c.prompt.strip():
    raise ValueError('config.prompt is empty (only whitespace)')
  _check_sampling(c)
  loader.check_model_spec(c.model)
  for spec in c.drafts:
    config_lib.check(
      isinstance(spec, str) and spec and '@' not in spec,
      'drafts',
      tuple(c.drafts),
      'non-empty draft specs (without @)',
    )
  config_lib.check(isinstance(c.quick, bool), 'quick', c.quick, 'True or False')
  if is_quick(c):
    _check_quick_method(c)
  methods = build_methods(c)
  for spec in dict.fromkeys(m.draft for m in methods if m.draft):
    registry.parse_draft(spec)
  check_depths(c, methods)
  return methods


def _check_sizes(c) -> None:
  """Counts, sizes and the dtype."""
  for field, low in (('num_prompts', 1), ('batch_size', 1), ('max_new_tokens', 1), ('seed', 0)):
    _check_int(c, field, low)
  _check_int(c, 'cache_size', 2)
  config_lib.check(
    c.max_new_tokens < c.cache_size,
    'max_new_tokens',
    c.max_new_tokens,
    f'fewer than config.cache_size = {c.cache_size} (a row holds its prompt and answer)',
  )
  config_lib.check(c.dtype in loader.DTYPES, 'dtype', c.dtype, f'one of {sorted(loader.DTYPES)}')


def _check_lists(c) -> None:
  """Drafts, draft lengths and trees: no repeats, lengths that fit the cache, trees that
  parse."""
  for field in ('drafts', 'gammas', 'adaptive_gammas', 'trees', 'adaptive_trees'):
    values = tuple(c.get(field, ()))
    twice = sorted({repr(v) for v in values if values.count(v) > 1})
    if twice:
      raise ValueError(f'config.{field} = {values}: lists {", ".join(twice)} more than once')
  for field in ('gammas', 'adaptive_gammas'):
    values = tuple(c.get(field, ()))
    config_lib.check(
      all(isinstance(g, int) and g >= 1 for g in values),
      field,
      values,
      'draft lengths, each an integer >= 1',
    )
    config_lib.check(
      all(g + 1 < c.cache_size for g in values),
      field,
      values,
      f'draft lengths below config.cache_size - 1 = {c.cache_size - 1} (a verification '
      'writes the draft and one more token)',
    )
  for text in tuple(c.get('trees', ())):
    try:
      tree_lib.parse_tree(text)
    except ValueError as e:
      raise ValueError(f'config.trees: {e}') from None
  adaptive_trees(c)


def _check_sampling(c) -> None:
  """The sampling settings, and a verifier that is lossless under them."""
  try:
    sampling = SamplingConfig(c.temperature, c.top_k, c.top_p)
  except ValueError as e:
    raise ValueError(f'config: {e}') from None
  if registry.VERIFIERS.get(c.verifier).greedy_only and not sampling.greedy:
    raise ValueError(
      f'config.verifier = {c.verifier!r} is only lossless for greedy decoding, but '
      f'config.temperature = {c.temperature}: use rejection or block, or temperature 0'
    )


def _check_quick_method(c) -> None:
  """A one-prompt run's method: speculative, adaptive only where the run has settings to
  choose from, and drafting with one of config.drafts."""
  try:
    quick = parse_method(c.quick_method)
  except ValueError as e:
    raise ValueError(f'config.quick_method: {e}') from None
  config_lib.check(
    quick.draft != '', 'quick_method', c.quick_method, "a speculative method such as 'ngram@2'"
  )
  if quick.is_adaptive and not has_adaptive(c):
    raise ValueError(
      f'config.quick_method = {c.quick_method!r} needs config.adaptive_gammas (or '
      "adaptive_trees); or pick a fixed gamma such as 'ngram@2'"
    )
  for spec in c.drafts:  # every draft asked for is a real one, even if this run skips it
    registry.parse_draft(spec)
  if quick.draft not in tuple(c.drafts):
    setting = c.quick_method.partition('@')[2]
    raise ValueError(
      f'config.quick_method = {c.quick_method!r} drafts with {quick.draft}, which is not '
      f'among config.drafts = {tuple(c.drafts)}: a one-prompt run compares one method; '
      f'pass --config.quick_method={c.drafts[0] if c.drafts else "ngram"}@{setting} or '
      '--config.quick=False (every draft)'
    )


def check_depths(config, methods) -> None:
  """Every tree fits the cache, and no draft is asked to draft deeper than it can (a
  feature head keeps the features of 15 positions), before any model loads."""
  adaptive = tuple(config.adaptive_gammas) + tuple(s.depth for s in adaptive_trees(config))
  for m in methods:
    if not m.draft:
      continue
    tree = m.tree_spec
    if tree is not None and tree.nodes + 1 >= config.cache_size:
      raise ValueError(
        f'method {m.name}: its tree has {tree.nodes} nodes, but config.cache_size = '
        f'{config.cache_size} (a verification writes every node and one more token)'
      )
    for shape in adaptive_trees(config) if m.is_adaptive else ():
      if shape.size + 1 >= config.cache_size:
        raise ValueError(
          f'config.adaptive_trees: a {shape.describe()} does not fit config.cache_size = '
          f'{config.cache_size} (a verification writes every node and one more token)'
        )
    depth = m.gamma or (tree.max_depth if tree is not None else max(adaptive, default=0))
    kind, _ = registry.parse_draft(m.draft)
    if kind.max_depth and depth > kind.max_depth:
      raise ValueError(
        f'method {m.name}: the draft {m.draft} drafts at most {kind.max_depth} tokens deep, '
        f'but this method asks for {depth}'
        + (' (config.adaptive_gammas / adaptive_trees)' if m.is_adaptive else '')
      )


MESH_FIELDS = {
  'data': 'devices along the batch axis',
  'model': 'devices along the tensor-parallel axis',
  'rules': "target partition rules 'REGEX=AXES' before the defaults (specjax/models/sharding.py)",
  'draft_rules': "draft partition rules 'REGEX=AXES' before the drafter's own",
  'cache': "KV cache axes over [B, G, S, H], e.g. 'data,model,None,None'",
}


def check_mesh(config) -> None:
  """config.mesh: data and model sizes, and optional partition rules and cache axes."""
  mesh = config.mesh
  known = set(MESH_FIELDS)
  for name in sorted(set(mesh.keys()) - known):
    raise ValueError(f'config.mesh.{name}: unknown field (known: {", ".join(MESH_FIELDS)})')
  for axis in ('data', 'model'):
    value = mesh.get(axis)
    config_lib.check(
      isinstance(value, int) and not isinstance(value, bool) and value >= 1,
      f'mesh.{axis}',
      value,
      'an integer >= 1',
    )
  needed, have = mesh.data * mesh.model, jax.device_count()
  if needed > have:
    raise ValueError(
      f'config.mesh: data={mesh.data} x model={mesh.model} needs {needed} devices, this run '
      f'has {have} ({jax.devices()[0].platform}; on a CPU simulate more with '
      f'XLA_FLAGS=--xla_force_host_platform_device_count={needed})'
    )
  mesh_rules(config)


def mesh_rules(config) -> dict:
  """The mesh's partition settings as Engine arguments: rules, draft_rules, cache_spec."""
  mesh = config.mesh
  out = {
    field: sharding.parse_rules(tuple(mesh.get(field, ())), field)
    for field in ('rules', 'draft_rules')
  }
  cache = mesh.get('cache', '')
  out['cache_spec'] = (
    sharding.parse_axes(cache, f'config.mesh.cache {cache!r}') if cache else sharding.CACHE_SPEC
  )
  if len(out['cache_spec']) > 4:
    raise ValueError(f'config.mesh.cache {cache!r}: a KV cache has 4 axes [B, G, S, H]')
  return out


def adaptive_trees(config) -> tuple[tree_lib.TreeShape, ...]:
  """config.adaptive_trees parsed (static shapes only: adaptive control predicts a tree
  from its shape), with an error naming the field."""
  shapes = []
  for text in tuple(config.get('adaptive_trees', ())):
    try:
      shapes.append(tree_lib.parse_shape(text))
    except ValueError as e:
      raise ValueError(f'config.adaptive_trees: {e} (dynamic trees cannot be chosen)') from None
  return tuple(shapes)


def has_adaptive(config) -> bool:
  return bool(config.adaptive_gammas) or bool(tuple(config.get('adaptive_trees', ())))


def parse_method(text: str, verifier: str = 'rejection') -> Method:
  """A method as a run names it (Method.parse): 'autoregressive', '<draft>@<gamma>',
  '<draft>@adaptive', '<draft>@scheduled' or '<draft>@<tree>'."""
  return Method.parse(text, verifier)


def is_quick(config) -> bool:
  """A one-prompt question (config.prompt, config.quick, no config.methods): answered with
  autoregressive decoding and config.quick_method, with a short cost measurement only
  where that method is adaptive (its controller needs the costs)."""
  return bool(config.prompt and config.quick and not config.methods)


def build_methods(config) -> list[Method]:
  """Autoregressive first, then every draft at every gamma (and adaptive), or config.methods.

  The declared set is config.drafts x config.gammas, plus '<draft>@adaptive' per draft
  when config.adaptive_gammas or config.adaptive_trees is set. config.methods (comma
  separated) picks a subset of those, or names others in the same syntax. A quick
  one-prompt run (is_quick) runs autoregressive decoding and config.quick_method.
  """
  if is_quick(config):
    return [AUTOREGRESSIVE, parse_method(config.quick_method, config.verifier)]
  declared = [AUTOREGRESSIVE]
  for spec in config.drafts:
    declared += [parse_method(f'{spec}@{g}', config.verifier) for g in config.gammas]
    if has_adaptive(config):
      declared.append(parse_method(f'{spec}@adaptive', config.verifier))
    declared += [parse_method(f'{spec}@{t}', config.verifier) for t in config.get('trees', ())]
  if not config.methods:
    return declared
  known = {m.name: m for m in declared}
  chosen = [AUTOREGRESSIVE]  # the baseline always runs
  for text in config.methods.split(','):
    if not text.strip():
      continue
    try:
      method = known.get(text.strip()) or parse_method(text, config.verifier)
    except ValueError as e:
      raise ValueError(f'config.methods: {e}; this config declares: {", ".join(known)}') from None
    if method.is_adaptive and not has_adaptive(config):
      raise ValueError(
        f'config.methods: {method.name} needs config.adaptive_gammas or config.adaptive_trees'
      )
    if method.name not in {m.name for m in chosen}:
      chosen.append(method)
  return chosen
