r"""Where one decoding iteration's time goes, op by op, in the real loop.

  python experiments/cpu_paths/iteration_profile.py [--method quantized@4,quantized@adaptive]
      [--adaptive_gammas 1,2,4,8] [--prompts humaneval]
      [--out experiments/cpu_paths/iteration_profile]

Loads SmolLM2-135M-Instruct and its quantized self-draft (the target's GGUF blocks), lets
the kernels choose their paths as a run does (bench/costs.tune_forwards, reading back what
this machine recorded), decodes one prompt greedily with autoregressive decoding and each
`--method` (adaptive control with the costs measured here, as a run measures them), and
runs each once more under XLA:CPU's profiler, all in one process. Every op the decode loop ran
is charged to its iteration: products by their kernel (the f32 products of the target,
the q4_1/q8_0 block products of the draft, attention) and row count, XLA's own ops by kind.
The tables say how many of each an iteration runs and their ms, beside this machine's
streaming bandwidth (kernels.cpu.stream_sum over a buffer as large as the target's
weights) and the least time a forward that reads every weight once can take.

Writes profile.md and profile.json to --out. Run it on a quiet machine.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import pathlib
import re
import shutil
import sys
import tempfile
import time

DUMP = tempfile.mkdtemp(prefix='specjax_hlo_')
os.environ['XLA_FLAGS'] = (
  os.environ.get('XLA_FLAGS', '')
  + f' --xla_dump_to={DUMP} --xla_dump_hlo_as_text --xla_dump_hlo_pass_re=NONE'
  + ' --xla_dump_hlo_module_re=.*decode.*'
)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from absl import app, flags  # noqa: E402

from specjax import config_lib  # noqa: E402
from specjax.bench import costs, provenance  # noqa: E402
from specjax.checkpoints import loader  # noqa: E402
from specjax.control.adaptive import AdaptiveConfig  # noqa: E402
from specjax.data import prompts as prompts_lib  # noqa: E402
from specjax.decode.engine import Engine  # noqa: E402
from specjax.decode.method import Method  # noqa: E402
from specjax.drafters import model as model_drafters  # noqa: E402
from specjax.kernels import cpu as cpu_kernels  # noqa: E402

FLAGS = flags.DEFINE_string(
  'method', 'quantized@4', 'quantized@<gamma> or quantized@adaptive, several comma separated'
)
GAMMAS = flags.DEFINE_list('adaptive_gammas', ['1', '2', '4', '8'], 'the adaptive arms')
PROMPTS = flags.DEFINE_string('prompts', 'humaneval', 'a prompt set; its first prompt is decoded')
OUT = flags.DEFINE_string('out', 'experiments/cpu_paths/iteration_profile', 'output folder')
TOKENS = flags.DEFINE_integer('max_new_tokens', 128, 'new tokens')
CACHE = 512


def _hlo(module_text: str) -> dict[str, tuple[str, str]]:
  """{op name: (result shape, what it is)} of a compiled module's text."""
  out = {}
  for line in module_text.split('\n'):
    m = re.match(r'\s*(?:ROOT )?%([\w.\-]+) = (\S+) ([\w\-]+)\((.*)', line)
    if not m:
      continue
    target = re.search(r'custom_call_target="([^"]+)"', line)
    op = re.search(r'op_name="([^"]*)"', line)
    what = target.group(1) if target else (op.group(1).split('/')[-1] if op else m.group(3))
    out[m.group(1)] = (m.group(2), what)
  return out


def _profile(engine, prompt, gamma: int, adaptive=None) -> tuple[dict, float, int]:
  """{(what, shape): [ms per iteration, ops per iteration]}, ms per iteration, iterations."""

  def run():
    method = Method.chain(gamma, 'greedy')
    if adaptive is not None:
      method = Method.adaptive(adaptive, 'greedy')
    return engine.generate([prompt], method, max_new_tokens=TOKENS.value)

  run()
  with tempfile.TemporaryDirectory() as d:
    with jax.profiler.trace(d, create_perfetto_trace=True):
      out = run()
    trace = glob.glob(f'{d}/**/*.trace.json.gz', recursive=True)[0]
    events = json.load(gzip.open(trace))['traceEvents']
  modules = sorted(
    glob.glob(f'{DUMP}/*jit_decode.cpu_after_optimizations.txt'), key=os.path.getmtime
  )
  hlo = _hlo(pathlib.Path(modules[-1]).read_text())
  spans = [e for e in events if e.get('name') == 'PjitFunction(decode)' and e.get('ph') == 'X']
  start = spans[-1]['ts']
  ops: dict = collections.defaultdict(lambda: [0.0, 0.0])
  for e in events:
    if e.get('ph') != 'X' or e['ts'] < start or e['name'] not in hlo:
      continue
    shape, what = hlo[e['name']]
    ops[what, shape][0] += e['dur'] / 1e3 / out.steps
    ops[what, shape][1] += 1 / out.steps
  return dict(ops), 1e3 * out.decode_seconds / out.steps, out.steps


def _group(what: str) -> str:
  """The part of an iteration an op belongs to."""
  if what.startswith('specjax_linear') or what == 'dot_general':  # XLA's: the target's here
    return 'target weight products (f32)'
  if what.startswith('specjax_blocks'):
    return 'draft weight products (q4_1 / q8_0 blocks)'
  if what.startswith('specjax_attention') or 'attention' in what:
    return 'attention (kernel)'
  if what.startswith('specjax_argmax'):
    return 'argmax of logits (kernel)'
  return "XLA's other ops (norms, RoPE, cache writes, sampling)"


