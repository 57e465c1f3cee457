"""The package's structure: layers import only downward, and the registry is the one name table."""

import ast
import dataclasses
import pathlib

import jax.numpy as jnp
import pytest

from specjax import config_lib, registry, testing
from specjax.checkpoints import loader
from specjax.core import contract
from specjax.core.registry import parse_spec
from specjax.drafters.ngram import LookupDrafter
from specjax.harness import run_lib
from specjax.models import llama

PACKAGE = pathlib.Path(registry.__file__).parent

# The layers, bottom first; a module may import from its own layer or any layer below.
# Top-level modules not listed sit on top (run, advise, self_consistency, ...).
LAYERS = [
  {'core', 'kernels', 'formats', 'config_lib'},
  {'registry', 'models', 'testing', 'data', 'pairs'},
  {'checkpoints'},
  {'verify', 'control', 'drafters'},
  {'decode'},
  {'bench', 'train'},
  {'harness'},
]
# The modules loose at the top of the package: the entry points and the few names every
# layer shares. Anything else belongs in a folder.
TOP = {
  'advise', 'calibrate_skip', 'config_lib', 'registry', 'run', 'self_consistency', 'testing',
  'train_draft',
}  # fmt: skip


def _node(module: str) -> str:
  """'specjax.decode.loop' -> 'decode' (a subpackage); 'specjax.harness.run_lib' -> 'run_lib'."""
  return module.split('.')[1]


def import_graph() -> dict[str, set[str]]:
  """{node: nodes it imports}, from every `import specjax...` in the package (lazy ones too)."""
  graph: dict[str, set[str]] = {}
  for path in PACKAGE.rglob('*.py'):
    module = '.'.join(('specjax', *path.relative_to(PACKAGE).with_suffix('').parts))
    module = module.removesuffix('.__init__')
    if module == 'specjax':
      continue
    node = _node(module)
    for stmt in ast.walk(ast.parse(path.read_text())):
      names = []
      if isinstance(stmt, ast.ImportFrom) and stmt.module and stmt.module.startswith('specjax'):
        names = (
          [stmt.module] if stmt.module != 'specjax' else [f'specjax.{a.name}' for a in stmt.names]
        )
      elif isinstance(stmt, ast.Import):
        names = [a.name for a in stmt.names if a.name.startswith('specjax.')]
      for name in names:
        if _node(name) != node:
          graph.setdefault(node, set()).add(_node(name))
  return graph


def test_at_most_eight_modules_sit_loose_at_the_top():
  loose = {p.stem for p in PACKAGE.glob('*.py')} - {'__init__'}
  assert loose == TOP and len(TOP) <= 8, sorted(loose ^ TOP)


def test_no_import_runs_upward():
  rank = {name: i for i, layer in enumerate(LAYERS) for name in layer}
  top = len(LAYERS)
  upward = [
    f'{a} (layer {rank.get(a, top)}) imports {b} (layer {rank.get(b, top)})'
    for a, targets in import_graph().items()
    for b in targets
    if rank.get(b, top) > rank.get(a, top)
  ]
  assert not upward, upward


def test_no_import_cycle_between_folders():
  graph = import_graph()

  def reaches(start, goal, seen=()):
    return any(
      n == goal or (n not in seen and reaches(n, goal, (*seen, n))) for n in graph.get(start, ())
    )

  cycles = sorted(a for a in graph if reaches(a, a))
  assert not cycles, cycles


def _module(path: pathlib.Path) -> str:
  """specjax/decode/loop.py -> 'specjax.decode.loop'; a package's __init__ -> the package."""
  parts = ('specjax', *path.relative_to(PACKAGE).with_suffix('').parts)
  return '.'.join(parts).removesuffix('.__init__')


def _dotted(node) -> str | None:
  """'a.b.c' for a chain of names and attributes, else None."""
  if isinstance(node, ast.Name):
    return node.id
  if isinstance(node, ast.Attribute):
    base = _dotted(node.value)
    return None if base is None else f'{base}.{node.attr}'
  return None


