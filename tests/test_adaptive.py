"""Adaptive draft length: the controller on synthetic acceptance, and the adaptive loop
(greedy identity, a draft cache that catches up after plain steps, lossless sampling)."""

import dataclasses
import types

import jax
import numpy as np
import pytest

from specjax import testing
from specjax.control import adaptive, cost_model
from specjax.core.sampling import SamplingConfig
from specjax.core.tree import parse_shape, parse_tree
from specjax.decode.engine import Engine
from specjax.decode.method import Method
from specjax.drafters import ModelDrafter, NgramDrafter, truncated_target

# Costs of a cheapish draft in target-step units (c ~ 0.1, verify grows with gamma).
COSTS = dict(gammas=(1, 2, 4), draft_cost=(0.1, 0.2, 0.4), verify_cost=(1.05, 1.1, 1.2))


def run(config, segments, seed=0, batch=1):
  probs = np.concatenate([np.full(n, p) for p, n in segments])
  ran, ctrl = adaptive.simulate(config, probs, jax.random.key(seed), batch)
  return np.asarray(config.choices)[np.asarray(ran)], ctrl


def test_turns_off_when_acceptance_collapses_and_back_on_when_it_recovers():
  config = adaptive.AdaptiveConfig(**COSTS)
  for seed in range(3):
    gammas, _ = run(config, [(0.8, 300), (0.02, 500), (0.8, 500)], seed)
    good, bad, again = gammas[:300], gammas[300:800], gammas[800:]
    # alpha 0.8 pays best at the largest gamma (climbing there from the prior's choice
    # takes up to ~80 iterations: gamma 4 beats 2 by only 12%, near the hysteresis margin)
    assert np.mean(good[100:] == 4) > 0.9
    assert np.mean(bad[100:] == 0) > 0.95  # off, apart from probes...
    assert np.mean(bad[200:] > 0) <= 0.02  # ...which back off while they fail
    assert np.mean(again[250:] > 0) > 0.95  # probes noticed the recovery


def test_no_flapping():
  config = adaptive.AdaptiveConfig(**COSTS)
  for alpha in (0.0, 0.1, 0.15, 0.3, 0.6, 0.9):  # break-even for gamma=1 is alpha ~ 0.2
    _, ctrl = run(config, [(alpha, 2000)], seed=1)
    assert int(ctrl.toggles) <= 6, (alpha, int(ctrl.toggles))  # on <-> off
    assert int(ctrl.switches) <= 40, (alpha, int(ctrl.switches))  # any change of gamma


def test_without_hysteresis_the_same_sequence_flaps_more():
  # The no-flapping test has power: hysteresis is what keeps the switches down.
  loose = adaptive.AdaptiveConfig(**COSTS, hysteresis=0.0, decay=0.7)
  tight = adaptive.AdaptiveConfig(**COSTS)
  _, ctrl_loose = run(loose, [(0.25, 2000)], seed=2)
  _, ctrl_tight = run(tight, [(0.25, 2000)], seed=2)
  assert int(ctrl_loose.toggles) > 3 * max(int(ctrl_tight.toggles), 1)


def test_a_draft_that_never_pays_stays_off():
  config = adaptive.AdaptiveConfig(gammas=(1, 2), draft_cost=(1.0, 2.0), verify_cost=(1.2, 1.4))
  gammas, _ = run(config, [(0.9, 500)])
  assert np.mean(gammas[50:] == 0) > 0.9  # even alpha 0.9 cannot pay for a draft this slow


# A draft four times as dear as a target step per token (the quantized self-draft on a CPU
# whose 8-bit kernels fall back: c = 3.87), feeding skipped tokens at the same price.
DEAR = dict(
  gammas=(1, 2, 4), draft_cost=(4.0, 8.0, 16.0), verify_cost=(1.05, 1.1, 1.2), catch_up_cost=4.0
)


