"""python -m specjax.quant_probe --config configs/quant_probe.py --workdir DIR"""

from specjax import config_lib
from specjax.quant_probe import probe


def main(config, workdir):
  probe.main(config, workdir)


if __name__ == '__main__':
  config_lib.run_cli(main, 'configs/quant_probe.py')
