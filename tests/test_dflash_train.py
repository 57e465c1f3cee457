"""Training the DFlash block drafter (specjax/train/dflash_block.py): the blocks training
computes are the blocks the drafter proposes in the decoding loop, and their labels the
tokens the target commits there; a few steps lower the loss; a trained drafter saved by the
trainer loads as `dflash:DIR` and decodes losslessly; an interrupted run resumes to the
parameters of an uninterrupted one; the config shares the EAGLE head's feature data."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from specjax import registry, testing
from specjax.checkpoints import loader
from specjax.core.sampling import SamplingConfig
from specjax.decode import loop
from specjax.decode.engine import Engine
from specjax.decode.method import Method
from specjax.decode.prefill import prefill
from specjax.drafters.dflash import DFlashDrafter, committed_length
from specjax.models import dflash as dflash_model
from specjax.models import eagle as eagle_model
from specjax.models.kv_cache import KVCache
from specjax.train import dflash_block, trainer
from tests.test_train_draft import _final_state, jax_leaves

STEPS = 12


def make_drafter(cfg, params, vocab_ids, block=4, seed=1):
  dc = dflash_model.DFlashConfig.for_target(cfg, len(vocab_ids), block_size=block)
  dp = dflash_model.init_params(dc, jax.random.key(seed), np.asarray(vocab_ids), params)
  return dc, dp, jnp.asarray(dp['vocab_ids'])


def full_w(cfg, params):
  """The target's output matrix [D, V]."""
  return jnp.asarray(params['embed']).T if cfg.tie_embeddings else jnp.asarray(params['lm_head'])


def labelled(cfg, params, tokens, capture):
  """What feature_data keeps of sequences tokens[B, S]: features, hidden and lse."""
  tokens = jnp.asarray(tokens)
  cache = KVCache.init(cfg, tokens.shape[0], tokens.shape[1])
  out = cfg.family.forward(params, tokens, cache, cfg, capture=capture, head=False)
  hidden, feats = out.hidden, out.features
  lse = jax.nn.logsumexp(cfg.family.logits(params, hidden, cfg), axis=-1)
  return {'tokens': tokens, 'features': feats, 'hidden': hidden, 'lse': lse}


def run_loop(cfg, params, dc, dp, prompts, lens, iterations, gamma):
  """Greedy speculative decoding with the drafter; per iteration, each row's committed
  length (the anchor's position) and the drafter's greedy tokens and T = 1 q."""
  drafter = DFlashDrafter(dc)
  method = Method.chain(gamma, 'greedy')
  greedy, t1 = SamplingConfig(temperature=0.0), SamplingConfig(temperature=1.0)
  all_params = {'target': params, 'draft': {'block': dp, 'embed': params['embed']}}
  kw = dict(cfg=cfg, method=method, drafter=drafter, sampling=greedy, eos_id=-1)
  state = prefill(
    all_params, jnp.asarray(prompts), jnp.asarray(lens), jnp.asarray([40, 40]),
    jax.random.key(0), cache_size=64, out_len=48, **kw,
  )  # fmt: skip
  step = jax.jit(lambda s: loop.step(all_params, s, **kw))
  propose = jax.jit(drafter.propose, static_argnums=(4, 5))
  anchors, drafts, qs = [], [], []
  for _ in range(iterations):
    ds = state.spec.draft
    anchors.append(np.asarray(committed_length(state)))
    drafts.append(
      np.asarray(propose(all_params['draft'], ds, state, jax.random.key(1), gamma, greedy)[0])
    )
    qs.append(np.asarray(propose(all_params['draft'], ds, state, jax.random.key(1), gamma, t1)[1]))
    state = step(state)
  n = np.asarray(state.num_generated)
  seqs = [
    list(p[:ln]) + list(np.asarray(state.tokens[r, : n[r]]))
    for r, (p, ln) in enumerate(zip(prompts, lens))
  ]
  return np.stack(anchors, 1), np.stack(drafts, 1), np.stack(qs, 1), seqs