def test_a_draft_dearer_than_a_target_step_never_turns_on():
  """Even accepting 99% of its tokens, a draft with c = 4 cannot pay: no start on it, no
  probes (a probe that keeps every token still costs 5 steps for 2 tokens)."""
  config = adaptive.AdaptiveConfig(**DEAR)
  assert not config.can_pay and config.ceiling < 1
  for seed in range(2):
    gammas, ctrl = run(config, [(0.99, 2000)], seed)
    assert np.all(gammas == 0) and int(ctrl.switches) == 0
  # A free catch-up does not rescue it, and a prior sure of every token does not start it.
  for more in (dict(catch_up_cost=0.0), dict(prior_alpha=1.0, probe_every=1)):
    gammas, _ = run(dataclasses.replace(config, **more), [(1.0, 500)])
    assert np.all(gammas == 0)


def test_turning_on_pays_the_catch_up():
  """Between plain steps a draft model falls behind and catches up when it drafts again.
  Charged: at alpha 0.7 a draft that pays in step (2.19 tokens for 1.7 steps, 1.29x) is
  not turned on (0.995x with a catch-up of 0.5 per iteration) but, once on, kept on; one
  that could not pay its catch-up even at alpha 1 is never probed."""
  import jax.numpy as jnp

  base = dict(gammas=(2,), draft_cost=(0.6,), verify_cost=(1.1,))
  free = adaptive.AdaptiveConfig(**base)
  charged = adaptive.AdaptiveConfig(**base, catch_up_cost=0.5)
  hopeless = adaptive.AdaptiveConfig(**base, catch_up_cost=1.2)
  assert free.can_pay and charged.can_pay and not hopeless.can_pay
  a = jnp.full((2, 1), 0.7)
  assert int(adaptive._decide(free, 0, a)) == 1
  assert int(adaptive._decide(charged, 0, a)) == 0
  assert int(adaptive._decide(charged, 1, a)) == 1
  for seed in range(2):
    gammas, _ = run(charged, [(0.95, 500)], seed)
    assert np.mean(gammas[100:] > 0) > 0.9  # 2.85 tokens for 2.2 steps with the catch-up
    gammas, _ = run(hopeless, [(0.95, 500)], seed)
    assert np.all(gammas == 0)


def _replay(config, start, misses=2, iterations=16):
  """The settings a controller chooses when it runs `start` [(gamma, kept)] first, then its
  own choices: a miss at depth 2 for `misses` more iterations, every drafted token kept
  after."""
  ctrl, ran = adaptive.init(config), []
  for i in range(iterations):
    arm = int(adaptive.choose(config, ctrl))
    gamma = config.choices[arm]
    ran.append(gamma)
    if i < len(start):
      gamma, kept = start[i]
      arm = config.choices.index(gamma)
    else:
      kept = min(gamma, 1) if i < len(start) + misses else gamma
    ctrl = adaptive.update(config, ctrl, arm, np.array([kept]), np.array([gamma]))
  return ran


def test_stale_misses_at_one_depth_do_not_pin_a_short_chain():
  # The quantized draft's costs on HumanEval (issue 27) and that run's first iterations
  # after its probe: two misses at depth 2 in a row; at gamma 1 depth 2 is never tried
  # again, so only the rank's pooled rate can lift its estimate.
  config = adaptive.AdaptiveConfig(
    gammas=(1, 2, 4), draft_cost=(0.449, 0.773, 1.335), verify_cost=(1.119, 1.173, 1.505)
  )
  start = [(0, 0)] * 16 + [(1, 1), (4, 4), (4, 1), (2, 1)]
  ran = _replay(config, start, misses=0, iterations=40)
  assert 1 not in ran[20:], ran
  # Depth 2 as a cell of its own at weight 0.5 (before) stayed at gamma 1 throughout.
  old = _replay(dataclasses.replace(config, cell_weight=0.5), start, misses=0, iterations=40)
  assert old[20:] == [1] * 20, old


