r"""Entry point: python -m specjax.train_draft --config configs/distill_smollm2.py --workdir DIR.

Trains a draft for the config's target by distillation (specjax.train.trainer); running it
again with the same workdir resumes from the latest checkpoint.

Example:
  python -m specjax.train_draft --config configs/distill_smollm2.py:tiny --workdir /tmp/tiny
"""

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from specjax.train import trainer

_CONFIG = config_flags.DEFINE_config_file(
  'config', None, 'Distillation config (configs/*.py).', lock_config=True
)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Checkpoints, metrics, plots and the draft.')
_BAR = flags.DEFINE_bool('progress', True, 'Show a progress bar.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if _CONFIG.value is None or _WORKDIR.value is None:
    raise app.UsageError('--config and --workdir are required')
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  try:
    result = trainer.train(_CONFIG.value, _WORKDIR.value, progress_bar=_BAR.value)
  except (ValueError, FileNotFoundError) as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  print(
    'final evaluation: '
    + ', '.join(f'{k}={v:.4f}' for k, v in result.items() if isinstance(v, float))
  )


if __name__ == '__main__':
  app.run(main)