def module_imports() -> tuple[dict[str, set[str]], list[str]]:
  """({module: specjax modules it imports, lazy imports too}, ['a uses b._name', ...]): the
  private names one module takes from another, by `from b import _name`, `b._name` or a
  dotted path to b (`specjax.x.b._name`, `x.b._name` after `from specjax import x`).
  Relative imports are reported as problems of their own (specjax writes none)."""
  modules = {_module(p): p for p in PACKAGE.rglob('*.py')}
  graph, private = {}, []
  for module, path in modules.items():
    tree = ast.parse(path.read_text())
    aliases = {}  # local name -> the specjax module it is bound to
    for stmt in ast.walk(tree):
      if isinstance(stmt, ast.ImportFrom) and stmt.level:
        private.append(f'{module} has a relative import (from {"." * stmt.level}...)')
      elif isinstance(stmt, ast.ImportFrom) and (stmt.module or '').startswith('specjax'):
        for a in stmt.names:
          full = f'{stmt.module}.{a.name}'
          if full in modules:  # from package import module
            graph.setdefault(module, set()).add(full)
            aliases[a.asname or a.name] = full
          else:
            graph.setdefault(module, set()).add(stmt.module)
            if a.name.startswith('_'):
              private.append(f'{module} uses {stmt.module}.{a.name}')
      elif isinstance(stmt, ast.Import):
        for a in stmt.names:
          if a.name.startswith('specjax.'):
            graph.setdefault(module, set()).add(a.name)
            if a.asname:  # import specjax.x.y as z: z is specjax.x.y
              aliases[a.asname] = a.name
            else:  # import specjax.x.y binds specjax
              aliases['specjax'] = 'specjax'
    for node in ast.walk(tree):
      if not isinstance(node, ast.Attribute) or not node.attr.startswith('_'):
        continue
      if node.attr.startswith('__'):
        continue
      chain = _dotted(node.value)
      if chain is None or chain.split('.')[0] not in aliases:
        continue
      head, *rest = chain.split('.')
      target = '.'.join([aliases[head], *rest])
      if target in modules and target != module:
        private.append(f'{module} uses {target}.{node.attr}')
  graph = {m: {t for t in ts if t != m and t in modules} for m, ts in graph.items()}
  return graph, sorted(set(private))


def test_no_import_cycle_between_modules():
  """Between any two modules, inside a folder too, lazy imports included: an import inside
  a function hides a circle from Python, not from this test."""
  graph, _ = module_imports()

  def reaches(start, goal):
    seen, todo = set(), list(graph.get(start, ()))
    while todo:
      n = todo.pop()
      if n == goal:
        return True
      if n not in seen:
        seen.add(n)
        todo.extend(graph.get(n, ()))
    return False

  cycles = sorted(m for m in graph if reaches(m, m))
  assert not cycles, cycles


def test_no_private_name_crosses_a_module():
  """Inside specjax (tests and experiments may reach into a module to test or probe it)."""
  _, private = module_imports()
  assert not private, private


def test_functions_fit_on_a_screen():
  """No function in specjax is longer than 80 lines (docstring included): a longer one
  is several steps that want names of their own."""
  long = [
    f'{p.relative_to(PACKAGE)}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)'
    for p in PACKAGE.rglob('*.py')
    for n in ast.walk(ast.parse(p.read_text()))
    if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.end_lineno - n.lineno >= 80
  ]
  assert not long, long


def test_every_registry_entry_resolves():
  for table in (registry.FAMILIES, registry.DRAFTS, registry.VERIFIERS, registry.DIVERGENCES):
    for name in table.names:
      assert table.get(name) is not None, (table.what, name)
  for name in registry.MODEL_SOURCES.names:
    assert isinstance(registry.MODEL_SOURCES.get(name), contract.ModelSource), name
  assert registry.FAMILIES.get('llama') is testing.tiny_model()[0].family


def test_unknown_names_list_the_known_ones():
  with pytest.raises(
    ValueError,
    match=r"unknown verifier 'rejetion'; known: block, greedy, rejection; did you mean 'rejection'",
  ):
    registry.VERIFIERS.get('rejetion')
  with pytest.raises(ValueError, match=r"unknown draft 'ngrm'.*did you mean 'ngram'"):
    registry.parse_draft('ngrm')


def test_one_spec_grammar():
  spec = parse_spec('consensus:8,k=4,m=1')
  assert (spec.kind, spec.args, spec.options) == ('consensus', ('8',), (('k', '4'), ('m', '1')))
  assert parse_spec('layers:0-11,20-29').args == ('0-11', '20-29')
  assert parse_spec('ngram').args == ()
  # Checked without loading anything (the draft's own settings included):
  assert registry.parse_draft('ngram:3-8')[1] == (3, 8)
  with pytest.raises(ValueError, match='k >= 1 and 0 <= max_mismatches < k'):
    registry.parse_draft('consensus:8,k=2,m=2')


def test_drafter_hooks_have_defaults():
  cfg, params = testing.tiny_model()
  drafter, _ = registry.build_draft('truncated:1', loader.LoadedModel(cfg, params, None, 'tiny'))
  assert drafter.skip_when_empty is False
  assert bool(drafter.has_proposals(None))
  assert registry.DRAFTS.get('truncated').group(None) == 1
  lookup, _ = registry.build_draft('ngram', loader.LoadedModel(cfg, params, None, 'tiny'))
  assert lookup.skip_when_empty is True


# A new drafter kind: one class and one DraftKind (what its file would hold) and one
# registry line; nothing else in specjax changes.
@dataclasses.dataclass(frozen=True)
class RepeatDrafter(LookupDrafter):
  """Proposes the last emitted token gamma times (a toy lookup drafter)."""

  name = 'repeat the last token'

  def propose(self, params, draft_state, state, key, gamma, sampling):
    tokens = jnp.repeat(state.last_tokens[:, None], gamma, axis=1)
    return self.deterministic(tokens, jnp.ones_like(state.done), draft_state)