def test_a_draft_the_prior_leaves_off_is_probed_at_once():
  """The quantized draft's costs on HumanEval (issue 27): the prior (alpha 0.5) predicts no
  pay, so the controller starts off; it probes at the first iteration and, accepting 0.97,
  stays on. Without probe_first it ran probe_every plain steps first."""
  config = adaptive.AdaptiveConfig(
    gammas=(1, 2, 4), draft_cost=(0.449, 0.773, 1.335), verify_cost=(1.119, 1.173, 1.505)
  )
  ctrl = adaptive.init(config)
  assert int(ctrl.choice) == 0  # the prior leaves it off...
  assert int(adaptive.choose(config, ctrl)) > 0  # ...and the first iteration is a probe
  for seed in range(2):
    gammas, _ = run(config, [(0.97, 40)], seed)
    assert gammas[0] > 0 and np.all(gammas[:40] > 0), gammas
  late = dataclasses.replace(config, probe_first=False)
  gammas, _ = run(late, [(0.97, 40)])
  assert np.all(gammas[: late.probe_every] == 0) and gammas[late.probe_every] > 0, gammas
  # A first probe that fails waits probe_every plain steps, as any probe does, not none.
  gammas, _ = run(config, [(0.0, 40)])
  assert gammas[0] > 0 and np.all(gammas[1 : 1 + config.probe_every] == 0), gammas
  # A draft that cannot pay is still never probed, first iteration included.
  dear = adaptive.AdaptiveConfig(**DEAR)
  assert int(adaptive.choose(dear, adaptive.init(dear))) == 0


def test_bad_settings_are_named():
  with pytest.raises(ValueError, match='increasing integers >= 1'):
    adaptive.AdaptiveConfig(gammas=(2, 1))
  with pytest.raises(ValueError, match='draft_cost needs one non-negative cost per gamma'):
    adaptive.AdaptiveConfig(gammas=(1, 2), draft_cost=(0.1,))
  with pytest.raises(ValueError, match='decay'):
    adaptive.AdaptiveConfig(decay=0.0)


# Trees: a chain draws a chain's acceptance; '3x2x1' gains from ranks 1 and 2.
TREE = parse_shape('3x2x1')  # 15 nodes


def test_the_rank_model_learns_each_ranks_acceptance():
  """Siblings tried in order, each accepted with alpha: rank r is the accepted one with
  probability alpha (1 - alpha)^r, which the controller's counts must recover."""
  config = adaptive.AdaptiveConfig(gammas=(), trees=(TREE,), decay=1.0, start_on=True)
  ran, ctrl = adaptive.simulate(config, np.full(3000, 0.5), jax.random.key(0))
  assert np.all(np.asarray(ran) == 1)
  a = np.asarray(adaptive.alpha(config, ctrl))
  np.testing.assert_allclose(a[:, 0], 0.5, atol=0.03)
  np.testing.assert_allclose(a[0, 1:], [0.25, 0.125], atol=0.03)
  np.testing.assert_allclose(a[1, 1], 0.25, atol=0.03)


def test_the_controllers_counts_agree_with_the_cost_models_rank_acceptance():
  """adaptive._tree_counts (jnp, in the loop) and cost_model.rank_acceptance (NumPy, from a
  run's records) are one notion of depth/rank acceptance: the same stops give the same
  trials and rates."""
  import jax.numpy as jnp

  shape = parse_shape('3x2x1')
  config = adaptive.AdaptiveConfig(gammas=(1,), trees=(shape,))
  stops = np.random.default_rng(0).integers(0, shape.size + 1, 200)
  s, f = adaptive._tree_counts(config, shape, jnp.asarray(stops), jnp.ones(200, bool))
  s, f = np.asarray(s)[: shape.depth], np.asarray(f)[: shape.depth]
  accept, trials = cost_model.rank_acceptance(shape, stops, max_rank=config.ranks)
  np.testing.assert_array_equal(s + f, trials)
  tried = trials > 0
  np.testing.assert_allclose((s / np.maximum(s + f, 1))[tried], accept[tried], atol=1e-6)
  assert tried[0].sum() == 3 and tried[1].sum() == 2 and tried[2].sum() == 1


