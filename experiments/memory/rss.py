r"""Resident memory of a `specjax.run` over a workload: sampled every 0.25 s, with each
printed progress line, so growth per batch (compiled executables, caches) shows.

  python experiments/memory/rss.py --out experiments/memory/results/p20.json -- \
      --config.num_prompts=20 --config.max_new_tokens=32

Everything after `--` is a `--config.FIELD=VALUE` override of configs/smollm2.py (the
default config, real model). Writes OUT (peak and final RSS, the samples, the lines) and
OUT with .png: RSS over time with the batches marked.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import pathlib
import resource
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]


def rss_mib() -> float:
  for line in pathlib.Path('/proc/self/status').read_text().splitlines():
    if line.startswith('VmRSS:'):
      return int(line.split()[1]) / 1024
  return float('nan')


class Lines(io.TextIOBase):
  """stdout that also keeps each line with the time it was printed."""

  def __init__(self, start: float, out):
    self.start, self.out, self.lines, self.buf = start, out, [], ''

  def write(self, text: str) -> int:
    self.out.write(text)
    self.buf += text
    while '\n' in self.buf:
      line, self.buf = self.buf.split('\n', 1)
      self.lines.append((time.perf_counter() - self.start, rss_mib(), line))
    return len(text)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--out', required=True)
  parser.add_argument('--config', default=str(ROOT / 'configs' / 'smollm2.py'))
  args, overrides = parser.parse_known_args()
  overrides = [o for o in overrides if o != '--']
  sys.path.insert(0, str(ROOT))
  from specjax import config_lib
  from specjax.harness import run_lib

  config = config_lib.load_config(args.config)
  for o in overrides:
    name, _, value = o.removeprefix('--config.').partition('=')
    old = config[name]
    if isinstance(old, bool):
      config[name] = value.lower() in ('1', 'true')
    elif isinstance(old, (tuple, list)):
      config[name] = tuple(ast.literal_eval(value))
    else:
      config[name] = type(old)(value)
  start = time.perf_counter()
  samples, stop = [], threading.Event()

  def sample():
    while not stop.wait(0.25):
      samples.append((time.perf_counter() - start, rss_mib()))

  thread = threading.Thread(target=sample, daemon=True)
  thread.start()
  lines = Lines(start, sys.stdout)
  with tempfile.TemporaryDirectory() as workdir, contextlib.redirect_stdout(lines):
    run_lib.main(config, workdir + '/run')
  stop.set()
  thread.join()
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  out = pathlib.Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  result = {
    'overrides': overrides,
    'peak_rss_mib': round(peak, 1),
    'final_rss_mib': round(rss_mib(), 1),
    'seconds': round(time.perf_counter() - start, 1),
    'samples': [(round(t, 2), round(r, 1)) for t, r in samples],
    'lines': [(round(t, 2), round(r, 1), line) for t, r, line in lines.lines],
  }
  out.write_text(json.dumps(result, indent=1) + '\n')
  import matplotlib

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(9, 4))
  ax.plot([t for t, _ in samples], [r / 1024 for _, r in samples], linewidth=0.8)
  for t, _, line in lines.lines:
    if line.startswith('['):
      ax.axvline(t, color='gray', linewidth=0.3)
  ax.set(
    xlabel='seconds',
    ylabel='RSS (GiB)',
    title=f'specjax.run {" ".join(overrides)}: peak {peak / 1024:.2f} GiB (gray: batches)',
  )
  fig.tight_layout()
  fig.savefig(out.with_suffix('.png'), dpi=110)
  print(f'peak RSS {peak:.0f} MiB, final {rss_mib():.0f} MiB; wrote {out}', file=sys.stderr)


if __name__ == '__main__':
  main()
