"""Sharded generation on 8 simulated CPU devices equals unsharded generation."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import pytest
from jax.sharding import PartitionSpec as P

from specjax import testing
from specjax.models import sharding

SCRIPT = textwrap.dedent("""
    import json, jax
    from specjax import testing
    from specjax.decode.engine import Engine
    from specjax.core.sampling import SamplingConfig
    from specjax.models import sharding
    assert jax.device_count() == 8, jax.devices()
    cfg, params = testing.tiny_model(seed=5)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 15, 16]]
    mesh = sharding.make_mesh(data=4, model=2)
    sharded = Engine(params, cfg, eos_id=-1, cache_size=64, mesh=mesh)
    single = Engine(params, cfg, eos_id=-1, cache_size=64)
    s = SamplingConfig(temperature=1.0, top_k=16)
    out = {
        'wq_spec': str(sharded.params['layers'][0]['wq'].sharding.spec),
        'wq_devices': len(sharded.params['layers'][0]['wq'].sharding.device_set),
        'greedy': [sharded.generate(prompts, max_new_tokens=12).tokens,
                   single.generate(prompts, max_new_tokens=12).tokens],
        'sampled': [sharded.generate(prompts, max_new_tokens=12, sampling=s, seed=3).tokens,
                    single.generate(prompts, max_new_tokens=12, sampling=s, seed=3).tokens],
    }
    print('RESULT' + json.dumps(out))
""")


def test_tensor_and_data_parallel_generation_matches_one_device():
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8', JAX_PLATFORMS='cpu')
  proc = subprocess.run(
    [sys.executable, '-c', SCRIPT], env=env, capture_output=True, text=True, timeout=600
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  line = next(l for l in proc.stdout.splitlines() if l.startswith('RESULT'))
  out = json.loads(line[len('RESULT') :])
  assert out['wq_spec'] == str(P(None, 'model')) and out['wq_devices'] == 8
  assert out['greedy'][0] == out['greedy'][1]
  assert out['sampled'][0] == out['sampled'][1]


def test_rules_replicate_dimensions_the_mesh_does_not_divide():
  cfg, params = testing.tiny_model(n_heads=3, n_kv_heads=3, head_dim=8, d_model=24)
  mesh = jax.sharding.Mesh([[jax.devices()[0]]], ('data', 'model'))
  fake = jax.sharding.AbstractMesh((1, 2), ('data', 'model'))
  assert sharding.fit_spec(P(None, 'model'), (24, 24), fake) == P(None, 'model')
  assert sharding.fit_spec(P(None, 'model'), (24, 9), fake) == P(None, None)
  specs = sharding.param_specs(params, mesh)
  assert specs['layers'][0]['w_down'] == P('model', None)
  assert specs['final_norm'] == P(None)


def test_mesh_larger_than_the_machine_is_refused():
  with pytest.raises(ValueError, match='needs 64 devices'):
    sharding.make_mesh(data=8, model=8)


FAMILY_SCRIPT = textwrap.dedent("""
    import json, jax
    from specjax.core.sampling import SamplingConfig
    from specjax.core.tree import parse_tree
    from specjax.decode.engine import Engine
    from specjax.decode.method import Method
    from specjax.drafters import ModelDrafter, truncated_target
    from specjax.models import llama, sharding
    assert jax.device_count() == 8, jax.devices()
    base = dict(vocab_size=64, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8,
                ffn_dim=48)
    families = {
        'qwen2': dict(arch='qwen2', qkv_bias=True),
        'gemma3': dict(arch='gemma3', qk_norm=True, sandwich_norms=True, norm_offset=1.0,
                       activation='gelu_tanh', scale_embeddings=True, query_scale=0.2,
                       sliding_window=4, layer_types=('sliding', 'full', 'sliding'),
                       rope_local_base=100.0, rope_scaling=('linear', 2.0)),
    }
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 15, 16]]
    s = SamplingConfig(temperature=1.0)
    mesh = sharding.make_mesh(data=4, model=2)
    out = {}
    for name, extra in families.items():
      cfg = llama.LlamaConfig(**base, **extra)
      params = llama.init_params(cfg, jax.random.key(7), scale=0.3)
      draft_cfg, draft = truncated_target(cfg, params, 1)
      kw = dict(eos_id=-1, cache_size=64, drafter=ModelDrafter(draft_cfg), draft_params=draft)
      runs = []
      for engine in (Engine(params, cfg, mesh=mesh, **kw), Engine(params, cfg, **kw)):
        runs.append([engine.generate(prompts, max_new_tokens=12).tokens,
                     engine.generate(prompts, Method.chain(3, 'greedy'), 12).tokens,
                     engine.generate(prompts, Method.chain(3), 12, s, seed=3).tokens,
                     engine.generate(prompts, Method.tree(parse_tree('2x2x1'), 'greedy'),
                                     12).tokens])
      out[name] = runs
    print('RESULT' + json.dumps(out))