def test_a_tree_that_pays_is_chosen_and_one_that_does_not_is_only_probed():
  chains = dict(gammas=(1, 2, 3), draft_cost=(0.0,) * 3, verify_cost=(1.1, 1.1, 1.1))
  # alpha 0.5: the chain of 3 makes 1.88 tokens (1.70x), the tree 2.86 (2.2x at cost 1.3).
  cheap = adaptive.AdaptiveConfig(**chains, trees=(TREE,), tree_verify_cost=(1.3,))
  dear = adaptive.AdaptiveConfig(**chains, trees=(TREE,), tree_verify_cost=(2.5,))
  for seed in range(2):
    ran, _ = run_arms(cheap, [(0.5, 600)], seed)
    assert np.mean(ran[100:] == 4) > 0.95
    ran, _ = run_arms(dear, [(0.5, 600)], seed)
    assert np.mean(ran[100:] == 3) > 0.9  # the chain of 3...
    assert 0 < np.mean(ran[100:] == 4) <= 1.5 / dear.explore_every  # ...and tree probes
    # At alpha 0.98 a chain keeps nearly everything: the tree's extra nodes buy nothing.
    ran, _ = run_arms(cheap, [(0.98, 600)], seed)
    assert np.mean(ran[100:] == 3) > 0.9


def test_tree_settings_are_checked():
  with pytest.raises(ValueError, match='static shapes'):
    adaptive.AdaptiveConfig(trees=(parse_tree('dynamic:8-3-2'),))
  with pytest.raises(ValueError, match='tree_verify_cost needs one non-negative cost per tree'):
    adaptive.AdaptiveConfig(trees=(TREE,), tree_verify_cost=(1.0, 2.0))
  with pytest.raises(ValueError, match='at least one draft length or tree'):
    adaptive.AdaptiveConfig(gammas=())
  with pytest.raises(ValueError, match='no measured cost for the tree'):
    adaptive.AdaptiveConfig.from_costs(
      cost_model.Costs(1, 64, 10.0, {1: 1.0}, {1: 11.0}), trees=(TREE,)
    )


def run_arms(config, segments, seed=0):
  probs = np.concatenate([np.full(n, p) for p, n in segments])
  ran, ctrl = adaptive.simulate(config, probs, jax.random.key(seed))
  return np.asarray(ran), ctrl


# ---------------------------------------------------------------------------------------------
# The adaptive loop.

PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3], [7], [2, 7, 1, 8, 2, 8, 1]]
# Settings that switch often: a pessimistic start, frequent probes, no hysteresis.
JUMPY = adaptive.AdaptiveConfig(
  gammas=(1, 3, 5),
  draft_cost=(0.3, 0.9, 1.5),
  verify_cost=(1.0, 1.0, 1.0),
  prior_alpha=0.0,
  hysteresis=0.0,
  probe_every=3,
  start_on=False,
  probe_first=False,  # plain steps first: the loop tests need both kinds of iteration
  decay=0.5,
)


@pytest.fixture(scope='module')
def target():
  return testing.tiny_model(seed=3, n_layers=3)


def engine_with(target, drafter, draft_params, cache=128):
  cfg, params = target
  return Engine(
    params, cfg, eos_id=-1, cache_size=cache, drafter=drafter, draft_params=draft_params
  )


def drafts(target):
  cfg, params = target
  small_cfg, small = testing.tiny_model(seed=11, n_layers=1, d_model=16, n_heads=2, n_kv_heads=1)
  trunc_cfg, trunc = truncated_target(cfg, params, 1)
  from specjax.drafters.distilled import DistilledDrafter, init_from_target

  dist_cfg, dist = init_from_target(cfg, params, (0,), np.arange(0, cfg.vocab_size, 2))
  return {
    'random tiny model': (ModelDrafter(small_cfg), small),
    'reduced-vocabulary draft': (DistilledDrafter(dist_cfg), dist),
    'truncated target': (ModelDrafter(trunc_cfg), trunc),
    'skip layers': (ModelDrafter(cfg, layers=(0, 2)), params),
    'prompt lookup': (NgramDrafter(cfg.vocab_size), None),
  }


