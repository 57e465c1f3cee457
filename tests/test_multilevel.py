"""Multi-level speculation (specjax/drafters/multilevel.py): a draft model whose own tokens
are drafted by a lower level and checked by it. Its proposals must be exact samples of the
upper model (whatever the lower level proposes), and greedy decoding must equal the
target's."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specjax import registry, testing, verify
from specjax.control import adaptive
from specjax.core.sampling import SamplingConfig
from specjax.decode.engine import Engine
from specjax.decode.method import Method
from specjax.drafters import ModelDrafter, NgramDrafter, truncated_target
from specjax.drafters import multilevel as ml
from specjax.drafters.eagle import EagleDrafter
from specjax.models import eagle as eagle_model
from specjax.verify import common
from tests import test_speculative as spec

PROMPTS = [
  [3, 1, 4, 1, 5, 3, 1, 4],
  [9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3],
  [7],
  [2, 7, 1, 8, 2, 8],
]


@pytest.fixture(scope='module')
def target():
  return testing.tiny_model(seed=3, n_layers=3)


def levels(target, lower: str, k: int = 3):
  """A multilevel drafter over the target's first two layers, and its parameters."""
  cfg, params = target
  upper_cfg, upper = truncated_target(cfg, params, 2)
  if lower == 'ngram':
    low, low_params = NgramDrafter(cfg.vocab_size), None
  elif lower == 'ngram 3':  # finds nothing for many steps: narrow steps between rounds
    low, low_params = NgramDrafter(cfg.vocab_size, n_max=3, n_min=3), None
  elif lower == 'one layer':
    low_cfg, low_params = truncated_target(cfg, params, 1)
    low = ModelDrafter(low_cfg)
  else:  # three levels: the one-layer model drafted by prompt lookup
    low_cfg, low_params = truncated_target(cfg, params, 1)
    low = ml.MultiLevelDrafter(ModelDrafter(low_cfg), NgramDrafter(cfg.vocab_size), k=2)
    low_params = {'upper': low_params, 'lower': None}
  drafter = ml.MultiLevelDrafter(ModelDrafter(upper_cfg), low, k=k)
  return drafter, {'upper': upper, 'lower': low_params}


LOWERS = ['ngram', 'ngram 3', 'one layer', 'three levels']


@pytest.mark.parametrize('lower', LOWERS)
def test_multilevel_greedy_equals_target_greedy(target, lower):
  cfg, params = target
  drafter, draft_params = levels(target, lower)
  engine = Engine(params, cfg, eos_id=-1, cache_size=64, drafter=drafter, draft_params=draft_params)
  reference = engine.generate(PROMPTS, max_new_tokens=20).tokens
  for gamma in (1, 2, 5):
    out = engine.generate(PROMPTS, Method.chain(gamma, 'greedy'), max_new_tokens=20)
    assert out.tokens == reference, gamma
  jumpy = adaptive.AdaptiveConfig(
    gammas=(2, 4), draft_cost=(0.3, 0.6), prior_alpha=0.0, hysteresis=0.0, probe_every=2,
    start_on=False, decay=0.5,
  )  # fmt: skip
  out = engine.generate(PROMPTS, Method.adaptive(jumpy, 'greedy'), max_new_tokens=20)
  assert out.tokens == reference
  assert {0} < {d for row in out.drafted for d in row}  # plain steps and drafts both ran


def _keep_everything(p, q, draft, key):
  """An outer verifier that keeps every draft token: the output is the proposals."""
  del q, key
  return jnp.full(draft.shape[:1], draft.shape[1], jnp.int32), jnp.argmax(p[:, -1], axis=-1)


@pytest.fixture
def keep_everything(monkeypatch):
  monkeypatch.setitem(
    registry.VERIFIERS.table, 'keep', verify.Verifier('keep', _keep_everything, None)
  )


