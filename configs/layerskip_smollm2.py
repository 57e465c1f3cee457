"""Self-speculative layer skipping for SmolLM2-135M-Instruct: the calibrated skip set.

The skip set and gamma come from configs/layerskip_smollm2.json, written by
`python -m specjax.calibrate_skip --config configs/calibrate_skip.py` (calibration prompts
kept apart from the evaluation sets). `calibration=<path>` reads another calibration file.

  python -m specjax.run --config configs/layerskip_smollm2.py
  python -m specjax.run --config configs/layerskip_smollm2.py --config.prompts=humaneval
"""

import json
import pathlib

from specjax import config_lib

CALIBRATION = pathlib.Path(__file__).with_suffix('.json')


def get_config(arg: str | None = None):
  args = config_lib.parse_arg(arg, calibration=str(CALIBRATION))
  path = pathlib.Path(args.calibration)
  if not path.is_file():
    raise FileNotFoundError(
      f'calibration file {path} not found: run python -m specjax.calibrate_skip '
      f'--config configs/calibrate_skip.py'
    )
  try:
    report = json.loads(path.read_text())
    model, draft, gamma = report['model'], report['chosen']['draft'], int(report['chosen']['gamma'])
  except (ValueError, KeyError, TypeError) as e:
    raise ValueError(
      f'{path}: expected a calibration report with model, chosen.draft and chosen.gamma ({e})'
    ) from None
  c = config_lib.load_config('smollm2.py', 'tiny' if model == 'tiny' else None)
  c.model = model
  c.drafts = (draft,)
  c.gammas = (gamma,)
  c.quick_method = f'{draft}@{gamma}'  # a one-prompt run compares the calibrated draft
  c.verifier = 'greedy'  # calibrated for greedy decoding; rejection/block work too
  return c
