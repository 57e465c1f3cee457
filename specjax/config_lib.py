"""Configs and entry points: `get_config(arg)` argument parsing, field checks, and
`run_cli`, the one command-line wrapper of every entry point and experiment script
(absl flags + an ml_collections config file, errors as one line)."""

from __future__ import annotations

import difflib
import importlib.util
import pathlib
import signal
import sys
from collections.abc import Callable

import ml_collections

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / 'configs'  # the repository's


def load_config(path: str | pathlib.Path, arg: str | None = None) -> ml_collections.ConfigDict:
  """`get_config(arg)` of the config file `path` (relative paths: from the working
  directory, else under the repository's configs/), for configs built on another one."""
  path = pathlib.Path(path)
  if not path.is_absolute() and not path.is_file():
    path = CONFIGS / path
  if not path.is_file():
    raise FileNotFoundError(f'config file {path} not found')
  spec = importlib.util.spec_from_file_location(f'_specjax_config_{path.stem}', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """Parses 'tiny,gamma=4,model=x' into a ConfigDict over `defaults`.

  A bare word sets a boolean default to True; values are converted to the type of
  their default. Unknown keys are an error that lists the known ones.
  """
  out = ml_collections.ConfigDict(defaults)
  for item in filter(None, (arg or '').split(',')):
    key, sep, value = item.partition('=')
    key = key.strip()
    if key not in defaults:
      raise ValueError(f'unknown config argument {key!r}; known: {sorted(defaults)}')
    default = defaults[key]
    if not sep:
      if not isinstance(default, bool):
        raise ValueError(f'config argument {key!r} needs a value ({key}=...)')
      out[key] = True
    elif isinstance(default, bool):
      out[key] = value.lower() in ('1', 'true', 'yes')
    else:
      try:
        out[key] = type(default)(value)
      except ValueError as e:
        kind = type(default).__name__
        raise ValueError(f'config argument {key}={value!r}: expected {kind}') from e
  return out


def optim(
  lr: float, warmup_steps: int, clip_norm: float, weight_decay: float = 0.0, b2: float = 0.95
) -> ml_collections.ConfigDict:
  """A training config's `optim` (specjax.train.task.make_optimizer): gradient clipping to
  clip_norm, then AdamW (b1 0.9) with linear warm-up to lr and cosine decay to lr / 10."""
  o = ml_collections.ConfigDict()
  o.lr = lr
  o.warmup_steps = warmup_steps
  o.end_lr_fraction = 0.1
  o.weight_decay = weight_decay
  o.clip_norm = clip_norm
  o.b1 = 0.9
  o.b2 = b2
  return o


def check(condition: bool, field: str, value, expected: str) -> None:
  """Raises ValueError('config.<field> = <value>: expected <expected>') unless condition."""
  if not condition:
    raise ValueError(f'config.{field} = {value!r}: expected {expected}')


def _flag_value(argv, name: str) -> str | None:
  for i, a in enumerate(argv):
    if a.startswith(f'--{name}='):
      return a.split('=', 1)[1]
    if a == f'--{name}' and i + 1 < len(argv):
      return argv[i + 1]
  return None


def check_overrides(argv, flag: str = 'config') -> None:
  """Raises ValueError for a --config.<field> override that the config file lacks, and
  the config file's own errors (a bad argument after the colon) as they are.

  ml_collections reports those with a traceback from deep inside flag parsing; this
  names the override and the closest fields instead, before anything is loaded.
  """
  overrides = [a[len(flag) + 3 :].split('=', 1)[0] for a in argv if a.startswith(f'--{flag}.')]
  spec = _flag_value(argv, flag)
  if spec is None:
    return
  file, _, arg = spec.partition(':')
  if not pathlib.Path(file).is_file():
    raise FileNotFoundError(f'--{flag}={spec}: config file {file} not found')
  config = load_config(file, arg or None)
  for override in overrides:
    node, parts = config, override.split('.')
    for depth, part in enumerate(parts):
      if not isinstance(node, ml_collections.ConfigDict) or part not in node:
        known = list(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
        close = difflib.get_close_matches(part, known, n=3, cutoff=0.5)
        where = '.'.join(parts[:depth]) or file
        hint = f'; did you mean {" or ".join(close)}?' if close else ''
        raise ValueError(
          f'--{flag}.{override}: {where} has no field {part!r}{hint} (known: {", ".join(known)})'
        )
      node = node[part]


def start_processes(coordinator: str | None, num_processes: int | None, process_id: int | None):
  """jax.distributed.initialize for a multi-process run (nothing when `coordinator` is unset).

  Every process runs the same command; the devices of all of them form the mesh
  (config.mesh), and process 0 alone prints and writes results.
  """
  if not coordinator:
    if num_processes is not None or process_id is not None:
      raise ValueError('--num_processes and --process_id need --coordinator=HOST:PORT')
    return
  import jax  # noqa: PLC0415 (only for multi-process runs)

  if coordinator == 'auto':
    jax.distributed.initialize()
    return
  if num_processes is None or process_id is None or not 0 <= process_id < num_processes:
    raise ValueError(
      f'--coordinator={coordinator} needs --num_processes=N and --process_id in [0, N), got '
      f'num_processes={num_processes}, process_id={process_id}'
    )
  jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id)


def _interrupt(signum, frame):
  raise KeyboardInterrupt(f'signal {signum}')


def describe(config: ml_collections.ConfigDict, fields: dict[str, str] | None = None) -> str:
  """Every field of `config` with its value and, where `fields` has one, what it holds (in
  `fields`' order, then the rest by name): the text `--print_config` shows."""
  fields = fields or {}
  lines = []
  for name in [*(f for f in fields if f in config), *sorted(set(config) - set(fields))]:
    value = config[name]
    if isinstance(value, ml_collections.ConfigDict):
      value = value.to_dict()
    text = f'{name} = {value!r}'
    lines.append(f'{text:<40}  # {fields[name]}' if name in fields else text)
  return '\n'.join(lines)


def run_cli(
  main: Callable[..., object],
  default_config: str | None = None,
  argv=None,
  fields: dict[str, str] | None = None,
) -> None:
  """Runs `main(config, workdir)` from the command line: --config FILE[:ARG] (with
  --config.<field>=<value> overrides) and --workdir DIR; --print_config prints every field
  with its value and (from `fields`) what it holds, and runs nothing.

  Unknown overrides, ValueError and FileNotFoundError (bad input, raised before any
  expensive work) print one line 'error: ...' and exit with status 2.
  """
  from absl import app, flags
  from ml_collections import config_flags

  argv = list(sys.argv if argv is None else argv)
  help_text = f'Config file, e.g. {default_config}' if default_config else 'Config file.'
  config = config_flags.DEFINE_config_file('config', None, help_text, lock_config=True)
  workdir = flags.DEFINE_string('workdir', None, 'Where results go (default runs/<UTC time>).')
  coordinator = flags.DEFINE_string(
    'coordinator',
    None,
    'Several processes (jax.distributed): host:port of process 0, or "auto" where JAX finds '
    'it (TPU slices, SLURM, Open MPI). Unset: one process.',
  )
  num_processes = flags.DEFINE_integer('num_processes', None, 'Processes in all (--coordinator).')
  process_id = flags.DEFINE_integer('process_id', None, "This process's index (--coordinator).")
  print_config = flags.DEFINE_bool(
    'print_config', False, 'Print every config field, its value and what it holds; run nothing.'
  )

  def run(args):
    if len(args) > 1:
      raise app.UsageError(f'unexpected arguments: {args[1:]}')
    if config.value is None:
      raise app.UsageError(f'--config is required, e.g. --config {default_config}')
    if print_config.value:
      print(describe(config.value, fields))
      return
    signal.signal(signal.SIGTERM, _interrupt)  # cleanup as for Ctrl-C (what is done is kept)
    try:
      start_processes(coordinator.value, num_processes.value, process_id.value)
      main(config.value, workdir.value)
    except (ValueError, FileNotFoundError) as e:
      print(f'error: {e}', file=sys.stderr)
      sys.exit(2)
    except KeyboardInterrupt:
      print('interrupted', file=sys.stderr)
      sys.exit(130)

  try:
    check_overrides(argv)
  except (ValueError, FileNotFoundError) as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  app.run(run, argv)
