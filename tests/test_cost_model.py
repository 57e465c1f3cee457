"""The cost model's formulas, and cost measurement on a tiny model."""

import types

import numpy as np
import pytest

from specjax import testing
from specjax.bench import costs, metrics
from specjax.control import cost_model
from specjax.decode.engine import Engine
from specjax.drafters import ModelDrafter, NgramDrafter, truncated_target


def test_expected_tokens():
  assert cost_model.expected_tokens(0.0, 4) == 1.0
  assert cost_model.expected_tokens(1.0, 4) == 5.0
  assert cost_model.expected_tokens(0.5, 2) == pytest.approx(1.75)
  # The mean of min(geometric run, gamma) + 1, by simulation.
  rng = np.random.default_rng(0)
  runs = np.cumprod(rng.random((200_000, 3)) < 0.7, axis=1).sum(1) + 1
  assert cost_model.expected_tokens(0.7, 3) == pytest.approx(runs.mean(), rel=0.01)


def test_alpha_inverts_expected_tokens():
  for alpha in (0.1, 0.5, 0.9):
    tpc = cost_model.expected_tokens(alpha, 4)
    assert cost_model.alpha_from_tokens_per_call(tpc, 4) == pytest.approx(alpha, abs=1e-6)


def test_predictions_and_best_gamma():
  free = {g: (0.0, 1.0) for g in (1, 2, 4, 8)}
  assert cost_model.best_gamma(0.9, free)[0] == 8  # a free draft: draft as much as possible
  costly = {g: (0.5 * g, 1.0 + 0.05 * g) for g in (1, 2, 4)}
  assert cost_model.best_gamma(0.3, costly) == (0, 1.0)  # never pays: off
  assert cost_model.predicted_speedup(0.8, 4, 0.4, 1.2) == pytest.approx(
    cost_model.expected_tokens(0.8, 4) / 1.6
  )
  # Iterations without a draft (no lookup match) are plain steps.
  assert cost_model.predicted_speedup(0.5, 2, 0.0, 1.0, verified_fraction=0.0) == 1.0
  alpha = cost_model.break_even_alpha(1, 0.2, 1.0)
  assert cost_model.predicted_speedup(alpha, 1, 0.2, 1.0) == pytest.approx(1.0)
  assert np.isnan(cost_model.break_even_alpha(1, 2.0, 1.0))


def test_position_acceptance_is_exact_on_bimodal_runs():
  """Prompt lookup keeps a copied span whole or fails at once: a geometric alpha gets the
  mean wrong, the per-position estimate gets it right, and extends to other gammas."""
  rng = np.random.default_rng(1)
  runs = np.where(rng.random(4000) < 0.4, 0, 12)  # 0 or every token of an unbounded draft
  for gamma in (4, 8):
    pairs = [(min(r, gamma), gamma) for r in runs]
    measured = np.mean([a + 1 for a, _ in pairs])
    accept = cost_model.position_acceptance(pairs, gamma)
    assert cost_model.expected_tokens_by_position(accept, gamma) == pytest.approx(measured)
    alpha = sum(a for a, _ in pairs) / (sum(a for a, _ in pairs) + sum(a < d for a, d in pairs))
    assert cost_model.expected_tokens(alpha, gamma) > 1.08 * measured  # over-predicts
  # From gamma 4's iterations, gamma 8 is predicted by extending the last position.
  accept4 = cost_model.position_acceptance([(min(r, 4), 4) for r in runs], 8)
  assert np.isnan(accept4[4:]).all()
  want = np.mean([min(r, 8) + 1 for r in runs])
  assert cost_model.expected_tokens_by_position(accept4, 8) == pytest.approx(want, rel=0.01)