def test_training_blocks_are_the_blocks_the_drafter_proposes_in_the_loop():
  """The training forward at anchor a (the loop's committed length) gives the drafter's
  proposal in the loop: greedy tokens and T = 1 q, with a vocabulary that leaves tokens
  out; it equals models/dflash.forward from scratch; and the training labels of block
  position k are the target's distributions whose argmax the greedy loop committed at a + k."""
  cfg, params = testing.tiny_model(seed=21, vocab_size=8, n_layers=3, scale=0.3)
  ids = [0, 1, 2, 4, 5, 7]
  dc, dp, vocab_ids = make_drafter(cfg, params, ids)
  gamma = dc.block_size - 1
  prompts = [[3, 1, 4, 1, 5, 1, 2, 6, 5, 3, 5, 0, 1], [7, 2, 7, 1, 0, 2, 0, 0, 0, 0, 0, 0, 0]]
  anchors, drafts, qs, seqs = run_loop(cfg, params, dc, dp, prompts, [13, 6], 10, gamma)
  width = 64
  batch = labelled(cfg, params, [s + [0] * (width - len(s)) for s in seqs], dc.capture)
  at = jnp.asarray(anchors)  # [2, iterations]
  logits = jax.jit(dflash_block.block_logits_at, static_argnums=5)(
    dp, params['embed'], batch['features'], batch['tokens'], at, dc
  )  # [2, N, T - 1, K]
  np.testing.assert_array_equal(np.asarray(vocab_ids)[np.argmax(logits, -1)], drafts)
  np.testing.assert_allclose(jax.nn.softmax(logits, -1), qs[..., ids], rtol=1e-4, atol=1e-6)
  assert np.all(qs[..., [3, 6]] == 0)
  forward = jax.jit(dflash_model.forward, static_argnums=5)
  for n in range(anchors.shape[1]):  # from scratch, the context cut at the anchor
    want = forward(
      dp, params['embed'], batch['features'], at[:, n], batch['tokens'][jnp.arange(2), at[:, n]], dc
    )
    np.testing.assert_allclose(logits[:, n], want, rtol=1e-4, atol=1e-5)
  # Labels: with the full vocabulary as the head, the teacher's argmax at block position
  # k + 1 is the token the greedy loop committed at a + k + 1.
  mask = jnp.asarray(np.arange(width)[None] < np.array([len(s) for s in seqs])[:, None] - 1)
  pos, valid = dflash_block.label_positions(at, mask, dc.block_size)
  frozen = {'head_w': full_w(cfg, params)}
  p_sub, p = dflash_block.teacher_at(frozen, batch, pos)
  np.testing.assert_allclose(p_sub, p, rtol=1e-5)  # the whole vocabulary: nothing left out
  committed = np.asarray(batch['tokens'])[np.arange(2)[:, None, None], np.asarray(pos) + 1]
  valid = np.asarray(valid)  # the last blocks reach past the committed tokens
  assert valid.mean() > 0.8
  np.testing.assert_array_equal(np.argmax(p, -1)[valid], committed[valid])


def test_a_few_steps_lower_the_loss():
  cfg, params = testing.tiny_model(seed=3, n_layers=3)
  dc, dp, vocab_ids = make_drafter(cfg, params, np.arange(0, cfg.vocab_size, 2))
  dp.pop('vocab_ids')  # frozen, not trained
  tokens = np.asarray(jax.random.randint(jax.random.key(0), (4, 24), 0, cfg.vocab_size))
  batch = labelled(cfg, params, tokens, dc.capture)
  batch['mask'] = jnp.asarray(np.arange(24)[None].repeat(4, 0) < 23)
  w = full_w(cfg, params)
  frozen = {'embed': jnp.asarray(params['embed']), 'vocab_ids': vocab_ids, 'full_w': w}
  frozen['head_w'] = w[:, vocab_ids]
  optimizer = optax.adam(3e-3)
  step = dflash_block.make_train_step(dc, optimizer, anchors=6, gamma=4.0, divergence='forward_kl')
  state = {'step': jnp.zeros((), jnp.int32), 'params': dp, 'opt_state': optimizer.init(dp)}
  key = jax.random.key(7)
  losses = []
  for _ in range(15):
    state, metrics = step(state, frozen, batch, key)
    losses.append(float(metrics['loss']))
  assert np.all(np.isfinite(losses)) and losses[-1] < 0.8 * losses[0], losses


