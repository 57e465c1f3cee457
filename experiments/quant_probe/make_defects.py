"""Writes five broken copies of a GGUF file (specjax/quant_probe/defects.py), one defect
each, for the probe to find:

  python experiments/quant_probe/make_defects.py --out /tmp/defects [--src FILE]

Default source: the shipped SmolLM2-135M-Instruct (q4_1). The layers and tensors are
this script's choice; the tests use others.
"""

import argparse
import pathlib

from specjax.data import assets
from specjax.quant_probe import defects

DEFECTS = {
  'scales_blk18_ffn_gate': lambda s, d: defects.scales(s, d, 'blk.18.ffn_gate.weight', 0.5),
  'exchange_blk25_attn_k_v': lambda s, d: defects.exchange(
    s, d, 'blk.25.attn_k.weight', 'blk.25.attn_v.weight'
  ),
  'nibbles_blk2_ffn_up': lambda s, d: defects.nibbles(s, d, 'blk.2.ffn_up.weight'),
  'unpermuted_blk9_attn_q': lambda s, d: defects.unpermuted(s, d, 'blk.9.attn_q.weight', 9),
  'rope_base_10000': lambda s, d: defects.metadata(s, d, 'llama.rope.freq_base', 10000.0),
}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--out', required=True)
  parser.add_argument('--src', default='')
  args = parser.parse_args()
  src = pathlib.Path(args.src) if args.src else assets.fetch('smollm2-135m-instruct')
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  for name, make in DEFECTS.items():
    print(make(src, out / f'{name}.gguf'))


if __name__ == '__main__':
  main()
