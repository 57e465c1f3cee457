"""A code-editing prompt set built offline from the Python standard library.

Each prompt shows a stdlib function and asks for it back with one small change, so the
answer mostly repeats the prompt: the workload where lookup-style drafters shine. The
sources come from the running interpreter (`inspect.getsource`), so the exact text
follows the Python version; functions that are not pure Python there are skipped.
"""

from __future__ import annotations

import importlib
import inspect
import textwrap
import warnings

CANDIDATES = (
  'textwrap.dedent',
  'textwrap.indent',
  'textwrap.shorten',
  'shlex.quote',
  'shlex.join',
  'posixpath.join',
  'posixpath.normpath',
  'posixpath.splitext',
  'posixpath.relpath',
  'genericpath.commonprefix',
  'string.capwords',
  'colorsys.rgb_to_hsv',
  'colorsys.hsv_to_rgb',
  'colorsys.rgb_to_hls',
  'colorsys.hls_to_rgb',
  'html.escape',
  'calendar.isleap',
  'calendar.leapdays',
  'calendar.monthrange',
  'statistics.median',
  'statistics.mode',
  'statistics.fmean',
  'statistics.median_low',
  'statistics.median_high',
  'glob.has_magic',
  'fnmatch.filter',
  'difflib.get_close_matches',
  'urllib.parse.quote_from_bytes',
  'fractions.Fraction.limit_denominator',
  'random.Random.choices',
  'heapq.nsmallest',
)
CHANGES = (
  'add a docstring that explains what it does',
  'add type hints to every parameter and to the return value',
  'rename it by appending "_v2" to its name',
  'add a short comment above each return statement',
)
TEMPLATE = (
  'Here is a Python function from the standard library:\n\n```python\n{source}```\n\n'
  'Return the complete function with one change: {change}. Keep everything else '
  'exactly the same and reply with only the code.'
)


def stdlib_source(qualname: str) -> str | None:
  """The dedented source of a stdlib object by dotted name, or None if it has none."""
  parts = qualname.split('.')
  for split in range(len(parts) - 1, 0, -1):  # the longest importable module prefix
    try:
      with warnings.catch_warnings():  # e.g. uu: deprecated, still there before Python 3.13
        warnings.simplefilter('ignore', DeprecationWarning)
        obj = importlib.import_module('.'.join(parts[:split]))
    except ImportError:
      continue
    try:
      for attr in parts[split:]:
        obj = getattr(obj, attr)
      return textwrap.dedent(inspect.getsource(obj))
    except (TypeError, OSError, AttributeError):
      return None
  return None


def code_edit_prompts(min_lines: int = 5, max_lines: int = 40) -> list[tuple[str, str]]:
  """(id, text) pairs, one per usable stdlib function, changes assigned round robin."""
  out = []
  for qualname in CANDIDATES:
    source = stdlib_source(qualname)
    if source is None or not min_lines <= source.count('\n') <= max_lines:
      continue
    change = CHANGES[len(out) % len(CHANGES)]
    out.append((qualname, TEMPLATE.format(source=source, change=change)))
  return out
