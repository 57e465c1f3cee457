"""The paper pairs (configs/pairs/, specjax/pairs/): real shapes, dry runs, missing paths."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from specjax import config_lib, pairs
from specjax.harness import run_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAIR_CONFIGS = ('qwen2_5', 'llama3', 'gemma3', 'vicuna')


@pytest.mark.parametrize('name', sorted(pairs.MODELS))
def test_real_shapes_have_the_published_sizes(name):
  shape = pairs.MODELS[name]
  count = pairs.per_device(shape.cfg, 1, 1)['params']
  assert abs(count / shape.published_params - 1) < 0.03, (name, count)


def test_real_shapes_spot_checks():
  """A few sizes written out (parameters of the real shapes, from the published configs)."""
  sizes = {n: pairs.MODELS[n].cfg.num_params for n in pairs.MODELS}
  assert round(sizes['qwen2.5-7b-instruct'] / 1e9, 2) == 7.62
  assert round(sizes['llama-3.1-8b-instruct'] / 1e9, 2) == 8.03
  assert round(sizes['llama-3.2-1b-instruct'] / 1e9, 3) == 1.236
  assert round(sizes['gemma-3-4b-it'] / 1e9, 2) == 3.88
  assert round(sizes['vicuna-7b-v1.3'] / 1e9, 2) == 6.74
  assert round(sizes['vicuna-68m'] / 1e6) == 68
  llama = pairs.MODELS['llama-3.1-8b-instruct'].cfg
  assert llama.rope_scaling == ('llama3', 8.0, 1.0, 4.0, 8192.0)
  assert pairs.MODELS['llama-3.2-1b'].cfg.rope_scaling[1] == 32.0
  gemma = pairs.MODELS['gemma-3-4b-it'].cfg
  assert gemma.layer_types[:6] == ('sliding',) * 5 + ('full',) and gemma.sliding_window == 1024
  assert gemma.rope_scaling == ('linear', 8.0) and gemma.rope_local_base == 10000.0


def test_per_device_bytes_on_a_mesh():
  """Tensor parallelism over 4 devices splits Qwen2.5-7B's matrices; data parallelism none."""
  cfg = pairs.MODELS['qwen2.5-7b-instruct'].cfg
  one = pairs.per_device(cfg, 1, 1)
  four = pairs.per_device(cfg, 2, 4)
  assert one['params_per_device'] == one['params']
  assert one['bytes_per_device'] == 2 * one['params']  # bfloat16
  assert one['params'] / 4 <= four['params_per_device'] < one['params'] / 3.9  # norms replicate
  assert four['kv_bytes_per_token_per_device'] == one['kv_bytes_per_token_per_device'] // 4


@pytest.mark.parametrize('name', PAIR_CONFIGS)
def test_missing_paths_are_one_clear_error(name, tmp_path):
  config = config_lib.load_config(f'pairs/{name}.py')
  pair = pairs.PAIRS[name]
  with pytest.raises(ValueError) as e:
    run_lib.main(config, str(tmp_path / 'out'), verbose=False)
  text = str(e.value)
  for field, model in (('model', pair.target), ('drafts', pair.draft)):
    hf_id = pairs.MODELS[model].hf_id
    assert f'config.{field} = ' in text and f'--config.{field}=' in text
    assert f'hf download {hf_id}' in text
  assert not (tmp_path / 'out').exists()  # before any work
  config.model = str(tmp_path)  # the target given, the draft still missing
  with pytest.raises(ValueError, match='config.drafts') as e:
    run_lib.main(config, str(tmp_path / 'out'), verbose=False)
  assert 'config.model' not in str(e.value)


