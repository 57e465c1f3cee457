"""Shared fixtures: the real SmolLM2-135M-Instruct, loaded once per test session."""

import gc
import os

import pytest

# Every XLA:CPU executable maps a few hundred memory regions, and the kernel allows a
# process 65,530 by default (vm.max_map_count); the whole suite compiles well over 200
# programs in one process and would abort inside the compiler past that limit.
MAPS_BEFORE_CLEARING = 20_000


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


@pytest.fixture(autouse=True, scope='module')
def _programs_dropped_after_each_file():
  """Two workers share the machine's memory: a file's compiled programs go when it ends."""
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

  from specjax import assets

  path = assets.fetch('smollm2-135m-instruct')
  model = transformers.AutoModelForCausalLM.from_pretrained(
    str(path.parent), gguf_file=path.name, dtype=torch.float32
  )
  return model.eval()
