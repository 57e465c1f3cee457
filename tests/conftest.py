"""Shared fixtures: the real SmolLM2-135M-Instruct, loaded once per test session."""

import pytest


@pytest.fixture(scope='session')
def smollm2():
  """specjax's LoadedModel of SmolLM2-135M-Instruct (fetched into the cache on first use)."""
  from specjax.models import loader
  return loader.load_model('smollm2-135m-instruct')


@pytest.fixture(scope='session')
def hf_smollm2():
  """transformers' own load of the same GGUF file: the independent implementation."""
  import torch
  import transformers

  from specjax import assets
  path = assets.fetch('smollm2-135m-instruct')
  model = transformers.AutoModelForCausalLM.from_pretrained(
      str(path.parent), gguf_file=path.name, dtype=torch.float32)
  return model.eval()