def test_measured_costs_on_a_tiny_model():
  cfg, params = testing.tiny_model(seed=3, n_layers=4)
  draft_cfg, draft = truncated_target(cfg, params, 1)
  engine = Engine(
    params, cfg, eos_id=-1, cache_size=128, drafter=ModelDrafter(draft_cfg), draft_params=draft
  )
  # Gammas 1 and 8: seven more draft forwards, a margin that a loaded machine (the test
  # suite on two workers) does not erase, as it once did three (0.50 against 0.56 ms).
  c = costs.measure(engine, batch=2, cache_size=128, gammas=(1, 8), repeats=5)
  assert c.target_ms > 0 and set(c.draft_ms) == set(c.verify_ms) == {1, 8}
  assert c.draft_ms[8] > c.draft_ms[1] > 0  # eight draft forwards cost more than one
  assert c.units(0) == (0.0, 1.0) and c.table()[8] == c.units(8)
  assert c.c == pytest.approx(c.draft_ms[8] / 8 / c.target_ms)
  from specjax.core import tree as tree_lib

  tree = tree_lib.TreeSpec(tree_lib.parse_shape('2x2'))
  run = costs.timer_propose(engine.drafter, draft, params, cfg, 1, 0, 128, tree=tree, inner=2)
  assert run() > 0
  lookup = Engine(params, cfg, eos_id=-1, cache_size=128, drafter=NgramDrafter(cfg.vocab_size))
  assert costs.measure(lookup, batch=1, cache_size=128, gammas=(2,), repeats=2).draft_ms[2] > 0
  with pytest.raises(ValueError, match='needs an engine with a drafter'):
    costs.measure(Engine(params, cfg, eos_id=-1, cache_size=128), 1, 128, (1,))


def test_a_draft_with_weights_is_also_timed_as_the_loop_runs_it():
  """A model draft's proposal is also timed followed by the target's verification of it
  (less that verification's time), and the larger of the two kept: alone, its weights may
  stay in a large last-level cache that the target's evict in the loop."""
  cfg, params = testing.tiny_model(seed=3, n_layers=4)
  draft_cfg, draft = truncated_target(cfg, params, 1)
  drafter = ModelDrafter(draft_cfg)
  alone = costs.timer_propose(drafter, draft, params, cfg, 1, 3, 128, inner=2)
  verified = costs.timer_propose(drafter, draft, params, cfg, 1, 3, 128, inner=2, verified=True)
  verify = costs.timer_forward(params, cfg, 1, 4, 128, inner=2)
  # The verified proposal runs the target's four-row forward too: it costs more than the
  # proposal alone (by about that forward), fastest of several runs each.
  best = {k: min(t() for _ in range(7)) for k, t in [('a', alone), ('v', verified), ('f', verify)]}
  assert best['v'] > best['a'] + 0.3 * best['f'], best
  timed = {('d', 1): 1.0, ('d', 3): 2.0, ('d', 'verified', 3): 9.0, ('verify', 3): 6.0}
  assert costs._in_loop(timed, 'd', (1, 3)) == 1.5  # in the loop (9 - 6) over alone (2)
  assert costs._in_loop({**timed, ('d', 'verified', 3): 7.0}, 'd', (1, 3)) == 1.0  # at least 1
  assert costs._in_loop({('n', 3): 0.1, ('verify', 3): 6.0}, 'n', (3,)) == 1.0  # no weights
  drafts = {'d': (drafter, draft, (1, 4)), 'n': (NgramDrafter(cfg.vocab_size), None, (2,))}
  _, measured = costs.measure_drafts(params, cfg, drafts, 1, 128, repeats=3)
  assert measured['d'].draft_ms[4] > measured['d'].draft_ms[1] > 0
  assert measured['n'].draft_ms[2] > 0