REPEAT = contract.DraftKind(
  usage='repeat',
  parse=lambda spec: None,
  build=lambda settings, target, dtype: (RepeatDrafter(target.cfg.vocab_size), None),
)


def run_new_kinds(tmp_path, monkeypatch, kinds: dict) -> dict:
  """The tiny default config's run summary with `kinds` registered and drafted at gamma 4."""
  for name, kind in kinds.items():
    monkeypatch.setitem(registry.DRAFTS.table, name, kind)
  config = config_lib.load_config('smollm2.py', 'tiny')
  config.drafts = tuple(kinds)
  config.adaptive_gammas = ()
  config.measure_costs = False
  return run_lib.main(config, str(tmp_path), verbose=False)


def test_a_new_drafter_is_one_file_and_one_registry_line(tmp_path, monkeypatch):
  summary = run_new_kinds(tmp_path, monkeypatch, {'repeat': REPEAT})
  assert summary['drafts'] == {'repeat': 'repeat the last token'}
  assert summary['methods']['repeat@4']['greedy_mismatches'] == 0
  assert summary['methods']['repeat@4']['drafted_tokens'] > 0


# A new feature drafter: it reads the target through `capture` and `TargetOut` alone; the
# loop, prefill and engine are not touched.
@dataclasses.dataclass(frozen=True)
class LastFeatureDrafter(contract.Drafter):
  """Proposes, gamma times, what the target's own head makes of the stream after its last
  layer at the last position the target ran (a toy feature drafter, for the tiny tied-head
  Llama: its build hands it the target's embedding and final norm)."""

  cfg: object
  name = 'the target head on its last feature'

  @property
  def capture(self):
    return (self.cfg.n_layers,)  # the stream leaving the last layer

  @property
  def vocab_size(self):
    return self.cfg.vocab_size

  def init(self, params, prompt_tokens, prompt_lens, cache_size, constrain, target):
    return jnp.take_along_axis(target.features, (prompt_lens - 1)[:, None, None], axis=1)[:, 0]

  def propose(self, params, draft_state, state, key, gamma, sampling):
    x = llama.rms_norm(draft_state, params['final_norm'], self.cfg.norm_eps)
    token = jnp.argmax(self.cfg.family.logits(params, x, self.cfg), axis=-1)
    return jnp.repeat(token[:, None], gamma, axis=1).astype(jnp.int32), None, draft_state

  def update(self, draft_state, state, target):
    if target.features is None:
      return draft_state
    last = state.prompt_lens + state.num_generated - 2 - target.start  # the last run, kept
    last = jnp.clip(last, 0, target.features.shape[1] - 1)[:, None, None]
    return jnp.take_along_axis(target.features, last, axis=1)[:, 0]


LAST_FEATURE = contract.DraftKind(
  usage='lastfeature',
  parse=lambda spec: None,
  build=lambda settings, target, dtype: (
    LastFeatureDrafter(target.cfg),
    {'embed': target.params['embed'], 'final_norm': target.params['final_norm']},
  ),
)


def test_a_new_feature_drafter_is_one_file_and_one_registry_line(tmp_path, monkeypatch):
  summary = run_new_kinds(tmp_path, monkeypatch, {'lastfeature': LAST_FEATURE})
  record = summary['methods']['lastfeature@4']
  assert record['greedy_mismatches'] == 0 and record['drafted_tokens'] > 0
  # Some proposals are accepted. (That the loop hands a drafter the right positions'
  # features is proved by test_eagle's and test_dflash's fresh-head equalities: on the
  # tiny model's repetitive text this toy cannot tell one position from another.)
  assert record['acceptance_rate'] > 0


def test_plots_leave_a_notebooks_matplotlib_backend_alone(tmp_path):
  """Library plots draw on matplotlib Figures, never through pyplot (which would pick or
  switch the backend, and a notebook would stop showing figures inline)."""
  import matplotlib

  from specjax.train.trainer import MetricsLog

  matplotlib.use('svg')
  log = MetricsLog(tmp_path / 'metrics.jsonl', resume_step=0)
  log.write({'kind': 'train', 'step': 1, 'loss': 0.5})
  log.write({'kind': 'eval', 'step': 1, 'greedy': 0.4})
  log.plot(tmp_path)
  assert (tmp_path / 'loss.png').stat().st_size > 0 and (tmp_path / 'acceptance.png').exists()
  assert matplotlib.get_backend().lower() == 'svg'
  offenders = [
    str(p.relative_to(PACKAGE))
    for p in PACKAGE.rglob('*.py')
    if 'matplotlib.use(' in p.read_text() or 'matplotlib.pyplot' in p.read_text()
  ]
  assert offenders == []
