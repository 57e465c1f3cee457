"""The registry: every name a config or a spec can use, in one place.

  FAMILIES     model families ('llama': the Llama lineage, whose config switches also cover
               Mistral, Qwen2/3 and Gemma 3): the model contract, specjax/core/contract.py
  DRAFTS       draft kinds ('ngram', 'layers', 'consensus', ...): specjax/drafters/
  VERIFIERS    'greedy', 'rejection', 'block': specjax/verify/
  DIVERGENCES  distillation losses ('forward_kl', 'tvd', ...): specjax/train/divergences.py
  MODEL_SOURCES  model specs besides assets, .gguf files and Hugging Face directories: the
               test stand-ins 'tiny' and 'dry:<a paper pair's model>' (core.contract.ModelSource)

Entries are 'module:attribute', imported on first use (specjax/core/registry.py), so this
module imports only core and any layer may look a name up. Adding a drafter kind is its
file (a `DraftKind`: usage, parse, build) plus one line in DRAFTS.

Draft specs use the one grammar KIND[:ARG,...,KEY=VALUE,...] (`ngram:3-8`,
`layers:0-11,20-29`, `consensus:8,k=4`, `distilled:DIR`, `multilevel:quantized,ngram,k=3`);
a spec whose kind is not a registered name is a distilled draft directory, or else a model
(an asset name, a .gguf file, a Hugging Face directory) with the target's vocabulary.
"""

from __future__ import annotations

from specjax.core.contract import DraftKind
from specjax.core.registry import Registry, parse_spec

FAMILIES = Registry('model family', {'llama': 'specjax.models.llama:FAMILY'})

DRAFTS = Registry(
  'draft',
  {
    'ngram': 'specjax.drafters.ngram:NGRAM',
    'truncated': 'specjax.drafters.model:TRUNCATED',
    'layers': 'specjax.drafters.model:LAYERS',
    'distilled': 'specjax.drafters.distilled:DISTILLED',
    'eagle': 'specjax.drafters.eagle:EAGLE',
    'dflash': 'specjax.drafters.dflash:DFLASH',
    'dspark': 'specjax.drafters.dspark:DSPARK',
    'consensus': 'specjax.drafters.consensus:CONSENSUS',
    'quantized': 'specjax.drafters.model:QUANTIZED',
    'multilevel': 'specjax.drafters.multilevel:MULTILEVEL',
    'model': 'specjax.drafters.model:MODEL',  # any other spec: a model path
  },
)

VERIFIERS = Registry(
  'verifier',
  {
    'greedy': 'specjax.verify.greedy:VERIFIER',
    'rejection': 'specjax.verify.rejection:VERIFIER',
    'block': 'specjax.verify.block:VERIFIER',
  },
)

DIVERGENCES = Registry(
  'divergence',
  {
    'forward_kl': 'specjax.train.divergences:forward_kl',
    'reverse_kl': 'specjax.train.divergences:reverse_kl',
    'jsd': 'specjax.train.divergences:jsd',
    'tvd': 'specjax.train.divergences:tvd',
  },
)

MODEL_SOURCES = Registry(
  'model source',
  {'tiny': 'specjax.testing:TINY_SOURCE', 'dry': 'specjax.pairs:DRY_SOURCE'},
)


BARE_KINDS = ('distilled', 'model')  # tried in turn for a spec of no registered kind (a path)
# The kind of a drafter built in code that no entry names: no resync, the target's rules.
_PLAIN_KIND = DraftKind(usage='', parse=lambda spec: None, build=lambda *args: (None, None))


def parse_draft(text: str) -> tuple[object, object]:
  """(the DraftKind, its settings) of a draft spec, checked without loading anything.

  A bad spec is a ValueError naming it; one of no known kind lists every kind's usage.
  """
  if not isinstance(text, str) or not text.strip() or '@' in text:
    raise ValueError(f'draft {text!r}: expected a non-empty draft spec without @')
  spec = parse_spec(text)
  if spec.kind in DRAFTS:  # 'ngram:3-8', 'distilled:DIR', 'model:PATH', ...
    kind = DRAFTS.get(spec.kind)
    return kind, kind.parse(spec)
  for name in BARE_KINDS:
    kind = DRAFTS.get(name)
    try:
      return kind, kind.parse(spec)
    except ValueError:
      continue
  usages = '; '.join(DRAFTS.get(name).usage for name in DRAFTS.names)
  raise ValueError(f'unknown draft {text!r}: expected one of {usages}{DRAFTS.suggest(spec.kind)}')


def kind_of(drafter):
  """The DraftKind whose `classes` hold the nearest class in `drafter`'s MRO (a quantized
  or distilled draft model is served by MODEL's hooks), or a plain one (no resync, the
  target's partition rules) for a drafter no kind names."""
  for cls in type(drafter).__mro__:
    for name in DRAFTS.names:
      kind = DRAFTS.get(name)
      if cls in kind.classes:
        return kind
  return _PLAIN_KIND


def resync(drafter, window: int):
  """`drafter` as adaptive control runs it: able to resume after `window` skipped steps."""
  kind = kind_of(drafter)
  return drafter if kind.resync is None else kind.resync(drafter, window)


def build_draft(text: str, target, dtype: str = 'float32'):
  """(drafter, draft params or None) for a draft spec, checked against the loaded target
  (a specjax.checkpoints.loader.LoadedModel)."""
  kind, settings = parse_draft(text)
  return kind.build(settings, target, dtype)