def test_anchors_and_weights():
  mask = jnp.asarray([[True] * 6 + [False] * 4, [False] * 8 + [True] * 2])
  at, keep = dflash_block.sample_anchors(jax.random.key(0), mask, 4)
  at, keep = np.asarray(at), np.asarray(keep)
  assert sorted(at[0]) == sorted(set(at[0])) and set(at[0]) <= {1, 2, 3, 4, 5} and keep[0].all()
  assert set(at[1][keep[1]]) == {8, 9} and keep[1].sum() == 2
  w = np.asarray(dflash_block.position_weights(16, 7.0))
  np.testing.assert_allclose(w, np.exp(-np.arange(15) / 7.0), rtol=1e-6)
  assert w[0] == 1.0


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """A straight tiny run of STEPS steps, and one interrupted (a KeyboardInterrupt at
  step 5, as Ctrl-C) and restarted in its workdir."""
  from configs import dflash_smollm2

  config = dflash_smollm2.get_config(f'tiny,steps={STEPS}')
  straight, interrupted = tmp_path_factory.mktemp('straight'), tmp_path_factory.mktemp('cut')
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv('SPECJAX_CACHE', str(tmp_path_factory.mktemp('cache')))
    result = trainer.train(config, straight, progress_bar=False)

    def cut_task(config, progress=print):
      task = dflash_block.task(config, progress)
      batch = task.batch

      def stop_at_5(step):
        if step == 5:
          raise KeyboardInterrupt
        return batch(step)

      task.batch = stop_at_5
      return task

    mp.setitem(trainer.TASKS, 'dflash', cut_task)
    trainer.train(config, interrupted, progress_bar=False)
    mp.setitem(trainer.TASKS, 'dflash', dflash_block.task)
    cut_at = _final_state(interrupted)[0]
    trainer.train(config, interrupted, progress_bar=False)
  return straight, interrupted, cut_at, result


def test_a_run_writes_metrics_and_a_drafter_that_decodes_losslessly(runs):
  straight, _, _, result = runs
  records = [json.loads(x) for x in (straight / 'metrics.jsonl').read_text().splitlines()]
  evals = [r for r in records if r['kind'] == 'eval']
  assert evals[0]['step'] == 0 and evals[-1]['step'] == STEPS and result['step'] == STEPS
  assert {'greedy_1', 'greedy_3', 'accept_t1_3', 'chain', 'chain_t1'} <= set(evals[-1])
  assert all(0 <= evals[-1][f'accept_t1_{k}'] <= 1 for k in (1, 2, 3))
  train = [r for r in records if r['kind'] == 'train']
  assert train[-1]['loss'] < train[0]['loss']
  for name in ('loss.png', 'acceptance.png', 'drafter/config.json', 'drafter/model.safetensors'):
    assert (straight / name).is_file(), name
  info = json.loads((straight / 'drafter' / 'config.json').read_text())['specjax']
  assert info['steps'] == STEPS and info['anchors'] == 8
  target = loader.load_model('tiny')
  drafter, draft_params = registry.build_draft(f'dflash:{straight / "drafter"}', target)
  assert drafter.cfg.block_size == 4 and drafter.cfg.draft_vocab == 64
  engine = Engine(
    target.params, target.cfg, eos_id=-1, cache_size=128, drafter=drafter,
    draft_params=draft_params,
  )  # fmt: skip
  prompts = [target.tokenizer.encode_chat(p) for p in ('Hello there', 'def f(x):')]
  reference = engine.generate(prompts, max_new_tokens=24).tokens
  for gamma in (1, 3):
    assert engine.generate(prompts, Method.chain(gamma), max_new_tokens=24).tokens == reference


def test_an_interrupted_run_resumes_to_the_same_parameters(runs):
  straight, interrupted, cut_at, _ = runs
  assert cut_at == 5
  step_a, state_a = _final_state(straight)
  step_b, state_b = _final_state(interrupted)
  assert step_a == step_b == STEPS
  for a, b in zip(jax_leaves(state_a), jax_leaves(state_b), strict=True):
    np.testing.assert_array_equal(a, b)


def test_the_config_trains_on_the_eagle_heads_feature_data():
  from configs import dflash_smollm2, eagle_smollm2

  for arg in ('', 'tiny'):
    c, e = dflash_smollm2.get_config(arg), eagle_smollm2.get_config(arg)
    assert c.data.to_dict() == e.data.to_dict() and c.kind == 'dflash'
  assert tuple(dflash_smollm2.get_config().drafter.capture) == eagle_model.default_capture(30)
  assert tuple(dflash_smollm2.get_config('tiny').drafter.capture) == eagle_model.default_capture(2)
  c = dflash_smollm2.get_config('block=8,layers=1,anchors=4')
  assert (c.drafter.block_size, c.drafter.layers, c.anchors, c.loss_decay) == (8, 1, 4, 4.0)
