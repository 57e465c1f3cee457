"""jax.distributed: two local CPU processes decode one data-parallel batch speculatively and
get the tokens one process gets (README "Beyond one process")."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from specjax import config_lib

SCRIPT = textwrap.dedent("""
    import json, sys, jax
    from specjax import config_lib
    coordinator, n, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if n > 1:
      config_lib.start_processes(coordinator, n, pid)
    from specjax import testing
    from specjax.core.sampling import SamplingConfig
    from specjax.decode.engine import Engine
    from specjax.drafters import ModelDrafter, truncated_target
    from specjax.decode.method import Method
    from specjax.models import sharding
    assert jax.process_count() == n and jax.device_count() == 2, jax.devices()
    cfg, params = testing.tiny_model(seed=3, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8,
                                     d_model=32)
    draft_cfg, draft = truncated_target(cfg, params, 1)
    mesh = sharding.make_mesh(data=2, model=1)  # one row block per process
    prompts = [[1, 2, 3, 1, 2], [4, 5, 6, 7, 8, 9, 10], [1, 2, 3, 1], [12, 13, 14, 15, 16]]
    s = SamplingConfig(temperature=1.0)
    model = Engine(params, cfg, eos_id=-1, cache_size=64, mesh=mesh,
                   drafter=ModelDrafter(draft_cfg), draft_params=draft)
    out = {
        'local_devices': jax.local_device_count(),
        'greedy': model.generate(prompts, Method.chain(3, 'greedy'), 10).tokens,
        'sampled': model.generate(prompts, Method.chain(3), 10, s, seed=3).tokens,
    }
    print('RESULT' + json.dumps(out), flush=True)
""")


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def launch(n: int, devices_per_process: int) -> list[dict]:
  env = dict(
    os.environ,
    JAX_PLATFORMS='cpu',
    XLA_FLAGS=f'--xla_force_host_platform_device_count={devices_per_process}',
  )
  coordinator = f'localhost:{free_port()}'
  procs = [
    subprocess.Popen(
      [sys.executable, '-c', SCRIPT, coordinator, str(n), str(i)],
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for i in range(n)
  ]
  results = []
  try:
    for p in procs:
      stdout, stderr = p.communicate(timeout=600)
      assert p.returncode == 0, stderr[-3000:]
      line = next(l for l in stdout.splitlines() if l.startswith('RESULT'))
      results.append(json.loads(line[len('RESULT') :]))
  finally:
    for p in procs:
      p.kill()
  return results


def test_two_processes_decode_speculatively_as_one():
  first, second = launch(2, devices_per_process=1)
  (single,) = launch(1, devices_per_process=2)
  assert first['local_devices'] == 1 and single['local_devices'] == 2
  assert first == dict(second, local_devices=1)  # both processes see the whole batch
  for key in ('greedy', 'sampled'):
    assert first[key] == single[key], key


def test_process_flags_are_checked_before_any_work():
  with pytest.raises(ValueError, match='need --coordinator'):
    config_lib.start_processes(None, 2, None)
  with pytest.raises(
    ValueError, match=r'process_id in \[0, N\), got num_processes=2, process_id=2'
  ):
    config_lib.start_processes('localhost:1234', 2, 2)
