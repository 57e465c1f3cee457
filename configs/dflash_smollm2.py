"""Trains a DFlash-style block drafter for SmolLM2-135M-Instruct, on this CPU.

  python -m specjax.train_draft --config configs/dflash_smollm2.py --workdir runs/dflash
  python -m specjax.train_draft --config configs/dflash_smollm2.py:steps=100 --workdir ...
  python -m specjax.train_draft --config configs/dflash_smollm2.py:tiny --workdir /tmp/tiny

Arguments after the colon (comma separated): `tiny` trains a drafter for the random tiny
byte-level target in seconds (for tests); `steps=` overrides the number of steps;
`vocab=` the draft vocabulary size; `block=` the block size (the loss decay follows
DFlash's: gamma 7 for blocks of 16, 4 for 8 and below); `layers=` the drafter's depth;
`anchors=` blocks per training sequence.

The drafter (specjax/drafters/dflash.py, loaded by `dflash:<workdir>/drafter`): the
target's residual stream entering layers 2, 15 and 27 fused by one linear map into every
layer's context keys and values, a block of the last committed token and mask embeddings,
decoder layers at the target's width, bidirectional inside the block, and an output head
over the draft vocabulary (the tokens the target emits most in the training data). Its
training data is the EAGLE head's (configs/eagle_smollm2.py: the same `data` and the
same captured layers, so one labelling serves both; specjax/train/feature_data.py); the
objective is DFlash's block loss (specjax/train/dflash_block.py).
"""

import pathlib

import ml_collections

from specjax import config_lib

# Its `data` is the EAGLE head's, field for field (their cached features are reused).
EAGLE = pathlib.Path(__file__).with_name('eagle_smollm2.py')


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = config_lib.parse_arg(
    arg, tiny=False, init_from='', steps=0, vocab=0, block=0, layers=0, anchors=0
  )
  tiny = args.tiny
  c = ml_collections.ConfigDict()
  c.kind = 'dflash'
  c.target = 'tiny' if tiny else 'smollm2-135m-instruct'
  c.dtype = 'float32'  # the target's, for generation and features
  c.seed = 0
  c.divergence = 'forward_kl'  # to the target's distribution (specjax.train.divergences)
  c.data = config_lib.load_config(EAGLE, 'tiny' if tiny else None).data

  c.drafter = ml_collections.ConfigDict()
  # The EAGLE head's layers (its feature data); DFlash's own spread would be (2, 15, 28).
  c.drafter.capture = (0, 1, 2) if tiny else (2, 15, 27)
  c.drafter.vocab_size = args.vocab or (64 if tiny else 8192)
  c.drafter.block_size = args.block or (4 if tiny else 16)
  c.drafter.layers = args.layers or (1 if tiny else 2)
  c.drafter.init_from = args.init_from  # a DFlash drafter directory to continue from

  c.anchors = args.anchors or (8 if tiny else 24)  # random blocks per training sequence
  c.loss_decay = 7.0 if c.drafter.block_size > 8 else 4.0  # DFlash's gamma
  c.eval_stride = 1 if tiny else 4  # held-aside blocks start every eval_stride positions

  c.optim = config_lib.optim(3e-3 if tiny else 6e-4, 3 if tiny else 40, clip_norm=1.0)

  c.batch_size = 4 if tiny else 8
  c.num_steps = args.steps or (24 if tiny else 1200)
  c.log_every = 2 if tiny else 10
  c.eval_every = 8 if tiny else 100
  c.eval_batch = 4
  c.checkpoint_every = 4 if tiny else 50
  c.keep_checkpoints = 2
  return c
