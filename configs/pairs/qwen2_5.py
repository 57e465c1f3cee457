"""Qwen2.5-0.5B-Instruct drafting for Qwen2.5-7B-Instruct (the Qwen2.5 pair of EAGLE-3,
HASS and the speculative-sampling baselines), on a GPU or TPU, in bfloat16.

  hf download Qwen/Qwen2.5-7B-Instruct --local-dir /models/Qwen2.5-7B-Instruct
  hf download Qwen/Qwen2.5-0.5B-Instruct --local-dir /models/Qwen2.5-0.5B-Instruct
  python -m specjax.run --config configs/pairs/qwen2_5.py \
      --config.model=/models/Qwen2.5-7B-Instruct --config.drafts=/models/Qwen2.5-0.5B-Instruct
  python -m specjax.run --config configs/pairs/qwen2_5.py:dry --config.mesh.data=2 \
      --config.mesh.model=4  # no weights: real shapes per device, then a tiny random pair

Arguments after the colon: `dry` (see specjax/pairs/), `base` (Qwen2.5-0.5B -> 7B, the
base models), `target=DIR,draft=DIR` (the same as --config.model and --config.drafts).
The 7B model's vocabulary has 152064 rows and the 0.5B's 151936 (one tokenizer): the
draft's logits are padded (specjax/drafters/model.py, PaddedVocabDrafter).
"""

from specjax import config_lib, pairs


def get_config(arg: str | None = None):
  args = config_lib.parse_arg(arg, dry=False, base=False, target='', draft='')
  config = config_lib.load_config('smollm2.py')
  return pairs.pair_config(config, 'qwen2_5', args.dry, args.base, args.target, args.draft)
