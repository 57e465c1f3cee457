"""The published draft/target pairs as data, and their dry runs (configs/pairs/): models.py
(the pairs and their configs), shapes.py (real shapes per device), dry.py (dry runs),
gemma3_text.py (Gemma 3 4B's text model as a directory of its own).

Every model of a paper pair is one entry of MODELS: its Hugging Face id, its LlamaConfig
written down from the published config.json (the text model's for Gemma 3 4B), and the
parameter count its model card gives. configs/pairs/*.py name the pair; the user gives
the local Hugging Face directories:

    python -m specjax.run --config configs/pairs/qwen2_5.py \
        --config.model=/models/Qwen2.5-7B-Instruct --config.drafts=/models/Qwen2.5-0.5B-Instruct

A pair config leaves its paths as `required:<model>` placeholders, and `check_paths`
(called first thing by run_lib.main) turns any left into one error naming the fields and
what to pass, before anything is loaded.

The `:dry` variant of a pair config runs without weights. `report_shapes` takes the real
shapes (`jax.eval_shape` on `llama.init_params`, nothing allocated), their shardings on
the run's (data, model) mesh (specjax.models.sharding.param_specs), and prints parameters
and bytes per device. The models themselves are `dry:<model>` specs: the loader builds
`tiny_config(name)`, the same architecture shrunk to a tiny width and a few layers (same
family switches, layer-type pattern, RoPE settings, head counts, vocabulary padding) with
random weights over a byte-level tokenizer, and the run shards and decodes it as it would
the real one; `check_dry_run` then insists speculative greedy output equals the target's.
"""

from specjax.pairs.dry import (
  DRY_SOURCE,
  TINY,
  TINY_VOCAB,
  check_dry_run,
  check_model_spec,
  dry_model,
  dry_params,
  tiny_config,
)
from specjax.pairs.gemma3_text import GEMMA3_TEXT_DEFAULTS, TEXT_PREFIXES, gemma3_text_model
from specjax.pairs.models import (
  BASE_PAIRS,
  DRY,
  MODELS,
  PAIRS,
  REQUIRED,
  ModelShape,
  Pair,
  check_paths,
  lookup,
  pair_config,
)
from specjax.pairs.shapes import per_device, real_shapes, report_shapes

__all__ = [
  'BASE_PAIRS',
  'DRY',
  'DRY_SOURCE',
  'GEMMA3_TEXT_DEFAULTS',
  'MODELS',
  'PAIRS',
  'REQUIRED',
  'TEXT_PREFIXES',
  'TINY',
  'TINY_VOCAB',
  'ModelShape',
  'Pair',
  'check_dry_run',
  'check_model_spec',
  'check_paths',
  'dry_model',
  'dry_params',
  'gemma3_text_model',
  'lookup',
  'pair_config',
  'per_device',
  'real_shapes',
  'report_shapes',
  'tiny_config',
]
