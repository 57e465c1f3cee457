"""Gemma 3 270M (instruction tuned) drafting for Gemma 3 4B's text model, on a GPU or TPU,
in bfloat16. Both interleave five sliding-window layers with one full layer (windows of
512 and 1024 tokens), RoPE base 10000 on the sliding layers and 1e6 on the full ones
(4B: linear scaling 8), head_dim 256, query_pre_attn_scalar 256.

  hf download google/gemma-3-4b-it --local-dir /models/gemma-3-4b-it
  hf download google/gemma-3-270m-it --local-dir /models/gemma-3-270m-it
  python -m specjax.pairs gemma3-text /models/gemma-3-4b-it /models/gemma-3-4b-it-text
  python -m specjax.run --config configs/pairs/gemma3.py \
      --config.model=/models/gemma-3-4b-it-text --config.drafts=/models/gemma-3-270m-it
  python -m specjax.run --config configs/pairs/gemma3.py:dry --config.mesh.data=2 \
      --config.mesh.model=4  # no weights: real shapes per device, then a tiny random pair

gemma-3-4b-it is a multimodal checkpoint (model_type gemma3, the text model under
text_config and language_model.*): specjax.checkpoints.hf reads text-only gemma3_text
directories, which `python -m specjax.pairs gemma3-text` writes (the text tensors' bytes
copied, the vision tower left out).
The 4B vocabulary has 262208 rows and the 270M's 262144: the draft's logits are padded.

Arguments after the colon: `dry` (see specjax/pairs/), `base` (gemma-3-270m ->
gemma-3-4b-pt), `target=DIR,draft=DIR` (the same as --config.model and --config.drafts).
"""

from specjax import config_lib, pairs


def get_config(arg: str | None = None):
  args = config_lib.parse_arg(arg, dry=False, base=False, target='', draft='')
  config = config_lib.load_config('smollm2.py')
  return pairs.pair_config(config, 'gemma3', args.dry, args.base, args.target, args.draft)
