"""Autoregressive generation: one while_loop, ragged batches, per-row stopping, clear errors."""

import jax.numpy as jnp
import pytest

from specjax import testing
from specjax.core import sampling as sampling_lib
from specjax.decode.engine import Engine
from specjax.models import llama
from specjax.models.kv_cache import KVCache

PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3], [7]]


@pytest.fixture(scope='module')
def engine():
  cfg, params = testing.tiny_model(seed=3)
  return Engine(params, cfg, eos_id=-1, cache_size=128)


def naive_greedy(engine, prompt, n):
  """Greedy decoding by full forwards without a cache: the independent reference."""
  tokens = list(prompt)
  for _ in range(n):
    cache = KVCache.init(engine.cfg, 1, 128)
    logits, _ = llama.forward(engine.params, jnp.asarray([tokens]), cache, engine.cfg)[:2]
    tokens.append(int(jnp.argmax(logits[0, -1])))
  return tokens[len(prompt) :]


def test_greedy_matches_uncached_reference(engine):
  out = engine.generate([PROMPTS[0]], max_new_tokens=12)
  assert out.tokens[0] == naive_greedy(engine, PROMPTS[0], 12)
  assert out.steps == 11  # the first token comes from prefill


def test_batch_of_different_lengths_equals_each_row_alone(engine):
  batch = engine.generate(PROMPTS, max_new_tokens=16)
  for prompt, row in zip(PROMPTS, batch.tokens):
    assert engine.generate([prompt], max_new_tokens=16).tokens[0] == row


def test_per_row_max_new_tokens(engine):
  out = engine.generate(PROMPTS, max_new_tokens=[3, 9, 1])
  assert [len(t) for t in out.tokens] == [3, 9, 1]
  full = engine.generate(PROMPTS, max_new_tokens=9)
  assert all(full.tokens[i][: len(t)] == t for i, t in enumerate(out.tokens))


def test_eos_stops_its_row_only(engine):
  free = engine.generate(PROMPTS, max_new_tokens=12).tokens
  eos = free[0][4]  # make row 0's fifth token the EOS
  stopped = Engine(engine.params, engine.cfg, eos_id=eos, cache_size=128).generate(
    PROMPTS, max_new_tokens=12
  )
  for row, free_row in zip(stopped.tokens, free):
    cut = free_row.index(eos) + 1 if eos in free_row else len(free_row)
    assert row == free_row[:cut]
  assert len(stopped.tokens[0]) == free[0].index(eos) + 1 <= 5


def test_sampling_is_deterministic_per_seed(engine):
  s = sampling_lib.SamplingConfig(temperature=1.0, top_k=20, top_p=0.95)
  a = engine.generate(PROMPTS, max_new_tokens=20, sampling=s, seed=7).tokens
  assert engine.generate(PROMPTS, max_new_tokens=20, sampling=s, seed=7).tokens == a
  assert engine.generate(PROMPTS, max_new_tokens=20, sampling=s, seed=8).tokens != a


def test_new_prompt_length_in_same_bucket_does_not_recompile(engine):
  engine.generate([[1, 2, 3]], max_new_tokens=8)
  prefill, _ = next(reversed(engine._compiled.values()))
  before = prefill._cache_size()
  assert (
    engine.generate([[5, 6, 7, 8, 9, 10]], max_new_tokens=8).compile_seconds == 0
  )  # still bucket 16
  assert prefill._cache_size() == before == 1


def test_executables_of_the_least_recently_used_shapes_are_freed(monkeypatch):
  # A long run visits many (bucket, method) shapes: past MAX_COMPILED per method the oldest
  # shape's functions are dropped, and with them its executables (JAX keeps executables
  # of a jitted function only while the function lives); a shape that comes back compiles
  # again with a warm-up, so its timing never includes compilation.
  import gc
  import weakref

  from specjax.decode import engine as engine_lib

  monkeypatch.setattr(engine_lib, 'MAX_COMPILED', 2)
  cfg, params = testing.tiny_model(seed=3)
  e = Engine(params, cfg, eos_id=-1, cache_size=128)
  first = e.generate([[1, 2, 3]], max_new_tokens=4)
  alive = weakref.ref(next(iter(e._compiled.values()))[1])
  e.generate([[1] * 20], max_new_tokens=4)  # prompt bucket 32
  e.generate([[1] * 40], max_new_tokens=4)  # 64: the first shape is dropped
  gc.collect()
  assert len(e._compiled) == 2 and alive() is None
  again = e.generate([[1, 2, 3]], max_new_tokens=4)
  assert again.compile_seconds > 0 and again.tokens == first.tokens
  # Another method's shapes never evict these: each method keeps its own recent ones.
  e.generate([[1, 2, 3]], max_new_tokens=4, sampling=sampling_lib.SamplingConfig(1.0), seed=1)
  assert len(e._compiled) == 3
  assert e.generate([[1] * 40], max_new_tokens=4).compile_seconds == 0


@pytest.mark.parametrize(
  'prompts,max_new,match',
  [
    ([], 4, 'no prompts'),
    ([[1, 2], []], 4, 'prompt 1 is empty'),
    ([[1] * 120], 16, r'prompt 0 has 120 tokens.*136 cache slots.*cache_size is 128'),
    ([[1, 2, 64]], 4, r'prompt 0 has token ids outside \[0, 64\)'),
    ([[1, 2]], 0, 'max_new_tokens must be >= 1'),
  ],
)
def test_bad_input_is_named(engine, prompts, max_new, match):
  with pytest.raises(ValueError, match=match):
    engine.generate(prompts, max_new_tokens=max_new)


def test_cache_larger_than_context_is_refused():
  cfg, params = testing.tiny_model(max_seq_len=64)
  with pytest.raises(ValueError, match='cache_size 128 exceeds the model context 64'):
    Engine(params, cfg, eos_id=-1, cache_size=128)


def test_non_finite_target_logits_are_an_error():
  # A target whose activations overflow (e.g. float16) or whose weights hold NaN has no
  # distribution to sample: an error naming the rows and the dtype, never tokens.
  from specjax.decode.engine import NonFiniteLogits

  cfg, params = testing.tiny_model(seed=3)
  params = dict(params, final_norm=params['final_norm'].at[0].set(jnp.nan))
  engine = Engine(params, cfg, eos_id=-1, cache_size=128)
  with pytest.raises(NonFiniteLogits, match=r'non-finite logits .* rows \[0, 1\].* float32'):
    engine.generate(PROMPTS[:2], max_new_tokens=4)