def test_rank_acceptance_recovers_the_depth_rank_model():
  """Simulated greedy tree iterations on a static shape: the target's token is the draft's
  rank-r child with probability accept[d, r]; the estimate recovers it, and the shape's
  expected accepted tokens match the simulation's mean."""
  from specjax.core import tree as tree_lib

  truth = np.array([[0.6, 0.2, 0.1], [0.7, 0.15, 0.05], [0.8, 0.1, 0.0]])
  shape = tree_lib.parse_shape('3x2x1')
  rng = np.random.default_rng(0)
  stops, depths = [], []
  for _ in range(20000):
    node = ()
    while True:
      d = len(node)
      width = sum(1 for p in shape.paths if p[:-1] == node)
      if d >= shape.depth or not width:
        break
      r = rng.choice(4, p=[*truth[d], 1 - truth[d].sum()])
      if r >= width:
        break
      node = node + (int(r),)
    stops.append(shape.paths.index(node) + 1 if node else 0)
    depths.append(len(node))
  accept, trials = cost_model.rank_acceptance(shape, stops)
  assert trials[0, 0] == 20000 and np.isnan(accept[2, 1])  # depth 3 has one child each
  np.testing.assert_allclose(accept[:2, :2], truth[:2, :2], atol=0.02)
  assert shape.expected_accepted(cost_model.fill_acceptance(accept)) == pytest.approx(
    np.mean(depths), rel=0.02
  )
  assert cost_model.tree_speedup(shape, truth, 0.5, 1.5) == pytest.approx(
    (shape.expected_accepted(truth) + 1) / 2.0
  )


def test_predicted_tokens_leave_out_those_cut_at_the_end_of_a_text():
  c = cost_model.Costs(
    batch=1, cache_size=64, target_ms=10.0, draft_ms={4: 8.0}, verify_ms={4: 12.0}
  )

  def predicted(new_tokens):
    m = types.SimpleNamespace(alpha=0.8, iteration_ms=20.0)
    # Two iterations that kept all 4 drafts: 10 tokens, after the prefill's one.
    recs = [{'accepted': [4, 4], 'drafted': [4, 4], 'new_tokens': new_tokens}]
    metrics.predict(m, recs, c, 4, adaptive=False)
    return m.predicted_speedup

  assert predicted(11) == pytest.approx(5 / 2.0)  # 5 tokens per 0.8 + 1.2 steps
  assert predicted(8) == pytest.approx(predicted(11) * 7 / 10)  # 3 cut at max_new / EOS


def test_the_runs_own_plain_iteration_is_the_unit_when_there_is_one():
  """predict(plain_ms=...): the timed pieces scaled by the timed plain iteration over the
  run's own (autoregressive decoding's), a plain step of adaptive control left at 1."""
  c = cost_model.Costs(
    batch=1, cache_size=64, target_ms=10.0, draft_ms={4: 8.0}, verify_ms={4: 12.0},
    overhead_ms={0: 0.0, 4: 2.0},
  )  # fmt: skip
  recs = [{'accepted': [4, 4, 0], 'drafted': [4, 4, 0], 'new_tokens': 12}]

  def predicted(plain_ms):
    m = types.SimpleNamespace(alpha=1.0, iteration_ms=20.0)
    metrics.predict(m, recs, c, 4, adaptive=True, plain_ms=plain_ms)
    return m

  timed, run = predicted(None), predicted(8.0)  # the run's plain iteration: 8 ms, not 10
  # 11 tokens; two drafts of (8 + 12 + 2) / 10 and a plain step of 1 in the timed unit,
  # each draft 22 / 8 in the run's.
  assert timed.predicted_speedup == pytest.approx(11 / (2 * 2.2 + 1))
  assert run.predicted_speedup == pytest.approx(11 / (2 * 22 / 8 + 1))
  # The split stays in milliseconds: the timed drafts', the plain step at the run's 8.
  assert run.time_split_ms['draft'] == pytest.approx(16 / 3)
  assert run.time_split_ms['verify'] == pytest.approx((24 + 8) / 3)
  assert run.time_split_ms['loop'] == pytest.approx(4 / 3)


