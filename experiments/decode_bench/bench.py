r"""Decode speed of specjax on SmolLM2-135M-Instruct against the memory roofline and transformers.

  python experiments/decode_bench/bench.py --rounds 3 --max_new 128 \
      --out experiments/decode_bench/results

Measures, interleaved round by round so machine drift hits every method alike:
  * this machine's read bandwidth (numpy single thread, a jitted JAX reduction; the best
    counts) over a buffer as large as the model's weights;
  * specjax: prefill time of a 128-token prompt, decode tokens/s at batch 1, 4 and 8,
    and batch-1 bytes of weights read per step / step time as a fraction of that bandwidth;
  * transformers (torch CPU, the same GGUF, float32): greedy tokens/s at batch 1.
EOS is disabled on both sides so that every run generates exactly --max_new tokens.
Reports medians over rounds in results.json (with the run's provenance) and prints it.
"""

from __future__ import annotations

import json
import os
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from specjax.bench import provenance
from specjax.checkpoints import loader
from specjax.data import assets
from specjax.data import prompts as prompts_lib
from specjax.decode.engine import Engine

flags.DEFINE_integer('rounds', 3, 'Rounds of every measurement; medians are reported.')
flags.DEFINE_integer('max_new', 128, 'Tokens generated per prompt (EOS disabled).')
flags.DEFINE_string('out', 'experiments/decode_bench/results', 'Folder for results.json.')
flags.DEFINE_bool('skip_transformers', False, 'Leave out the transformers comparison.')
FLAGS = flags.FLAGS


def read_bandwidth(nbytes: int, repeats: int = 7) -> dict[str, float]:
  """Best-of-`repeats` read bandwidth in GB/s over a buffer of `nbytes`."""
  host = np.ones(nbytes // 4, np.float32)
  dev = jnp.asarray(host)
  total = jax.jit(jnp.sum)
  total(dev).block_until_ready()
  best = {'numpy': 0.0, 'jax': 0.0}
  for _ in range(repeats):
    t = time.perf_counter()
    host.sum()
    best['numpy'] = max(best['numpy'], nbytes / (time.perf_counter() - t) / 1e9)
    t = time.perf_counter()
    total(dev).block_until_ready()
    best['jax'] = max(best['jax'], nbytes / (time.perf_counter() - t) / 1e9)
  return best


def transformers_model(gguf_path: pathlib.Path):
  import torch
  import transformers

  torch.set_num_threads(os.cpu_count() or 1)
  model = transformers.AutoModelForCausalLM.from_pretrained(
    str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
  )
  return model.eval()


def transformers_greedy(model, prompt: list[int], max_new: int) -> tuple[float, float]:
  """(prefill seconds, total seconds) of a greedy generate that ignores EOS."""
  import torch

  ids = torch.tensor([prompt])
  with torch.inference_mode():
    t = time.perf_counter()
    model(ids)
    prefill = time.perf_counter() - t
    t = time.perf_counter()
    out = model.generate(
      ids,
      max_new_tokens=max_new,
      min_new_tokens=max_new,
      do_sample=False,
      eos_token_id=None,
      pad_token_id=0,
    )
    total = time.perf_counter() - t
  assert out.shape[1] == len(prompt) + max_new, out.shape
  return prefill, total


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')

  model = loader.load_model('smollm2-135m-instruct')
  tok = model.tokenizer
  mtbench = prompts_lib.load_prompts('mtbench')
  prompts = [tok.encode_chat(p.text) for p in mtbench[::10]]  # one per category
  long_prompt = (sum(prompts, []) * 4)[:128]
  engine = Engine(model.params, model.cfg, eos_id=-1, cache_size=1024)
  weight_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(model.params))
  hf = (
    None if FLAGS.skip_transformers else transformers_model(assets.fetch('smollm2-135m-instruct'))
  )

  rows = {
    k: []
    for k in (
      'bw_numpy',
      'bw_jax',
      'prefill128_ms',
      'b1',
      'b4',
      'b8',
      'b1_step_ms',
      'hf_b1',
      'hf_e2e_b1',
      'sj_e2e_b1',
    )
  }
  for r in range(FLAGS.rounds):
    bw = read_bandwidth(weight_bytes)
    rows['bw_numpy'].append(bw['numpy'])
    rows['bw_jax'].append(bw['jax'])
    rows['prefill128_ms'].append(
      1e3 * engine.generate([long_prompt], max_new_tokens=1).prefill_seconds
    )
    b1 = [engine.generate([p], max_new_tokens=FLAGS.max_new) for p in prompts]
    rows['b1'].append(np.median([o.decode_tokens_per_second for o in b1]))
    rows['b1_step_ms'].append(np.median([o.decode_seconds / o.steps * 1e3 for o in b1]))
    rows['sj_e2e_b1'].append(
      np.median([FLAGS.max_new / (o.prefill_seconds + o.decode_seconds) for o in b1])
    )
    for b in (4, 8):
      o = engine.generate(
        prompts[:b] if b <= len(prompts) else (prompts * 2)[:b], max_new_tokens=FLAGS.max_new
      )
      rows[f'b{b}'].append(o.decode_tokens_per_second)
    if hf is not None:
      runs = [transformers_greedy(hf, p, FLAGS.max_new) for p in prompts]
      rows['hf_b1'].append(np.median([(FLAGS.max_new - 1) / (total - pre) for pre, total in runs]))
      rows['hf_e2e_b1'].append(np.median([FLAGS.max_new / total for _, total in runs]))
    print(
      f'round {r + 1}/{FLAGS.rounds}: '
      + ', '.join(f'{k}={v[-1]:.1f}' for k, v in rows.items() if v),
      flush=True,
    )

  med = {k: float(np.median(v)) for k, v in rows.items() if v}
  bandwidth = max(med['bw_numpy'], med['bw_jax'])
  achieved = weight_bytes / (med['b1_step_ms'] / 1e3) / 1e9
  result = {
    'provenance': provenance.provenance(),
    'backend': jax.default_backend(),
    'rounds': FLAGS.rounds,
    'max_new': FLAGS.max_new,
    'prompts': len(prompts),
    'weight_bytes': weight_bytes,
    'medians': med,
    'bandwidth_gb_s': bandwidth,
    'achieved_gb_s': achieved,
    'roofline_fraction': achieved / bandwidth,
  }
  if 'hf_b1' in med:
    result['speedup_vs_transformers_decode'] = med['b1'] / med['hf_b1']
    result['speedup_vs_transformers_e2e'] = med['sj_e2e_b1'] / med['hf_e2e_b1']
  out = pathlib.Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)
  (out / 'results.json').write_text(json.dumps(result, indent=2))
  print(json.dumps(result, indent=2))


if __name__ == '__main__':
  app.run(main)
