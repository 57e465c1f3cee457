"""Training DSpark's heads (specjax/train/dspark_heads.py) and DSpark checkpoints
(specjax/checkpoints/dspark.py): the training forward's Markov logits are what the drafter
draws from in the decoding loop; a few steps lower the block loss and the confidence BCE; a
trained drafter saves in DeepSpec's head names, loads as `dspark:DIR` and decodes
losslessly; the calibration error by hand."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import safetensors.numpy

from specjax import registry, testing
from specjax.checkpoints import dflash as dflash_ckpt
from specjax.checkpoints import dspark as dspark_ckpt
from specjax.checkpoints import loader
from specjax.control.adaptive import AdaptiveConfig
from specjax.core.sampling import SamplingConfig
from specjax.decode import loop
from specjax.decode.engine import Engine
from specjax.decode.method import Method
from specjax.decode.prefill import prefill
from specjax.drafters.dflash import committed_length
from specjax.drafters.dspark import DSparkDrafter
from specjax.train import dspark_heads, trainer
from tests.test_dflash_train import full_w, labelled, make_drafter
from tests.test_dspark import trained_heads
from tests.test_train_draft import _final_state

STEPS = 8


def run_loop(cfg, params, dc, draft_params, prompts, lens, iterations, gamma):
  """Greedy speculative decoding with a DSpark drafter; per iteration, each row's committed
  length (the anchor's position), the drafter's greedy tokens, its T = 1 draws and their q."""
  drafter = DSparkDrafter(dc)
  method = Method.chain(gamma, 'greedy')
  greedy, t1 = SamplingConfig(temperature=0.0), SamplingConfig(temperature=1.0)
  all_params = {'target': params, 'draft': draft_params}
  kw = dict(cfg=cfg, method=method, drafter=drafter, sampling=greedy, eos_id=-1)
  state = prefill(
    all_params, jnp.asarray(prompts), jnp.asarray(lens), jnp.asarray([40, 40]),
    jax.random.key(0), cache_size=64, out_len=48, **kw,
  )  # fmt: skip
  step = jax.jit(lambda s: loop.step(all_params, s, **kw))
  propose = jax.jit(drafter.propose, static_argnums=(4, 5))
  out = {'anchors': [], 'greedy': [], 'drawn': [], 'q': []}
  for i in range(iterations):
    ds, key = state.spec.draft, jax.random.key(i)
    out['anchors'].append(np.asarray(committed_length(state)))
    out['greedy'].append(np.asarray(propose(draft_params, ds, state, key, gamma, greedy)[0]))
    drawn, q, _ = propose(draft_params, ds, state, key, gamma, t1)
    out['drawn'].append(np.asarray(drawn))
    out['q'].append(np.asarray(q))
    state = step(state)
  n = np.asarray(state.num_generated)
  seqs = [
    list(p[:ln]) + list(np.asarray(state.tokens[r, : n[r]]))
    for r, (p, ln) in enumerate(zip(prompts, lens))
  ]
  return {k: np.stack(v, 1) for k, v in out.items()}, seqs


def test_training_markov_logits_are_what_the_drafter_draws_from_in_the_loop():
  """At the loop's committed lengths, the training forward with block position k's
  previous token set to what the drafter drew before it gives the drafter's greedy tokens
  and, at T = 1, its q (a vocabulary that leaves tokens out, a Markov head that matters)."""
  cfg, params = testing.tiny_model(seed=21, vocab_size=8, n_layers=3, scale=0.3)
  ids = [0, 1, 2, 4, 5, 7]
  dc, dp, _ = make_drafter(cfg, params, ids)
  heads = trained_heads(cfg, dc)
  draft_params = {'block': dp, 'embed': params['embed'], 'heads': heads}
  gamma = dc.block_size - 1
  prompts = [[3, 1, 4, 1, 5, 1, 2, 6, 5, 3, 5, 0, 1], [7, 2, 7, 1, 0, 2, 0, 0, 0, 0, 0, 0, 0]]
  got, seqs = run_loop(cfg, params, dc, draft_params, prompts, [13, 6], 8, gamma)
  batch = labelled(cfg, params, [s + [0] * (64 - len(s)) for s in seqs], dc.capture)
  at = jnp.asarray(got['anchors'])  # [2, N]
  anchor_token = batch['tokens'][jnp.arange(2)[:, None], at][..., None]
  forward = jax.jit(dspark_heads.markov_logits_at, static_argnums=6)
  for drafted in ('greedy', 'drawn'):
    prev = jnp.concatenate([anchor_token, got[drafted][..., :-1]], axis=-1)
    logits, _ = forward(
      {'block': dp, 'heads': heads}, params['embed'], batch['features'], batch['tokens'], at,
      prev, dc,
    )  # fmt: skip
    if drafted == 'greedy':
      np.testing.assert_array_equal(np.asarray(ids)[np.argmax(logits, -1)], got['greedy'])
    else:
      q = got['q'][..., ids]
      np.testing.assert_allclose(jax.nn.softmax(logits, -1), q, rtol=1e-4, atol=1e-6)
  assert np.all(got['q'][..., [3, 6]] == 0)
  # the Markov head matters here: the greedy chain differs from the block's own argmax
  base = dspark_heads.markov_logits_at(
    {'block': dp, 'heads': dict(heads, w2=0 * heads['w2'])}, params['embed'],
    batch['features'], batch['tokens'], at, prev, dc,
  )[0]  # fmt: skip
  assert np.any(np.asarray(ids)[np.argmax(base, -1)] != got['greedy'])


def test_a_few_steps_lower_the_block_loss_and_the_confidence_bce():
  cfg, params = testing.tiny_model(seed=3, n_layers=3)
  dc, dp, vocab_ids = make_drafter(cfg, params, np.arange(0, cfg.vocab_size, 2))
  dp.pop('vocab_ids')  # frozen, not trained
  tokens = np.asarray(jax.random.randint(jax.random.key(0), (4, 24), 0, cfg.vocab_size))
  batch = labelled(cfg, params, tokens, dc.capture)
  batch['mask'] = jnp.asarray(np.arange(24)[None].repeat(4, 0) < 23)
  w = full_w(cfg, params)
  batch['target_top'] = jnp.argmax(batch['hidden'] @ w, -1)
  frozen = {'embed': jnp.asarray(params['embed']), 'vocab_ids': vocab_ids, 'full_w': w}
  frozen['head_w'] = w[:, vocab_ids]
  heads = dspark_heads.dspark_model.init_params(
    cfg.vocab_size, dc.draft_vocab, dc.d_model, 4, jax.random.key(2)
  )
  p = jax.tree.map(jnp.asarray, {'block': dp, 'heads': heads})
  optimizer = optax.adam(3e-3)
  history = train_steps(p, frozen, batch, dc, optimizer, 15)
  first, last = history[0], history[-1]
  assert all(np.isfinite(h['loss']) for h in history)
  assert last['block_loss'] < 0.8 * first['block_loss'], history
  assert first['conf_bce'] == pytest.approx(np.log(2), rel=1e-5)  # untrained: 1/2 everywhere
  assert 0 < last['conf_counted'] <= 1
  # The labels move while the drafter learns; with the drafter held (only conf_w and
  # conf_b train) they stay, and the BCE falls.
  trained = history.params
  only_conf = jax.tree.map(lambda _: 'held', trained)
  only_conf['heads'].update(conf_w='trained', conf_b='trained')
  optimizer = optax.multi_transform(
    {'held': optax.set_to_zero(), 'trained': optax.adam(3e-2)}, only_conf
  )
  history = train_steps(trained, frozen, batch, dc, optimizer, 15)
  assert history[-1]['block_loss'] == history[0]['block_loss']
  assert history[-1]['conf_bce'] < 0.8 * history[0]['conf_bce'], history
  # the BCE reaches the confidence head only (a stop-gradient at the block's states)
  grad = jax.jit(jax.grad(dspark_heads.loss_fn, has_aux=True), static_argnums=(4, 5, 6, 7, 8))
  args = (frozen, batch, jax.random.key(7), dc, 6, 4.0, 'forward_kl')
  with_bce, without = grad(history.params, *args, 1.0)[0], grad(history.params, *args, 0.0)[0]
  for a, b in zip(jax.tree.leaves(with_bce['block']), jax.tree.leaves(without['block'])):
    np.testing.assert_array_equal(a, b)
  assert float(jnp.abs(with_bce['heads']['conf_w']).max()) > 0


class History(list):
  params: dict


def train_steps(params, frozen, batch, dc, optimizer, count):
  """Each step's metrics (the step's anchors fixed); .params the last parameters."""
  step = dspark_heads.make_train_step(dc, optimizer, 6, 4.0, 'forward_kl', 1.0)
  state = {'step': jnp.zeros((), jnp.int32), 'params': params}
  state['opt_state'] = optimizer.init(params)
  history = History()
  for _ in range(count):
    state, metrics = step(state, frozen, batch, jax.random.key(7))
    history.append({k: float(v) for k, v in metrics.items()})
  history.params = state['params']
  return history


def test_calibration_error_and_labels_by_hand():
  conf = [0.05, 0.15, 0.12, 0.95, 1.0]
  label = [0, 1, 0, 1, 1]
  # bins [0, .1): |.05 - 0|; [.1, .2): two, |.135 - .5|; [.9, 1]: two, |.975 - 1|
  want = (0.05 + 2 * 0.365 + 2 * 0.025) / 5
  assert dspark_heads.expected_calibration_error(conf, label) == pytest.approx(want)
  assert dspark_heads.expected_calibration_error([0.3, 0.3, 0.3], [0, 1, 0]) == pytest.approx(
    abs(0.3 - 1 / 3)
  )
  assert np.isnan(dspark_heads.expected_calibration_error([], []))
  # labels: position 1 always counted; position k where every earlier draft and data token
  # were the target's argmax
  draft = jnp.asarray([[5, 6, 7, 8], [5, 6, 7, 8], [5, 1, 7, 8]])
  top = jnp.asarray([[5, 6, 0, 8]] * 3)
  data = jnp.asarray([[5, 6, 7, 8], [5, 2, 0, 8], [5, 6, 0, 8]])
  label, counted = dspark_heads.confidence_labels(draft, top, data, jnp.ones((3, 4), bool))
  np.testing.assert_array_equal(label, [[1, 1, 0, 1], [1, 1, 0, 1], [1, 0, 0, 1]])
  np.testing.assert_array_equal(counted, [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 0, 0]])
  c = np.asarray([[0.9, 0.8, 0.3, 0.5]] * 3)
  out = dspark_heads.calibration(c, np.asarray(label, float), np.asarray(counted))
  assert out['counted_1'] == 3 and out['counted_3'] == 1 and out['counted_4'] == 0
  assert out['ece_1'] == pytest.approx(0.1) and out['ece_3'] == pytest.approx(0.3)
  assert out['hit_2'] == pytest.approx(2 / 3) and np.isnan(out['ece_4'])
  assert out['ece'] == pytest.approx(
    dspark_heads.expected_calibration_error([0.9] * 3 + [0.8] * 3 + [0.3], [1, 1, 1, 1, 1, 0, 0])
  )


def test_heads_round_trip_in_deepspecs_names(tmp_path):
  cfg, params = testing.tiny_model(seed=3, n_layers=3)
  dc, dp, _ = make_drafter(cfg, params, np.arange(0, cfg.vocab_size, 2))
  heads = trained_heads(cfg, dc, rank=5)
  dspark_ckpt.save(tmp_path, dc, dp, heads, {'steps': 3})
  tensors = safetensors.numpy.load_file(str(tmp_path / 'model.safetensors'))
  shapes = {n: tensors[n].shape for n in tensors if not n.startswith(('layers.', 'fc', 'norm'))}
  assert shapes['markov_head.markov_w1.weight'] == (cfg.vocab_size, 5)
  assert shapes['markov_head.markov_w2.weight'] == (dc.draft_vocab, 5)
  assert shapes['confidence_head.proj.weight'] == (1, dc.d_model)
  assert shapes['confidence_head.proj.bias'] == (1,)
  np.testing.assert_array_equal(tensors['markov_head.markov_w2.weight'], heads['w2'].T)
  config = json.loads((tmp_path / 'config.json').read_text())
  assert config['markov_rank'] == 5 and config['enable_confidence_head'] is True
  assert config['confidence_head_with_markov'] is False and config['markov_head_type'] == 'vanilla'
  got_cfg, block, got, info = dspark_ckpt.load(tmp_path)
  assert got_cfg == dc and info['steps'] == 3
  for name in ('w1', 'w2', 'conf_w', 'conf_b'):
    np.testing.assert_array_equal(got[name], np.asarray(heads[name], np.float32), err_msg=name)
  np.testing.assert_array_equal(block['vocab_ids'], dflash_ckpt.load(tmp_path)[1]['vocab_ids'])
  assert registry.parse_draft(f'dspark:{tmp_path}')
  # Hugging Face shards (how the shipped drafter stays under the repository's file size)
  sharded = tmp_path / 'sharded'
  dspark_ckpt.save(sharded, dc, dp, heads, {'steps': 3}, shard_bytes=4096)
  files = sorted(f.name for f in sharded.glob('*.safetensors'))
  assert len(files) > 2 and 'model.safetensors' not in files
  index = json.loads((sharded / 'model.safetensors.index.json').read_text())
  assert sorted(set(index['weight_map'].values())) == files
  assert all((sharded / f).stat().st_size <= 4096 + 2048 for f in files)  # header aside
  again = dspark_ckpt.load(sharded)
  jax.tree.map(np.testing.assert_array_equal, again[1:3], (block, got))
  (sharded / files[-1]).unlink()  # a shard gone: the error names it
  with pytest.raises(ValueError, match=f'names {files[-1]}, which is not in the directory'):
    registry.parse_draft(f'dspark:{sharded}')
  plain = tmp_path / 'plain'
  dflash_ckpt.save(plain, dc, dp)
  with pytest.raises(ValueError, match='no DSpark drafter at .*loads as dflash:DIR'):
    registry.parse_draft(f'dspark:{plain}')
  config['confidence_head_with_markov'] = True
  (tmp_path / 'config.json').write_text(json.dumps(config))
  with pytest.raises(ValueError, match='reads the Markov embedding'):
    dspark_ckpt.load(tmp_path)
  del config['enable_confidence_head']  # DeepSpec without a confidence head: 1/2
  (tmp_path / 'config.json').write_text(json.dumps(config))
  assert not np.any(dspark_ckpt.load(tmp_path)[2]['conf_w'])


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  from configs import dspark_smollm2

  config = dspark_smollm2.get_config(f'tiny,steps={STEPS}')
  config.eval_every = 4
  workdir = tmp_path_factory.mktemp('dspark')
  cache = tmp_path_factory.mktemp('cache')
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv('SPECJAX_CACHE', str(cache))
    result = trainer.train(config, workdir, progress_bar=False)
  return workdir, result, cache


def test_heads_alone_learn_on_a_trained_block_that_stays_as_it_was(run, tmp_path, monkeypatch):
  from configs import dspark_smollm2

  start = run[0] / 'drafter'
  monkeypatch.setenv('SPECJAX_CACHE', str(run[2]))  # the run's labelled features
  from specjax.train import dflash_block

  with pytest.MonkeyPatch.context() as mp:  # refused before the target and features load
    mp.setattr(dflash_block, 'setup', lambda *a: pytest.fail('setup ran before the check'))
    with pytest.raises(ValueError, match='freeze_block needs drafter.init_from'):
      trainer.train(dspark_smollm2.get_config('tiny,steps=2,freeze_block=True'), tmp_path)
  config = dspark_smollm2.get_config(f'tiny,steps=3,init_from={start},freeze_block=True')
  config.eval_every = 3
  trainer.train(config, tmp_path, progress_bar=False)
  _, block, heads, _ = dspark_ckpt.load(start)
  _, block2, heads2, _ = dspark_ckpt.load(tmp_path / 'drafter')
  jax.tree.map(np.testing.assert_array_equal, block2, block)
  assert any(np.any(heads2[n] != heads[n]) for n in heads)


def test_a_run_reports_calibration_and_saves_a_drafter_that_decodes_losslessly(run):
  workdir, result, _ = run
  records = [json.loads(x) for x in (workdir / 'metrics.jsonl').read_text().splitlines()]
  evals = [r for r in records if r['kind'] == 'eval']
  assert evals[-1]['step'] == STEPS and result['step'] == STEPS
  assert {'ece', 'ece_1', 'ece_3', 'conf_1', 'hit_1', 'counted_1', 'chain'} <= set(evals[-1])
  assert 0 <= evals[-1]['ece'] <= 1 and evals[-1]['counted_1'] > 0
  train = [r for r in records if r['kind'] == 'train']
  assert train[-1]['block_loss'] < train[0]['block_loss']
  assert train[-1]['conf_bce'] < train[0]['conf_bce']
  target = loader.load_model('tiny')
  drafter, draft_params = registry.build_draft(f'dspark:{workdir / "drafter"}', target)
  assert isinstance(drafter, DSparkDrafter) and drafter.cfg.block_size == 4
  _, state = _final_state(workdir)
  for name, value in state['params']['heads'].items():  # the trained heads, exactly
    np.testing.assert_array_equal(draft_params['heads'][name], np.asarray(value), err_msg=name)
  assert np.any(draft_params['heads']['w2'])
  engine = Engine(
    target.params, target.cfg, eos_id=-1, cache_size=128, drafter=drafter,
    draft_params=draft_params,
  )  # fmt: skip
  prompts = [target.tokenizer.encode_chat(p) for p in ('Hello there', 'def f(x):')]
  reference = engine.generate(prompts, max_new_tokens=24).tokens
  assert engine.generate(prompts, Method.chain(3), max_new_tokens=24).tokens == reference
  sched = AdaptiveConfig(gammas=(1, 3), draft_cost=(0.3, 0.3), verify_cost=(1.1, 1.4),
                         schedule='confidence')  # fmt: skip
  assert engine.generate(prompts, Method.adaptive(sched), max_new_tokens=24).tokens == reference


def test_the_config_shares_the_dflash_drafters_data_and_block():
  from configs import dflash_smollm2, dspark_smollm2

  for arg in ('', 'tiny'):
    c, d = dspark_smollm2.get_config(arg), dflash_smollm2.get_config(arg)
    assert c.data.to_dict() == d.data.to_dict() and c.kind == 'dspark'
    assert tuple(c.drafter.capture) == tuple(d.drafter.capture)
    assert (c.anchors, c.loss_decay, c.drafter.block_size) == (
      d.anchors, d.loss_decay, d.drafter.block_size,
    )  # fmt: skip
  c = dspark_smollm2.get_config('block=8,rank=16,anchors=4,conf_weight=0.5')
  assert (c.drafter.block_size, c.drafter.rank, c.anchors, c.conf_weight) == (8, 16, 4, 0.5)
