r"""The distilled draft on SmolLM2-135M-Instruct: acceptance, draft cost, speedup, and
transformers' assisted generation with the same pair, in one run.

  python experiments/distill_bench/bench.py --draft distilled --gammas 3,5 --max_new 128 \
      --num_prompts 8 --out experiments/distill_bench/results

For each prompt set (the first N HumanEval tasks; MT-bench one question per category),
batch 1, greedy (and temperature 1 on HumanEval with --t1): specjax autoregressive
decoding, specjax speculative decoding with the draft at each gamma, the same draft
architecture before distillation (its initialisation from the target, --compare_init),
and transformers (torch, CPU) greedy decoding with and without `assistant_model` = the
draft exported to a Hugging Face directory (full-vocabulary head with zero columns outside
the draft vocabulary: same greedy choices), all on the same prompts in the same run, one method
after another over the prompt set.
The draft's per-token cost is timed against the target's step in the same run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import tempfile
import time

import numpy as np
from absl import app, flags

from specjax import registry
from specjax.bench import provenance
from specjax.checkpoints import draft_dir, hf, loader
from specjax.core.sampling import SamplingConfig
from specjax.data import prompts as prompts_lib
from specjax.decode.engine import Engine
from specjax.decode.method import Method
from specjax.drafters import distilled

flags.DEFINE_string('draft', 'distilled', 'A distilled draft spec: distilled or distilled:DIR.')
flags.DEFINE_string('gammas', '3,5', 'Comma-separated draft lengths.')
flags.DEFINE_integer('max_new', 128, 'Tokens generated per prompt.')
flags.DEFINE_integer('num_prompts', 8, 'HumanEval prompts (the first N).')
flags.DEFINE_bool('compare_init', False, 'Also the draft before distillation.')
flags.DEFINE_bool('t1', False, 'also temperature 1 on HumanEval')
flags.DEFINE_bool('transformers', False, "Also transformers' greedy and assisted generation.")
flags.DEFINE_string('out', 'experiments/distill_bench/results', 'Folder for results.json.')
FLAGS = flags.FLAGS


def _sibling(name: str):
  """The module `name`.py of this folder (experiments/ is not a package)."""
  path = pathlib.Path(__file__).with_name(f'{name}.py')
  spec = importlib.util.spec_from_file_location(f'distill_bench_{name}', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


cost_lib = _sibling('cost')  # step_ms, subset_forward: the same timing as cost.py


def prompt_sets(tokenizer, n):
  he = prompts_lib.load_prompts('humaneval', n)
  mt = prompts_lib.load_prompts('mtbench')[::10]
  return {
    'humaneval': [tokenizer.encode_chat(p.text) for p in he],
    'mtbench': [tokenizer.encode_chat(p.text) for p in mt],
  }


def run_specjax(engine, prompts, gamma, max_new, sampling):
  tokens = seconds = drafted = accepted = 0
  outs = []
  for i, p in enumerate(prompts):
    o = engine.generate([p], Method.chain(gamma), max_new_tokens=max_new, sampling=sampling, seed=i)
    tokens += o.num_generated
    seconds += o.prefill_seconds + o.decode_seconds
    drafted += sum(sum(d) for d in o.drafted)
    accepted += sum(sum(a) for a in o.accepted)
    outs.append(o.tokens[0])
  return {
    'tokens': tokens,
    'seconds': seconds,
    'tokens_per_second': tokens / seconds,
    'acceptance_rate': accepted / drafted if drafted else None,
  }, outs


def run_transformers(model, prompts, max_new, eos_id, assistant=None, gamma=0):
  import torch

  tokens = seconds = 0
  outs = []
  kwargs = {}
  if assistant is not None:
    assistant.generation_config.num_assistant_tokens = gamma
    assistant.generation_config.num_assistant_tokens_schedule = 'constant'
    assistant.generation_config.assistant_confidence_threshold = 0.0
    kwargs['assistant_model'] = assistant
  with torch.inference_mode():
    for p in prompts:
      ids = torch.tensor([p])
      model.generate(
        ids, max_new_tokens=2, do_sample=False, eos_token_id=eos_id, pad_token_id=eos_id, **kwargs
      )  # warm-up
      t = time.perf_counter()
      out = model.generate(
        ids,
        max_new_tokens=max_new,
        do_sample=False,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        **kwargs,
      )
      seconds += time.perf_counter() - t
      new = out[0, len(p) :].tolist()
      tokens += len(new)
      outs.append(new)
  return {'tokens': tokens, 'seconds': seconds, 'tokens_per_second': tokens / seconds}, outs


def init_draft(target, cfg, params, info):
  """The draft before distillation: the same architecture initialised from the target."""
  layers = tuple(int(i) % target.cfg.n_layers for i in info['init_layers'])
  return distilled.init_from_target(
    target.cfg, target.params, layers, np.asarray(params['vocab_ids']), cfg.ffn_dim
  )[1]


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  gammas = [int(g) for g in FLAGS.gammas.split(',')]

  target = loader.load_model('smollm2-135m-instruct')
  drafter, draft_params = registry.build_draft(FLAGS.draft, target)
  path = distilled.SHIPPED if FLAGS.draft == 'distilled' else FLAGS.draft.split(':')[-1]
  _, _, info = draft_dir.load_draft_dir(path, target.params['embed'])
  engine = Engine(
    target.params,
    target.cfg,
    eos_id=target.tokenizer.eos_id,
    cache_size=1024,
    drafter=drafter,
    draft_params=draft_params,
  )
  sets = prompt_sets(target.tokenizer, FLAGS.num_prompts)
  target_ms = cost_lib.step_ms(target.cfg.family.forward, engine.params, target.cfg)
  draft_ms = cost_lib.step_ms(cost_lib.subset_forward, engine.draft_params, drafter.cfg)
  results = {
    'cost': {'target_step_ms': target_ms, 'draft_step_ms': draft_ms, 'ratio': draft_ms / target_ms}
  }
  print(
    f"draft step {draft_ms:.2f} ms = {100 * draft_ms / target_ms:.1f}% of the target's "
    f'{target_ms:.2f} ms',
    flush=True,
  )
  meta = _meta(drafter.name, info)
  init_engine = None
  if FLAGS.compare_init:
    init_engine = Engine(
      target.params,
      target.cfg,
      eos_id=target.tokenizer.eos_id,
      cache_size=1024,
      drafter=drafter,
      draft_params=init_draft(target, drafter.cfg, draft_params, info),
    )
  settings = [(name, 0.0) for name in sets] + ([('humaneval', 1.0)] if FLAGS.t1 else [])
  for name, temp in settings:
    sampling = SamplingConfig(temperature=temp)
    base, base_out = run_specjax(engine, sets[name], 0, FLAGS.max_new, sampling)
    row = {'autoregressive': base}
    for g in gammas:
      res, out = run_specjax(engine, sets[name], g, FLAGS.max_new, sampling)
      res['speedup'] = res['tokens_per_second'] / base['tokens_per_second']
      if temp == 0:
        res['greedy_mismatches'] = sum(a != b for a, b in zip(out, base_out))
      row[f'speculative_gamma{g}'] = res
      if init_engine is not None:
        res0, _ = run_specjax(init_engine, sets[name], g, FLAGS.max_new, sampling)
        res0['speedup'] = res0['tokens_per_second'] / base['tokens_per_second']
        row[f'before_distillation_gamma{g}'] = res0
      print(
        f'{name} T={temp:g} gamma={g}: acceptance {res["acceptance_rate"]:.3f}, '
        f'{res["tokens_per_second"]:.1f} tok/s, {res["speedup"]:.2f}x of '
        f'{base["tokens_per_second"]:.1f}'
        + (
          f'; before distillation {res0["acceptance_rate"]:.3f} ({res0["speedup"]:.2f}x)'
          if init_engine is not None
          else ''
        ),
        flush=True,
      )
    results[f'{name}_T{temp:g}'] = row
    save(FLAGS.out, meta, results)
  if FLAGS.transformers:
    results['transformers'] = compare_transformers(
      target, drafter, draft_params, sets, gammas, FLAGS.max_new, results
    )
    save(FLAGS.out, meta, results)


def save(folder, meta, results):
  out = pathlib.Path(folder)
  out.mkdir(parents=True, exist_ok=True)
  (out / 'results.json').write_text(json.dumps({'meta': meta, 'results': results}, indent=2))


def _meta(label, info):
  return {
    **provenance.provenance(),
    'draft': label,
    'info': info,
    'max_new': FLAGS.max_new,
    'num_prompts': FLAGS.num_prompts,
  }


def compare_transformers(target, drafter, draft_params, sets, gammas, max_new, results):
  """transformers greedy and assisted generation on the same prompts; specjax's figures
  from this run beside them."""
  import torch
  import transformers

  torch.set_num_threads(os.cpu_count())
  tmp = pathlib.Path(tempfile.mkdtemp(prefix='distill_bench_'))
  hf.export_hf(tmp / 'target', target.cfg, target.params, target.tokenizer)
  draft_dir.export_hf(tmp / 'draft', drafter.cfg, draft_params, target.tokenizer)
  model = transformers.AutoModelForCausalLM.from_pretrained(
    tmp / 'target', dtype=torch.float32
  ).eval()
  assistant = transformers.AutoModelForCausalLM.from_pretrained(
    tmp / 'draft', dtype=torch.float32
  ).eval()
  out = {}
  eos = target.tokenizer.eos_id
  for name, prompts in sets.items():
    plain, _ = run_transformers(model, prompts, max_new, eos)
    row = {'greedy': plain}
    for g in gammas:
      res, _ = run_transformers(model, prompts, max_new, eos, assistant, g)
      res['speedup_over_transformers_greedy'] = (
        res['tokens_per_second'] / plain['tokens_per_second']
      )
      ours = results[f'{name}_T0'][f'speculative_gamma{g}']['tokens_per_second']
      res['specjax_speculative_over_assisted'] = ours / res['tokens_per_second']
      row[f'assisted_gamma{g}'] = res
      print(
        f'transformers {name} gamma={g}: assisted {res["tokens_per_second"]:.1f} tok/s '
        f'(greedy {plain["tokens_per_second"]:.1f}); specjax speculative {ours:.1f} tok/s = '
        f'{res["specjax_speculative_over_assisted"]:.2f}x assisted',
        flush=True,
      )
    out[name] = row
  return out


if __name__ == '__main__':
  app.run(main)
