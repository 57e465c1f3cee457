r"""Entry point: python -m specjax.run --config configs/smollm2.py [--workdir DIR] [--config.K=V].

Example:
  python -m specjax.run --config configs/smollm2.py --config.prompt="What is the capital of France?"
  python -m specjax.run --config configs/smollm2.py --print_config  # every field, its default
"""

from specjax import config_lib
from specjax.harness import run_config, run_lib

if __name__ == '__main__':
  config_lib.run_cli(run_lib.main, 'configs/smollm2.py', fields=run_config.FIELDS)
