"""Copies a trained DSpark drafter (a DFlash block with DSpark's heads) into specjax's
shipped drafts, where `dflash` (its block) and `dspark` (all of it) find it, in Hugging
Face shards small enough for the repository, with the training runs' metrics and logs.

  python experiments/block_bench/ship.py --dspark runs/dspark --dflash runs/dflash

--dspark and --dflash are the trainers' workdirs (configs/dspark_smollm2.py with
init_from=<dflash>/drafter,freeze_block=True, and configs/dflash_smollm2.py).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import shutil

from specjax.checkpoints import dspark as dspark_ckpt
from specjax.drafters import dflash as dflash_drafter

SHARD_BYTES = 20 * 10**6


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  ap.add_argument('--dspark', type=pathlib.Path, required=True, help="the DSpark run's workdir")
  ap.add_argument('--dflash', type=pathlib.Path, required=True, help="the DFlash run's workdir")
  ap.add_argument('--out', type=pathlib.Path, default=pathlib.Path(dflash_drafter.SHIPPED))
  args = ap.parse_args(argv)
  cfg, block, heads, info = dspark_ckpt.load(args.dspark / 'drafter')
  block_info = json.loads((args.dflash / 'drafter' / 'config.json').read_text())['specjax']
  info = {'heads': info, 'block': {k: v for k, v in block_info.items() if k != 'capture'}}
  if args.out.exists():
    shutil.rmtree(args.out)
  dspark_ckpt.save(args.out, cfg, block, heads, info, shard_bytes=SHARD_BYTES)
  for run, name in ((args.dflash, 'dflash'), (args.dspark, 'dspark')):
    shutil.copy(run / 'metrics.jsonl', args.out / f'train_metrics_{name}.jsonl')
    shutil.copy(run / 'config.json', args.out / f'train_config_{name}.json')
    for log in sorted(run.glob('*.log')):  # the console, progress bars left out
      lines = log.read_text(errors='replace').replace('\r', '\n').splitlines()
      kept = [x for x in lines if x.strip() and not re.search(r'\d+%\|', x)]
      (args.out / f'train_{name}_{log.name}').write_text('\n'.join(kept) + '\n')
  sizes = {f.name: f.stat().st_size for f in sorted(args.out.iterdir())}
  for name, size in sizes.items():
    print(f'{size / 1e6:8.2f} MB  {args.out / name}')


if __name__ == '__main__':
  main()