def test_a_lower_level_that_finds_nothing_leaves_the_upper_models_own_tokens(
  target, keep_everything
):
  """With prompt lookup of 8-grams (nothing matches) every step is a narrow one: the
  proposals, all kept, are the upper model's greedy text, as its own drafter gives."""
  cfg, params = target
  upper_cfg, upper = truncated_target(cfg, params, 2)
  never = NgramDrafter(cfg.vocab_size, n_max=8, n_min=8)
  texts = []
  for drafter, draft_params in [
    (ml.MultiLevelDrafter(ModelDrafter(upper_cfg), never, k=3), {'upper': upper, 'lower': None}),
    (ModelDrafter(upper_cfg), upper),
  ]:
    engine = Engine(
      params, cfg, eos_id=-1, cache_size=64, drafter=drafter, draft_params=draft_params
    )
    texts.append(engine.generate(PROMPTS, Method.chain(4, 'keep'), max_new_tokens=12).tokens)
  assert texts[0] == texts[1]
  reference = Engine(params, cfg, eos_id=-1, cache_size=64).generate(PROMPTS, max_new_tokens=12)
  assert texts[0] != reference.tokens  # the upper model is not the target: a real check


def test_a_lower_level_that_is_the_upper_model_keeps_every_token(target, monkeypatch):
  """A lower level that is the upper model itself (greedy) proposes the upper model's own
  tokens, if its cache holds the text where it belongs: every round keeps all k. A lower
  cache one slot off (positions shifted) would still give exact output, only slower."""
  kept = []

  def recording(plan, key):
    out = common.run_plan(plan, key)
    jax.debug.callback(lambda n: kept.extend(np.asarray(n).tolist()), out[0])
    return out

  monkeypatch.setattr(ml, 'common', types.SimpleNamespace(run_plan=recording))
  cfg, params = target
  upper_cfg, upper = truncated_target(cfg, params, 2)
  drafter = ml.MultiLevelDrafter(ModelDrafter(upper_cfg), ModelDrafter(upper_cfg), k=3)
  engine = Engine(
    params, cfg, eos_id=-1, cache_size=64, drafter=drafter,
    draft_params={'upper': upper, 'lower': upper},
  )  # fmt: skip
  reference = Engine(params, cfg, eos_id=-1, cache_size=64).generate(PROMPTS[:1], max_new_tokens=24)
  out = engine.generate(PROMPTS[:1], Method.chain(6, 'greedy'), max_new_tokens=24)
  assert out.tokens == reference.tokens
  assert len(kept) >= 4 and np.mean(kept) > 0.9 * 3, kept
  counts = out.draft_counts[0]  # what the drafter counted: every round kept all k
  assert counts['lower_rejected'] == 0 and counts['lower_kept'] >= 3 * counts['wide'] > 0


@pytest.mark.parametrize('lower', ['ngram 3', 'one layer'])
def test_the_counters_account_for_every_drafted_token(target, lower):
  """Drafter.counters: a proposal is one first step (one token), narrow steps (one each)
  and wide steps (the lower tokens kept, and one more), so per row the tokens the steps
  drew cover every proposal's gamma and overshoot it by at most k each."""
  cfg, params = target
  drafter, draft_params = levels(target, lower, k=3)
  engine = Engine(params, cfg, eos_id=-1, cache_size=64, drafter=drafter, draft_params=draft_params)
  gamma = 5
  out = engine.generate(PROMPTS[:1], Method.chain(gamma, 'greedy'), max_new_tokens=24)
  c = out.draft_counts[0]
  assert set(c) == set(ml.COUNTS)
  proposals = sum(d > 0 for d in out.drafted[0])
  assert c['first'] == proposals > 0
  drawn = c['first'] + c['narrow'] + c['wide'] + c['lower_kept']
  assert proposals * gamma <= drawn <= proposals * (gamma + 3), (c, proposals)
  assert c['lower_rejected'] <= c['wide'] and c['wide'] > 0
  if lower == 'ngram 3':  # a lookup of 3-grams misses at some steps: narrow steps too
    assert c['narrow'] > 0
  # The target alone counts nothing.
  plain = Engine(params, cfg, eos_id=-1, cache_size=64).generate(PROMPTS[:1], max_new_tokens=4)
  assert plain.draft_counts == []