def main(argv):
  del argv
  methods = FLAGS.value.split(',')
  for m in methods:
    kind, _, gamma = m.partition('@')
    if kind != 'quantized' or not (gamma.isdigit() or gamma == 'adaptive'):
      sys.exit(f'--method: quantized@<gamma> or quantized@adaptive, comma separated; got {m!r}')
  out = pathlib.Path(OUT.value)
  out.mkdir(parents=True, exist_ok=True)
  config = config_lib.load_config(
    pathlib.Path(__file__).resolve().parents[2] / 'configs' / 'smollm2.py'
  )
  model = loader.load_model(config.model, config.dtype)
  drafter, dparams = model_drafters.QUANTIZED.build(('auto', True), model, config.dtype)
  # The target as an engine holds it on one device (q|k|v joined): its kernel choices are
  # recorded per parameter tree, and the unjoined tree's would not reach the engine's.
  tp = jax.device_put(model.cfg.family.fuse(model.params))
  dp, cfg = jax.device_put(dparams), model.cfg
  arms = tuple(int(a) for a in GAMMAS.value)
  fixed = [int(m.partition('@')[2]) for m in methods if not m.endswith('@adaptive')]
  costs.tune_forwards(tp, cfg, 1, sorted({1, *(g + 1 for g in (*arms, *fixed))}), CACHE)
  costs.tune_forwards(dp, drafter.cfg, 1, [1, 2], CACHE, forward=drafter.forward, name='draft')
  runs = []  # (name, gamma, adaptive config)
  for m in methods:
    if m.endswith('@adaptive'):  # the run's costs, measured here as the harness does
      _, measured = costs.measure_drafts(tp, cfg, {'q': (drafter, dp, arms)}, 1, CACHE)
      c = measured['q']
      adaptive = AdaptiveConfig(
        gammas=arms,
        draft_cost=tuple(c.units(a)[0] for a in arms),
        verify_cost=tuple(c.units(a)[1] for a in arms),
        catch_up_cost=c.c,
      )
      runs.append((m, max(arms), adaptive))
    else:
      runs.append((m, int(m.partition('@')[2]), None))
  engine = Engine(tp, cfg, eos_id=-1, cache_size=CACHE, drafter=drafter, draft_params=dp)
  prompt = model.tokenizer.encode_chat(prompts_lib.load_prompts(PROMPTS.value, 1)[0].text)
  print(f'prompt: {len(prompt)} tokens; profiling autoregressive and {FLAGS.value}', flush=True)
  x = jnp.ones((sum(a.nbytes for a in jax.tree_util.tree_leaves(tp)) // 4,), jnp.float32)
  stream = jax.jit(cpu_kernels.stream_sum)
  stream(x).block_until_ready()
  t0 = time.perf_counter()
  for _ in range(5):
    stream(x).block_until_ready()
  gbs = x.nbytes * 5 / (time.perf_counter() - t0) / 1e9
  del x
  target_mb = sum(a.nbytes for a in jax.tree_util.tree_leaves(tp)) / 1e6
  draft_mb = sum(a.nbytes for a in jax.tree_util.tree_leaves(dp)) / 1e6
  results = {
    'provenance': provenance.provenance(),
    'stream_gb_s': gbs,
    'prompt_tokens': len(prompt),
    'target MB': target_mb,
    'draft MB': draft_mb,
  }
  lines = [
    f'# One decoding iteration, op by op ({FLAGS.value}, {PROMPTS.value} prompt 1, '
    f'{len(prompt)} prompt tokens, {TOKENS.value} new)',
    '',
    f'CPU: {results["provenance"]["machine"]}; this machine streams '
    f"{gbs:.1f} GB/s (kernels.cpu.stream_sum over the target's {target_mb:.0f} MB, mean of "
    f'5): a forward that reads every weight once takes at least {target_mb / gbs:.1f} ms '
    f'(target) and {draft_mb / gbs:.1f} ms (draft, {draft_mb:.0f} MB).',
    '',
  ]
  for name, gm, ad in (('autoregressive', 0, None), *runs):
    ops, ms, steps = _profile(engine, prompt, gm, ad)
    total = sum(v[0] for v in ops.values())
    results[name] = {
      'ms_per_iteration': ms,
      'iterations': steps,
      'ops': [
        {'what': w, 'shape': s, 'ms': v[0], 'per_iteration': v[1]} for (w, s), v in ops.items()
      ],
    }
    lines += [
      f'## {name}: {ms:.2f} ms an iteration ({steps} iterations); the ops sum to {total:.2f} ms',
      '',
      '| part | ms | share |',
      '| --- | --- | --- |',
    ]
    groups = collections.Counter()
    for (what, _), (t, _) in ops.items():
      groups[_group(what)] += t
    lines += [f'| {k} | {v:.2f} | {v / total:.0%} |' for k, v in groups.most_common()]
    lines += ['', '| op | result shape | per iteration | ms |', '| --- | --- | --- | --- |']
    for (what, shape), (t, n) in sorted(ops.items(), key=lambda kv: -kv[1][0])[:24]:
      lines.append(f'| {what} | {shape.split("{")[0]} | {n:.0f} | {t:.2f} |')
    lines.append('')
  (out / 'profile.md').write_text('\n'.join(lines))
  (out / 'profile.json').write_text(json.dumps(results, indent=1, default=str))
  print('\n'.join(lines))
  shutil.rmtree(DUMP, ignore_errors=True)


if __name__ == '__main__':
  app.run(main)