@pytest.mark.parametrize(
  'name',
  [
    'random tiny model',
    'truncated target',
    'skip layers',
    'reduced-vocabulary draft',
    'prompt lookup',
  ],
)
def test_adaptive_greedy_equals_target_greedy(target, name):
  engine = engine_with(target, *drafts(target)[name])
  reference = engine.generate(PROMPTS, max_new_tokens=40).tokens
  drafted = set()
  for config in (JUMPY, adaptive.AdaptiveConfig(**COSTS)):
    out = engine.generate(PROMPTS, Method.adaptive(config, 'greedy'), max_new_tokens=40)
    assert out.tokens == reference
    assert (
      engine.generate(PROMPTS[1:2], Method.adaptive(config), max_new_tokens=40).tokens[0]
      == reference[1]
    )
    drafted |= {d for row in out.drafted for d in row}
  assert 0 in drafted and len(drafted) >= 3, drafted  # plain steps and two draft lengths


def test_jumpy_settings_do_switch(target):
  engine = engine_with(target, *drafts(target)['random tiny model'])
  out = engine.generate(PROMPTS, Method.adaptive(JUMPY), max_new_tokens=60)
  drafted = {d for row in out.drafted for d in row}
  assert drafted >= {0, 1}, drafted  # plain steps and probes both ran
  assert out.switches >= 1


def test_the_draft_cache_catches_up_after_plain_steps(target):
  """With the target as its own draft every draft token is accepted, unless the draft's
  cache missed the tokens of the plain steps that skipped it."""
  cfg, params = target
  engine = engine_with(target, ModelDrafter(cfg), params)
  out = engine.generate(PROMPTS, Method.adaptive(JUMPY), max_new_tokens=60)
  tried = [(a, d) for acc, dr in zip(out.accepted, out.drafted) for a, d in zip(acc, dr) if d]
  plain = sum(d == 0 for row in out.drafted for d in row)
  assert plain >= 4 and len(tried) >= 4  # it started off, probed, and turned on
  assert all(a == d for a, d in tried), tried


def iteration_speedup(out, config, row):
  """Tokens of `row` over the cost of the iterations that made them, in target steps: 1 per
  plain step; a speculative iteration's draft and verify costs, and the catch-up of the
  plain steps since the draft last ran (config.catch_up_cost each). The first token comes
  from the prefill, in every method."""
  cost, behind = 0.0, 0
  by_gamma = dict(zip(config.gammas, zip(config.draft_cost, config.verify_cost)))
  for drafted in out.drafted[row]:
    if drafted == 0:
      cost, behind = cost + 1, behind + 1
      continue
    draft, verify = by_gamma[drafted]
    cost, behind = cost + draft + verify + config.catch_up_cost * behind, 0
  return (len(out.tokens[row]) - 1) / cost


def test_a_dear_draft_in_the_loop_stays_near_autoregressive_speed(target):
  """The jitted loop under adaptive control over the target itself as its own draft (every
  token accepted, so acceptance cannot save it) at simulated costs of c = 4: counted in
  iterations, at least 0.97x autoregressive decoding on every row. The same loop with a
  cheap draft (c = 0.1) turns on and pays."""
  cfg, params = target
  engine = engine_with(target, ModelDrafter(cfg), params)
  dear = adaptive.AdaptiveConfig(**DEAR)
  cheap = adaptive.AdaptiveConfig(**COSTS, catch_up_cost=0.1)
  for config, low, high in ((dear, 0.97, 1.0), (cheap, 1.5, None)):
    out = engine.generate(PROMPTS, Method.adaptive(config), max_new_tokens=80)
    for row in range(len(PROMPTS)):
      speedup = iteration_speedup(out, config, row)
      assert speedup >= low and (high is None or speedup <= high), (row, speedup, out.drafted)