def _proposals(upper, lower, sampling, seed=0):
  """N continuations of 3 tokens: the first from the target (the upper model itself), the
  next two proposed by the multilevel drafter and all kept by the outer verifier, so they
  are distributed as its proposals."""
  (cfg, params), (low_cfg, low_params) = upper, lower
  drafter = ml.MultiLevelDrafter(ModelDrafter(cfg), ModelDrafter(low_cfg), k=2)
  engine = Engine(
    params, cfg, eos_id=-1, cache_size=16, drafter=drafter,
    draft_params={'upper': params, 'lower': low_params},
  )  # fmt: skip
  out = engine.generate(
    [spec.PROMPT] * spec.N, Method.chain(2, 'keep'), max_new_tokens=3, sampling=sampling, seed=seed
  )
  return np.array(out.tokens)


@pytest.mark.parametrize('sampling', spec.SAMPLINGS, ids=['t1', 't0.7-k5-p0.9'])
def test_multilevel_proposals_are_exact_samples_of_the_upper_model(keep_everything, sampling):
  """The upper model's distribution over 3 tokens against 30,000 proposals, with a lower
  model that disagrees with it (another random model)."""
  upper = testing.tiny_model(seed=21, vocab_size=spec.VOCAB, n_layers=2, scale=0.3)
  lower = testing.tiny_model(seed=22, vocab_size=spec.VOCAB, n_layers=1, scale=0.3)
  probs = spec.exact_continuations(*upper, sampling)
  assert spec.chi_square_pvalue(_proposals(upper, lower, sampling), probs) > 1e-3


def test_the_exactness_test_catches_a_multilevel_drafter_that_keeps_every_lower_token(
  keep_everything, monkeypatch
):
  def keep_all(p, q, draft):
    ones = jnp.ones(draft.shape, p.dtype)
    return common.Plan(thresholds=ones, residuals=p, rule='first_failure')

  monkeypatch.setattr(ml, 'rejection', types.SimpleNamespace(rejection_plan=keep_all))
  upper = testing.tiny_model(seed=21, vocab_size=spec.VOCAB, n_layers=2, scale=0.3)
  lower = testing.tiny_model(seed=22, vocab_size=spec.VOCAB, n_layers=1, scale=0.3)
  probs = spec.exact_continuations(*upper, SamplingConfig(temperature=1.0))
  samples = _proposals(upper, lower, SamplingConfig(temperature=1.0))
  assert spec.chi_square_pvalue(samples, probs) < 1e-6


def test_multilevel_sampling_matches_the_target():
  """The whole method at temperature 1: the target's exact distribution."""
  target = testing.tiny_model(seed=21, vocab_size=spec.VOCAB, n_layers=2, scale=0.3)
  upper = testing.tiny_model(seed=22, vocab_size=spec.VOCAB, n_layers=1, scale=0.3)
  lower = testing.tiny_model(seed=23, vocab_size=spec.VOCAB, n_layers=1, scale=0.3)
  sampling = SamplingConfig(temperature=1.0)
  drafter = ml.MultiLevelDrafter(ModelDrafter(upper[0]), ModelDrafter(lower[0]), k=2)
  engine = Engine(
    target[1], target[0], eos_id=-1, cache_size=16, drafter=drafter,
    draft_params={'upper': upper[1], 'lower': lower[1]},
  )  # fmt: skip
  out = engine.generate(
    [spec.PROMPT] * spec.N, Method.chain(2), max_new_tokens=3, sampling=sampling, seed=1
  )
  probs = spec.exact_continuations(*target, sampling)
  assert spec.chi_square_pvalue(np.array(out.tokens), probs) > 1e-3


