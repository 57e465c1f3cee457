"""Every notebook in colabs/ runs top to bottom (its code cells, in order, in one namespace,
with SPECJAX_TINY=1 so those with a `TINY` switch run a random tiny model), and its install
cell installs specjax from a fresh clone of this repository."""

import glob
import os
import re
import shutil
import subprocess
import sys

import nbformat
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, 'colabs', '*.ipynb')))


def test_there_are_notebooks():
  assert NOTEBOOKS


@pytest.mark.slow
@pytest.mark.parametrize('path', NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs(path, monkeypatch):
  monkeypatch.chdir(os.path.dirname(path))
  monkeypatch.setenv('SPECJAX_TINY', '1')
  namespace = {'__name__': '__main__'}
  for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
    if cell.cell_type != 'code':
      continue
    source = '\n'.join(l for l in cell.source.splitlines() if not l.lstrip().startswith(('!', '%')))
    exec(compile(source, f'{os.path.basename(path)} cell {i}', 'exec'), namespace)


@pytest.mark.parametrize('path', NOTEBOOKS, ids=os.path.basename)
def test_notebook_is_stripped_and_installs(path):
  """Git keeps notebooks without outputs, each opens in Colab with an install cell, and
  configs load through specjax.config_lib (no sys.path edits to reach configs/)."""
  cells = nbformat.read(path, as_version=4).cells
  code = [c for c in cells if c.cell_type == 'code']
  assert all(not c.outputs and c.execution_count is None for c in code), 'outputs not stripped'
  assert any('!pip install' in c.source for c in code[:2]), 'no install cell at the top'
  assert not [c.source for c in code if 'sys.path' in c.source], 'edits sys.path'
  tiny = [c.source for c in code if 'TINY' in c.source]
  assert not [t for t in tiny if re.search(r'^TINY = True', t, re.M)], 'a tiny model by default'
  assert all("TINY = os.environ.get('SPECJAX_TINY') == '1'" in t for t in tiny if 'TINY =' in t)


@pytest.fixture(scope='module')
def fresh_clone(tmp_path_factory):
  """A clone of this repository's committed tree (what a Colab user clones)."""
  if shutil.which('git') is None or not os.path.exists(os.path.join(ROOT, '.git')):
    pytest.skip('not a git checkout')
  clone = tmp_path_factory.mktemp('clone') / 'specjax'
  subprocess.run(['git', 'clone', '-q', ROOT, str(clone)], check=True, timeout=120)
  return clone


@pytest.mark.parametrize('path', NOTEBOOKS, ids=os.path.basename)
def test_install_cell_installs_a_fresh_clone(path, fresh_clone):
  """The install cell's own pip command, with its SPECJAX pointed at a fresh clone: pip
  builds the package from it (a dry run: this environment stays as it is)."""
  cell = next(c for c in nbformat.read(path, as_version=4).cells if '!pip install' in c.source)
  namespace = {}
  exec('\n'.join(l for l in cell.source.splitlines() if not l.lstrip().startswith('!')), namespace)
  assert namespace.get('SPECJAX'), 'the install cell names where specjax is'
  (line,) = [l.strip()[1:] for l in cell.source.splitlines() if l.strip().startswith('!pip')]
  args = line.replace('{SPECJAX}', str(fresh_clone)).split()[2:]  # after 'pip install'
  args = [a for a in args if a != '-q']
  proc = subprocess.run(  # offline: the build backend and dependencies as installed here
    [
      sys.executable,
      '-m',
      'pip',
      'install',
      *args,
      '--dry-run',
      '--no-deps',
      '--no-build-isolation',
    ],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert 'Would install specjax' in proc.stdout, proc.stdout[-2000:]
