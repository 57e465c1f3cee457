r"""Entry point: python -m specjax.run --config configs/smollm2.py [--workdir DIR] [--config.K=V].

Example:
  python -m specjax.run --config configs/smollm2.py --config.prompt="What is the capital of France?"
"""

import sys

from absl import app, flags
from ml_collections import config_flags

from specjax import run_lib

_CONFIG = config_flags.DEFINE_config_file(
  'config', None, 'Experiment config file (configs/*.py).', lock_config=True
)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where results go (default runs/<UTC time>).')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if _CONFIG.value is None:
    raise app.UsageError('--config is required, e.g. --config configs/smollm2.py')
  try:
    run_lib.main(_CONFIG.value, _WORKDIR.value)
  except (ValueError, FileNotFoundError) as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)


if __name__ == '__main__':
  app.run(main)