def test_missing_paths_on_the_command_line():
  proc = subprocess.run(
    [sys.executable, '-m', 'specjax.run', '--config', 'configs/pairs/llama3.py'],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert 'error: a paper pair needs its model directories' in proc.stderr
  assert '--config.model=/models/Llama-3.1-8B-Instruct' in proc.stderr


def test_paths_in_the_config_argument():
  config = config_lib.load_config('pairs/vicuna.py', 'target=/m/vicuna-7b,draft=/m/vicuna-68m')
  assert config.model == '/m/vicuna-7b' and config.drafts == ('/m/vicuna-68m',)
  assert config.dtype == 'bfloat16'
  base = config_lib.load_config('pairs/qwen2_5.py', 'base')
  assert base.model == pairs.REQUIRED + 'qwen2.5-7b'


def test_tiny_configs_keep_the_architecture():
  for name, shape in pairs.MODELS.items():
    real, tiny = shape.cfg, pairs.tiny_config(name)
    for field in ('arch', 'qkv_bias', 'qk_norm', 'sandwich_norms', 'activation', 'rope_base'):
      assert getattr(tiny, field) == getattr(real, field), (name, field)
    assert tiny.rope_scaling == real.rope_scaling and tiny.rope_local_base == real.rope_local_base
    assert (tiny.n_heads, tiny.n_kv_heads) == (real.n_heads, real.n_kv_heads)
    assert tiny.tie_embeddings == real.tie_embeddings
    assert tiny.layer_types == real.layer_types[: tiny.n_layers]
    assert bool(tiny.sliding_window) == bool(real.sliding_window)
  gemma = pairs.tiny_config('gemma-3-4b-it')
  assert 'full' in gemma.layer_types and 'sliding' in gemma.layer_types
  for pair in pairs.PAIRS.values():  # the target's padded vocabulary stays padded further
    t, d = pairs.MODELS[pair.target].cfg, pairs.MODELS[pair.draft].cfg
    assert (t.vocab_size > d.vocab_size) == (
      pairs.tiny_config(pair.target).vocab_size > pairs.tiny_config(pair.draft).vocab_size
    )


DRY_SCRIPT = textwrap.dedent("""
    import json, sys, time
    import jax
    from specjax import config_lib
    from specjax.harness import report, run_lib
    assert jax.device_count() == 8, jax.devices()
    report.plot_all = lambda *a, **k: None  # the plots cost ~4 s a run and are tested elsewhere
    out = {}
    for name in sys.argv[1].split(','):
      start = time.perf_counter()
      config = config_lib.load_config(f'pairs/{name}.py', 'dry')
      config.mesh.data, config.mesh.model = 2, 4
      summary = run_lib.main(config, f'{sys.argv[2]}/{name}', verbose=True)
      out[name] = {'methods': {k: {f: v.get(f) for f in ('greedy_mismatches', 'acceptance_rate')}
                               for k, v in summary['methods'].items()},
                   'source': summary.get('model'), 'seconds': time.perf_counter() - start}
    print('RESULT' + json.dumps(out))
""")


def test_every_pair_dry_runs_sharded_on_eight_devices(tmp_path):
  """One subprocess, 8 simulated devices, a (2, 4) mesh: each pair's dry run prints the real
  shapes per device, then decodes its tiny random stand-ins speculatively (greedy), equal
  to the target alone (run_lib raises otherwise), with drafts both accepted and rejected."""
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8', JAX_PLATFORMS='cpu')
  proc = subprocess.run(
    [sys.executable, '-c', DRY_SCRIPT, ','.join(PAIR_CONFIGS), str(tmp_path)],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  line = next(l for l in proc.stdout.splitlines() if l.startswith('RESULT'))
  out = json.loads(line[len('RESULT') :])
  assert set(out) == set(PAIR_CONFIGS)
  for name, run in out.items():
    pair = pairs.PAIRS[name]
    hf_id = pairs.MODELS[pair.target].hf_id
    assert f'{hf_id} real shapes on a (data 2, model 4) mesh' in proc.stdout
    assert f'dry run dry:{pair.target}: speculative greedy output equals' in proc.stdout
    spec = run['methods'][f'dry:{pair.draft}@3']
    assert spec['greedy_mismatches'] == 0
    assert 0 < spec['acceptance_rate'] < 1, (name, spec)  # accepts some drafts, rejects some
  assert 'vocabulary 264 padded to 272' in proc.stdout  # Qwen2.5 and Gemma 3's padded vocab


def test_gemma3_multimodal_directory_to_its_text_model(tmp_path):
  """The converter for google/gemma-3-4b-it: text tensors renamed, the vision tower left
  out, text_config's gaps filled with Gemma3TextConfig's defaults; hf.load_hf reads it."""
  import numpy as np
  import safetensors.numpy

  from specjax.checkpoints import hf

  cfg = pairs.tiny_config('gemma-3-4b-it')
  params = pairs.dry_params(cfg)
  tensors = {'vision_tower.vision_model.embeddings.weight': np.ones((4, 4), np.float32)}
  for name, path, kind in hf.tensor_table(cfg):
    w = params
    for key in path:
      w = w[key]
    w = np.asarray(w, np.float32)
    tensors['language_model.' + name] = np.ascontiguousarray(w.T if kind == hf.LINEAR else w)
  src, dst = tmp_path / 'gemma-3-4b-it', tmp_path / 'text'
  src.mkdir()
  half = len(tensors) // 2  # two shards, as the real checkpoint has
  items = sorted(tensors.items())
  safetensors.numpy.save_file(dict(items[:half]), src / 'model-00001-of-00002.safetensors')
  safetensors.numpy.save_file(dict(items[half:]), src / 'model-00002-of-00002.safetensors')
  text_config = {  # as sparse as the real one: the rest are Gemma3TextConfig's defaults
    'model_type': 'gemma3_text',
    'hidden_size': cfg.d_model,
    'intermediate_size': cfg.ffn_dim,
    'num_hidden_layers': cfg.n_layers,
    'head_dim': cfg.head_dim,
    'vocab_size': cfg.vocab_size,
    'sliding_window': cfg.sliding_window,
    'rope_scaling': {'factor': 8.0, 'rope_type': 'linear'},
  }
  (src / 'config.json').write_text(json.dumps({'model_type': 'gemma3', 'text_config': text_config}))
  (src / 'tokenizer_config.json').write_text('{"bos_token": "<bos>"}')
  (src / 'chat_template.json').write_text('{"chat_template": "{{ messages }}"}')
  pairs.gemma3_text_model(src, dst)
  loaded_cfg, loaded = hf.load_hf(dst)
  for field in ('n_heads', 'n_kv_heads', 'head_dim', 'layer_types', 'rope_scaling', 'query_scale'):
    assert getattr(loaded_cfg, field) == getattr(cfg, field), field
  assert loaded_cfg.rope_local_base == 10000.0 and loaded_cfg.rope_base == 1e6
  np.testing.assert_array_equal(loaded['layers'][3]['wq'], np.float32(params['layers'][3]['wq']))
  np.testing.assert_array_equal(loaded['embed'], np.float32(params['embed']))
  assert (
    json.loads((dst / 'tokenizer_config.json').read_text())['chat_template'] == '{{ messages }}'
  )
  with pytest.raises(ValueError, match='expected a Gemma 3 multimodal config'):
    pairs.gemma3_text_model(dst, tmp_path / 'again')
  # The same directory twice is refused before anything is written (it truncated its own
  # shard and looped forever); a cut shard is named, never a hang or a cut output.
  before = (src / 'model-00001-of-00002.safetensors').read_bytes()
  with pytest.raises(ValueError, match='SRC and DST are the same directory'):
    pairs.gemma3_text_model(src, src / '.' / '..' / src.name)
  assert (src / 'model-00001-of-00002.safetensors').read_bytes() == before
  shard = src / 'model-00002-of-00002.safetensors'
  shard.write_bytes(shard.read_bytes()[:-100])
  with pytest.raises(ValueError, match='model-00002-of-00002.safetensors: truncated: tensor'):
    pairs.gemma3_text_model(src, tmp_path / 'cut')
  assert not (tmp_path / 'cut' / shard.name).exists()
  shard.write_bytes(b'\x10\x00')
  with pytest.raises(ValueError, match='truncated or not a safetensors file'):
    pairs.gemma3_text_model(src, tmp_path / 'cut')


def test_a_draft_with_fewer_vocabulary_rows_is_padded_to_the_target():
  """Qwen2.5-0.5B -> 7B and Gemma 3 270M -> 4B: one tokenizer, vocabularies padded to
  different sizes; the draft's logits are padded to the target's, never proposing past its
  rows. A draft with more rows than the target is still an error."""
  import jax.numpy as jnp

  from specjax import registry
  from specjax.checkpoints import loader
  from specjax.drafters.model import PaddedVocabDrafter

  target = loader.load_model('dry:qwen2.5-7b-instruct')
  drafter, params = registry.build_draft('dry:qwen2.5-0.5b-instruct', target)
  assert isinstance(drafter, PaddedVocabDrafter)
  assert drafter.vocab_size == target.cfg.vocab_size == drafter.cfg.vocab_size + 8
  cache = drafter.cfg.family.init_cache(drafter.cfg, 1, 16)
  logits, _ = drafter.forward(params, jnp.array([[5, 6, 7]]), cache)
  assert logits.shape == (1, 3, target.cfg.vocab_size)
  assert float(logits[..., drafter.cfg.vocab_size :].max()) < -1e29
  small = loader.load_model('dry:qwen2.5-0.5b-instruct')
  with pytest.raises(ValueError, match='vocabulary of 272 tokens but the target'):
    registry.build_draft('dry:qwen2.5-7b-instruct', small)
