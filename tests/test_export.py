"""python -m specjax.export: EAGLE-3 heads for vLLM and SGLang (the same tensors, captured
layer ids one apart), DFlash drafters in each engine's DFlash layout (read back to the same
weights), distilled drafts as a transformers assistant model with the draft's logits, and
one-line errors before any model loads."""

import json

import jax
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy

from specjax import testing
from specjax.checkpoints import dflash as dflash_ckpt
from specjax.checkpoints import draft_dir, eagle3, loader
from specjax.drafters import distilled
from specjax.export import dflash as dflash_export
from specjax.export import engines as export
from specjax.models import dflash as dflash_model
from specjax.models import eagle as eagle_model


def save_head(directory, capture=(1, 2, 4), n_layers=4):
  cfg, params = testing.tiny_model(seed=3, n_layers=n_layers)
  ids = np.arange(0, cfg.vocab_size, 3)
  hc = eagle_model.EagleConfig.for_target(cfg, len(ids), capture=capture)
  hp = eagle_model.init_params(hc, jax.random.key(0), ids, params)
  eagle3.save(directory, hc, hp, {'note': 'test'})
  return hc


@pytest.fixture(scope='module')
def head(tmp_path_factory):
  directory = tmp_path_factory.mktemp('head')
  return directory, save_head(directory)


@pytest.fixture(scope='module')
def draft(tmp_path_factory):
  """A distilled draft for the 'tiny' target: its layer 1, every other byte token."""
  target = loader.load_model('tiny')
  ids = np.arange(3, target.cfg.vocab_size, 2)
  cfg, params = distilled.init_from_target(target.cfg, target.params, (1,), ids)
  directory = tmp_path_factory.mktemp('draft')
  draft_dir.save_draft(directory, cfg, params, {'target': 'tiny'})
  return directory


def run(capsys, *args):
  """(status, stdout, stderr) of python -m specjax.export with `args`."""
  rc = export.main([str(a) for a in args])
  out, err = capsys.readouterr()
  return rc, out, err


def config_of(directory):
  return json.loads((directory / 'config.json').read_text())


def test_vllm_and_sglang_get_the_same_tensors_and_layer_ids_one_apart(head, tmp_path, capsys):
  src, hc = head
  for engine in ('vllm', 'sglang'):
    rc, out, err = run(capsys, '--draft', src, '--engine', engine, '--out', tmp_path / engine)
    assert rc == 0 and not err, err
    assert str(tmp_path / engine) in out
  vllm, sglang = config_of(tmp_path / 'vllm'), config_of(tmp_path / 'sglang')
  # vLLM reads the top-level key; SGLang reads eagle_config's and adds one.
  assert vllm['eagle_aux_hidden_state_layer_ids'] == list(hc.capture) == [1, 2, 4]
  assert vllm['eagle_config']['eagle_aux_hidden_state_layer_ids'] == [1, 2, 4]
  assert sglang['eagle_config']['eagle_aux_hidden_state_layer_ids'] == [0, 1, 3]
  assert 'eagle_aux_hidden_state_layer_ids' not in sglang
  ids = lambda c: np.array(c['eagle_config']['eagle_aux_hidden_state_layer_ids'])
  np.testing.assert_array_equal(ids(vllm) - ids(sglang), 1)
  assert sglang['specjax'] == {'note': 'test', 'exported_for': 'sglang'}
  assert vllm['specjax'] == {'note': 'test'}
  rest = lambda c: {k: v for k, v in c.items() if k not in ('eagle_config', 'specjax')}
  vllm_rest = rest(vllm)
  del vllm_rest['eagle_aux_hidden_state_layer_ids']
  assert rest(sglang) == vllm_rest
  assert vllm['architectures'] == ['LlamaForCausalLMEagle3']
  assert vllm['draft_vocab_size'] == hc.draft_vocab
  # The weights: byte for byte the head's, under the names both loaders read.
  weights = (src / 'model.safetensors').read_bytes()
  for engine in ('vllm', 'sglang'):
    assert (tmp_path / engine / 'model.safetensors').read_bytes() == weights
  names = set(safetensors.numpy.load_file(str(tmp_path / 'sglang' / 'model.safetensors')))
  assert {'fc.weight', 'norm.weight', 'lm_head.weight', 'd2t', 't2d'} <= names
  assert set(eagle3.LAYER_NAMES.values()) <= names


