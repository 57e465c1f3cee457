"""Helpers for experiment configs: `get_config(arg)` argument parsing and validation."""

from __future__ import annotations

import ml_collections


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
