"""specjax on the real SmolLM2-135M-Instruct agrees with transformers (torch) on the same GGUF."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from specjax.decode.engine import Engine
from specjax.models import llama
from specjax.models.kv_cache import KVCache

TEXTS = [
  'The quick brown fox jumps over the lazy dog because',
  'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
  'Les élèves ont étudié 3 langues: 日本語, русский и español. 🎉',
  'In 1969, 12345 + 67890 =',
]
CHATS = [
  'What is the capital of France?',
  'Write a Python function that reverses a string.',
  'Give me three tips for staying focused while studying.',
  'Explain in two sentences why the sky is blue.',
]

pytestmark = pytest.mark.slow


@pytest.fixture(scope='module')
def engine(smollm2):
  return Engine(smollm2.params, smollm2.cfg, eos_id=smollm2.tokenizer.eos_id, cache_size=512)


@pytest.mark.parametrize('text', TEXTS)
def test_last_token_logits_match_transformers(smollm2, engine, hf_smollm2, text):
  ids = smollm2.tokenizer.encode(text)
  ours, _ = llama.forward(
    engine.params, jnp.asarray([ids]), KVCache.init(smollm2.cfg, 1, 64), smollm2.cfg
  )[:2]
  with torch.inference_mode():
    theirs = hf_smollm2(torch.tensor([ids])).logits[0, -1].numpy()
  np.testing.assert_allclose(np.asarray(ours[0, -1]), theirs, atol=1e-3, rtol=0)


def test_greedy_continuations_match_transformers(smollm2, engine, hf_smollm2):
  tok = smollm2.tokenizer
  for chat in CHATS:
    ids = tok.encode_chat(chat)
    ours = engine.generate([ids], max_new_tokens=32).tokens[0]
    with torch.inference_mode():
      out = hf_smollm2.generate(
        torch.tensor([ids]),
        max_new_tokens=32,
        do_sample=False,
        eos_token_id=tok.eos_id,
        pad_token_id=0,
      )
    theirs = out[0, len(ids) :].tolist()
    assert ours == theirs, (chat, tok.decode(ours), tok.decode(theirs))


def test_real_batch_of_different_lengths_equals_rows_alone(smollm2, engine):
  prompts = [smollm2.tokenizer.encode_chat(c) for c in CHATS]
  batch = engine.generate(prompts, max_new_tokens=24).tokens
  assert len({len(p) for p in prompts}) > 1
  for prompt, row in zip(prompts, batch):
    assert engine.generate([prompt], max_new_tokens=24).tokens[0] == row


def test_capital_of_france(smollm2, engine):
  tok = smollm2.tokenizer
  out = engine.generate([tok.encode_chat('What is the capital of France?')], max_new_tokens=32)
  assert 'Paris' in tok.decode(out.tokens[0])
  assert out.tokens[0][-1] == tok.eos_id  # it answered and stopped