def test_exports_load_back_as_the_same_head(head, tmp_path, capsys):
  src, hc = head
  _, params, _ = eagle3.load(src)
  for engine in ('vllm', 'sglang'):
    assert run(capsys, '--draft', src, '--engine', engine, '--out', tmp_path / engine)[0] == 0
    cfg2, params2, _ = eagle3.load(tmp_path / engine)
    assert cfg2 == hc  # the SGLang export's ids are undone by its exported_for mark
    jax.tree.map(np.testing.assert_array_equal, params, params2)
  # An SGLang export exported again for vLLM gets vLLM's ids back.
  assert (
    run(capsys, '--draft', tmp_path / 'sglang', '--engine', 'vllm', '--out', tmp_path / 'v2')[0]
    == 0
  )
  assert config_of(tmp_path / 'v2') == config_of(tmp_path / 'vllm')


def test_a_distilled_draft_is_a_transformers_assistant_with_the_drafts_logits(
  draft, tmp_path, capsys
):
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  import jax.numpy as jnp

  from specjax.models.kv_cache import KVCache

  rc, out, err = run(
    capsys, '--draft', draft, '--engine', 'hf', '--out', tmp_path / 'hf', '--target', 'tiny'
  )
  assert rc == 0 and not err, err
  assert 'assistant_model=AutoModelForCausalLM.from_pretrained' in out
  model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / 'hf').eval()
  assert type(model).__name__ == 'LlamaForCausalLM'
  target = loader.load_model('tiny')
  cfg, params, _ = draft_dir.load_draft_dir(draft, target.params['embed'])
  tokens = np.random.default_rng(0).integers(3, 259, (2, 10))
  ours, _ = distilled.subset_logits(params, jnp.asarray(tokens), KVCache.init(cfg, 2, 10), cfg)
  with torch.no_grad():
    theirs = model(torch.from_numpy(tokens)).logits.numpy()
  ids = np.asarray(params['vocab_ids'])
  np.testing.assert_allclose(theirs[..., ids], np.asarray(ours), rtol=1e-4, atol=1e-4)
  np.testing.assert_array_equal(theirs.argmax(-1), ids[np.asarray(ours).argmax(-1)])
  # vLLM and SGLang serve it as a plain draft model: the same directory.
  for engine, words in (('vllm', '"method": "draft_model"'), ('sglang', 'STANDALONE')):
    rc, out, err = run(
      capsys, '--draft', draft, '--engine', engine, '--out', tmp_path / engine, '--target', 'tiny'
    )
    assert rc == 0 and words in out and 'same directory' in out, err
    for name in ('config.json', 'model.safetensors'):
      assert (tmp_path / engine / name).read_bytes() == (tmp_path / 'hf' / name).read_bytes()


def test_snippets_name_each_engines_flags(head, tmp_path, capsys):
  src, _ = head
  rc, out, _ = run(
    capsys,
    '--draft',
    src,
    '--engine',
    'vllm',
    '--out',
    tmp_path / 'v',
    '--target',
    'smollm2-135m-instruct',
  )
  assert rc == 0
  assert "LLM(model='HuggingFaceTB/SmolLM2-135M-Instruct', speculative_config=" in out
  assert f'"method": "eagle3", "model": "{tmp_path / "v"}", "num_speculative_tokens": 4' in out
  rc, out, _ = run(capsys, '--draft', src, '--engine', 'sglang', '--out', tmp_path / 's')
  assert rc == 0 and 'TARGET: the Hugging Face model' in out
  assert '--model TARGET --speculative-algorithm EAGLE3 ' in out
  assert f'--speculative-draft-model-path {tmp_path / "s"}' in out


def no_loading(*args, **kwargs):
  raise AssertionError('a model was loaded before the arguments were checked')


ERRORS = [
  ('neither', 'not a draft specjax saved'),
  ('engine', "unknown engine 'tensorrt': expected vllm, sglang or hf"),
  ('hf_head', export.HF_EAGLE3),
  ('not_empty', 'exists and is not empty (pass --overwrite to replace its files)'),
  ('out_is_draft', 'is the draft itself'),
  ('two_layers', 'vLLM and SGLang build EAGLE-3 heads over exactly 3'),
  ('layer_0', 'entering target layer 0'),
  ('no_out', 'the following arguments are required: --out'),
]


