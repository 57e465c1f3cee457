"""Spec-Bench's speculative-sampling pair (Xia et al. 2024): double7/vicuna-68m drafting
for lmsys/vicuna-7b-v1.3 (LLaMA-1 shapes, vocabulary 32000), on a GPU or TPU, in bfloat16.

Both repositories hold PyTorch .bin weights and a SentencePiece tokenizer.model only:
convert them once to safetensors and tokenizer.json (README, Paper pairs), then

  python -m specjax.run --config configs/pairs/vicuna.py \
      --config.model=/models/vicuna-7b-v1.3 --config.drafts=/models/vicuna-68m
  python -m specjax.run --config configs/pairs/vicuna.py:dry --config.mesh.data=2 \
      --config.mesh.model=4  # no weights: real shapes per device, then a tiny random pair

Arguments after the colon: `dry` (see specjax/pairs/), `target=DIR,draft=DIR` (the
same as --config.model and --config.drafts); `base` changes nothing (no other variant).
"""

from specjax import config_lib, pairs


def get_config(arg: str | None = None):
  args = config_lib.parse_arg(arg, dry=False, base=False, target='', draft='')
  config = config_lib.load_config('smollm2.py')
  return pairs.pair_config(config, 'vicuna', args.dry, args.base, args.target, args.draft)