def test_the_loops_own_work_counts_against_speculation_in_plain_iterations():
  """Measured overhead (the verifier, the commit, the draft's update) is added to each
  speculative iteration's cost, and a plain iteration (step and its overhead) is the unit."""
  from specjax.core import tree as tree_lib

  shape = tree_lib.parse_shape('2x1')
  c = cost_model.Costs(
    batch=1,
    cache_size=64,
    target_ms=10.0,
    draft_ms={2: 3.0, 4: 8.0},
    verify_ms={2: 11.0, 4: 12.0},
    tree_ms={shape.text: (4.0, 12.0)},
    overhead_ms={0: 1.0, 2: 3.0, 4: 3.0},
  )
  assert c.plain_ms == 11.0 and c.units(0) == (0.0, 1.0)
  assert c.units(4) == pytest.approx((8 / 11, 15 / 11))
  assert c.loop_units(0) == pytest.approx(1 / 11) and c.loop_units(4) == pytest.approx(3 / 11)
  assert c.tree_units(shape) == pytest.approx((4 / 11, 15 / 11))
  assert cost_model.Costs.from_json(c.to_json()) == c
  old = c.to_json()
  del old['overhead_ms']  # results written before overhead was measured
  legacy = cost_model.Costs.from_json(old)
  assert legacy.overhead_ms == {} and legacy.units(4) == pytest.approx((0.8, 1.2))
  assert c.c == legacy.c == pytest.approx(8 / 4 / 10)  # c stays per target step

  m = types.SimpleNamespace(alpha=0.8, iteration_ms=30.0)
  recs = [{'accepted': [4, 4], 'drafted': [4, 4], 'new_tokens': 11}]
  metrics.predict(m, recs, c, 4, adaptive=False)
  assert m.predicted_speedup == pytest.approx(5 / (23 / 11))  # 5 tokens per 8 + 12 + 3 ms
  assert m.time_split_ms == pytest.approx({'draft': 8.0, 'verify': 12.0, 'loop': 3.0, 'other': 7.0})
  # The overhead as measure_drafts takes it: a plain iteration less the step; a draft's
  # iteration at its largest gamma less its proposal in the loop (alone 2, in the loop
  # 9 - 6) and the forward, for every gamma; never below 0.
  best = {
    ('step', 0): 10.0,
    ('iteration', 0): 10.5,
    ('verify', 3): 6.0,
    ('d', 1): 1.0,
    ('d', 3): 2.0,
    ('d', 'verified', 3): 9.0,
    ('d', 'iteration', 3): 11.0,
    ('n', 3): 0.1,
    ('n', 'iteration', 3): 5.0,
  }
  assert costs._overheads(best, 'd', (1, 3)) == pytest.approx({0: 0.5, 1: 2.0, 3: 2.0})
  assert costs._overheads(best, 'n', (3,)) == pytest.approx({0: 0.5, 3: 0.0})
  # Timed at its smallest gamma too (as measure_drafts does): that gamma keeps its own, the
  # others take the largest's.
  best.update({('verify', 1): 5.0, ('d', 'iteration', 1): 7.0, ('d', 2): 1.5, ('verify', 2): 5.5})
  assert costs._overheads(best, 'd', (1, 2, 3)) == pytest.approx({0: 0.5, 1: 0.5, 2: 2.0, 3: 2.0})
  assert costs._overheads(best, 'x', ()) == {0: 0.5}


def test_a_whole_iteration_is_timed_as_the_loop_runs_it():
  """timer_iteration runs the loop's own round (proposal, forward, verifier, commit,
  update) from the same state each time: it costs more than the target's forward over
  the proposal alone, and measure_drafts turns it into each draft's overhead."""
  cfg, params = testing.tiny_model(seed=3, n_layers=4)
  draft_cfg, draft = truncated_target(cfg, params, 1)
  drafter = ModelDrafter(draft_cfg)
  whole = costs.timer_iteration(drafter, draft, params, cfg, 1, 3, 128, inner=2)
  plain = costs.timer_iteration(None, None, params, cfg, 1, 0, 128, inner=2)
  verify = costs.timer_forward(params, cfg, 1, 4, 128, inner=2)
  best = {k: min(t() for _ in range(7)) for k, t in [('w', whole), ('p', plain), ('f', verify)]}
  assert best['w'] > best['f'], best  # the iteration runs that forward and more
  assert plain() > 0
  # Each repetition starts where the first did: both caches rolled back, the same tokens.
  fn, args = costs.timer_iteration(drafter, draft, params, cfg, 2, 3, 128, inner=3, runner=True)
  draft_state, cache = args[-1]
  start = (np.asarray(draft_state.cache.lengths), np.asarray(cache.lengths))
  assert (start[1] == 64).all()  # half the cache: the prompt
  acc, carried = fn(*args[:-1], args[-1])
  again, carried = fn(*args[:-1], carried)
  np.testing.assert_array_equal(carried[0].cache.lengths, start[0])
  np.testing.assert_array_equal(carried[1].lengths, start[1])
  np.testing.assert_array_equal(again, acc)
  assert (np.asarray(acc) > 3).all()  # each of 3 iterations emitted a token at least
  drafts = {'d': (drafter, draft, (1, 3)), 'n': (NgramDrafter(cfg.vocab_size), None, (2,))}
  _, measured = costs.measure_drafts(params, cfg, drafts, 1, 128, repeats=2, verifier='greedy')
  for c in measured.values():
    assert set(c.overhead_ms) == {0, *c.draft_ms} and min(c.overhead_ms.values()) >= 0


