"""Fault injection: configs drawn over every field's edge values either run or fail with
one clear error before any model loads; never a traceback, never a late crash.

The first property draws 500 configs (derandomized: CI sees the same ones every run) and
stops each at the model load: a config either reaches it (it passed every check) or was
refused with one line (ValueError / FileNotFoundError: `run_cli` prints them as
'error: ...'). The second runs a few configs drawn from the values the tiny model can
run end to end and asserts they finish or are refused the same way.
"""

import math
import shutil
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specjax import config_lib
from specjax.checkpoints import loader
from specjax.harness import run_lib

INTS = [-1, 0, 1, 2, 3, 10**9]
GAMMAS = st.lists(st.sampled_from([-1, 0, 1, 2, 4, 15, 16, 100]), max_size=3).map(tuple)
DRAFTS = [
  'ngram',
  'ngram:3-8',
  'ngram:0',
  'truncated:1',
  'truncated:100',
  'layers:0-1',
  'eagle',
  'eagle:/nonexistent',
  'consensus:2',
  'consensus:2,k=1,m=1',
  'quantized',
  'distilled:/nonexistent',
  'nosuch',
  '',
  'ngram@2',
]
TREES = ['2x1', '4x2x1x1', 'chain:3', 'chain:100000', 'dynamic:4-2-2', 'dynamic:9999-3-2', 'bad']

# Every field of the run config, with the values a user can pass for it (the CLI types
# each --config.FIELD as its default; tuples take any literal).
FIELDS = {
  'model': st.sampled_from(['tiny', 'nosuch', '', 'missing.gguf', 'dry:nosuch']),
  'dtype': st.sampled_from(['float32', 'bfloat16', 'float16', 'int8', '']),
  'prompt': st.sampled_from(['', ' \n', 'Hi!', 'x' * 3000, '\x00']),
  'prompts': st.sampled_from(
    ['mtbench', 'mtbench:writing', 'mtbench:nosuch', 'humaneval', 'code_edit', 'specbench:nosuch']
    + ['nosuch.jsonl', '']
  ),
  'num_prompts': st.sampled_from(INTS),
  'batch_size': st.sampled_from(INTS),
  'max_new_tokens': st.sampled_from(INTS),
  'cache_size': st.sampled_from([-1, 0, 1, 2, 3, 8, 64, 1024, 10**9]),
  'temperature': st.sampled_from([-1.0, 0.0, 1e-40, 1e-4, 0.8, 1.0, 1e30, math.nan, math.inf]),
  'top_k': st.sampled_from(INTS),
  'top_p': st.sampled_from([-0.5, 0.0, 1e-50, 0.5, 1.0, 1.5, math.nan]),
  'seed': st.sampled_from([-1, 0, 2**40]),
  'mesh.data': st.sampled_from([-1, 0, 1, 2, 3]),
  'mesh.model': st.sampled_from([-1, 0, 1, 2, 3]),
  'mesh.rules': st.sampled_from([(), ('lm_head$=None,model',), ('bad',), ('x=nosuch',)]),
  'mesh.cache': st.sampled_from(['data,model,None,None', '', 'bad', 'a,b,c,d,e']),
  'drafts': st.lists(st.sampled_from(DRAFTS), max_size=3).map(tuple),
  'verifier': st.sampled_from(['rejection', 'block', 'greedy', 'nosuch']),
  'gammas': GAMMAS,
  'adaptive_gammas': GAMMAS,
  'adaptive_trees': st.lists(st.sampled_from(TREES), max_size=2).map(tuple),
  'trees': st.lists(st.sampled_from(TREES), max_size=2).map(tuple),
  'methods': st.sampled_from(
    ['', 'ngram@4', 'ngram@adaptive', 'nosuch@2', 'ngram@0', ',,', 'autoregressive', 'ngram@2x1']
  ),
  'measure_costs': st.booleans(),
  'quick': st.booleans(),
  'quick_method': st.sampled_from(['ngram@adaptive', 'ngram@2', 'autoregressive', 'ngram@x']),
  'strict': st.booleans(),
  'resume': st.booleans(),
}


