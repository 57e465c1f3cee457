"""Layer-skip calibration: the simulation, the candidate set, and a valid config written."""

import json

import numpy as np
import pytest

from specjax import calibrate_skip as cs
from specjax import config_lib
from specjax.drafters.model import parse_layers
from specjax.harness import run_config


def test_simulated_tokens_per_call():
  assert cs.simulate(np.ones(12, bool), 3) == 12 / 3  # 4 tokens per call
  assert cs.simulate(np.zeros(5, bool), 4) == 1.0
  # accept 2 then miss (3 tokens), accept 0 (1 token), accept 1 to the end
  assert cs.simulate(np.array([1, 1, 0, 0, 1, 0], bool), 4) == 6 / 3


def test_layer_ranges_and_contiguous_skips():
  assert cs.layer_ranges((0, 1, 2, 5, 7, 8)) == '0-2,5,7-8'
  skips = cs.contiguous_skips(10, min_skip=2, stride=2)
  assert (1, 2) in skips and (7, 8) in skips and (1, 2, 3, 4) in skips
  assert all(0 not in s and 9 not in s for s in skips)
  assert all(list(s) == list(range(s[0], s[-1] + 1)) for s in skips)


def test_more_kept_layers_cost_more():
  costs = cs.SkipCosts(fixed=0.13, per_layer=0.029, verify={4: 1.26}, step_ms=16.0)
  assert cs.predicted_speedup(2.0, 20, 4, costs) < cs.predicted_speedup(2.0, 10, 4, costs)
  # The one cost model: tokens per call over draft + verify, in target steps.
  assert cs.predicted_speedup(2.0, 10, 4, costs) == pytest.approx(2.0 / (4 * 0.42 + 1.26))


def test_masked_forward_with_every_layer_is_the_model():
  import jax.numpy as jnp

  from specjax import testing
  from specjax.models import llama
  from specjax.models.kv_cache import KVCache

  cfg, params = testing.tiny_model(seed=2, n_layers=3)
  tokens = jnp.array([[5, 9, 2, 7, 1, 3], [4, 4, 8, 0, 0, 0]])
  lengths = jnp.array([6, 3])
  for keep in ([True] * 3, [True, False, True]):
    pred = cs.masked_forward(params, tokens, lengths, jnp.array(keep), cfg)
    layers = tuple(i for i, k in enumerate(keep) if k)
    logits, _ = llama.forward(params, tokens, KVCache.init(cfg, 2, 8), cfg, layers)[:2]
    np.testing.assert_array_equal(pred[0], logits[0].argmax(-1))
    np.testing.assert_array_equal(pred[1, :3], logits[1, :3].argmax(-1))


def tiny_config(**overrides):
  c = config_lib.load_config('calibrate_skip.py', 'tiny')
  c.update(overrides)
  return c


def test_calibration_writes_the_json_a_config_reads(tmp_path):
  out = tmp_path / 'layerskip_tiny.json'
  result = cs.calibrate(tiny_config(out=str(out)), say=lambda *a: None)
  report = json.loads(out.read_text())
  assert report['chosen'] == json.loads(json.dumps(result['chosen']))
  assert all(c['measured'] is None or c['measured']['speedup'] > 0 for c in report['candidates'])
  c = config_lib.load_config('layerskip_smollm2.py', f'calibration={out}')
  (draft,) = c.drafts
  assert draft == result['chosen']['draft'] and c.model == 'tiny'
  assert c.gammas == (result['chosen']['gamma'],)
  kept = parse_layers(draft.split(':', 1)[1], 2)
  assert set(kept).isdisjoint(result['chosen']['skipped'])


def test_the_shipped_calibration_is_a_valid_config():
  c = config_lib.load_config('layerskip_smollm2.py')
  assert c.model == 'smollm2-135m-instruct' and c.drafts[0].startswith('layers:')
  run_config.validate(c)


@pytest.mark.parametrize(
  'overrides,match',
  [
    ({'measure_top': 0}, r'config.measure_top = 0: expected an integer >= 1'),
    ({'num_prompts': 99}, r'config.num_prompts = 99: expected an integer in \[1, 6\]'),
    ({'gammas': (0,)}, r'config.gammas = \(0,\): expected draft lengths'),
    ({'out': 'x.py'}, 'a path ending in .json'),
  ],
)
def test_bad_settings_are_named(tmp_path, overrides, match):
  with pytest.raises(ValueError, match=match):
    cs.calibrate(tiny_config(**overrides))
