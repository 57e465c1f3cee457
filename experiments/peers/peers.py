r"""specjax beside llama.cpp and transformers on the same weights, prompts and threads, one run.

  bash experiments/peers/build_llama_cpp.sh          # once (~4 min on 2 cores), outside the repo
  python experiments/peers/peers.py --out experiments/peers/results

Every engine decodes greedily at batch 1 from SmolLM2-135M-Instruct's own weights (the
q4_1 GGUF's values: specjax and transformers expand them to float32, llama.cpp reads a
float32 GGUF made from that file with its llama-quantize, and its Q4_1 rows read the
original file), with each machine core as one thread, on the same chat-rendered prompts
(by default the last 4 of specjax's 20 code-editing prompts, where prompt lookup pays):

  specjax         greedy; prompt lookup (ngram:3-8 at gamma 12); the quantized self-draft
                  (the target's q4_1 blocks with 8-bit products, gamma 4)
  llama.cpp       llama-completion, float32 weights, float32 and float16 KV cache;
                  llama-lookup (prompt lookup) with each cache; llama-completion on Q4_1
  transformers    greedy; prompt lookup (prompt_lookup_num_tokens=10); assisted generation
                  with specjax's distilled draft exported as a Hugging Face model (gamma 4)

Reported per engine: decode tokens/s (the tokens after the first over the time after the
prompt's forward), tokens/s including the prompt's forward, prefill tokens/s, target
forwards per generated token, speedup over the same engine's own greedy, and whether its
text equals specjax greedy's. llama.cpp's figures are its own timers (common_perf_print;
llama-lookup's encode/decode lines); transformers has no separate prefill timer, so only
its end-to-end rate is given. Not part of CI.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import statistics
import subprocess
import tempfile
import time

import numpy as np
from absl import app, flags

from specjax import registry
from specjax.bench import provenance
from specjax.checkpoints import draft_dir, hf, loader
from specjax.data import assets
from specjax.data import prompts as prompts_lib
from specjax.decode.engine import Engine
from specjax.decode.method import Method

PEERS = pathlib.Path(os.environ.get('SPECJAX_PEERS', pathlib.Path.home() / '.cache/specjax-peers'))
flags.DEFINE_string('prompts', 'code_edit', 'Prompt set (specjax/data/prompts.py).')
flags.DEFINE_integer('last', 4, 'Use the last N prompts of the set (0: all).')
flags.DEFINE_integer('max_new', 256, 'Most new tokens per prompt (EOS ends a row earlier).')
flags.DEFINE_integer('rounds', 3, 'Runs of every prompt per engine; medians are reported.')
flags.DEFINE_list(
  'specjax_drafts',
  ['ngram:3-8@12', 'quantized@4'],
  'specjax drafts as SPEC@GAMMA: prompt lookup, and the target in its q4_1 blocks.',
)
flags.DEFINE_integer('llama_draft_max', 16, 'llama-lookup --spec-draft-n-max (its default).')
flags.DEFINE_string('llama_cpp', str(PEERS / 'llama.cpp/build/bin'), 'llama.cpp binaries.')
flags.DEFINE_bool('skip_llama_cpp', False, 'Leave out llama.cpp.')
flags.DEFINE_bool('skip_transformers', False, 'Leave out transformers.')
flags.DEFINE_string('out', 'experiments/peers/results', 'Folder for results.json and table.md.')
FLAGS = flags.FLAGS
THREADS = os.cpu_count() or 1


def _rate(tokens, seconds):
  return tokens / seconds if seconds > 0 else float('nan')


def _summary(runs: list[dict]) -> dict:
  """Medians over rounds of the per-round totals over prompts."""
  keys = runs[0].keys()
  return {k: statistics.median(r[k] for r in runs) for k in keys if k != 'texts'}


def specjax_runs(target, prompt_ids, texts_out):
  result = {}
  methods = [('greedy', None, 0)] + [
    (spec, spec, int(g)) for spec, g in (d.rsplit('@', 1) for d in FLAGS.specjax_drafts)
  ]
  for label, spec, gamma in methods:
    drafter, draft_params = registry.build_draft(spec, target) if spec else (None, None)
    engine = Engine(
      target.params,
      target.cfg,
      eos_id=target.tokenizer.eos_id,
      cache_size=1024,
      drafter=drafter,
      draft_params=draft_params,
    )
    name = label if not spec else f'{drafter.name}, gamma {gamma}'
    for p in prompt_ids:
      engine.generate([p], Method.chain(gamma), max_new_tokens=FLAGS.max_new)  # compiles this shape
    rounds = []
    for _ in range(FLAGS.rounds):
      tot = dict(generated=0, prefill_s=0.0, decode_s=0.0, calls=0, prompt_tokens=0)
      texts = []
      for p in prompt_ids:
        out = engine.generate([p], Method.chain(gamma), max_new_tokens=FLAGS.max_new)
        tot['generated'] += out.num_generated
        tot['prefill_s'] += out.prefill_seconds
        tot['decode_s'] += out.decode_seconds
        tot['calls'] += out.steps + 1
        tot['prompt_tokens'] += len(p)
        texts.append(target.tokenizer.decode(out.tokens[0]))
      rounds.append(tot | {'texts': texts})
    texts_out[f'specjax {name}'] = rounds[0]['texts']
    result[f'specjax {name}'] = _figures(rounds, len(prompt_ids))
    print(f'specjax {name}: {result[f"specjax {name}"]["decode_tok_s"]:.1f} tok/s', flush=True)
  return result


def _figures(rounds, n_prompts):
  rows = []
  for r in rounds:
    rows.append(
      {
        'decode_tok_s': _rate(r['generated'] - n_prompts, r['decode_s']),
        'total_tok_s': _rate(r['generated'], r['prefill_s'] + r['decode_s']),
        'prefill_tok_s': _rate(r['prompt_tokens'], r['prefill_s']),
        'tokens_per_call': r['generated'] / r['calls'],
        'generated': r['generated'],
      }
    )
  return _summary(rows)


_PROMPT_EVAL = re.compile(r'prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens')
_EVAL = re.compile(r'\beval time =\s*([\d.]+) ms /\s*(\d+) runs')
_ENCODED = re.compile(r'encoded\s+(\d+) tokens in\s+([\d.]+) seconds')
_DECODED = re.compile(r'decoded\s+(\d+) tokens in\s+([\d.]+) seconds')
_ACCEPT = re.compile(r'n_accept\s*=\s*(\d+)')
_ANSI = re.compile(r'\x1b\[[0-9;]*m')


def _llama(binary: str, model: pathlib.Path, prompt_file: pathlib.Path, extra: list[str]):
  # --no-escape: the prompts' backslashes are code ('\\x3f'), not escape sequences.
  cmd = [
    str(pathlib.Path(FLAGS.llama_cpp) / binary),
    '-m', str(model), '-f', str(prompt_file), '-n', str(FLAGS.max_new),
    '--temp', '0', '-t', str(THREADS), '-c', '2048', '--seed', '0', '--no-escape', *extra,
  ]  # fmt: skip
  if binary == 'llama-completion':
    cmd += ['-no-cnv', '--no-display-prompt']
  done = subprocess.run(cmd, capture_output=True, text=True)
  if done.returncode:
    raise RuntimeError(f'{" ".join(cmd)} failed:\n{done.stderr[-3000:]}')
  return done.stdout, done.stderr


def llama_cpp_runs(prompt_texts, texts_out):
  f32 = PEERS / 'smollm2-135m-instruct-f32.gguf'
  q4 = assets.fetch('smollm2-135m-instruct')
  if not f32.exists():
    quantize = str(pathlib.Path(FLAGS.llama_cpp) / 'llama-quantize')
    cmd = [quantize, '--allow-requantize', str(q4), str(f32), 'F32']
    subprocess.run(cmd, check=True, capture_output=True)
  tmp = pathlib.Path(tempfile.mkdtemp(prefix='peers_'))
  files = []
  for i, text in enumerate(prompt_texts):
    files.append(tmp / f'prompt{i}.txt')
    files[-1].write_text(text)
  cache = {'f32': ['-ctk', 'f32', '-ctv', 'f32'], 'f16': ['-ctk', 'f16', '-ctv', 'f16']}
  setups = {
    'llama.cpp greedy, f32 weights, f32 KV': ('llama-completion', f32, cache['f32']),
    'llama.cpp greedy, f32 weights, f16 KV': ('llama-completion', f32, cache['f16']),
    'llama.cpp prompt lookup, f32 weights, f32 KV': ('llama-lookup', f32, cache['f32']),
    'llama.cpp prompt lookup, f32 weights, f16 KV': ('llama-lookup', f32, cache['f16']),
    'llama.cpp greedy, Q4_1 weights, f16 KV': ('llama-completion', q4, cache['f16']),
  }
  result = {}
  for name, (binary, model, extra) in setups.items():
    if binary == 'llama-lookup':
      extra = extra + ['--spec-draft-n-max', str(FLAGS.llama_draft_max)]
    rounds = []
    for r in range(FLAGS.rounds):
      tot = dict(generated=0, prefill_s=0.0, decode_s=0.0, calls=0, prompt_tokens=0)
      texts = []
      for f in files:
        out, err = _llama(binary, model, f, extra)
        if binary == 'llama-lookup':
          n_in, enc = _ENCODED.search(err).groups()
          n_out, dec = _DECODED.search(err).groups()
          accepted = int(_ACCEPT.search(err).group(1))
          # One target forward yields its accepted drafts plus one token; the first token
          # comes from the prompt's forward.
          tot['generated'] += int(n_out)
          tot['prefill_s'] += float(enc)
          tot['decode_s'] += float(dec)
          tot['calls'] += int(n_out) - accepted
          tot['prompt_tokens'] += int(n_in)
          plain = _ANSI.sub('', out)
          texts.append(plain.split(f.read_text(), 1)[-1])
        else:
          pe_ms, n_in = _PROMPT_EVAL.search(err).groups()
          ev_ms, runs = _EVAL.search(err).groups()
          tot['generated'] += int(runs) + 1
          tot['prefill_s'] += float(pe_ms) / 1e3
          tot['decode_s'] += float(ev_ms) / 1e3
          tot['calls'] += int(runs) + 1
          tot['prompt_tokens'] += int(n_in)
          texts.append(out)
      rounds.append(tot | {'texts': texts})
      print(f'{name}: round {r + 1}/{FLAGS.rounds}', flush=True)
    texts_out[name] = rounds[0]['texts']
    result[name] = _figures(rounds, len(files))
  return result


def transformers_runs(target, prompt_ids, texts_out):
  import torch
  import transformers

  torch.set_num_threads(THREADS)
  tmp = pathlib.Path(tempfile.mkdtemp(prefix='peers_hf_'))
  hf.export_hf(tmp / 'target', target.cfg, target.params, target.tokenizer)
  drafter, draft_params = registry.build_draft('distilled', target)
  draft_dir.export_hf(tmp / 'draft', drafter.cfg, draft_params, target.tokenizer)
  load = lambda d: transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
  model, assistant = load(tmp / 'target'), load(tmp / 'draft')
  assistant.generation_config.num_assistant_tokens = 4
  assistant.generation_config.num_assistant_tokens_schedule = 'constant'
  assistant.generation_config.assistant_confidence_threshold = 0.0
  eos = target.tokenizer.eos_id
  setups = {
    'transformers greedy': {},
    'transformers prompt lookup (10 tokens)': {'prompt_lookup_num_tokens': 10},
    'transformers assisted, specjax distilled draft (4 tokens)': {'assistant_model': assistant},
  }
  result = {}
  with torch.inference_mode():
    for name, kwargs in setups.items():
      rounds = []
      for _ in range(FLAGS.rounds):
        generated, seconds, texts = 0, 0.0, []
        for p in prompt_ids:
          ids = torch.tensor([p])
          model.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=eos, **kwargs)
          t = time.perf_counter()
          out = model.generate(
            ids, max_new_tokens=FLAGS.max_new, do_sample=False, eos_token_id=eos,
            pad_token_id=eos, **kwargs,
          )  # fmt: skip
          seconds += time.perf_counter() - t
          new = out[0, len(p) :].tolist()
          generated += len(new)
          texts.append(target.tokenizer.decode(new))
        rounds.append({'total_tok_s': generated / seconds, 'generated': generated, 'texts': texts})
      texts_out[name] = rounds[0]['texts']
      result[name] = _summary(rounds)
      print(f'{name}: {result[name]["total_tok_s"]:.1f} tok/s', flush=True)
  return result


def table(results: dict, same_text: dict) -> str:
  own_greedy = {
    'specjax': results.get('specjax greedy', {}),
    'llama.cpp': {},
    'transformers': results.get('transformers greedy', {}),
  }
  lines = [
    '| engine | decode tok/s | tok/s incl. prefill | prefill tok/s | tokens per target call | '
    'speedup over own greedy (decode / incl. prefill) | text agrees with specjax greedy |',
    '|---|---|---|---|---|---|---|',
  ]
  fmt = lambda v: '—' if v is None or (isinstance(v, float) and np.isnan(v)) else f'{v:.1f}'
  for name, r in results.items():
    family = name.split(' ')[0]
    base = own_greedy[family]
    if family == 'llama.cpp':
      kv = name.split(', ')[-1]
      base = results.get(f'llama.cpp greedy, f32 weights, {kv}', {})
      if 'Q4_1' in name:
        base = {}
    speed = '—'
    if base and r is not base:
      d = r.get('decode_tok_s', float('nan')) / base.get('decode_tok_s', float('nan'))
      t = r['total_tok_s'] / base['total_tok_s']
      speed = f'{d:.2f}x / {t:.2f}x' if not np.isnan(d) else f'— / {t:.2f}x'
    lines.append(
      f'| {name} | {fmt(r.get("decode_tok_s"))} | {fmt(r.get("total_tok_s"))} | '
      f'{fmt(r.get("prefill_tok_s"))} | {fmt(r.get("tokens_per_call"))} | {speed} | '
      f'{same_text.get(name, "—")} |'
    )
  return '\n'.join(lines)


def main(argv):
  del argv
  out = pathlib.Path(FLAGS.out)
  out.mkdir(parents=True, exist_ok=True)
  target = loader.load_model('smollm2-135m-instruct')
  chosen = prompts_lib.load_prompts(FLAGS.prompts)
  chosen = chosen[-FLAGS.last :] if FLAGS.last else chosen
  tok = target.tokenizer
  prompt_ids = [tok.encode_chat(p.text) for p in chosen]
  prompt_texts = [tok.decode(ids, skip_special_tokens=False) for ids in prompt_ids]
  texts: dict[str, list[str]] = {}
  results = specjax_runs(target, prompt_ids, texts)
  if not FLAGS.skip_llama_cpp:
    results |= llama_cpp_runs(prompt_texts, texts)
  if not FLAGS.skip_transformers:
    results |= transformers_runs(target, prompt_ids, texts)
  norm = lambda s: s.replace('<|im_end|>', '').strip()
  ref = [norm(t) for t in texts['specjax greedy']]
  # llama-completion does not print the last token it samples and llama-lookup may run past
  # max_new: texts agree when the shorter is a prefix of the longer.
  agree = lambda a, b: a.startswith(b) or b.startswith(a)
  same = {
    k: f'{sum(agree(norm(a), b) for a, b in zip(v, ref))}/{len(ref)}' for k, v in texts.items()
  }
  md = table(results, same)
  meta = {
    **provenance.provenance(),
    'prompts': [p.id for p in chosen],
    'prompt_set': FLAGS.prompts,
    'max_new': FLAGS.max_new,
    'rounds': FLAGS.rounds,
    'threads': THREADS,
  }
  (out / 'results.json').write_text(
    json.dumps({'meta': meta, 'results': results, 'same_text': same}, indent=1)
  )
  (out / 'texts.json').write_text(json.dumps(texts, indent=1))
  (out / 'table.md').write_text(md + '\n')
  print(md)


if __name__ == '__main__':
  app.run(main)