""")


def test_new_families_decode_speculatively_sharded_as_on_one_device():
  """Qwen2's sharded biases and Gemma 3's sliding and full layers, on a (4, 2) mesh: plain,
  speculative (greedy and sampled with a fixed key) and tree decoding equal one device's."""
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8', JAX_PLATFORMS='cpu')
  proc = subprocess.run(
    [sys.executable, '-c', FAMILY_SCRIPT], env=env, capture_output=True, text=True, timeout=900
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  line = next(l for l in proc.stdout.splitlines() if l.startswith('RESULT'))
  for name, (sharded, single) in json.loads(line[len('RESULT') :]).items():
    assert sharded == single, name
    assert sharded[1] == sharded[0] and sharded[3] == sharded[0], name  # greedy identity


DRAFTERS_SCRIPT = textwrap.dedent("""
    import json, sys, jax, numpy as np
    from specjax import testing
    from specjax.control.adaptive import AdaptiveConfig
    from specjax.core.sampling import SamplingConfig
    from specjax.decode.engine import Engine
    from specjax.decode.method import Method
    from specjax.drafters import ModelDrafter, truncated_target
    from specjax.drafters.consensus import ConsensusDrafter
    from specjax.drafters.dflash import DFlashDrafter
    from specjax.drafters.dspark import DSparkDrafter
    from specjax.drafters.distilled import DistilledDrafter, init_from_target
    from specjax.drafters.eagle import EagleDrafter
    from specjax.drafters.multilevel import MultiLevelDrafter
    from specjax.drafters.ngram import NgramDrafter
    from specjax.models import dflash as dflash_model
    from specjax.models import dspark as dspark_model
    from specjax.models import eagle as eagle_model
    from specjax.models import sharding
    assert jax.device_count() == 8, jax.devices()
    cfg, params = testing.tiny_model(seed=3, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8,
                                     d_model=32)
    def build(name):
      if name == 'draft model':
        small_cfg, small = testing.tiny_model(seed=11, n_layers=1, d_model=16, n_heads=2,
                                              n_kv_heads=2)
        return ModelDrafter(small_cfg), small
      if name == 'truncated':
        trunc_cfg, trunc = truncated_target(cfg, params, 1)
        return ModelDrafter(trunc_cfg), trunc
      if name == 'distilled':
        ids = np.arange(0, cfg.vocab_size, 2)
        dist_cfg, dist = init_from_target(cfg, params, (0,), ids)
        return DistilledDrafter(dist_cfg), dist
      if name == 'layer skip':
        return ModelDrafter(cfg, layers=(0, 2)), params
      if name == 'lookup':
        return NgramDrafter(cfg.vocab_size), None
      if name == 'consensus':
        return ConsensusDrafter(cfg.vocab_size, group=2, k=2), None
      if name in ('dflash', 'dspark'):
        ids = np.arange(0, cfg.vocab_size, 2)
        dc = dflash_model.DFlashConfig.for_target(cfg, len(ids), block_size=4)
        dp = dflash_model.init_params(dc, jax.random.key(0), ids, params)
        if name == 'dflash':
          return DFlashDrafter(dc), {'block': dp, 'embed': params['embed']}
        heads = dspark_model.init_params(cfg.vocab_size, len(ids), 32, 4, jax.random.key(1))
        heads['w1'], heads['w2'] = heads['w1'] * 50, np.ones_like(heads['w2']) * 0.3
        return DSparkDrafter(dc), {'block': dp, 'embed': params['embed'], 'heads': heads}
      if name == 'multilevel':  # two target layers in q, drafted by prompt lookup
        up_cfg, up = truncated_target(cfg, params, 2)
        low = NgramDrafter(cfg.vocab_size)
        return MultiLevelDrafter(ModelDrafter(up_cfg), low, k=2), {'upper': up, 'lower': None}
      ids = np.arange(0, cfg.vocab_size, 2)
      hc = eagle_model.EagleConfig.for_target(cfg, len(ids))
      hp = eagle_model.init_params(hc, jax.random.key(0), ids, params)
      hp['fc'] = hp['fc'] * 10
      return EagleDrafter(hc), {'head': hp, 'embed': params['embed']}
    # Rows 0 and 2 repeat themselves (lookup and consensus find drafts); 4 rows over data=4.
    prompts = [[1, 2, 3, 1, 2], [4, 5, 6, 7, 8, 9, 10], [1, 2, 3, 1], [12, 13, 14, 15, 16]]
    s = SamplingConfig(temperature=1.0)
    adaptive = AdaptiveConfig(gammas=(1, 2), draft_cost=(0.1, 0.2), verify_cost=(1.1, 1.2))
    mesh = sharding.make_mesh(data=4, model=2)
    greedy = (dict(method=Method.chain(3, 'greedy')),
              dict(method=Method.adaptive(adaptive, 'greedy')))
    sampled = (dict(sampling=s, seed=4, method=Method.adaptive(adaptive)),
               dict(sampling=s, seed=3, method=Method.chain(3)))
    plain = Engine(params, cfg, eos_id=-1, cache_size=64)
    out = {'plain': plain.generate(prompts, max_new_tokens=10).tokens}
    for name in sys.argv[1:]:
      # Every drafter at fixed gamma (greedy) and adaptively (sampled); the draft model and
      # prompt lookup also the other way round (compiles on 8 devices dominate the time).
      n = 2 if name in ('draft model', 'lookup') else 1
      drafter, draft_params = build(name)
      kw = dict(eos_id=-1, cache_size=64, drafter=drafter, draft_params=draft_params)
      sharded, single = Engine(params, cfg, mesh=mesh, **kw), Engine(params, cfg, **kw)
      split = [x.sharding.spec for x in jax.tree.leaves(sharded.draft_params or {})]
      out[name] = {
        'greedy': [sharded.generate(prompts, max_new_tokens=10, **r).tokens for r in greedy[:n]],
        'sampled': [[e.generate(prompts, max_new_tokens=10, **r).tokens for e in (sharded, single)]
                    for r in sampled[:n]],
        'draft_split': sum(any(a is not None for a in spec) for spec in split),
      }
    print('RESULT' + json.dumps(out))
""")


def run_drafters(*names):
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8', JAX_PLATFORMS='cpu')
  proc = subprocess.run(
    [sys.executable, '-c', DRAFTERS_SCRIPT, *names],
    env=env,
    capture_output=True,
    text=True,
    timeout=1200,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  line = next(l for l in proc.stdout.splitlines() if l.startswith('RESULT'))
  return json.loads(line[len('RESULT') :])


@pytest.mark.slow
@pytest.mark.parametrize(
  'names',
  [
    ('draft model', 'distilled'),
    ('layer skip', 'lookup', 'consensus', 'eagle'),
    ('dflash', 'dspark'),
    ('multilevel',),
  ],
  ids=['models', 'self-lookup-consensus-eagle', 'dflash-dspark', 'multilevel'],
)
def test_every_drafter_decodes_sharded_as_on_one_device(names):
  """On a (data=4, model=2) mesh, every drafter kind: greedy speculative decoding equals
  target greedy and sampled decoding with a fixed key equals one device's, at fixed gamma
  and under adaptive control; draft parameters are split by their own rules."""
  out = run_drafters(*names)
  for name in names:
    # greedy runs equal target greedy (out['plain']), which equals one device's elsewhere
    assert all(run == out['plain'] for run in out[name]['greedy']), name
    for sharded, single in out[name]['sampled']:
      assert sharded == single, name
    if name in (
      'draft model',
      'distilled',
      'layer skip',
      'eagle',
      'dflash',
      'dspark',
      'multilevel',
    ):
      assert out[name]['draft_split'] > 0, name  # not all replicated


def test_partition_rules_parse_and_refuse_bad_ones():
  rules = sharding.parse_rules(('lm_head$=None,model', r'layers/\d+/wo$='))
  assert rules == (('lm_head$', P(None, 'model')), (r'layers/\d+/wo$', P()))
  with pytest.raises(ValueError, match=r"config.mesh.rules: rule 'wq' is not REGEX=AXES"):
    sharding.parse_rules(('wq',))
  with pytest.raises(ValueError, match="unknown mesh axis 'tensor'"):
    sharding.parse_rules(('wq$=None,tensor',))
  with pytest.raises(ValueError, match='bad regex'):
    sharding.parse_rules(('w[q=None',), 'draft_rules')


def test_config_rules_override_the_defaults():
  cfg, params = testing.tiny_model(n_heads=4, n_kv_heads=2, head_dim=8, d_model=32)
  fake = jax.sharding.AbstractMesh((1, 2), ('data', 'model'))
  rules = sharding.parse_rules(('w_down$=',)) + sharding.DEFAULT_RULES
  specs = sharding.param_specs(params, fake, rules)
  assert specs['layers'][0]['w_down'] == P(None, None)  # replicated
  assert specs['layers'][0]['w_up'] == P(None, 'model')
