"""Running specjax's command-line tools in a subprocess, as a user would."""

import subprocess
import sys

ROOT = __file__.rsplit('/tests/', 1)[0]


def one_line_error(module: str, *args: str) -> str:
  """`python -m <module> <args>` from the repository root must fail with exit status 2 and
  exactly one line on stderr, no traceback; returns that line."""
  proc = subprocess.run(
    [sys.executable, '-m', module, *args], cwd=ROOT, capture_output=True, text=True, timeout=120
  )
  assert proc.returncode == 2 and 'Traceback' not in proc.stderr, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1, lines
  return lines[0]
