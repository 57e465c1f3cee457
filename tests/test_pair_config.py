"""configs/pair.py (any target with any draft) and the header checks every run makes before
loading weights (specjax/harness/pair_check.py)."""

import os

import pytest

from specjax import config_lib, testing
from specjax.checkpoints import hf, loader
from specjax.harness import pair_check, run_lib
from tests import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_pair_config_takes_any_target_and_drafts():
  c = config_lib.load_config(
    'pair.py',
    'target=hf:HuggingFaceTB/SmolLM2-360M-Instruct@main,draft=smollm2-135m-instruct+ngram',
  )
  assert c.model == 'hf:HuggingFaceTB/SmolLM2-360M-Instruct@main'
  assert c.drafts == ('smollm2-135m-instruct', 'ngram')
  assert c.quick is False and c.quick_method == 'smollm2-135m-instruct@adaptive'
  assert set(config_lib.load_config('smollm2.py')) == set(c)  # the default config's fields
  tiny = config_lib.load_config('pair.py', 'tiny')
  assert tiny.model == 'tiny' and tiny.drafts == ('truncated:1', 'ngram')
  with pytest.raises(ValueError, match=r'configs/pair.py needs target=\.\.\. and draft=\.\.\.'):
    config_lib.load_config('pair.py')


def test_a_bad_config_argument_is_one_line():
  for spec, expected in (
    ('configs/pair.py:draft=ngram', 'error: configs/pair.py needs target=...'),
    ('configs/smollm2.py:tiny,foo', "error: unknown config argument 'foo'"),
  ):
    assert cli.one_line_error('specjax.run', '--config', spec).startswith(expected)


def _model_dir(path, **overrides):
  cfg, params = testing.tiny_model(**overrides)
  hf.export_hf(path, cfg, params)
  return str(path)


def test_headers_are_read_without_the_weights(tmp_path):
  d = _model_dir(tmp_path / 'm', vocab_size=96, n_layers=3)
  cfg = loader.peek_config(d)
  assert (cfg.vocab_size, cfg.n_layers) == (96, 3)
  assert loader.peek_config('tiny') is None  # stand-ins and Hub ids: nothing to peek
  assert loader.peek_config('hf:HuggingFaceTB/SmolLM2-135M-Instruct') is None
  with pytest.raises(FileNotFoundError, match='config.json'):
    loader.peek_config(str(tmp_path))


def _no_loading(monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError('a model was loaded before the header checks')

  monkeypatch.setattr(loader, 'load_model', refuse)


def test_a_draft_of_another_vocabulary_fails_before_loading(tmp_path, monkeypatch):
  target = _model_dir(tmp_path / 'target', vocab_size=512)
  for rows in (64, 600):  # far fewer (another tokenizer) or more than the target's
    draft = _model_dir(tmp_path / f'draft{rows}', vocab_size=rows)
    config = config_lib.load_config('pair.py', f'target={target},draft={draft}+ngram')
    _no_loading(monkeypatch)
    with pytest.raises(ValueError, match=f'vocabulary of {rows} tokens but the target'):
      run_lib.main(config, str(tmp_path / 'out'), verbose=False)
    assert not (tmp_path / 'out').exists()
  # A few rows fewer is one vocabulary padded differently: the header check lets it by.
  padded = _model_dir(tmp_path / 'padded', vocab_size=500)
  pair_check.check_vocabularies(
    pair_check.Peeked(target, loader.peek_config(target)),
    [pair_check.Peeked(padded, loader.peek_config(padded))],
  )


def test_models_that_do_not_fit_fail_before_loading(tmp_path, monkeypatch):
  target = _model_dir(tmp_path / 'target', vocab_size=512)
  draft = _model_dir(tmp_path / 'draft', vocab_size=512, n_layers=1)
  config = config_lib.load_config('pair.py', f'target={target},draft={draft}')
  monkeypatch.setattr(pair_check, 'device_bytes', lambda: (1024, 'the test device'))
  _no_loading(monkeypatch)
  with pytest.raises(ValueError, match='per device in float32 .* the test device is 0.0 GiB'):
    run_lib.main(config, str(tmp_path / 'out'), verbose=False)
  assert not (tmp_path / 'out').exists()


def test_bytes_per_device_follow_dtype_mesh_and_cache(tmp_path):
  target = _model_dir(tmp_path / 'target', vocab_size=512, d_model=64, n_heads=4, head_dim=16)
  config = config_lib.load_config('pair.py', f'target={target},draft=ngram')
  peeked = [pair_check.Peeked(target, loader.peek_config(target))]
  config.cache_size = 2
  f32 = pair_check.needed_bytes(config, peeked)
  config.dtype = 'bfloat16'
  assert pair_check.needed_bytes(config, peeked) == f32 // 2
  config.mesh.model = 2  # weights split over 'model' (the norms stay whole)
  assert pair_check.needed_bytes(config, peeked) < 0.6 * f32 // 2
  config.mesh.model, config.cache_size = 1, 1002  # + 2 x layers x kv heads x head dim per slot
  cfg = peeked[0].cfg
  per_slot = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 2
  assert pair_check.needed_bytes(config, peeked) == f32 // 2 + 1000 * per_slot
