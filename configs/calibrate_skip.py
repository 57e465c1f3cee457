"""Layer-skip calibration (python -m specjax.calibrate_skip): which layers a self-speculative
draft of SmolLM2-135M-Instruct skips, and its gamma.

  python -m specjax.calibrate_skip --config configs/calibrate_skip.py
  python -m specjax.calibrate_skip --config configs/calibrate_skip.py:tiny  # seconds, no download

Writes `out` (JSON); configs/layerskip_smollm2.py reads the chosen skip set from it.
"""

import ml_collections

from specjax import config_lib


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = config_lib.parse_arg(arg, tiny=False)
  c = ml_collections.ConfigDict()
  c.model = 'tiny' if args.tiny else 'smollm2-135m-instruct'
  c.out = '/tmp/layerskip_tiny.json' if args.tiny else 'configs/layerskip_smollm2.json'
  c.max_new = 8 if args.tiny else 48  # greedy tokens per calibration prompt
  c.num_prompts = 2 if args.tiny else 4
  c.gammas = (1, 2) if args.tiny else (1, 2, 3, 4, 6, 8)
  c.min_skip = 2  # the shortest skipped block
  c.stride = 2  # block lengths and starts step by this
  c.measure_top = 1 if args.tiny else 3  # candidates decoded for real
  return c
