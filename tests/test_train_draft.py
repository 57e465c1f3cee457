"""Draft distillation end to end on the tiny config: a run that is SIGKILLed and restarted
ends with exactly the parameters of an uninterrupted run; training data holds no
evaluation prompt; the trained draft loads and decodes losslessly."""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from specjax.data import prompts as eval_prompts
from specjax.decode.method import Method
from specjax.train import data as data_lib
from specjax.train import prompts as train_prompts

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG = f'{ROOT}/configs/distill_smollm2.py:tiny,steps=40'


def _command(workdir):
  return [
    sys.executable,
    '-m',
    'specjax.train_draft',
    f'--config={CONFIG}',
    f'--workdir={workdir}',
    '--noprogress',
  ]


@pytest.fixture(scope='module')
def env(tmp_path_factory):
  cache = tmp_path_factory.mktemp('cache')
  return {**os.environ, 'SPECJAX_CACHE': str(cache), 'JAX_PLATFORMS': 'cpu'}


def _final_state(workdir):
  with ocp.CheckpointManager(pathlib.Path(workdir) / 'checkpoints') as manager:
    step = manager.latest_step()
    return step, manager.restore(step, args=ocp.args.StandardRestore())


def _steps(workdir):
  folder = pathlib.Path(workdir) / 'checkpoints'
  if not folder.exists():
    return []
  return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory, env):
  workdir = tmp_path_factory.mktemp('straight')
  subprocess.run(_command(workdir), env=env, check=True, capture_output=True, timeout=240)
  return workdir


def test_sigkill_and_resume_ends_with_the_same_parameters(uninterrupted, tmp_path, env):
  proc = subprocess.Popen(
    _command(tmp_path), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
  )
  deadline = time.time() + 200
  while not any(s >= 8 for s in _steps(tmp_path)) and proc.poll() is None:
    assert time.time() < deadline, 'no checkpoint appeared'
    time.sleep(0.02)
  proc.send_signal(signal.SIGKILL)
  assert proc.wait() == -signal.SIGKILL, 'the run finished before it could be killed'
  killed_at = max(_steps(tmp_path))
  assert 8 <= killed_at < 40
  with (tmp_path / 'metrics.jsonl').open('a') as f:  # killed while a line was written
    f.write('{"kind": "train", "st')
  changed = subprocess.run(
    [*_command(tmp_path), '--config.optim.lr=0.1'], env=env, capture_output=True, text=True
  )
  assert changed.returncode == 2 and 'Traceback' not in changed.stderr, changed.stderr[-2000:]
  assert 'holds a run of another config (changed: optim)' in changed.stderr
  done = subprocess.run(_command(tmp_path), env=env, capture_output=True, text=True, timeout=240)
  assert done.returncode == 0, done.stderr[-2000:]
  assert f'resumed from step {killed_at}' in done.stdout
  step_a, state_a = _final_state(uninterrupted)
  step_b, state_b = _final_state(tmp_path)
  assert step_a == step_b == 40
  leaves_a, leaves_b = (jax_leaves(state_a), jax_leaves(state_b))
  assert len(leaves_a) == len(leaves_b)
  for a, b in zip(leaves_a, leaves_b):
    np.testing.assert_array_equal(a, b)
  # Metrics of the resumed run have one record per logged step, none duplicated.
  lines = (tmp_path / 'metrics.jsonl').read_text().splitlines()
  records = [json.loads(line) for line in lines]
  train_steps = [r['step'] for r in records if r['kind'] == 'train']
  assert train_steps == sorted(set(train_steps)) and train_steps[-1] == 40


def jax_leaves(tree):
  import jax

  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_outputs_of_a_run(uninterrupted):
  lines = (uninterrupted / 'metrics.jsonl').read_text().splitlines()
  records = [json.loads(line) for line in lines]
  evals = [r for r in records if r['kind'] == 'eval']
  assert evals[0]['step'] == 0 and evals[-1]['step'] == 40
  assert evals[-1]['greedy'] > evals[0]['greedy']  # distillation made the draft agree more
  train = [r for r in records if r['kind'] == 'train']
  assert train[-1]['loss'] < train[0]['loss'] and train[-1]['tokens_per_s'] > 0
  for name in ('loss.png', 'acceptance.png', 'draft/draft.json', 'draft/draft.safetensors'):
    assert (uninterrupted / name).is_file(), name


def test_the_trained_draft_decodes_losslessly(uninterrupted):
  from specjax import registry
  from specjax.checkpoints.loader import load_model
  from specjax.decode.engine import Engine

  target = load_model('tiny')
  drafter, draft_params = registry.build_draft(str(uninterrupted / 'draft'), target)
  assert 'distilled' in drafter.name
  engine = Engine(
    target.params, target.cfg, eos_id=-1, cache_size=128, drafter=drafter, draft_params=draft_params
  )
  prompts = [target.tokenizer.encode_chat(p) for p in ('Hello there', 'def f(x):')]
  reference = engine.generate(prompts, max_new_tokens=24).tokens
  for gamma in (1, 3):
    out = engine.generate(prompts, Method.chain(gamma, 'rejection'), max_new_tokens=24)
    assert out.tokens == reference


def _normal(text):
  return ' '.join(text.split())