def test_multilevel_specs_are_checked_before_anything_loads():
  kind, settings = registry.parse_draft('multilevel:quantized,ngram:2-4,k=4')
  assert kind is ml.MULTILEVEL and settings[2] == 4 and settings[0] == ('quantized', 'ngram:2-4')
  # '+' separates levels inside a method list (whose methods a comma separates); deeper
  # chains nest: the lower level of a three-level chain is multilevel itself.
  _, settings = registry.parse_draft('multilevel:quantized+truncated:2+ngram')
  assert settings[0] == ('quantized', 'multilevel:truncated:2+ngram')
  assert settings[1][1][0] is ml.MULTILEVEL
  for bad, match in [
    ('multilevel:quantized', 'multilevel:<upper'),
    ('multilevel:quantized+', 'multilevel:<upper'),
    ('multilevel:ngram+quantized', 'must be a draft model'),
    ('multilevel:quantized,ngram,k=0', 'k >= 1'),
    ('multilevel:quantized,ngram,j=2', 'multilevel:<upper'),
    ('multilevel:ngram,quantized', 'must be a draft model'),
    ('multilevel:quantized,nonsense:3', 'nonsense'),
  ]:
    with pytest.raises(ValueError, match=match):
      registry.parse_draft(bad)


def test_the_rounds_formula_equals_a_simulation_of_the_rounds():
  from specjax.control import cost_model  # noqa: PLC0415

  rng = np.random.default_rng(0)
  for alpha, k, gamma in [(0.0, 3, 4), (1.0, 3, 4), (1.0, 2, 7), (0.6, 3, 5), (0.9, 7, 8)]:
    rounds = []
    for _ in range(4000):
      filled, n = 1, 0  # after the first step's one token
      while filled < gamma:
        kept = 0
        while kept < k and rng.random() < alpha:
          kept += 1
        filled, n = filled + kept + 1, n + 1
      rounds.append(n)
    got = cost_model.multilevel_rounds(alpha, k, gamma)
    assert abs(got - np.mean(rounds)) < 0.05, (alpha, k, gamma, got, np.mean(rounds))
  assert cost_model.multilevel_rounds(0.0, 3, 4) == 3
  assert (
    cost_model.multilevel_rounds(1.0, 3, 4) == 1 and cost_model.multilevel_rounds(1.0, 2, 7) == 2
  )
  # A perfect lower level at k = 3: gamma 4 in the first step and one round of 4 rows.
  assert cost_model.multilevel_speedup(1.0, 4, 1.0, 3, 0.3, 0.4, 1.3) == pytest.approx(5 / 2.0)


def test_the_steps_formula_equals_a_simulation_of_lookups_that_miss():
  """cost_model.multilevel_steps: narrow steps where the lower level finds nothing (with
  probability 1 - hit), wide ones where it proposes; hit = 1 is multilevel_rounds."""
  from specjax.control import cost_model  # noqa: PLC0415

  rng = np.random.default_rng(1)
  for hit, alpha, k, gamma in [
    (0.5, 0.6, 3, 8),
    (0.2, 0.9, 3, 12),
    (0.9, 0.3, 2, 5),
    (0.0, 1, 3, 6),
  ]:
    narrow, wide = [], []
    for _ in range(4000):
      filled, n, w = 1, 0, 0
      while filled < gamma:
        if rng.random() < hit:
          kept = 0
          while kept < k and rng.random() < alpha:
            kept += 1
          filled, w = filled + kept + 1, w + 1
        else:
          filled, n = filled + 1, n + 1
      narrow.append(n)
      wide.append(w)
    got = cost_model.multilevel_steps(gamma, k, hit, alpha)
    assert got == pytest.approx((np.mean(narrow), np.mean(wide)), abs=0.06), (hit, alpha, got)
  assert cost_model.multilevel_steps(8, 3, 0.0, 0.5) == (7.0, 0.0)
  assert cost_model.multilevel_steps(9, 3, 1.0, 0.7)[1] == pytest.approx(
    cost_model.multilevel_rounds(0.7, 3, 9)
  )


