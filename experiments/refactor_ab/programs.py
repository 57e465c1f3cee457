r"""Does a refactor change the compiled decoding loop? Dump, then compare, two checkouts.

  PYTHONPATH=<old checkout> python experiments/refactor_ab/programs.py dump /tmp/old
  PYTHONPATH=<new checkout> python experiments/refactor_ab/programs.py dump /tmp/new
  python experiments/refactor_ab/programs.py compare /tmp/old /tmp/new

`dump` compiles `loop.decode` on random tiny models for every kind of drafter in DRAFTS
(a draft model, prompt lookup, an EAGLE-3 head, the quantized target, DFlash and DSpark
block drafters, multilevel) with the methods listed there (plain, chains, adaptive
control over chains and trees, confidence scheduling, static and dynamic trees), greedy
and at temperature 1, and writes XLA's optimized HLO text (`dump DIR ngram,eagle` only
those). Both checkouts must have `decode.method` (issue 28 item 1, b50acca or later).
`compare` counts the instructions of each program by (opcode, result shape): equal counts,
copies included, mean the two checkouts compile to the same work (names and order aside).
Run it from outside the checkouts (`python -m` or a script inside one puts that one first
on sys.path).
"""

from __future__ import annotations

import collections
import pathlib
import re
import sys


def _resync(drafter, window):
  """The drafter adaptive control runs (one that catches up after `window` plain steps)."""
  from specjax import registry

  kind_of = getattr(registry, 'kind_of', None)  # issue 28 item 3: a host hook of the kind
  if kind_of is None:
    return drafter.resyncing(window)
  resync = kind_of(drafter).resync
  return drafter if resync is None else resync(drafter, window)


def _eagle(target):
  """An EAGLE-3 head of random weights for the tiny target, built as tests/test_eagle.py does."""
  import jax
  import numpy as np

  from specjax.drafters.eagle import EagleDrafter
  from specjax.models import eagle as eagle_model

  ids = np.arange(0, target.cfg.vocab_size, 2)
  hc = eagle_model.EagleConfig.for_target(target.cfg, len(ids))
  hp = eagle_model.init_params(hc, jax.random.key(0), ids, target.params)
  return EagleDrafter(hc, name='eagle (random)'), {'head': hp, 'embed': target.params['embed']}


# draft -> the methods compiled for it ('plain', a chain length, 'adaptive', 'scheduled', a tree)
DRAFTS = {
  'truncated:1': ('plain', 2, 'adaptive', '2x2x1', 'adaptive+tree'),
  'ngram': ('plain', 2, 'adaptive', 'dynamic:6-3-2'),
  'eagle': (2, 'adaptive', '2x2x1'),
  'quantized': (2, 'adaptive'),
  'dflash:random,block=3': (2, '2x1'),
  'dspark:random,block=3': ('scheduled',),
  'multilevel:truncated:1+ngram,k=2': (2, 'adaptive'),
}


def dump(out: pathlib.Path, only: str = '') -> None:
  import jax
  import jax.numpy as jnp

  from specjax import registry, testing
  from specjax.checkpoints import loader
  from specjax.control import adaptive as adaptive_lib
  from specjax.core import tree as tree_lib
  from specjax.core.sampling import SamplingConfig
  from specjax.decode import loop
  from specjax.decode import prefill as prefill_lib
  from specjax.decode.method import Adaptive, Method

  out.mkdir(parents=True, exist_ok=True)
  tiny = loader.load_model('tiny')
  statics = ('cfg', 'method', 'sampling', 'eos_id', 'drafter')
  prefill = jax.jit(prefill_lib.prefill, static_argnames=(*statics, 'cache_size', 'out_len'))
  decode = jax.jit(loop.decode, static_argnames=statics)
  # q8_0 rounds blocks of 32 along every product's inputs: a tiny model of ffn 64 for it.
  target_q = loader.LoadedModel(*testing.tiny_model(ffn_dim=64), None, 'tiny')
  for spec, settings in DRAFTS.items():
    if only and not any(o in spec for o in only.split(',')):
      continue
    target = target_q if spec == 'quantized' else tiny
    if spec == 'eagle':
      drafter, draft_params = _eagle(target)
    else:
      drafter, draft_params = registry.build_draft(spec, target)
    for setting in settings:
      if setting == 'plain':
        method = Method()
      elif setting == 'adaptive':
        method = Method.adaptive(adaptive_lib.AdaptiveConfig(gammas=(1, 2)))
      elif setting == 'adaptive+tree':
        trees = (tree_lib.parse_tree('2x1').shape,)
        method = Method.adaptive(adaptive_lib.AdaptiveConfig(gammas=(1, 2), trees=trees))
      elif setting == 'scheduled':
        method = Method.parse(f'{spec}@scheduled')
        config = adaptive_lib.AdaptiveConfig(gammas=(1, 2), schedule='confidence')
        method = method.with_plan(Adaptive(config))
      elif isinstance(setting, int):
        method = Method.chain(setting)
      else:
        method = Method.tree(tree_lib.parse_tree(setting))
      runs = drafter if method.speculative else None
      if method.is_adaptive:
        runs = _resync(drafter, method.adaptive_config.max_wait)
      config = method.adaptive_config
      control = None if config is None else adaptive_lib.init(config)
      for sname, sampling in (('greedy', SamplingConfig()), ('t1', SamplingConfig(1.0))):
        params = {'target': target.params, 'draft': draft_params if runs else None}
        kw = dict(cfg=target.cfg, method=method, sampling=sampling, eos_id=2, drafter=runs)
        state = prefill(
          params,
          jnp.ones((2, 8), jnp.int32),
          jnp.full((2,), 8, jnp.int32),
          jnp.full((2,), 16, jnp.int32),
          jax.random.key(0),
          control,
          cache_size=64,
          out_len=16,
          **kw,
        )
        text = decode.lower(params, state, **kw).compile().as_text()
        name = re.sub(r'[^\w]+', '_', f'{spec}-{sname}-{setting}')
        (out / f'{name}.hlo').write_text(text)
        print(name, flush=True)
  print(f'wrote {len(list(out.iterdir()))} programs to {out}')


def instructions(path: pathlib.Path) -> collections.Counter:
  """(opcode, result shape) -> count, over every computation of an HLO text."""
  count = collections.Counter()
  for line in path.read_text().splitlines():
    m = re.match(r'\s*(?:ROOT )?[%\w.\-]+ = ([^ ]+) ([\w\-]+)\(', line)
    if m:
      count[m.group(2), m.group(1)] += 1
  return count


def compare(old: pathlib.Path, new: pathlib.Path) -> bool:
  same = True
  for f in sorted(old.iterdir()):
    a, b = instructions(f), instructions(new / f.name)
    diff = {k: (a[k], b[k]) for k in a.keys() | b.keys() if a[k] != b[k]}
    copies = [sum(v for (op, _), v in c.items() if op == 'copy') for c in (a, b)]
    print(
      f'{f.name}: {sum(a.values())} / {sum(b.values())} instructions, copies {copies[0]} / '
      f'{copies[1]}, (opcode, shape) counts differing: {len(diff)}'
    )
    same &= not diff
  print('the same instructions in every program' if same else 'the programs differ')
  return same


if __name__ == '__main__':
  if len(sys.argv) in (3, 4) and sys.argv[1] == 'dump':
    dump(pathlib.Path(sys.argv[2]), *sys.argv[3:])
  elif len(sys.argv) == 4 and sys.argv[1] == 'compare':
    sys.exit(0 if compare(pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])) else 1)
  else:
    sys.exit(__doc__)
