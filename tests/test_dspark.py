"""DSpark's heads on a DFlash block drafter: the chain is drawn position by position with
each position's q as the Markov head gives it (what a teacher-forced pass over the drawn
tokens computes), confidences are probabilities, greedy identity, lossless sampling."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import registry, testing
from specjax.checkpoints import dspark as dspark_ckpt
from specjax.checkpoints import loader
from specjax.control import scheduled
from specjax.control.adaptive import AdaptiveConfig
from specjax.core.sampling import SamplingConfig
from specjax.decode import method as method_lib
from specjax.decode.engine import Engine
from specjax.decode.method import Method
from specjax.decode.prefill import prefill
from specjax.drafters.dflash import DFlashDrafter
from specjax.drafters.dspark import DSparkDrafter
from specjax.models import dflash as dflash_model
from specjax.models import dspark as dspark_model
from tests.test_dflash import PROMPTS, make_drafter


def trained_heads(cfg, dc, rank=4, seed=7):
  """Heads with a Markov bias and confidences that matter (an untrained W2 is zero)."""
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  heads = dspark_model.init_params(cfg.vocab_size, dc.draft_vocab, dc.d_model, rank, k1)
  heads['w1'] = heads['w1'] * 50.0  # normal(0, 1)
  heads['w2'] = np.asarray(jax.random.normal(k2, heads['w2'].shape))
  heads['conf_w'] = np.asarray(jax.random.normal(k3, heads['conf_w'].shape)) * 0.5
  heads['conf_b'] = np.float32(0.5)
  return heads


def engine_for(target, dc, dp, heads, cache_size=128):
  cfg, params = target
  return Engine(
    params,
    cfg,
    eos_id=-1,
    cache_size=cache_size,
    drafter=DSparkDrafter(dc),
    draft_params={'block': dp, 'embed': params['embed'], 'heads': heads},
  )


def test_the_chain_is_the_markov_heads_distributions_over_the_drawn_tokens():
  """Sampled at T = 1: each drawn position's q equals the Markov head over the token
  drawn before it (all positions at once, given the draws), the first g positions are
  the same for any gamma >= g, and the confidences are the sigmoid of the block's states,
  in (0, 1) and the same whatever the key (nothing drawn is read)."""
  target = testing.tiny_model(seed=21, vocab_size=8, n_layers=3, scale=0.3)
  cfg, params = target
  dc, dp = make_drafter(target, block=5, vocab_ids=[0, 1, 2, 4, 5, 7], seed=1)
  heads = trained_heads(cfg, dc)
  drafter = DSparkDrafter(dc)
  method = Method.chain(4)
  draft_params = {'block': dp, 'embed': params['embed'], 'heads': heads}
  t1 = SamplingConfig(temperature=1.0)
  state = prefill(
    {'target': params, 'draft': draft_params}, jnp.asarray([PROMPTS[1], PROMPTS[3] + [0] * 6]) % 8,
    jnp.asarray([len(PROMPTS[1]), len(PROMPTS[3])]), jnp.asarray([20, 20]), jax.random.key(0),
    cfg=cfg, method=method, drafter=drafter, sampling=t1, eos_id=-1, cache_size=64, out_len=24,
  )  # fmt: skip
  ds, key = state.spec.draft, jax.random.key(3)
  tokens, q, _ = drafter.propose(draft_params, ds, state, key, 4, t1)
  shorter, _, _ = drafter.propose(draft_params, ds, state, key, 2, t1)
  np.testing.assert_array_equal(shorter, tokens[:, :2])
  cache = drafter.context(draft_params, ds, state, 4)
  states = dflash_model.block_states(dp, params['embed'], state.last_tokens, cache, dc, 4)
  base = dflash_model.head_logits(dp, states)
  previous = jnp.concatenate([state.last_tokens[:, None], tokens[:, :-1]], axis=1)
  logits = dspark_model.step(heads, base, previous)
  ids = np.asarray(dp['vocab_ids'])
  np.testing.assert_allclose(q[..., ids], jax.nn.softmax(logits, -1), rtol=1e-5, atol=1e-6)
  assert float(q[..., [3, 6]].max()) == 0.0  # outside the draft vocabulary
  # the Markov head matters: without it the drafted distributions differ
  assert float(jnp.abs(jax.nn.softmax(base, -1) - jax.nn.softmax(logits, -1)).max()) > 0.05
  conf, after = drafter.confidences(draft_params, ds, state, 4)
  want = 1 / (1 + np.exp(-(np.asarray(states) @ heads['conf_w'] + heads['conf_b'])))
  np.testing.assert_allclose(conf, want, rtol=1e-5)
  assert np.all((np.asarray(conf) > 0) & (np.asarray(conf) < 1))
  np.testing.assert_array_equal(after.cache.lengths, cache.lengths)


@pytest.mark.parametrize('verifier', ['rejection'])  # (every verifier: tests/test_dflash.py)
def test_dspark_greedy_equals_target_greedy(verifier):
  target = testing.tiny_model(seed=3, n_layers=3)
  cfg, params = target
  dc, dp = make_drafter(target, block=4)
  engine = engine_for(target, dc, dp, trained_heads(cfg, dc))
  reference = engine.generate(PROMPTS, max_new_tokens=24).tokens
  for gamma in (1, 3):
    assert (
      engine.generate(PROMPTS, Method.chain(gamma, verifier), max_new_tokens=24).tokens == reference
    )


@pytest.mark.parametrize('verifier', ['rejection'])  # (block verification: test_dflash.py)
def test_dspark_sampling_is_lossless(verifier):
  """Chi-square of 3-token continuations at T = 1 against the exact target distribution,
  with a draft vocabulary that leaves two of eight tokens out and a Markov head whose
  distributions depend on the tokens drawn before."""
  from tests.test_speculative import chi_square_pvalue, exact_continuations

  target = testing.tiny_model(seed=21, vocab_size=8, n_layers=2, scale=0.3)
  cfg, params = target
  dc, dp = make_drafter(target, block=4, vocab_ids=[0, 1, 2, 4, 5, 7], seed=5)
  engine = engine_for(target, dc, dp, trained_heads(cfg, dc), cache_size=16)
  sampling = SamplingConfig(temperature=1.0)
  probs = exact_continuations(cfg, params, sampling)
  out = engine.generate(
    [[1, 5, 2]] * 30000, Method.chain(3, verifier), max_new_tokens=3, sampling=sampling, seed=0
  )
  assert chi_square_pvalue(np.array(out.tokens), probs) > 1e-3


def test_dspark_specs():
  target = testing.tiny_model(seed=3, n_layers=3)
  drafter, params = registry.build_draft(
    'dspark:random,block=3,rank=8', loader.LoadedModel(*target, None, 'tiny')
  )
  assert isinstance(drafter, DSparkDrafter) and params['heads']['w1'].shape == (64, 8)
  assert 'untrained' in drafter.name and not np.any(params['heads']['w2'])
  for spec, message in {
    'dspark:rank=8': 'expected dspark',
    'dspark:random,rank=0': 'rank >= 1',
    'dspark:random,rnk=2': "unknown option 'rnk'",
    'dspark:/nowhere': 'no DSpark drafter at',
  }.items():
    with pytest.raises(ValueError, match=message):
      registry.parse_draft(spec)


def test_the_shipped_drafter_is_what_both_specs_find_and_fits_smollm2():
  from specjax.drafters import dflash as dflash_drafter

  for spec in ('dflash', 'dspark'):
    assert registry.parse_draft(spec)[1] == dflash_drafter.SHIPPED
  cfg, _, heads, info = dspark_ckpt.load(dflash_drafter.SHIPPED)
  assert (cfg.vocab_size, cfg.d_model, cfg.capture) == (49152, 576, (2, 15, 27))
  assert cfg.block_size == 16 and heads['w1'].shape == (49152, 32)
  assert info['block']['steps'] == 1200 and info['heads']['steps'] == 200  # README's commands
  files = list(pathlib.Path(dflash_drafter.SHIPPED).iterdir())
  assert all(f.stat().st_size <= 25 * 10**6 for f in files), files  # the repository's limit


def test_expected_tokens_and_the_shared_choice():
  conf = jnp.asarray([[0.9, 0.9, 0.9, 0.9], [0.1, 0.5, 0.5, 0.5]])
  tokens = scheduled.expected_tokens(conf, (1, 2, 4))
  np.testing.assert_allclose(
    tokens[0], [1, 1.9, 1.9 + 0.81, 1.9 + 0.81 + 0.729 + 0.6561], rtol=1e-6
  )
  cfg = AdaptiveConfig(gammas=(1, 2, 4), draft_cost=(0.2, 0.2, 0.2), verify_cost=(1.1, 1.2, 1.4),
                       schedule='confidence')  # fmt: skip
  # costs 1.3, 1.4, 1.6 steps: the sure row alone runs gamma 4 (4.10 tokens / 1.6 = 2.56
  # a step), the unsure one alone plain steps (gamma 1: 1.1 / 1.3 < 1); together the batch
  # shares one width, and gamma 4 still does best (7.66 / 1.6 against 4 / 1 and 3.0 / 1.3)
  assert int(scheduled.choose(cfg, conf, jnp.asarray([False, True]))) == 3
  assert int(scheduled.choose(cfg, conf, jnp.asarray([True, False]))) == 0
  assert int(scheduled.choose(cfg, conf, jnp.asarray([False, False]))) == 3
  with pytest.raises(ValueError, match="'controller' or 'confidence'"):
    AdaptiveConfig(schedule='sometimes')


@pytest.mark.parametrize('verifier', ['rejection'])
def test_confidence_scheduled_verification_is_the_target_greedy(verifier):
  """Greedy identity with the arm chosen from the confidences every iteration; the
  choices vary (plain steps and several chain lengths run) and, with every confidence
  near 1, the longest chain runs throughout."""
  target = testing.tiny_model(seed=3, n_layers=3)
  cfg, params = target
  dc, dp = make_drafter(target, block=5)
  heads = trained_heads(cfg, dc)
  engine = engine_for(target, dc, dp, heads)
  reference = engine.generate(PROMPTS, max_new_tokens=24).tokens
  sched = AdaptiveConfig(gammas=(1, 2, 4), draft_cost=(0.3,) * 3, verify_cost=(1.1, 1.6, 2.6),
                         schedule='confidence')  # fmt: skip
  out = engine.generate(PROMPTS, Method.adaptive(sched, verifier), max_new_tokens=24)
  assert out.tokens == reference
  drafted = {d for row in out.drafted for d in row}
  assert len(drafted) > 1, drafted  # the schedule moved between settings
  sure = dict(heads, conf_b=np.float32(20.0), conf_w=np.zeros_like(heads['conf_w']))
  out = engine_for(target, dc, dp, sure).generate(
    PROMPTS, Method.adaptive(sched, verifier), max_new_tokens=24
  )
  assert out.tokens == reference
  assert {d for row in out.drafted for d in row} == {4}


def test_confidence_scheduled_sampling_is_lossless():
  """Chi-square at T = 1 with the verification length chosen from the confidences (of
  the block's states, never of the drawn tokens) and a reduced draft vocabulary."""
  from tests.test_speculative import chi_square_pvalue, exact_continuations

  target = testing.tiny_model(seed=21, vocab_size=8, n_layers=2, scale=0.3)
  cfg, params = target
  dc, dp = make_drafter(target, block=4, vocab_ids=[0, 1, 2, 4, 5, 7], seed=5)
  engine = engine_for(target, dc, dp, trained_heads(cfg, dc), cache_size=16)
  sampling = SamplingConfig(temperature=1.0)
  probs = exact_continuations(cfg, params, sampling)
  sched = AdaptiveConfig(gammas=(1, 3), draft_cost=(0.3, 0.3), verify_cost=(1.05, 1.2),
                         schedule='confidence')  # fmt: skip
  out = engine.generate(
    [[1, 5, 2]] * 30000, Method.adaptive(sched), max_new_tokens=3, sampling=sampling, seed=0
  )
  assert chi_square_pvalue(np.array(out.tokens), probs) > 1e-3


def test_a_confidence_schedule_needs_a_confidence_head():
  target = testing.tiny_model(seed=3, n_layers=3)
  dc, _ = make_drafter(target, block=5)
  sched = AdaptiveConfig(gammas=(1, 2), schedule='confidence')
  with pytest.raises(ValueError, match='needs a drafter with a confidence head'):
    method_lib.check(Method.adaptive(sched), DFlashDrafter(dc))


def test_a_scheduled_method_runs_through_the_harness(tmp_path):
  """'<draft>@scheduled' from the config to the loop: costs measured, the adaptive config
  built with the confidence schedule, greedy output the target's; a draft without a
  confidence head is refused before any model loads."""
  from specjax.harness import run_config, run_lib
  from tests.test_run import tiny_config

  config = tiny_config(num_prompts=2, drafts=('dspark:random',), methods='dspark:random@scheduled')
  summary = run_lib.main(config, str(tmp_path), verbose=False)
  assert summary['methods']['dspark:random@scheduled']['greedy_mismatches'] == 0
  method = run_config.parse_method('dspark:random@scheduled')
  assert method.is_adaptive and method.schedule == 'confidence'
  with pytest.raises(ValueError, match='needs a draft with a confidence head'):
    run_config.parse_method('ngram@scheduled')


@pytest.mark.parametrize('kind', ['dflash', 'dspark'])
def test_trees_from_block_marginals_are_the_target_greedy(kind):
  """Static and dynamic trees whose nodes at each depth come from the block's
  distribution there (DSpark's shifted by each node's own token): greedy identity; a
  tree deeper than the block is refused."""
  from specjax.core import tree as tree_lib

  target = testing.tiny_model(seed=3, n_layers=3)
  cfg, params = target
  dc, dp = make_drafter(target, block=5)
  if kind == 'dflash':
    engine = Engine(params, cfg, eos_id=-1, cache_size=128, drafter=DFlashDrafter(dc),
                    draft_params={'block': dp, 'embed': params['embed']})  # fmt: skip
  else:
    engine = engine_for(target, dc, dp, trained_heads(cfg, dc))
  reference = engine.generate(PROMPTS, max_new_tokens=24).tokens
  for text in ('2x2x1', 'dynamic:8-3-3'):
    out = engine.generate(PROMPTS, Method.tree(tree_lib.parse_tree(text)), max_new_tokens=24)
    assert out.tokens == reference, text
  with pytest.raises(ValueError, match='trees of depth at most 4'):
    engine.generate(PROMPTS, Method.tree(tree_lib.parse_tree('chain:5')), max_new_tokens=8)


def test_dspark_tree_sampling_is_lossless():
  """Chi-square at T = 1 with a static tree whose siblings are drawn without replacement
  from each node's Markov-shifted block distribution, over a reduced draft vocabulary."""
  from specjax.core import tree as tree_lib
  from tests.test_speculative import chi_square_pvalue, exact_continuations

  target = testing.tiny_model(seed=21, vocab_size=8, n_layers=2, scale=0.3)
  cfg, params = target
  dc, dp = make_drafter(target, block=4, vocab_ids=[0, 1, 2, 4, 5, 7], seed=5)
  engine = engine_for(target, dc, dp, trained_heads(cfg, dc), cache_size=24)
  sampling = SamplingConfig(temperature=1.0)
  probs = exact_continuations(cfg, params, sampling)
  spec = tree_lib.parse_tree('2x2x1')
  out = engine.generate(
    [[1, 5, 2]] * 30000, Method.tree(spec), max_new_tokens=3, sampling=sampling, seed=0
  )
  assert chi_square_pvalue(np.array(out.tokens), probs) > 1e-3
