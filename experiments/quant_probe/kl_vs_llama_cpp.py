"""specjax's KL against llama.cpp's `llama-perplexity --kl-divergence` on the same files and
the same tokens.

  bash experiments/peers/build_llama_cpp.sh     # builds llama-perplexity too
  python experiments/quant_probe/kl_vs_llama_cpp.py --reference REF.gguf \
      --candidates A.gguf B.gguf --out experiments/quant_probe/kl_vs_llama_cpp

The text is MT-bench's first turns, one after another. llama.cpp tokenizes it, cuts it
into chunks of --ctx tokens and scores each chunk's second half (the logits at positions
ctx/2 .. ctx-2, each predicting the next token); its base run stores the reference's
log-probabilities, its second run reads them back with the candidate's. specjax reads the
tokens llama.cpp stored, runs both models on each chunk in float32 and scores the same
positions (fidelity.compare with the first half and one token as the "prompt"). Both
report the mean KL(reference || candidate) over the scored positions.
"""

import argparse
import json
import os
import pathlib
import re
import subprocess
import time

import numpy as np

from specjax.bench import provenance
from specjax.checkpoints import loader
from specjax.data import prompts as prompts_lib
from specjax.quant_probe import fidelity

PEERS = pathlib.Path(os.environ.get('SPECJAX_PEERS', pathlib.Path.home() / '.cache/specjax-peers'))
BIN = PEERS / 'llama.cpp/build/bin/llama-perplexity'


def llama_kl(reference, candidate, text_file, base, ctx) -> tuple[float, list[int]]:
  """(llama.cpp's mean KLD, the tokens it scored) for `candidate` against `reference`."""
  common = ['-c', str(ctx), '-b', str(ctx), '-t', str(os.cpu_count() or 2)]
  if not base.is_file():
    subprocess.run(
      [str(BIN), '-m', str(reference), '-f', str(text_file), '--kl-divergence-base', str(base)]
      + common,
      check=True,
      capture_output=True,
    )
  out = subprocess.run(
    [str(BIN), '-m', str(candidate), '--kl-divergence-base', str(base), '--kl-divergence'] + common,
    check=True,
    capture_output=True,
    text=True,
  )
  log = out.stdout + out.stderr
  match = re.search(r'Mean\s+KLD:\s+([-0-9.e]+)', log)
  if not match:
    raise RuntimeError(f'no "Mean KLD" in llama-perplexity output:\n{log[-3000:]}')
  return float(match.group(1)), read_tokens(base)


def read_tokens(base: pathlib.Path) -> list[int]:
  """The tokens a --kl-divergence-base file stores (llama.cpp's tools/perplexity: the magic
  '_logits_', int32 n_ctx, n_vocab and n_chunk, then n_ctx x n_chunk int32 token ids; the
  reference's log-probabilities follow)."""
  with open(base, 'rb') as f:
    if f.read(8) != b'_logits_':
      raise RuntimeError(f'{base}: not a llama-perplexity --kl-divergence-base file')
    n_ctx, _, n_chunk = (int(x) for x in np.frombuffer(f.read(12), '<i4'))
    return np.frombuffer(f.read(4 * n_ctx * n_chunk), '<i4').tolist()


def specjax_kl(reference, candidate, tokens, ctx) -> float:
  ref, cand = loader.load_model(str(reference)), loader.load_model(str(candidate))
  first = ctx // 2
  chunks = [tokens[i : i + ctx] for i in range(0, len(tokens) - ctx + 1, ctx)]
  prompts = [c[: first + 1] for c in chunks]
  answers = [c[first + 1 :] for c in chunks]
  positions = fidelity.compare(
    ref.cfg, ref.params, cand.params, prompts, answers, cand_cfg=cand.cfg
  )
  return float(np.concatenate([p.kl for p in positions]).mean())


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--reference', required=True)
  parser.add_argument('--candidates', nargs='+', required=True)
  parser.add_argument('--out', required=True)
  parser.add_argument('--ctx', type=int, default=256)
  parser.add_argument('--prompts', default='mtbench')
  args = parser.parse_args()
  if not BIN.is_file():
    raise SystemExit(f'error: {BIN} not built: bash experiments/peers/build_llama_cpp.sh')
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  text_file = out / 'text.txt'
  text_file.write_text('\n\n'.join(p.text for p in prompts_lib.load_prompts(args.prompts)))
  base = out / 'reference.kld'
  rows = []
  for cand in args.candidates:
    start = time.time()
    theirs, tokens = llama_kl(args.reference, cand, text_file, base, args.ctx)
    ours = specjax_kl(args.reference, cand, tokens, args.ctx)
    rows.append({'candidate': pathlib.Path(cand).name, 'specjax_kl': ours, 'llama_cpp_kl': theirs,
                 'ratio': ours / theirs if theirs else None, 'tokens': len(tokens),
                 'seconds': time.time() - start})  # fmt: skip
    print(json.dumps(rows[-1]))
  result = {'reference': args.reference, 'ctx': args.ctx, 'rows': rows}
  result['provenance'] = provenance.provenance()
  (out / 'results.json').write_text(json.dumps(result, indent=2))


if __name__ == '__main__':
  main()