def test_control_carries_over_between_batches(target):
  cfg, params = target
  engine = engine_with(target, ModelDrafter(cfg), params)
  first = engine.generate(PROMPTS, Method.adaptive(JUMPY), max_new_tokens=30)
  second = engine.generate(PROMPTS, Method.adaptive(JUMPY), max_new_tokens=30)
  plain = lambda out: sum(d == 0 for row in out.drafted for d in row)
  assert plain(first) > 0 and plain(second) == 0  # it already knows the draft is perfect
  engine.reset_control()
  assert plain(engine.generate(PROMPTS, Method.adaptive(JUMPY), max_new_tokens=30)) == plain(first)


@pytest.mark.parametrize('trees', [False, True], ids=['chains', 'chains and trees'])
def test_adaptive_sampling_matches_the_target(trees):
  """30,000 sampled 4-token continuations against the exact target distribution."""
  import itertools

  import jax.numpy as jnp
  from scipy import stats

  from specjax.core.sampling import probabilities
  from specjax.models import llama
  from specjax.models.kv_cache import KVCache

  vocab, prompt, n = 4, [1, 2], 30000
  cfg, params = testing.tiny_model(seed=21, vocab_size=vocab, n_layers=2, scale=0.5)
  draft_cfg, draft = testing.tiny_model(seed=22, vocab_size=vocab, n_layers=1, scale=0.5)
  engine = Engine(
    params, cfg, eos_id=-1, cache_size=16, drafter=ModelDrafter(draft_cfg), draft_params=draft
  )
  sampling = SamplingConfig(temperature=1.0)
  # Starts off, probes after one plain step, then drafts: both kinds of iteration run.
  more = dict(trees=(parse_shape('2x1'),), explore_every=1) if trees else {}
  # With trees: a '2x1' tree (4 nodes) every other iteration while on.
  config = adaptive.AdaptiveConfig(
    gammas=(1, 2), start_on=False, probe_first=False, probe_every=1, **more
  )
  out = engine.generate(
    [prompt] * n, Method.adaptive(config), max_new_tokens=4, sampling=sampling, seed=5
  )
  assert {d for row in out.drafted for d in row} >= ({0, 4} if trees else {0, 2})

  seqs = np.array(list(itertools.product(range(vocab), repeat=4)))
  tokens = jnp.asarray(np.concatenate([np.tile(prompt, (len(seqs), 1)), seqs], 1))
  logits, _ = llama.forward(params, tokens, KVCache.init(cfg, len(seqs), 8), cfg)[:2]
  probs = np.asarray(probabilities(logits, sampling), np.float64)
  exact = np.prod(
    [probs[np.arange(len(seqs)), len(prompt) - 1 + j, seqs[:, j]] for j in range(4)], axis=0
  )
  counts = np.bincount(np.array(out.tokens) @ (vocab ** np.arange(4)[::-1]), minlength=len(seqs))
  expected = exact / exact.sum() * n
  big = expected >= 5
  obs = np.append(counts[big], counts[~big].sum())
  exp = np.append(expected[big], expected[~big].sum())
  assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3


# Adaptive control with trees in the loop: settings that visit off, a chain and a tree.
WITH_TREES = adaptive.AdaptiveConfig(
  gammas=(2,),
  trees=(parse_shape('2x2x1'),),  # 2 + 4 + 4 = 10 nodes
  draft_cost=(0.3,),
  verify_cost=(1.0,),
  tree_draft_cost=(0.6,),
  tree_verify_cost=(1.2,),
  prior_alpha=0.0,
  hysteresis=0.0,
  probe_every=2,
  explore_every=3,
  start_on=False,
  probe_first=False,
  decay=0.5,
)


