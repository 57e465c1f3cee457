"""Trains a DSpark drafter for SmolLM2-135M-Instruct, on this CPU: the DFlash block of
configs/dflash_smollm2.py with DSpark's rank-r Markov head and confidence head.

  python -m specjax.train_draft --config configs/dspark_smollm2.py --workdir runs/dspark
  python -m specjax.train_draft --config configs/dspark_smollm2.py:tiny --workdir /tmp/tiny

Arguments after the colon: those of configs/dflash_smollm2.py (`tiny`, `steps=`, `vocab=`,
`block=`, `layers=`, `anchors=`, `init_from=`: a DFlash drafter starts the block, a DSpark
one the heads too), `rank=` the Markov head's rank, `conf_weight=` the confidence
BCE's weight in the reported loss (it reaches the confidence head only) and
`freeze_block=True`: train the heads only, on init_from's block as it is. The shipped
DSpark drafter is that: the heads on the shipped DFlash block,

  python -m specjax.train_draft --config \
      configs/dspark_smollm2.py:init_from=runs/dflash/drafter,freeze_block=True,steps=300 \
      --workdir runs/dspark

The objective (specjax/train/dspark_heads.py): DFlash's block loss on the Markov head's
teacher-forced logits, and the confidence head's BCE against the greedy acceptance of each
block position given the earlier ones; held-aside evaluation adds the confidence head's
expected calibration error per block position and overall. The trained drafter
(`<workdir>/drafter`, DFlash's layout plus DeepSpec's head tensors) loads as
`dspark:<workdir>/drafter`. The feature data is configs/dflash_smollm2.py's, field for
field (its cached features are reused).
"""

import pathlib

import ml_collections

from specjax import config_lib

DFLASH = pathlib.Path(__file__).with_name('dflash_smollm2.py')


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = config_lib.parse_arg(
    arg, tiny=False, init_from='', steps=0, vocab=0, block=0, layers=0, anchors=0, rank=0,
    conf_weight=1.0, freeze_block=False,
  )  # fmt: skip
  passed = {k: args[k] for k in ('steps', 'vocab', 'block', 'layers', 'anchors') if args[k]}
  flags = ['tiny'] * args.tiny + [f'{k}={v}' for k, v in passed.items()]
  if args.init_from:
    flags.append(f'init_from={args.init_from}')
  c = config_lib.load_config(DFLASH, ','.join(flags))
  c.kind = 'dspark'
  c.drafter.rank = args.rank or (4 if args.tiny else 32)
  c.conf_weight = float(args.conf_weight)
  # True: only the heads learn, on init_from's block left as it is (DSpark on a trained
  # DFlash drafter; the block's forward without its backward, about a third of a step).
  c.drafter.freeze_block = bool(args.freeze_block)
  return c
