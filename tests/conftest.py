"""Shared fixtures: the real SmolLM2-135M-Instruct, loaded once per test session."""

import gc
import os
import tempfile

import pytest

# Every XLA:CPU executable maps a few hundred memory regions, and the kernel allows a
# process 65,530 by default (vm.max_map_count); the whole suite compiles well over 200
# programs in one process and would abort inside the compiler past that limit.
MAPS_BEFORE_CLEARING = 20_000

# Tiny models' programs compile about 30% faster with most XLA optimisations off, and
# compiling is most of what their tests do; the same maths runs. Subprocesses that tests start
# inherit it; tests marked slow (the real models) turn it back on (their forwards are faster
# optimised). See `_optimise_only_real_models`.
os.environ.setdefault('JAX_DISABLE_MOST_OPTIMIZATIONS', '1')
TINY_MODELS_UNOPTIMISED = os.environ['JAX_DISABLE_MOST_OPTIMIZATIONS'] == '1'

# Many tests compile the same programs (the same tiny shapes in many engines, the real
# model's in every `python -m specjax.run` subprocess), and every engine jits afresh. JAX's
# persistent compilation cache, shared by both workers and the subprocesses they start,
# compiles each program once per machine; a key is the program's HLO, the JAX version and
# the flags, so a hit is the same executable. SPECJAX_TEST_JAX_CACHE='' turns it off.
_CACHE = os.environ.setdefault(
  'SPECJAX_TEST_JAX_CACHE', os.path.join(tempfile.gettempdir(), 'specjax-test-jax-cache')
)
if _CACHE:
  os.environ.setdefault('JAX_COMPILATION_CACHE_DIR', _CACHE)
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0.1')
  os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')


def _map_count() -> int:
  try:
    with open(f'/proc/{os.getpid()}/maps') as f:
      return sum(1 for _ in f)
  except OSError:  # not Linux
    return 0


@pytest.fixture(autouse=True)
def _bounded_compiled_programs():
  """Drops JAX's compiled programs after a test when they hold too many memory maps."""
  yield
  if _map_count() > MAPS_BEFORE_CLEARING:
    import jax

    jax.clear_caches()
    gc.collect()


def _set_optimisation(node) -> None:
  import jax

  slow = node.get_closest_marker('slow') is not None
  jax.config.update('jax_disable_most_optimizations', TINY_MODELS_UNOPTIMISED and not slow)


@pytest.fixture(autouse=True)
def _optimise_only_real_models(request):
  _set_optimisation(request.node)


@pytest.fixture(autouse=True, scope='module')
def _programs_dropped_after_each_file(request):
  """Two workers share the machine's memory: a file's compiled programs go when it ends.
  (Also sets the optimisation level for the file's module-scoped fixtures.)"""
  _set_optimisation(request.node)
  yield
  import jax

  jax.clear_caches()
  gc.collect()


@pytest.fixture(scope='session')
def smollm2():
  """specjax's LoadedModel of SmolLM2-135M-Instruct (fetched into the cache on first use)."""
  from specjax.checkpoints import loader

  return loader.load_model('smollm2-135m-instruct')


@pytest.fixture(scope='session')
def hf_smollm2():
  """transformers' own load of the same GGUF file: the independent implementation."""
  import torch
  import transformers

  from specjax.data import assets

  path = assets.fetch('smollm2-135m-instruct')
  model = transformers.AutoModelForCausalLM.from_pretrained(
    str(path.parent), gguf_file=path.name, dtype=torch.float32
  )
  return model.eval()
