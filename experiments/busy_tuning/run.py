r"""Kernel choices timed on a quiet machine and beside a busy process.

Measured dispatch (specjax/kernels/cpu.py) times each product and each model's whole
forward once per machine and keeps the choice. This times SmolLM2-135M-Instruct's float32
forward at 1, 2, 3 and 5 rows under every policy this CPU allows twice, from an empty
choice cache each time: once with nothing else running, once beside one process spinning
on a CPU (a test suite's other worker, a training run), and prints what each chose and how
busy `others_load` found the machine. Run it on a quiet machine:

  python experiments/busy_tuning/run.py [--out experiments/busy_tuning/results.json]
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import tempfile
import time

from absl import app, flags

from specjax.bench import costs, provenance
from specjax.checkpoints import loader
from specjax.kernels import cpu

flags.DEFINE_string('out', '', 'Write the records here as JSON.')
flags.DEFINE_list('rows', ['1', '2', '3', '5'], 'Token counts of the forwards timed.')
FLAGS = flags.FLAGS


def tune(model, busy: bool) -> dict:
  """Every policy's forward times from an empty choice cache (the libraries kept)."""
  libs = {k: v for k, v in cpu._state.get('libs', {}).items() if v}
  burner = None
  if busy:
    burner = subprocess.Popen([sys.executable, '-c', 'while True: pass'])
    time.sleep(0.5)
  try:
    with tempfile.TemporaryDirectory() as d:
      cpu._state.clear()
      cpu._state['libs'] = libs
      cpu._cache_dir = lambda: pathlib.Path(d)
      rows = [int(r) for r in FLAGS.rows]
      return costs.tune_forwards(model.params, model.cfg, 1, rows, cache_size=512)
  finally:
    if burner is not None:
      burner.kill()


def main(argv):
  del argv
  model = loader.load_model('smollm2-135m-instruct')
  out = {'provenance': provenance.provenance()}
  for condition in ('quiet', 'busy', 'quiet again'):
    records = tune(model, condition == 'busy')
    out[condition] = {str(r): rec for r, rec in records.items()}
    for r, rec in records.items():
      ms = ', '.join(f'{p} {t:.1f}' for p, t in rec['ms'].items())
      print(f'{condition:>11} rows {r}: use {rec["use"]:<6} busy {rec.get("busy")}  ({ms} ms)')
  if FLAGS.out:
    pathlib.Path(FLAGS.out).write_text(json.dumps(out, indent=1) + '\n')


if __name__ == '__main__':
  app.run(main)