@pytest.mark.parametrize('case, message', ERRORS, ids=[case for case, _ in ERRORS])
def test_errors_are_one_line_before_any_model_loads(
  case, message, head, draft, tmp_path, capsys, monkeypatch
):
  monkeypatch.setattr(loader, 'load_model', no_loading)
  src, _ = head
  out = tmp_path / 'out'
  args = ['--draft', src, '--engine', 'vllm', '--out', out]
  if case == 'neither':
    (tmp_path / 'empty').mkdir()
    args[1] = tmp_path / 'empty'
  elif case == 'engine':
    args[3] = 'tensorrt'
  elif case == 'hf_head':
    monkeypatch.setattr(eagle3, 'load', no_loading)
    args[3] = 'hf'
  elif case == 'not_empty':
    out.mkdir()
    (out / 'keep.txt').write_text('x')
    args[1] = draft
  elif case == 'out_is_draft':
    args[5] = src
  elif case in ('two_layers', 'layer_0'):
    args[1] = tmp_path / 'head'
    save_head(args[1], capture=(2, 4) if case == 'two_layers' else (0, 2, 4))
  else:
    args = args[:4]
  if case == 'no_out':  # argparse's own error, made one line
    with pytest.raises(SystemExit) as exit_info:
      export.main([str(a) for a in args])
    rc, err = exit_info.value.code, capsys.readouterr().err
  else:
    rc, _, err = run(capsys, *args)
  assert rc == 2
  assert err.startswith('error: ') and err.count('\n') == 1, err
  assert message in err
  assert not (out / 'config.json').exists() and not (out / 'model.safetensors').exists()


def test_overwrite_writes_into_a_non_empty_directory(head, tmp_path, capsys):
  src, _ = head
  out = tmp_path / 'out'
  out.mkdir()
  (out / 'keep.txt').write_text('x')
  assert run(capsys, '--draft', src, '--engine', 'vllm', '--out', out, '--overwrite')[0] == 0
  assert (out / 'keep.txt').read_text() == 'x'
  assert eagle3.is_head_dir(out)


# DFlash drafters: the names and keys below are the ones read from the engines' loaders
# (specjax/export/dflash.py's docstring names the files and functions).
VLLM_TOP = {'fc.weight', 'hidden_norm.weight', 'norm.weight', 'lm_head.weight'}
LAYER_TENSORS = {
  'input_layernorm.weight',
  'self_attn.q_proj.weight',
  'self_attn.k_proj.weight',
  'self_attn.v_proj.weight',
  'self_attn.q_norm.weight',
  'self_attn.k_norm.weight',
  'self_attn.o_proj.weight',
  'post_attention_layernorm.weight',
  'mlp.gate_proj.weight',
  'mlp.up_proj.weight',
  'mlp.down_proj.weight',
}


def save_dflash(directory, ids=None, capture=(1, 2), layers=2, mask_row=None, seed=0):
  """A random DFlash drafter for the 'tiny' target (block 4); with `mask_row` its mask
  embedding is that target embedding row (what SGLang can run). Returns its config."""
  target = loader.load_model('tiny')
  ids = np.arange(target.cfg.vocab_size) if ids is None else np.asarray(ids)
  dc = dflash_model.DFlashConfig.for_target(
    target.cfg, len(ids), capture=capture, n_layers=layers, block_size=4
  )
  dp = dflash_model.init_params(dc, jax.random.key(seed), ids, target.params)
  if mask_row is not None:
    dp['mask'] = np.asarray(target.params['embed'], np.float32)[mask_row]
  dflash_ckpt.save(directory, dc, dp, {'note': 'test'})
  return dc


@pytest.fixture(scope='module')
def dflash_dirs(tmp_path_factory):
  """(reduced vocabulary, learned mask), (full vocabulary, mask = target row 77)."""
  reduced, full = tmp_path_factory.mktemp('dflash_k'), tmp_path_factory.mktemp('dflash_v')
  save_dflash(reduced, ids=np.arange(3, 259, 2))
  save_dflash(full, mask_row=77)
  return reduced, full


