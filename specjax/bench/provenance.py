"""Where a number came from: commit, date, machine, accelerator, environment switches and
package versions, in one dict.

Every results file an experiment or the harness writes carries `provenance()`, so a
figure in BENCHMARKS.md can be traced to the code and machine that produced it.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import pathlib
import platform
import subprocess

PACKAGES = (
  'specjax',
  'jax',
  'jaxlib',
  'jax-cuda12-plugin',  # the accelerator's plugins, where installed
  'jax-cuda12-pjrt',
  'libtpu',
  'flax',
  'numpy',
  'transformers',
  'torch',
)


def git_commit(directory: str | os.PathLike | None = None) -> str | None:
  """The short commit of the repository holding `directory` (default: this package's),
  with '+dirty' when it has uncommitted changes; None outside a git checkout."""
  directory = directory or pathlib.Path(__file__).resolve().parent
  try:
    run = lambda *args: subprocess.run(
      ['git', *args], cwd=directory, capture_output=True, text=True, timeout=10, check=True
    ).stdout.strip()
    commit = run('rev-parse', '--short', 'HEAD')
    dirty = bool(run('status', '--porcelain', '--untracked-files=no'))
  except (OSError, subprocess.SubprocessError):
    return None
  return commit + ('+dirty' if dirty else '')


def machine() -> str:
  """'x86_64, 2 cores, AMD EPYC ...' (the processor name where the OS reports one)."""
  name = platform.processor() or ''
  try:
    with open('/proc/cpuinfo') as f:
      name = next((line.split(':', 1)[1].strip() for line in f if 'model name' in line), name)
  except OSError:
    pass
  return ', '.join(filter(None, [platform.machine(), f'{os.cpu_count()} cores', name]))


def versions(packages=PACKAGES) -> dict[str, str]:
  out = {}
  for name in packages:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      continue
  return out


def accelerator() -> dict:
  """{'backend': jax.default_backend(), 'device_kind' (the first device's, e.g. 'cpu',
  'NVIDIA H100 80GB HBM3'), 'device_count' (every process's), 'local_device_count',
  'process_count', 'devices': {kind: count}}."""
  import jax  # noqa: PLC0415 - jax is imported only when asked

  devices = jax.devices()
  kinds: dict[str, int] = {}
  for d in devices:
    kinds[d.device_kind] = kinds.get(d.device_kind, 0) + 1
  return {
    'backend': jax.default_backend(),
    'device_kind': devices[0].device_kind if devices else None,
    'device_count': len(devices),
    'local_device_count': jax.local_device_count(),
    'process_count': jax.process_count(),
    'devices': kinds,
  }


ENVIRONMENT = ('XLA_FLAGS', 'JAX_PLATFORMS')  # recorded with every SPECJAX_* variable set


def environment(environ=None) -> dict[str, str | None]:
  """The switches a run's numbers depend on: XLA_FLAGS and JAX_PLATFORMS (None when unset)
  and every SPECJAX_* variable that is set (SPECJAX_CPU_KERNELS, SPECJAX_CPU_ISA, ...)."""
  environ = os.environ if environ is None else environ
  out = {name: environ.get(name) for name in ENVIRONMENT}
  out.update({k: v for k, v in sorted(environ.items()) if k.startswith('SPECJAX_')})
  return out


def provenance() -> dict:
  """{'commit', 'date' (UTC, ISO), 'machine', 'cpu' (model, ISA flags, kernel paths),
  'accelerator' (backend, device kind and count), 'environment' (XLA_FLAGS, SPECJAX_*),
  'python', 'packages': {name: version}}."""
  return {
    'commit': git_commit(),
    'date': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
    'machine': machine(),
    'cpu': kernels(),
    'accelerator': accelerator(),
    'environment': environment(),
    'python': platform.python_version(),
    'packages': versions(),
  }


def kernels() -> dict:
  """The CPU's model and ISA flags, and the kernel path chosen for each product so far
  (specjax.kernels.cpu.describe)."""
  from specjax.kernels import cpu  # noqa: PLC0415 - jax is imported only when asked

  return cpu.describe()
