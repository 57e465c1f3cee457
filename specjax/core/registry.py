"""The registry's machinery: name tables that import lazily, and the one spec grammar.

A spec names a thing and its settings:

    KIND[:ARG,ARG,...,KEY=VALUE,...]

`ngram`, `ngram:3-8`, `layers:0-11,20-29`, `consensus:8,k=4,m=1`, `distilled:DIR`. The
registry (specjax/registry.py) holds the tables; each entry is 'module:attribute', imported
on first lookup, so looking a name up never imports more than the one thing asked for and
this module imports nothing from specjax.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class Spec:
  """A parsed spec: `kind`, positional `args` and `options` (KEY=VALUE, in order)."""

  text: str
  kind: str
  args: tuple[str, ...] = ()
  options: tuple[tuple[str, str], ...] = ()

  def error(self, usage: str) -> ValueError:
    return ValueError(f'draft {self.text!r}: expected {usage}')

  def option_dict(self, known: Mapping[str, Any], usage: str) -> dict[str, Any]:
    """{field: converted value} for options named in `known` (key -> (field, type))."""
    out = {}
    for key, value in self.options:
      if key not in known:
        raise ValueError(
          f'draft {self.text!r}: unknown option {key!r} (known: {", ".join(known)}); '
          f'expected {usage}'
        )
      field, kind = known[key]
      try:
        out[field] = kind(value)
      except ValueError:
        raise self.error(usage) from None
    return out


def parse_spec(text: str) -> Spec:
  """'consensus:8,k=4' -> Spec('consensus:8,k=4', 'consensus', ('8',), (('k', '4'),))."""
  kind, sep, rest = text.strip().partition(':')
  if not sep:
    return Spec(text, kind)
  args, options = [], []
  for item in rest.split(','):
    key, eq, value = item.partition('=')
    if eq:
      options.append((key.strip(), value.strip()))
    else:
      args.append(item.strip())
  return Spec(text, kind, tuple(args), tuple(options))


class Registry:
  """Names -> objects, given as 'module:attribute' (imported on first lookup) or as the
  objects themselves (tests register deliberately wrong ones in `table`)."""

  def __init__(self, what: str, table: Mapping[str, Any]):
    self.what = what
    self.table = dict(table)

  @property
  def names(self) -> tuple[str, ...]:
    return tuple(self.table)

  def __contains__(self, name: str) -> bool:
    return name in self.table

  def suggest(self, name: str) -> str:
    """'; did you mean 'x'?' for the closest known names, or ''."""
    close = difflib.get_close_matches(str(name), self.names, n=3, cutoff=0.5)
    return f'; did you mean {" or ".join(map(repr, close))}?' if close else ''

  def unknown(self, name: str) -> ValueError:
    """The error for a name not in the table: the known names, the closest suggested."""
    return ValueError(
      f'unknown {self.what} {name!r}; known: {", ".join(sorted(self.names))}{self.suggest(name)}'
    )

  def get(self, name: str) -> Any:
    if name not in self.table:
      raise self.unknown(name)
    entry = self.table[name]
    if isinstance(entry, str):
      module, _, attr = entry.partition(':')
      return getattr(importlib.import_module(module), attr)
    return entry