@pytest.mark.parametrize('name', ['random tiny model', 'skip layers', 'reduced-vocabulary draft'])
def test_adaptive_trees_greedy_equals_target_greedy(target, name):
  engine = engine_with(target, *drafts(target)[name])
  reference = engine.generate(PROMPTS, max_new_tokens=40).tokens
  drafted = set()
  # The second starts on the tree: its prior thinks every draft token is accepted, and the
  # tree's 4 tokens at a cost of 1.4 then beat the chain's 3 at 1.3.
  starts_on_tree = dataclasses.replace(
    WITH_TREES, prior_alpha=1.0, start_on=True, tree_draft_cost=(0.2,)
  )
  for config in (WITH_TREES, starts_on_tree):
    out = engine.generate(PROMPTS, Method.adaptive(config, 'greedy'), max_new_tokens=40)
    assert out.tokens == reference
    drafted |= {d for row in out.drafted for d in row}
    assert (
      engine.generate(PROMPTS[1:2], Method.adaptive(config), max_new_tokens=40).tokens[0]
      == reference[1]
    )
  assert drafted >= {0, 2, 10}, drafted  # plain steps, chains and trees all ran


def test_the_segmented_loop_equals_one_switch_per_iteration(target):
  """decode runs each setting in an inner loop of its own; stepping one lax.switch per
  iteration must give the same tokens, records and controller state."""
  import jax.numpy as jnp

  from specjax.decode import loop
  from specjax.decode.prefill import prefill

  cfg, params = target
  drafter, small = drafts(target)['random tiny model']
  engine = engine_with(target, drafter, small)
  method = Method.adaptive(WITH_TREES)
  sampling = SamplingConfig(temperature=1.0)
  tokens, lengths, max_new, out_len, cache = engine.prepare(PROMPTS, 24, method.spare)
  kw = dict(
    cfg=cfg, method=method, drafter=engine.drafter_for(method), sampling=sampling, eos_id=-1
  )
  p = {'target': params, 'draft': small}
  start = lambda: prefill(
    p,
    jnp.asarray(tokens),
    jnp.asarray(lengths),
    jnp.asarray(max_new),
    jax.random.key(3),
    cache_size=cache,
    out_len=out_len,
    **kw,
  )
  whole = jax.jit(lambda s: loop.decode(p, s, **kw))(start())
  stepped, one = start(), jax.jit(lambda s: loop.step(p, s, **kw))
  while not bool(jnp.all(stepped.done)):
    stepped = one(stepped)
  for a, b in [
    (whole.tokens, stepped.tokens),
    (whole.spec.drafted, stepped.spec.drafted),
    (whole.spec.accepted, stepped.spec.accepted),
    (whole.spec.control.successes, stepped.spec.control.successes),
    (whole.spec.control.switches, stepped.spec.control.switches),
  ]:
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert {0, 2, 10} <= set(np.asarray(whole.spec.drafted).ravel().tolist())


def test_changing_setting_copies_no_cache(target):
  """The adaptive loop changes setting without copying either model's cache: the compiled
  loop has no conditional and no copy of a cache-shaped array (a lax.switch between
  settings copied every cache layer at each change, 19 ms a change with the q4 draft)."""
  import re

  import jax.numpy as jnp

  from specjax.decode import loop
  from specjax.decode.prefill import prefill

  cfg, params = target
  drafter, small = drafts(target)['truncated target']
  engine = engine_with(target, drafter, small)
  method = Method.adaptive(JUMPY)
  tokens, lengths, max_new, out_len, cache = engine.prepare(PROMPTS, 24, method.spare)
  greedy = SamplingConfig(temperature=0.0)
  kw = dict(cfg=cfg, method=method, drafter=engine.drafter_for(method), sampling=greedy, eos_id=-1)
  p = {'target': params, 'draft': small}
  state = prefill(
    p,
    jnp.asarray(tokens),
    jnp.asarray(lengths),
    jnp.asarray(max_new),
    jax.random.key(3),
    cache_size=cache,
    out_len=out_len,
    **kw,
  )
  hlo = jax.jit(lambda s: loop.decode(p, s, **kw), donate_argnums=0).lower(state)
  hlo = hlo.compile().as_text()
  shapes = {x.shape for x in jax.tree_util.tree_leaves((state.cache, state.spec.draft))}
  shapes = {s for s in shapes if len(s) == 4}  # the layers' K and V
  assert shapes
  for shape in shapes:
    dims = re.escape(','.join(map(str, shape)))
    assert not re.search(rf'= f32\[{dims}\]\S* copy\(', hlo), shape
  assert ' conditional(' not in hlo
  # and it still changes setting
  out = engine.generate(PROMPTS, Method.adaptive(JUMPY, 'greedy'), max_new_tokens=24)
  assert len({d for row in out.drafted for d in row}) > 1


