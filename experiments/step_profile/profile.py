r"""Where a decode step and a multi-token verification forward of SmolLM2-135M spend their time.

  python experiments/step_profile/profile.py --out experiments/step_profile/results

Run it on a quiet machine (nothing else running). It measures, for forwards of T new
tokens against a cache of --cache_size slots holding --length tokens (batch 1, float32):

  * wall time per forward, interleaved round by round over T and over ablations that
    each remove one part (attention, output head; a chain of the weight products alone)
    so that the difference is what that part costs inside the step;
  * the XLA:CPU profiler's time per executed op (thunk), grouped by kind (the weight
    products by matrix, attention, the output head, elementwise fusions, cache writes),
    for T = 1 and T = 5, with how many ops of each kind a step runs;
  * process CPU time / wall time (how many of the cores the step keeps busy);
  * what XLA's cost analysis says a step reads, and the resulting bandwidth;
  * this machine's read bandwidth over a buffer as large as the weights: XLA's own
    reduction (jnp.sum) and specjax's streaming kernel (kernels.cpu.stream_sum: every
    thread, prefetching, as the product kernels read weights); the best of 9 each.

Writes results.json (with provenance) and profile.md (the tables BENCHMARKS.md quotes).
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import pathlib
import re
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from specjax.bench import provenance
from specjax.checkpoints import loader
from specjax.kernels import cpu as cpu_kernels
from specjax.models import llama
from specjax.models.kv_cache import KVCache

flags.DEFINE_integer('cache_size', 512, 'KV slots per row (the engine bucket for ~300-token runs).')
flags.DEFINE_integer('length', 300, 'Tokens already in the cache.')
flags.DEFINE_list('tokens', ['1', '2', '3', '5', '9'], 'New tokens per forward (T).')
flags.DEFINE_integer('rounds', 7, 'Interleaved rounds; medians are reported.')
flags.DEFINE_integer('calls', 10, 'Forwards per timed sample.')
flags.DEFINE_string('out', 'experiments/step_profile/results', 'Output folder.')
FLAGS = flags.FLAGS


def _ablated(params, tokens, cache, cfg, attention=True, head=True):
  """llama.forward with attention (the output replaced by q) and/or the output head removed."""
  t = tokens.shape[1]
  positions = cache.lengths[:, None] + jnp.arange(t, dtype=jnp.int32)
  mask = jnp.arange(cache.cache_size)[None, None, :] <= positions[:, :, None]
  new_k, new_v = list(cache.k), list(cache.v)

  def attend(i, q, k, v):
    new_k[i] = llama.write_slots(cache.k[i], k, positions)
    new_v[i] = llama.write_slots(cache.v[i], v, positions)
    return llama.attention(q, new_k[i], new_v[i], mask) if attention else q

  x = llama._decoder(params, tokens, positions, cfg, None, attend)
  if head:
    out = llama.logits_from_hidden(params, x, cfg)
  else:
    out = jnp.pad(x, ((0, 0), (0, 0), (0, cfg.vocab_size - x.shape[-1])))
  return out, KVCache(k=new_k, v=new_v, lengths=cache.lengths + t)


def _products_only(params, tokens, cache, cfg):
  """Only the weight products, with the model's order and dependencies."""
  x = jnp.take(params['embed'], tokens, axis=0)
  for p in params['layers']:
    q, k, v = x @ p['wq'], x @ p['wk'], x @ p['wv']
    x = x + (q + jnp.tile(k + v, cfg.n_heads // cfg.n_kv_heads)) @ p['wo']
    x = x + ((x @ p['w_gate']) * (x @ p['w_up'])) @ p['w_down']
  return llama.logits_from_hidden(params, x, cfg), cache


VARIANTS = {
  'full step': lambda p, t, c, cfg: llama.forward(p, t, c, cfg)[:2],
  'without attention': lambda p, t, c, cfg: _ablated(p, t, c, cfg, attention=False),
  'without output head': lambda p, t, c, cfg: _ablated(p, t, c, cfg, head=False),
  'weight products only': _products_only,
}


def _classify(name: str, hlo: dict[str, tuple[str, str, str]]) -> str | None:
  if name not in hlo:
    return None
  shape, op, rest = hlo[name]
  if op == 'dot' or (op == 'fusion' and 'ynn' in name):
    if 'embed' in rest:
      return 'output head (49152 x 576)'
    weight = re.search(r'p__layers___\d+___(\w+?)__', rest)
    if weight:
      return f'weight product {weight.group(1)}'
    m = re.match(r'f32\[(.*?)\]', shape)
    dims = [int(d) for d in m.group(1).split(',')] if m and m.group(1) else []
    if dims and dims[-1] == 49152:
      return 'output head (49152 x 576)'
    if len(dims) >= 3 or (dims and dims[-1] in (FLAGS.cache_size,)):
      return 'attention (scores, softmax, values)'
    return f'weight product [{shape.split("{")[0]}]'
  if op == 'fusion' and 'scatter' in name:
    return 'cache writes (scatter)'
  if op == 'fusion':
    return 'elementwise fusions (norms, RoPE, residuals, masks)'
  return f'other ({op})'


def _op_profile(fn, params, tokens, cache, calls: int = 10):
  """Per-kind thunk time (ms per forward) and op counts from the XLA:CPU profiler."""
  compiled = fn.lower(params, tokens, cache).compile()
  hlo = {}
  for line in compiled.as_text().split('\n'):
    m = re.match(r'\s*(?:ROOT )?%([\w.\-]+) = (\S+) (\w[\w\-]*)\((.*)', line)
    if m:
      hlo[m.group(1)] = (m.group(2), m.group(3), m.group(4))
  with tempfile.TemporaryDirectory() as d:
    with jax.profiler.trace(d, create_perfetto_trace=True):
      for _ in range(calls):
        logits, cache = fn(params, tokens, cache)
        cache = cache.with_lengths(cache.lengths - tokens.shape[1])
      logits.block_until_ready()
    trace = glob.glob(f'{d}/**/*.trace.json.gz', recursive=True)[0]
    events = json.load(gzip.open(trace))['traceEvents']
  busy, count = collections.Counter(), collections.Counter()
  for e in events:
    kind = _classify(e.get('name', ''), hlo) if e.get('ph') == 'X' else None
    if kind:
      busy[kind] += e['dur'] / 1e3 / calls
      count[kind] += 1 / calls
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return (
    {k: {'ms': round(v, 3), 'ops': round(count[k])} for k, v in busy.most_common()},
    cache,
    float(cost.get('bytes accessed', 0.0)),
  )


def read_bandwidth(nbytes: int, repeats: int = 9) -> dict[str, float]:
  """Best-of-`repeats` read bandwidth (GB/s) of a float32 buffer of `nbytes`."""
  x = jnp.ones((nbytes // 4,), jnp.float32)
  probes = {
    'XLA reduction (jnp.sum)': jax.jit(jnp.sum),
    'specjax stream kernel': jax.jit(cpu_kernels.stream_sum),
  }
  best = {}
  for name, fn in probes.items():
    fn(x).block_until_ready()
    times = []
    for _ in range(repeats):
      t0 = time.perf_counter()
      fn(x).block_until_ready()
      times.append(time.perf_counter() - t0)
    best[name] = nbytes / min(times) / 1e9
  return best


def main(argv):
  del argv
  out = pathlib.Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)
  model = loader.load_model('smollm2-135m-instruct')
  cfg, params = model.cfg, jax.device_put(model.params)
  weight_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(params))
  ts = [int(t) for t in FLAGS.tokens]
  fns = {
    name: jax.jit(lambda p, t, c, f=f: f(p, t, c, cfg)[:2], donate_argnums=2)
    for name, f in VARIANTS.items()
  }
  fresh = lambda: llama.init_cache(cfg, 1, FLAGS.cache_size).with_lengths(
    jnp.full((1,), FLAGS.length, jnp.int32)
  )
  caches = {}
  for name, fn in fns.items():
    for t in ts:
      logits, c = fn(params, jnp.ones((1, t), jnp.int32), fresh())
      logits.block_until_ready()
      caches[name, t] = c.with_lengths(c.lengths - t)
  wall = collections.defaultdict(list)
  cpu = collections.defaultdict(list)
  for r in range(FLAGS.rounds):
    print(f'round {r + 1}/{FLAGS.rounds}', flush=True)
    for (name, t), c in caches.items():
      tokens = jnp.ones((1, t), jnp.int32)
      t0, c0 = time.perf_counter(), time.process_time()
      for _ in range(FLAGS.calls):
        logits, c = fns[name](params, tokens, c)
        c = c.with_lengths(c.lengths - t)
      logits.block_until_ready()
      wall[name, t].append((time.perf_counter() - t0) / FLAGS.calls * 1e3)
      cpu[name, t].append((time.process_time() - c0) / FLAGS.calls * 1e3)
      caches[name, t] = c
  ms = {name: {t: float(np.median(wall[name, t])) for t in ts} for name in fns}
  busy = {t: float(np.median(cpu['full step', t]) / np.median(wall['full step', t])) for t in ts}
  ops, read = {}, {}
  for t in (1, 5):
    if t in ts:
      ops[t], caches['full step', t], read[t] = _op_profile(
        fns['full step'], params, jnp.ones((1, t), jnp.int32), caches['full step', t]
      )
  bandwidth = read_bandwidth(weight_bytes)
  results = {
    'provenance': provenance.provenance(),
    'read_bandwidth_gbs': bandwidth,
    'cache_size': FLAGS.cache_size,
    'length': FLAGS.length,
    'rounds': FLAGS.rounds,
    'calls_per_sample': FLAGS.calls,
    'weight_bytes': weight_bytes,
    'ms_per_forward': ms,
    'ratio_to_one_token_step': {t: ms['full step'][t] / ms['full step'][ts[0]] for t in ts},
    'cores_busy': busy,
    'op_profile': ops,
    'bytes_accessed_per_forward': read,
    'weight_bandwidth_gbs': {t: weight_bytes / ms['full step'][t] / 1e6 for t in ts},
  }
  (out / 'results.json').write_text(json.dumps(results, indent=1))
  lines = [
    f'Forward of T new tokens, batch 1, cache {FLAGS.cache_size} slots holding {FLAGS.length}; '
    f'median of {FLAGS.rounds} rounds x {FLAGS.calls} calls (ms).',
    '',
    '| variant | ' + ' | '.join(f'T={t}' for t in ts) + ' |',
    '|---|' + '---|' * len(ts),
  ]
  for name in fns:
    lines.append(f'| {name} | ' + ' | '.join(f'{ms[name][t]:.2f}' for t in ts) + ' |')
  lines.append(
    '| full step / one-token step | '
    + ' | '.join(f'{results["ratio_to_one_token_step"][t]:.2f}x' for t in ts)
    + ' |'
  )
  lines.append(
    '| cores busy (CPU time / wall) | ' + ' | '.join(f'{busy[t]:.2f}' for t in ts) + ' |'
  )
  roof = max(bandwidth.values())
  moved = weight_bytes / ms['full step'][ts[0]] / 1e6
  lines += [
    '',
    f'Read bandwidth over {weight_bytes / 1e6:.0f} MB (best of 9): '
    + ', '.join(f'{k} {v:.1f} GB/s' for k, v in bandwidth.items())
    + f'. The one-token step moves the weights at {moved:.1f} GB/s, {moved / roof:.2f} of the'
    ' best probe.',
  ]
  for t, table in ops.items():
    total = sum(v['ms'] for v in table.values())
    lines += [
      '',
      f'XLA:CPU profiler, T={t}: op time per forward by kind (ops may overlap on the two '
      f'cores; sum {total:.2f} ms, wall {ms["full step"][t]:.2f} ms; cost analysis: '
      f'{read[t] / 1e6:.0f} MB accessed)',
      '',
      '| kind | ms | ops |',
      '|---|---|---|',
    ]
    lines += [f'| {k} | {v["ms"]:.2f} | {v["ops"]} |' for k, v in table.items()]
  (out / 'profile.md').write_text('\n'.join(lines) + '\n')
  print('\n'.join(lines))


if __name__ == '__main__':
  app.run(main)