def layer_names(n):
  return {f'layers.{i}.{name}' for i in range(n) for name in LAYER_TENSORS}


def test_dflash_for_vllm_has_the_names_keys_and_mask_file_its_loader_reads(
  dflash_dirs, tmp_path, capsys
):
  torch = pytest.importorskip('torch')
  src = dflash_dirs[0]
  dc, _, _ = dflash_ckpt.load(src)
  out = tmp_path / 'vllm'
  rc, text, err = run(capsys, '--draft', src, '--engine', 'vllm', '--out', out)
  assert rc == 0 and not err, err
  assert sorted(p.name for p in out.iterdir()) == [
    'config.json',
    'mask_embedding.pt',
    'model.safetensors',
  ]
  t = safetensors.numpy.load_file(str(out / 'model.safetensors'))
  # Bare names (vLLM prefixes model. itself); no in-file mask (vLLM would drop it).
  assert set(t) == VLLM_TOP | {'d2t'} | layer_names(2)
  assert not any(k.startswith('model.') for k in t)
  assert t['lm_head.weight'].shape == (dc.draft_vocab, dc.d_model)
  assert t['fc.weight'].shape == (dc.d_model, 2 * dc.d_model)
  assert t['d2t'].dtype == np.int64 and t['fc.weight'].dtype == ml_dtypes.bfloat16
  np.testing.assert_array_equal(t['d2t'] + np.arange(dc.draft_vocab), np.arange(3, 259, 2))
  c = config_of(out)
  assert c['architectures'] == ['DFlashDraftModel'] and c['model_type'] == 'qwen3'
  assert c['is_causal'] is False and c['draft_vocab_size'] == dc.draft_vocab
  assert c['dflash_config']['target_layer_ids'] == [0, 1]  # capture (1, 2) minus one
  assert c['dflash_config']['block_size'] == 4
  assert c['dflash_config']['mask_token_id'] == dc.vocab_size - 1
  assert c['specjax'] == {'note': 'test', 'exported_for': 'vllm'}
  mask = torch.load(str(out / 'mask_embedding.pt'), weights_only=True)
  assert mask['mask_token_id'] == dc.vocab_size - 1 and mask['embedding'].shape == (dc.d_model,)
  assert '"method": "dflash"' in text and '"num_speculative_tokens": 3' in text


def test_dflash_exports_read_back_as_the_same_drafter(dflash_dirs, tmp_path, capsys):
  pytest.importorskip('torch')
  target = loader.load_model('tiny')
  for src, engine in (
    (dflash_dirs[0], 'vllm'),
    (dflash_dirs[1], 'vllm'),
    (dflash_dirs[1], 'sglang'),
  ):
    dc, dp, _ = dflash_ckpt.load(src)
    out = tmp_path / f'{engine}_{src.name}'
    args = ['--draft', src, '--engine', engine, '--out', out, '--target', 'tiny']
    assert run(capsys, *args)[0] == 0
    c = config_of(out)
    assert 'capture' not in c['specjax']  # read back from target_layer_ids + 1
    dc2, dp2, info = dflash_export.read(out, target.params)
    assert dc2 == dc and dc2.capture == (1, 2)
    assert info == {'note': 'test', 'exported_for': engine}
    jax.tree.map(np.testing.assert_array_equal, dp, dp2)
  # A full vocabulary has no d2t for vLLM (no draft_id_to_target_id to load it into).
  t = safetensors.numpy.load_file(
    str(tmp_path / f'vllm_{dflash_dirs[1].name}' / 'model.safetensors')
  )
  assert 'd2t' not in t
  # An export exported again gives the same files.
  again = tmp_path / 'again'
  assert (
    run(
      capsys,
      '--draft',
      tmp_path / f'vllm_{dflash_dirs[0].name}',
      '--engine',
      'vllm',
      '--out',
      again,
    )[0]
    == 0
  )
  first = tmp_path / f'vllm_{dflash_dirs[0].name}'
  for name in ('config.json', 'model.safetensors'):
    assert (again / name).read_bytes() == (first / name).read_bytes()


