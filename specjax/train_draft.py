r"""Entry point: python -m specjax.train_draft --config configs/<name>.py --workdir DIR.

Trains a draft for the config's target (specjax.train.trainer): `config.kind` 'distilled'
(configs/distill_smollm2.py, a reduced-vocabulary draft model), 'eagle'
(configs/eagle_smollm2.py, an EAGLE-3-style feature head), 'dflash'
(configs/dflash_smollm2.py, a DFlash-style block drafter) or 'dspark'
(configs/dspark_smollm2.py, the block drafter with DSpark's Markov and confidence heads).
Running it again with the same workdir resumes from the latest checkpoint.

Examples:
  python -m specjax.train_draft --config configs/distill_smollm2.py:tiny --workdir /tmp/tiny
  python -m specjax.train_draft --config configs/eagle_smollm2.py --workdir runs/eagle
  python -m specjax.train_draft --config configs/dflash_smollm2.py --workdir runs/dflash
  python -m specjax.train_draft --config configs/dspark_smollm2.py --workdir runs/dspark
"""

from absl import flags, logging

from specjax import config_lib
from specjax.train import trainer

_BAR = flags.DEFINE_bool('progress', True, 'Show a progress bar.')


def main(config, workdir):
  if workdir is None:
    raise ValueError('--workdir is required: checkpoints, metrics, plots and the draft go there')
  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  result = trainer.train(config, workdir, progress_bar=_BAR.value)
  print(
    'final evaluation: '
    + ', '.join(f'{k}={v:.4f}' for k, v in result.items() if isinstance(v, float))
  )


if __name__ == '__main__':
  config_lib.run_cli(main, 'configs/distill_smollm2.py')
