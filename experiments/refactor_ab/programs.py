r"""Does a refactor change the compiled decoding loop? Dump, then compare, two checkouts.

  PYTHONPATH=<old checkout> python experiments/refactor_ab/programs.py dump /tmp/old
  PYTHONPATH=<new checkout> python experiments/refactor_ab/programs.py dump /tmp/new
  python experiments/refactor_ab/programs.py compare /tmp/old /tmp/new

`dump` compiles `loop.decode` on the random tiny model for a draft model (truncated:1) and
prompt lookup (ngram), each as a plain loop, a chain of 2 and adaptive control over 1, 2
and 4, greedy and at temperature 1 (12 programs), and writes XLA's optimized HLO text.
`compare` counts the instructions of each program by (opcode, result shape): equal counts,
copies included, mean the two checkouts compile to the same work (names and order aside).
Run it from outside the checkouts (`python -m` or a script inside one puts that one first
on sys.path).
"""

from __future__ import annotations

import collections
import importlib.util
import pathlib
import re
import sys


def dump(out: pathlib.Path) -> None:
  import jax
  import jax.numpy as jnp

  from specjax import registry
  from specjax.checkpoints import loader
  from specjax.control import adaptive as adaptive_lib
  from specjax.core.sampling import SamplingConfig
  from specjax.decode import loop
  from specjax.decode import prefill as prefill_lib

  out.mkdir(parents=True, exist_ok=True)
  target = loader.load_model('tiny')
  new_api = importlib.util.find_spec('specjax.decode.method') is not None  # issue 28 item 1
  statics = ('cfg', 'method', 'sampling', 'eos_id') + (('drafter',) if new_api else ())
  prefill = jax.jit(prefill_lib.prefill, static_argnames=(*statics, 'cache_size', 'out_len'))
  decode = jax.jit(loop.decode, static_argnames=statics)
  for spec in ('truncated:1', 'ngram'):
    drafter, draft_params = registry.build_draft(spec, target)
    adaptive = adaptive_lib.AdaptiveConfig(gammas=(1, 2, 4))
    if new_api:
      from specjax.decode.method import Method

      methods = {
        'plain': Method(),
        'chain2': Method.chain(2),
        'adaptive': Method.adaptive(adaptive),
      }
      resync = {'adaptive': drafter.resyncing(adaptive.max_wait)}
    else:  # the loop's own Method, its drafter inside (adaptive: resyncing, as the engine's)
      resyncing = drafter.resyncing(adaptive.max_wait)
      methods = {
        'plain': loop.Method(gamma=0),
        'chain2': loop.Method(gamma=2, drafter=drafter),
        'adaptive': loop.Method(gamma=4, drafter=resyncing, adaptive=adaptive),
      }
    for sname, sampling in (('greedy', SamplingConfig()), ('t1', SamplingConfig(1.0))):
      for mname, method in methods.items():
        speculative = mname != 'plain'
        params = {'target': target.params, 'draft': draft_params if speculative else None}
        config = adaptive if mname == 'adaptive' else None
        control = None if config is None else adaptive_lib.init(config)
        kw = dict(cfg=target.cfg, method=method, sampling=sampling, eos_id=2)
        if new_api:
          kw['drafter'] = resync.get(mname, drafter) if speculative else None
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
        (out / f'{spec.replace(":", "_")}-{sname}-{mname}.hlo').write_text(text)
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
  if len(sys.argv) == 3 and sys.argv[1] == 'dump':
    dump(pathlib.Path(sys.argv[2]))
  elif len(sys.argv) == 4 and sys.argv[1] == 'compare':
    sys.exit(0 if compare(pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])) else 1)
  else:
    sys.exit(__doc__)
