"""Your own pair: any target with any draft specjax loads, compared with the target alone.

  python -m specjax.run --config \
      configs/pair.py:target=/models/Qwen2.5-1.5B-Instruct,draft=/models/Qwen2.5-0.5B-Instruct
  python -m specjax.run --config \
      configs/pair.py:target=hf:HuggingFaceTB/SmolLM2-360M-Instruct,draft=smollm2-135m-instruct
  python -m specjax.run --config configs/pair.py:target=my-model-f16.gguf,draft=my-model-q4_0.gguf \
      --config.prompts=my_prompts.jsonl
  python -m specjax.run --config configs/pair.py:target=my-model.gguf,draft=quantized+ngram

Arguments after the colon (comma separated):
  target=  an asset name, a .gguf file, a Hugging Face directory or hf:<org>/<name>[@<rev>]
  draft=   any draft spec: another model with the target's tokenizer (the same forms), or
           one of specjax's drafts of the target itself ('quantized', 'ngram', 'layers:...',
           'eagle:DIR', 'multilevel:quantized,ngram'); several joined by '+'. A spec with
           commas goes in --config.drafts instead (a tuple).
  tiny     random stand-ins for both (what the tests run).

Each draft runs at gammas 2 and 4 and under adaptive control, beside autoregressive
decoding, on every prompt (also for one --config.prompt). Before any weight is read, the
models' headers are checked (specjax/harness/pair_check.py): a draft model's vocabulary
against the target's, and whether the weights and KV caches fit each device of the mesh in
config.dtype (float32 here, the fast type on CPUs; --config.dtype=bfloat16 on GPUs and
TPUs). The tokenizers are compared when the draft is built. Every other field is
configs/smollm2.py's (python -m specjax.run --config configs/pair.py:... --print_config).
"""

import ml_collections

from specjax import config_lib


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = config_lib.parse_arg(arg, target='', draft='', tiny=False)
  if args.tiny:
    args.target, args.draft = args.target or 'tiny', args.draft or 'truncated:1+ngram'
  missing = [k for k in ('target', 'draft') if not args[k]]
  if missing:
    raise ValueError(
      f'configs/pair.py needs {" and ".join(m + "=..." for m in missing)}, e.g. '
      'configs/pair.py:target=/models/Qwen2.5-1.5B-Instruct,draft=/models/Qwen2.5-0.5B-Instruct'
    )
  c = config_lib.load_config('smollm2.py', 'tiny' if args.tiny else None)
  c.model = args.target
  c.drafts = tuple(d.strip() for d in args.draft.split('+') if d.strip())
  c.gammas = (2, 4)
  c.adaptive_gammas = (1, 2, 4, 8)
  c.quick = False  # a pair is compared on every method, even for one prompt
  c.quick_method = f'{c.drafts[0]}@adaptive'
  return c