def test_no_evaluation_prompt_in_the_training_data(env, uninterrupted):
  held_out = [_normal(p.text) for p in eval_prompts.load_prompts('humaneval')]
  held_out += [_normal(p.text) for p in eval_prompts.load_prompts('mtbench')]
  stubs = [
    _normal(p.text.split('```python')[-1].rstrip('`'))
    for p in eval_prompts.load_prompts('humaneval')
  ]
  for prompt in train_prompts.instruction_prompts():
    text = _normal(prompt)
    assert not any(h in text or text in h for h in held_out), prompt
    assert not any(s in text for s in stubs), prompt
  # And the cached tiny training set, decoded back to text.
  from specjax.testing import ByteTokenizer

  folder = next((pathlib.Path(env['SPECJAX_CACHE']) / 'distill').iterdir())
  data = data_lib.Dataset.load(folder / 'train.npz')
  tok = ByteTokenizer()
  texts = [_normal(tok.decode(row)) for row in data.tokens]
  for h in held_out + stubs:
    assert not any(h in t for t in texts)


@pytest.mark.parametrize(
  'change,match', [('repeat', 'vocab_ids repeat 1 target ids'), ('range', r'ids in \[0, ')]
)
def test_a_draft_with_a_broken_vocabulary_map_is_refused(uninterrupted, tmp_path, change, match):
  import safetensors.numpy

  from specjax.checkpoints import draft_dir
  from specjax.checkpoints.loader import load_model

  target = load_model('tiny')
  broken = tmp_path / 'draft'
  shutil.copytree(uninterrupted / 'draft', broken)
  tensors = safetensors.numpy.load_file(broken / draft_dir.WEIGHTS_FILE)
  ids = tensors['vocab_ids'].copy()
  ids[1] = ids[0] if change == 'repeat' else len(target.params['embed'])
  safetensors.numpy.save_file({**tensors, 'vocab_ids': ids}, broken / draft_dir.WEIGHTS_FILE)
  with pytest.raises(ValueError, match=match):
    draft_dir.load_draft_dir(broken, target.params['embed'])


def test_a_diverging_run_stops_and_keeps_its_last_finite_parameters(tmp_path, env):
  bad = subprocess.run(
    [*_command(tmp_path), '--config.optim.lr=1e30'],
    env=env,
    capture_output=True,
    text=True,
    timeout=240,
  )
  assert bad.returncode == 2 and 'Traceback' not in bad.stderr, bad.stderr[-2000:]
  assert 'error: training diverged at step ' in bad.stderr
  step, state = _final_state(tmp_path)
  assert step < 40
  assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(state['params']))


def test_hugging_face_export_makes_the_same_greedy_choices(uninterrupted, tmp_path):
  import jax.numpy as jnp

  from specjax.checkpoints import draft_dir, hf
  from specjax.checkpoints.loader import load_model
  from specjax.drafters import distilled
  from specjax.models import llama
  from specjax.models.kv_cache import KVCache

  target = load_model('tiny')
  cfg, params, _ = draft_dir.load_draft_dir(uninterrupted / 'draft', target.params['embed'])
  draft_dir.export_hf(tmp_path / 'hf', cfg, params, None)
  hf_cfg, hf_params = hf.load_hf(tmp_path / 'hf')
  tokens = jnp.asarray(np.random.default_rng(0).integers(3, 200, (2, 12)), jnp.int32)
  sub, _ = distilled.subset_logits(params, tokens, KVCache.init(cfg, 2, 12), cfg)
  full, _ = llama.forward(hf_params, tokens, KVCache.init(hf_cfg, 2, 12), hf_cfg)[:2]
  ids = np.asarray(params['vocab_ids'])
  np.testing.assert_allclose(np.asarray(full)[..., ids], np.asarray(sub), rtol=1e-2, atol=1e-2)
  np.testing.assert_array_equal(ids[np.asarray(sub).argmax(-1)], np.asarray(full).argmax(-1))


def test_loop_settings_are_checked_before_the_target_loads(tmp_path, monkeypatch):
  from specjax import config_lib
  from specjax.checkpoints import loader
  from specjax.train import trainer

  def no_loading(*args, **kwargs):
    raise AssertionError('the target was loaded before the config was checked')

  monkeypatch.setattr(loader, 'load_model', no_loading)
  for field, value, match in (
    ('log_every', 0, 'config.log_every = 0: expected an integer >= 1'),
    ('num_steps', -1, 'config.num_steps = -1'),
    ('checkpoint_every', 0, 'config.checkpoint_every = 0'),
  ):
    config = config_lib.load_config(ROOT / 'configs' / 'distill_smollm2.py', 'tiny')
    config[field] = value
    with pytest.raises(ValueError, match=match):
      trainer.train(config, tmp_path / field)
  config = config_lib.load_config(ROOT / 'configs' / 'distill_smollm2.py', 'tiny')
  config.optim.lr = float('nan')
  with pytest.raises(ValueError, match='config.optim.lr = nan: expected a finite rate > 0'):
    trainer.train(config, tmp_path / 'lr')


def test_labels_are_cached_per_model_weights_not_per_path():
  from specjax import testing

  _, params = testing.tiny_model(seed=1)
  same = data_lib.fingerprint(params)
  assert data_lib.fingerprint(jax.tree.map(np.array, params)) == same
  changed = jax.tree.map(np.array, params)
  changed['layers'][1]['wq'][3, 5] += 1.0  # one weight of a retrained model at the same path
  flat = changed['layers'][1]['wq'].reshape(-1)
  if flat.size > 65536:  # (the digest samples large arrays; the tiny ones are read whole)
    pytest.skip('array larger than the sample')
  assert data_lib.fingerprint(changed) != same