def test_a_multilevel_drafts_steps_are_timed_one_by_one():
  """measure_drafts times a multi-level drafter's first, narrow and wide steps
  (timer_level_step) for the per-level prediction, and records its k."""
  from specjax.drafters import multilevel as ml  # noqa: PLC0415

  cfg, params = testing.tiny_model(seed=3, n_layers=3)
  upper_cfg, upper = truncated_target(cfg, params, 2)
  drafter = ml.MultiLevelDrafter(ModelDrafter(upper_cfg), NgramDrafter(cfg.vocab_size), k=2)
  draft_params = {'upper': upper, 'lower': None}
  for kind in costs.LEVEL_STEPS:
    assert 0 < costs.timer_level_step(drafter, draft_params, params, cfg, 1, 3, 64, kind, inner=2)()
  with pytest.raises(ValueError, match='kind must be'):
    costs.timer_level_step(drafter, draft_params, params, cfg, 1, 3, 64, 'sideways', inner=2)
  _, measured = costs.measure_drafts(
    params, cfg, {'m': (drafter, draft_params, (3,))}, 1, 64, repeats=1
  )
  c = measured['m']
  assert set(c.level_ms) == set(costs.LEVEL_STEPS) and c.level_k == 2
  assert min(c.level_ms.values()) > 0
  assert cost_model.Costs.from_json(c.to_json()) == c


def test_a_timed_multilevel_step_runs_its_lower_level_too():
  """step_for_timing's step is propose's: the upper model's forward counted under its kind,
  then the lower level (here a model of its own) fed the new text and proposing again;
  the proposal's length and pending lower proposal stay, so the same step can repeat."""
  import jax  # noqa: PLC0415

  from specjax.core.sampling import SamplingConfig  # noqa: PLC0415
  from specjax.decode.method import Method  # noqa: PLC0415
  from specjax.drafters import multilevel as ml  # noqa: PLC0415

  cfg, params = testing.tiny_model(seed=3, n_layers=3)
  (upper_cfg, upper), (lower_cfg, lower) = (truncated_target(cfg, params, n) for n in (2, 1))
  drafter = ml.MultiLevelDrafter(ModelDrafter(upper_cfg), ModelDrafter(lower_cfg), k=2)
  draft_params = {'upper': upper, 'lower': lower}
  sampling = SamplingConfig()
  state = costs._prefilled(drafter, draft_params, params, cfg, 2, 64, sampling, Method.chain(3))
  for i, kind in enumerate(costs.LEVEL_STEPS):
    step, carry = drafter.step_for_timing(draft_params, state.spec.draft, state, 3, sampling, kind)
    after, token = jax.jit(step)(carry)
    assert token.shape == (2,)
    np.testing.assert_array_equal(after.filled, carry.filled)
    np.testing.assert_array_equal(after.proposal[0], carry.proposal[0])
    counted = np.asarray(after.counts - carry.counts)
    np.testing.assert_array_equal(counted[:, i], 1)  # COUNTS starts with the steps' kinds
    assert (counted[:, :3].sum(1) == 1).all()
    before = np.asarray(carry.lower.cache.lengths)
    assert (np.asarray(after.lower.cache.lengths) > before).all(), kind  # the lower model ran
    assert (np.asarray(after.cache.lengths) != np.asarray(carry.cache.lengths)).all(), kind
