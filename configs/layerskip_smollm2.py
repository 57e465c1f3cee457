"""Self-speculative layer skipping for smollm2-135m-instruct: the calibrated skip set.

Written by `python -m specjax.calibrate_skip` on 2026-11-30; report:
experiments/layerskip_bench/calibration.json.
Skipped layers (25, 26) of 30; predicted 0.86x, measured 0.63x
over autoregressive decoding on the calibration prompts (not the evaluation sets).
No skip set beat autoregressive decoding: this is the least slow one.

  python -m specjax.run --config configs/layerskip_smollm2.py
  python -m specjax.run --config configs/layerskip_smollm2.py --config.prompts=humaneval
"""

from specjax import config_lib

MODEL = 'smollm2-135m-instruct'
SKIPPED = (25, 26)
DRAFT = 'layers:0-24,27-29'
GAMMA = 1


def get_config(arg: str | None = None):
  c = config_lib.load_config('smollm2.py', arg)
  c.model = MODEL
  c.drafts = (DRAFT,)
  c.gammas = (GAMMA,)
  c.verifier = 'greedy'  # calibrated for greedy decoding; rejection/block work too
  return c
