"""The Python API (specjax.load / LM.generate): the same engine and pipeline as specjax.run,
text in and text out, and README's first Python block as written."""

import json
import pathlib
import re

import numpy as np
import pytest

import specjax
from specjax.decode.engine import Engine
from specjax.harness import api

README = pathlib.Path(__file__).resolve().parents[1] / 'README.md'


@pytest.fixture(scope='module')
def lm():
  return specjax.load('tiny')


def target_greedy(lm, text: str, n: int) -> list[int]:
  """The target's own greedy tokens, through an Engine built here (not the API's)."""
  m = lm.model
  engine = Engine(m.params, m.cfg, eos_id=m.tokenizer.eos_id, cache_size=1024)
  return list(engine.generate([m.tokenizer.encode_chat(text)], max_new_tokens=n).tokens[0])


def test_speculative_text_is_the_targets_greedy_text(lm, tmp_path):
  out = lm.generate(
    'hello there', draft='truncated:1@4', compare=True, max_new_tokens=24, workdir=tmp_path / 'a'
  )
  assert out.method == 'truncated:1@4'
  assert out.tokens[0] == target_greedy(lm, 'hello there', 24)
  assert out.text == lm.model.tokenizer.decode(out.tokens[0])
  assert out.stats['greedy_mismatches'] == 0 and out.baseline is not None
  assert out.stats['speedup'] > 0 and out.stats['drafted_tokens'] > 0
  saved = json.loads((tmp_path / 'a' / 'results.json').read_text())
  assert set(saved['methods']) == {'autoregressive', 'truncated:1@4'}
  assert 'truncated:1@4' in str(out) and 'x autoregressive' in str(out)


def test_a_bare_draft_runs_its_adaptive_method_and_a_batch_keeps_its_order(lm, tmp_path):
  texts = ['abc', 'a longer prompt, with more in it', 'x']
  out = lm.generate(texts, draft='ngram', max_new_tokens=16, batch_size=3, workdir=tmp_path / 'b')
  assert out.method == 'ngram@adaptive'
  assert out.tokens == [target_greedy(lm, t, 16) for t in texts]
  # Uncompared: only the method ran, and nothing claims a speedup.
  saved = json.loads((tmp_path / 'b' / 'results.json').read_text())
  assert list(saved['methods']) == ['ngram@adaptive']
  assert out.baseline is None and out.stats['speedup'] is None
  assert out.stats['greedy_mismatches'] is None


@pytest.mark.parametrize('draft', ['truncated:1@4', 'truncated:1'])
def test_a_second_call_compiles_nothing(lm, tmp_path, draft):
  """The engines and, for an adaptive method, the measured costs its controller is built
  from are kept: the same draft and shapes compile nothing the second time."""
  lm = specjax.load('tiny')
  first = lm.generate('one', draft=draft, max_new_tokens=8, workdir=tmp_path / 'c')
  again = lm.generate('two', draft=draft, max_new_tokens=8, workdir=tmp_path / 'd')
  assert first.stats['compile_seconds'] > 0
  assert again.stats['compile_seconds'] == 0


def test_sampling_is_seeded(lm, tmp_path):
  kw = dict(draft='truncated:1@4', max_new_tokens=16, temperature=1.0)
  a = lm.generate('sample me', seed=7, workdir=tmp_path / 'e', **kw)
  b = lm.generate('sample me', seed=7, workdir=tmp_path / 'f', **kw)
  c = lm.generate('sample me', seed=8, workdir=tmp_path / 'g', **kw)
  assert a.tokens == b.tokens and a.tokens != c.tokens


@pytest.mark.parametrize(
  'kwargs, message',
  [
    (dict(draft='nope'), "unknown draft 'nope'"),
    (dict(draft='ngram@x'), "unknown method 'ngram@x'"),
    (dict(prompts=[]), 'prompts must be a non-empty string'),
    (dict(prompts=['ok', '  ']), 'prompts must be a non-empty string'),
    (dict(temperature=-1.0), 'temperature'),
    (dict(max_new_tokens=12.5), 'max_new_tokens'),
  ],
)
def test_bad_input_is_one_clear_error_before_decoding(lm, tmp_path, kwargs, message):
  kwargs = {'prompts': 'hi', 'workdir': tmp_path / 'w'} | kwargs
  with pytest.raises(ValueError, match=re.escape(message)):
    lm.generate(**kwargs)
  assert not (tmp_path / 'w').exists()  # nothing ran, nothing was written


def test_load_names_bad_fields_before_loading():
  with pytest.raises(ValueError, match='config.gamas: unknown field; did you mean gammas'):
    specjax.load('no-such-model.gguf', gamas=(1,))
  with pytest.raises(ValueError, match='load: seed, temperature are set per call'):
    specjax.load('no-such-model.gguf', temperature=1.0, seed=3)


def test_readme_first_python_block_runs_as_written(tmp_path, monkeypatch, capsys):
  """README's first Python block, on the tiny model and a draft it has (the block loads
  the real model and its q4 blocks, which the tiny model lacks)."""
  block = re.search(r'```python\n(.*?)```', README.read_text(), re.S).group(1)
  assert 'specjax.load()' in block and "draft='quantized'" in block
  block = block.replace('specjax.load()', "specjax.load('tiny')")
  monkeypatch.chdir(tmp_path)
  exec(block.replace("draft='quantized'", "draft='truncated:1'"), {})
  printed = capsys.readouterr().out
  assert 'tokens per target call' in printed and 'x autoregressive' in printed


def test_method_names():
  assert api.method_name(None) == 'autoregressive'
  assert api.method_name('quantized') == 'quantized@adaptive'
  assert api.method_name('eagle@4x2x1') == 'eagle@4x2x1'
  assert api.method_name(' ngram@4 ') == 'ngram@4'
  with pytest.raises(ValueError, match='draft must be'):
    api.method_name('')
  np.testing.assert_equal(len(api.prompts_of('a')), 1)
