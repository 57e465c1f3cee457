"""Llama-3.2-1B-Instruct drafting for Llama-3.1-8B-Instruct (the Llama 3 pair of EAGLE-3
and the speculative-sampling baselines), on a GPU or TPU, in bfloat16. Both use Llama 3
RoPE scaling (8B: factor 8, 1B: factor 32; low_freq_factor 1, high_freq_factor 4,
original_max_position_embeddings 8192), read from each config.json.

  hf download meta-llama/Llama-3.1-8B-Instruct \
      --local-dir /models/Llama-3.1-8B-Instruct  # gated: accept the license, hf auth login
  hf download meta-llama/Llama-3.2-1B-Instruct \
      --local-dir /models/Llama-3.2-1B-Instruct
  python -m specjax.run --config configs/pairs/llama3.py \
      --config.model=/models/Llama-3.1-8B-Instruct --config.drafts=/models/Llama-3.2-1B-Instruct
  python -m specjax.run --config configs/pairs/llama3.py:dry --config.mesh.data=2 \
      --config.mesh.model=4  # no weights: real shapes per device, then a tiny random pair

Arguments after the colon: `dry` (see specjax/pairs/), `base` (Llama-3.2-1B -> Llama-3.1-8B),
`target=DIR,draft=DIR` (the same as --config.model and --config.drafts).
"""

from specjax import config_lib, pairs


def get_config(arg: str | None = None):
  args = config_lib.parse_arg(arg, dry=False, base=False, target='', draft='')
  config = config_lib.load_config('smollm2.py')
  return pairs.pair_config(config, 'llama3', args.dry, args.base, args.target, args.draft)