def test_a_multilevel_prediction_counts_its_steps_at_the_runs_rates():
  """metrics.predict: a multi-level drafter's proposal costs its first step and the
  narrow and wide steps its lower level's measured hit rate and acceptance imply, not
  the proposal timed before the run; level_stats reports the counted steps beside them."""
  from specjax.bench import metrics  # noqa: PLC0415
  from specjax.control import cost_model  # noqa: PLC0415

  c = cost_model.Costs(
    batch=1, cache_size=64, target_ms=10.0, draft_ms={1: 2.0, 4: 5.0}, verify_ms={1: 11.0, 4: 12.0},
    level_ms={'first': 1.5, 'narrow': 1.0, 'wide': 3.0}, level_k=2,
  )  # fmt: skip
  assert cost_model.Costs.from_json(c.to_json()) == c

  def run(counts, rows=1):
    m = types.SimpleNamespace(alpha=1.0, iteration_ms=30.0)
    rec = {'accepted': [4, 4], 'drafted': [4, 4], 'new_tokens': 11, 'draft_counts': counts}
    metrics.predict(m, [rec | {'batch': 0}] * rows, c, 4, adaptive=False)
    return m

  # Lookups that never hit: the first step (the proposal at gamma 1: 2 ms) and 3 narrow.
  m = run({'first': 2, 'narrow': 6, 'wide': 0, 'lower_kept': 0, 'lower_rejected': 0})
  assert m.levels['hit'] == 0 and m.levels['narrow_per_proposal'] == 3
  assert m.levels['expected_narrow_per_proposal'] == pytest.approx(3)
  assert m.predicted_speedup == pytest.approx(5 / ((2 + 3 * 1.0 + 12) / 10))
  # Always a hit, every lower token kept (k = 2): one wide step fills 1 + 3 >= 4.
  m = run({'first': 2, 'narrow': 0, 'wide': 2, 'lower_kept': 4, 'lower_rejected': 0})
  assert m.levels['alpha_lower'] == 1 and m.levels['expected_wide_per_proposal'] == 1
  assert m.predicted_speedup == pytest.approx(5 / ((2 + 3.0 + 12) / 10))
  # Two rows of one batch: the batch's steps count once, each row's lower tokens count.
  half = {'first': 2, 'narrow': 2, 'wide': 2, 'lower_kept': 2, 'lower_rejected': 2}
  m = run(half, rows=2)
  assert m.levels['hit'] == 0.5 and m.levels['alpha_lower'] == 0.5
  assert m.levels['narrow_per_proposal'] == 1 and m.levels['wide_per_proposal'] == 1
  # Without counts (another drafter) the timed proposal stands.
  m = run({})
  assert m.levels is None and m.predicted_speedup == pytest.approx(5 / ((5 + 12) / 10))


def test_levels_over_other_vocabularies_or_the_targets_features_are_one_clear_error(target):
  """A lower level must draft over the upper model's vocabulary and from the text alone:
  building such a chain fails, naming both levels, before anything decodes."""
  cfg, params = target
  upper_cfg, _ = truncated_target(cfg, params, 2)
  upper = ModelDrafter(upper_cfg)
  with pytest.raises(ValueError, match=rf'drafts over {cfg.vocab_size + 1} tokens but the upper'):
    ml.MultiLevelDrafter(upper, NgramDrafter(cfg.vocab_size + 1))
  other_cfg = testing.tiny_config(n_layers=1, vocab_size=cfg.vocab_size * 2)
  with pytest.raises(ValueError, match='drafts over'):
    ml.MultiLevelDrafter(upper, ModelDrafter(other_cfg))
  ids = np.arange(0, cfg.vocab_size, 2)
  head = EagleDrafter(eagle_model.EagleConfig.for_target(cfg, len(ids)))
  with pytest.raises(ValueError, match="reads the target's features"):
    ml.MultiLevelDrafter(upper, head)
