"""Is my quant broken, and where? Each candidate GGUF file against a reference model.

  python -m specjax.quant_probe --config configs/quant_probe.py \
      --config.reference=model-f16.gguf "--config.candidates=('model-q4_0.gguf',)" \
      --workdir runs/probe

Prints one line per candidate (sound or broken, acceptance, KL, top-1, and for a broken
file the suspect tensor), and writes results.json, results.csv, acceptance_by_category.png
and tensor_errors.png. See specjax/quant_probe/probe.py.

Arguments after the colon: `demo` probes the shipped SmolLM2-135M-Instruct (q4_1) against
itself re-quantised (allowing its quantised reference).
"""

import ml_collections

from specjax import config_lib


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = config_lib.parse_arg(arg, demo=False)
  c = ml_collections.ConfigDict()
  c.reference = 'smollm2-135m-instruct' if args.demo else ''  # .gguf file or asset name
  c.candidates = ()  # GGUF files of the same model
  # The reference re-quantised to these types (q8_0, q4_0, q4_1, q5_0, q5_1, f16): sound by
  # construction, they calibrate what each type costs in KL.
  c.make = ('q8_0', 'q4_0') if args.demo else ('q8_0', 'q4_1')
  c.prompts = 'mtbench'  # a prompt set as specjax.run takes it; spread over its categories
  c.num_prompts = 16
  c.max_new_tokens = 64  # the reference's greedy answer, read by both models
  c.gamma = 4  # draft length of the tokens-per-call figures
  # Time each q4_1 / q8_0 candidate as a draft of the reference on specjax's kernels: the
  # speedup it would give here (other types run dequantised, untimed).
  c.speed = True
  c.kl_factor = 4.0  # broken above this many times the KL its type costs
  c.dynamic = True  # a broken file without a static suspect: find its layer by swapping
  c.allow_quantized_reference = args.demo  # a reference below 8 bits per weight
  return c
