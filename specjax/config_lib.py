"""Helpers for experiment configs: `get_config(arg)` argument parsing and validation."""

from __future__ import annotations

import importlib.util
import pathlib

import ml_collections

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / 'configs'  # the repository's


def load_config(path: str | pathlib.Path, arg: str | None = None) -> ml_collections.ConfigDict:
  """`get_config(arg)` of the config file `path` (relative paths: under the repository's
  configs/), for configs built on another one."""
  path = pathlib.Path(path)
  if not path.is_absolute():
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


def check(condition: bool, field: str, value, expected: str) -> None:
  """Raises ValueError('config.<field> = <value>: expected <expected>') unless condition."""
  if not condition:
    raise ValueError(f'config.{field} = {value!r}: expected {expected}')