def test_dflash_for_sglang_keeps_what_its_model_holds(dflash_dirs, tmp_path, capsys):
  src = dflash_dirs[1]
  out = tmp_path / 'sglang'
  rc, text, err = run(
    capsys, '--draft', src, '--engine', 'sglang', '--out', out, '--target', 'tiny'
  )
  assert rc == 0 and not err, err
  assert sorted(p.name for p in out.iterdir()) == ['config.json', 'model.safetensors']
  t = safetensors.numpy.load_file(str(out / 'model.safetensors'))
  assert set(t) == {'fc.weight', 'hidden_norm.weight', 'norm.weight'} | layer_names(2)
  c = config_of(out)
  assert c['architectures'] == ['DFlashDraftModel'] and 'draft_vocab_size' not in c
  assert c['dflash_config']['target_layer_ids'] == [0, 1]
  assert c['dflash_config']['mask_token_id'] == 77 and c['dflash_config']['block_size'] == 4
  assert '--speculative-algorithm DFLASH' in text and '--speculative-num-draft-tokens 4' in text


def test_dflash_refusals_are_one_line(dflash_dirs, tmp_path, capsys, monkeypatch):
  reduced, full = dflash_dirs
  cases = [
    (['--draft', full, '--engine', 'hf'], export.HF_DFLASH),
    (['--draft', reduced, '--engine', 'sglang', '--target', 'tiny'], 'keeps 128 of 259 tokens'),
    (['--draft', reduced, '--engine', 'vllm', '--mask-token-id', '259'], 'outside the vocabulary'),
    (
      ['--draft', full, '--engine', 'sglang', '--mask-token-id', '3'],
      '--mask-token-id is for vllm',
    ),
  ]
  learned = tmp_path / 'learned'
  save_dflash(learned)  # full vocabulary, learned mask
  cases.append(
    (['--draft', learned, '--engine', 'sglang', '--target', 'tiny'], 'no row of the target')
  )
  layer0 = tmp_path / 'layer0'
  save_dflash(layer0, capture=(0, 2))
  cases.append((['--draft', layer0, '--engine', 'vllm'], 'entering target layer 0'))
  for args, message in cases:
    rc, _, err = run(capsys, *args, '--out', tmp_path / 'out')
    assert rc == 2 and err.startswith('error: ') and err.count('\n') == 1, err
    assert message in err, err
    assert not (tmp_path / 'out' / 'config.json').exists()
  # The SGLang export's own head is the target's: a changed head is refused.
  dc, dp, _ = dflash_ckpt.load(full)
  dp['head'] = dp['head'] + 1.0
  dflash_ckpt.save(tmp_path / 'head', dc, dp)
  rc, _, err = run(
    capsys,
    '--draft',
    tmp_path / 'head',
    '--engine',
    'sglang',
    '--target',
    'tiny',
    '--out',
    tmp_path / 'out',
  )
  assert rc == 2 and "is not the target's lm_head" in err
  # checkpoints/dflash.load names the reader for an export.
  with pytest.raises(ValueError, match='an export for vllm'):
    run(capsys, '--draft', reduced, '--engine', 'vllm', '--out', tmp_path / 'v')
    dflash_ckpt.load(tmp_path / 'v')


def test_a_dspark_drafter_in_shards_exports_its_block_and_says_the_heads_stay(
  dflash_dirs, tmp_path, capsys
):
  from specjax.checkpoints import dspark as dspark_ckpt
  from specjax.models import dspark as dspark_model

  dc, block, _ = dflash_ckpt.load(dflash_dirs[0])
  heads = dspark_model.init_params(dc.vocab_size, dc.draft_vocab, dc.d_model, 4, jax.random.key(1))
  src = tmp_path / 'dspark'
  dspark_ckpt.save(src, dc, block, heads, {'note': 'test'}, shard_bytes=1 << 14)
  assert not (src / 'model.safetensors').exists()
  outs = {}
  for name, draft in (('plain', dflash_dirs[0]), ('dspark', src)):
    outs[name] = tmp_path / f'vllm_{name}'
    rc, text, err = run(capsys, '--draft', draft, '--engine', 'vllm', '--out', outs[name])
    assert rc == 0 and not err, err
    assert ('DSpark heads' in text) == (name == 'dspark'), text
  a, b = (safetensors.numpy.load_file(str(o / 'model.safetensors')) for o in outs.values())
  assert set(a) == set(b)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
