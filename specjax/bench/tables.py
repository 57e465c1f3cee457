"""Aligned text tables and Markdown tables from rows of cells: the one table formatter.

    print(text_table(['method', 'tok/s'], [['autoregressive', 31.2], ['ngram@4', 40.5]]))

Floats are written with `digits` decimals (a column may override it with a format in
`formats`), None as '-'; the first column is left-aligned, the others right-aligned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def cell(value: Any, fmt: str | None = None, digits: int = 2) -> str:
  if value is None:
    return '-'
  if fmt is not None:
    return format(value, fmt)
  if isinstance(value, float):
    return f'{value:.{digits}f}'
  return str(value)


def _cells(header, rows, formats, digits) -> list[list[str]]:
  formats = formats or {}
  out = [[str(h) for h in header]]
  for row in rows:
    out.append([cell(v, formats.get(header[i]), digits) for i, v in enumerate(row)])
  return out


def text_table(
  header: Sequence[str],
  rows: Sequence[Sequence[Any]],
  formats: Mapping[str, str] | None = None,
  digits: int = 2,
) -> str:
  """Columns padded to their widest cell, two spaces apart."""
  cells = _cells(header, rows, formats, digits)
  widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
  lines = []
  for r in cells:
    parts = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]
    lines.append('  '.join(parts).rstrip())
  return '\n'.join(lines)


def markdown_table(
  header: Sequence[str],
  rows: Sequence[Sequence[Any]],
  formats: Mapping[str, str] | None = None,
  digits: int = 2,
) -> str:
  """A GitHub Markdown table (first column left-aligned, the others right-aligned)."""
  cells = _cells(header, rows, formats, digits)
  lines = [
    '| ' + ' | '.join(cells[0]) + ' |',
    '|' + '|'.join([' --- '] + [' ---: '] * (len(header) - 1)) + '|',
  ]
  lines += ['| ' + ' | '.join(r) + ' |' for r in cells[1:]]
  return '\n'.join(lines)