def test_adaptive_trees_are_refused_where_they_cannot_run(target):
  cfg, _ = target
  lookup = engine_with(target, NgramDrafter(cfg.vocab_size), None)
  with pytest.raises(ValueError, match='static|dynamic'):
    lookup.check(Method.adaptive(WITH_TREES))
  drafter, small = drafts(target)['random tiny model']
  with pytest.raises(ValueError, match='block verification is proved for chains only'):
    engine_with(target, drafter, small).check(Method.adaptive(WITH_TREES, 'block'))


# ---------------------------------------------------------------------------------------------
# The run: a draft that cannot pay on this machine.


def fake_costs(c):
  """Measured costs of a draft at c target steps per draft token (a target step of 10 ms)."""
  gammas = (1, 2, 4)
  return cost_model.Costs(
    1, 64, 10.0, {g: 10.0 * c * g for g in gammas}, {g: 10.0 + g for g in gammas}
  )


def test_a_run_skips_the_fixed_gammas_of_a_draft_that_cannot_pay(tmp_path, monkeypatch, capsys):
  """Costs that no acceptance can pay (c = 4) are said in one line before decoding; the
  draft's fixed-gamma methods are skipped, its adaptive method runs and never drafts."""
  import json

  from specjax import config_lib
  from specjax.harness import run_config, run_lib

  measured = {'ngram': fake_costs(0.01), 'truncated:1': fake_costs(4.0)}
  monkeypatch.setattr(
    run_lib, 'measure_costs', lambda config, engines, *a: {s: measured[s] for s in engines if s}
  )
  config = config_lib.load_config('smollm2.py', 'tiny')
  config.update(num_prompts=1)
  summary = run_lib.main(config, str(tmp_path), verbose=True)
  lines = [l for l in capsys.readouterr().out.splitlines() if 'cannot pay' in l]
  assert lines == [
    'truncated:1 cannot pay on this machine: c = 4.00 target steps per draft token, at best '
    '0.39x autoregressive even if every draft token were accepted; skipping truncated:1@4 '
    '(truncated:1@adaptive stays off)'
  ]
  assert list(summary['methods']) == [
    'autoregressive',
    'ngram@4',
    'ngram@adaptive',
    'truncated:1@adaptive',
  ]
  records = [json.loads(l) for l in (tmp_path / 'generations.jsonl').read_text().splitlines()]
  off = [r['drafted'] for r in records if r['method'] == 'truncated:1@adaptive']
  assert off and all(d == 0 for row in off for d in row)

  # Named in config.methods, they run, and the line says so.
  config.methods = 'truncated:1@4,truncated:1@adaptive'
  methods, said = run_config.build_methods(config), []
  costs = {'truncated:1': measured['truncated:1']}
  # A draft model has a cache of its own to catch up on (its kind's resync: charged).
  engines = {'truncated:1': types.SimpleNamespace(drafter=None)}
  assert run_lib.skip_hopeless(config, engines, methods, costs, said.append) == methods
  assert len(said) == 1 and said[0].endswith(
    'running truncated:1@4 as config.methods names them (truncated:1@adaptive stays off)'
  )
  # A draft that pays at some gamma is not named.
  costs = {'truncated:1': fake_costs(0.5)}  # gamma 1: 2 tokens for 1.6 steps
  assert run_lib.skip_hopeless(config, engines, methods, costs, said.append) == methods
  assert len(said) == 1