def test_every_field_is_drawn():
  from specjax.harness import run_config

  config = config_lib.load_config('smollm2.py', 'tiny')
  top = {name.partition('.')[0] for name in FIELDS}
  assert top == set(run_config.FIELDS) == set(config.keys())
  assert {name.partition('.')[2] for name in FIELDS if name.startswith('mesh.')} <= set(
    config.mesh.keys()
  )


class Loaded(Exception):
  """Raised in place of loading a model: the config passed every check before it."""


def draw_config(draw, fields):
  config = config_lib.load_config('smollm2.py', 'tiny')
  for name, strategy in fields.items():
    if draw(st.integers(0, 7)):  # most fields keep the tiny config's value: 3-4 change
      continue
    head, _, sub = name.partition('.')
    if sub:
      config[head][sub] = draw(strategy)
    else:
      config[head] = draw(strategy)
  return config


def run(config) -> BaseException | None:
  """run_lib.main on config in a fresh work directory: the exception it raised, or None."""
  workdir = tempfile.mkdtemp()
  try:
    run_lib.main(config, workdir + '/run', verbose=False)
  except Exception as e:  # the property is about which exceptions come out
    return e
  finally:
    shutil.rmtree(workdir, ignore_errors=True)
  return None


def assert_one_line_error(error: BaseException, config) -> None:
  if isinstance(error, Loaded):
    return
  assert isinstance(error, (ValueError, FileNotFoundError)), (
    f'{type(error).__name__}: {error} (a traceback) for the config\n{config}'
  )
  assert str(error).strip() and '\n' not in str(error).strip(), (error, config)


@settings(
  max_examples=500,
  deadline=None,
  derandomize=True,
  suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(st.data())
def test_drawn_configs_fail_with_one_line_before_any_model_loads(monkeypatch, data):
  def load_model(*args, **kwargs):
    raise Loaded

  monkeypatch.setattr(loader, 'load_model', load_model)
  config = data.draw(st.composite(draw_config)(FIELDS))
  assert_one_line_error(run(config), config)


# Values the tiny model runs in seconds, with a few bad ones among them.
RUNNABLE = {
  'num_prompts': st.sampled_from([1, 2, 3]),
  'batch_size': st.sampled_from([1, 2, 64]),
  'max_new_tokens': st.sampled_from([1, 2, 5]),
  'cache_size': st.sampled_from([8, 64, 256]),
  'temperature': st.sampled_from([0.0, 1e-4, 1.0]),
  'top_k': st.sampled_from([0, 1, 10**9]),
  'top_p': st.sampled_from([1e-50, 0.9, 1.0]),
  'drafts': st.lists(st.sampled_from(['ngram', 'truncated:1', 'consensus:2']), max_size=2).map(
    tuple
  ),
  'verifier': st.sampled_from(['rejection', 'block', 'greedy']),
  'gammas': st.lists(st.sampled_from([1, 2, 7]), max_size=2).map(tuple),
  'adaptive_gammas': st.lists(st.sampled_from([1, 3]), max_size=2).map(tuple),
  'trees': st.lists(st.sampled_from(['2x1', 'dynamic:4-2-2']), max_size=1).map(tuple),
  'measure_costs': st.booleans(),
  'prompt': st.sampled_from(['', 'Hi!']),
}


@settings(
  max_examples=5,
  deadline=None,
  derandomize=True,
  suppress_health_check=[HealthCheck.too_slow],
)
@given(st.data())
def test_drawn_runnable_configs_run_or_fail_before_work(data):
  config = data.draw(st.composite(draw_config)(RUNNABLE))
  error = run(config)
  if error is not None:
    assert_one_line_error(error, config)
