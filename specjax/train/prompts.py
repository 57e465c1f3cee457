"""Instruction prompts for distillation data, written for specjax (not HumanEval, not MT-bench).

The target answers these and the draft learns from its answers (the target's own
distribution, which is what the draft must predict at decoding time). They are built by
crossing templates with topics, so the set is large, deterministic and offline; code
prompts also ask to complete or explain functions of the Python standard library.
HumanEval and MT-bench stay evaluation-only: tests check that none of their prompts
appears here.
"""

from __future__ import annotations

import inspect
import itertools
import random

from specjax.data import code_edit

PROSE_TEMPLATES = (
  'Explain {} to a high-school student in a few paragraphs.',
  'Write a short blog post about {}.',
  'Give me five practical tips related to {}.',
  'What are the main advantages and disadvantages of {}?',
  'Summarize the history of {} in about 150 words.',
  'Write a short poem about {}.',
  'Pretend you are a tour guide and describe {} to visitors.',
  'Write a polite email to a colleague asking for feedback on a report about {}.',
  'List three common misconceptions about {} and correct them.',
  'Compare {} with a closely related idea and explain the difference.',
)
TOPICS = (
  'photosynthesis',
  'the water cycle',
  'compound interest',
  'volcanoes',
  'the French Revolution',
  'machine learning',
  'recycling plastic',
  'learning a second language',
  'black holes',
  'the immune system',
  'remote work',
  'electric cars',
  'the printing press',
  'coral reefs',
  'sleep and memory',
  'public libraries',
  'the stock market',
  'climate change',
  'honeybees',
  'the Roman Empire',
  'vaccines',
  'time management',
  'solar panels',
  'the Internet',
  'healthy breakfast habits',
  'chess openings',
  'the moon landing',
  'urban gardening',
  'cryptography',
  'the Renaissance',
  'earthquakes',
  'budgeting for students',
  'rainforests',
  'public speaking',
  'the theory of evolution',
  'jazz music',
  'bicycles in cities',
  'ancient Egypt',
  'antibiotics',
  'the speed of light',
)
REASONING = (
  'A farmer has {a} sheep and buys {b} more, then sells half of them. How many are left? '
  'Explain your reasoning step by step.',
  'If a train travels at {a} km/h for {b} hours, how far does it go? Show the calculation.',
  'What is {a} multiplied by {b}, and how can you check the answer?',
  'A rectangle has sides {a} cm and {b} cm. What are its area and perimeter?',
  'Tom is {a} years old and his sister is {b} years younger. How old will she be in ten years?',
)
CODE_TASKS = (
  'reverses the words in a sentence',
  'checks whether a string is a palindrome',
  'counts the vowels in a string',
  'returns the n-th Fibonacci number',
  'merges two sorted lists into one sorted list',
  'removes duplicates from a list keeping order',
  'computes the greatest common divisor of two integers',
  'flattens a nested list',
  'finds the most frequent element in a list',
  'converts a Roman numeral to an integer',
  'checks whether a number is prime',
  'returns the transpose of a matrix given as lists',
  'parses a CSV line into fields',
  'groups words by their first letter',
  'computes the moving average of a list with a window size',
  'validates an email address',
  'returns the longest common prefix of a list of strings',
  'implements binary search',
  'rotates a list by k positions',
  'counts words in a text file',
  'converts Celsius to Fahrenheit',
  'sorts a list of dictionaries by a key',
  'computes the factorial iteratively',
  'checks whether brackets in a string are balanced',
  'returns all permutations of a string',
  'computes the dot product of two vectors',
  'finds the second largest number in a list',
  'chunks a list into pieces of size n',
  'capitalizes the first letter of every word',
  'computes the median of a list of numbers',
)
CODE_TEMPLATES = (
  'Write a Python function that {}. Include a docstring.',
  'Implement a Python function that {} and add a few example calls.',
  'Show me idiomatic Python code that {}, with comments.',
  'Write a Python class with a method that {}.',
)
STDLIB_FUNCTIONS = (
  'textwrap.wrap',
  'textwrap.fill',
  'shlex.split',
  'posixpath.basename',
  'posixpath.dirname',
  'posixpath.split',
  'posixpath.expanduser',
  'os.makedirs',
  'base64.b64encode',
  'bisect.insort_left',
  'json.dumps',
  'json.loads',
  'keyword.iskeyword',
  'operator.attrgetter',
  'functools.reduce',
  'functools.cmp_to_key',
  'heapq.merge',
  'heapq.nlargest',
  'statistics.variance',
  'statistics.stdev',
  'statistics.harmonic_mean',
  'statistics.quantiles',
  'random.Random.shuffle',
  'random.Random.sample',
  'random.Random.randrange',
  'string.Formatter.vformat',
  'difflib.unified_diff',
  'difflib.ndiff',
  'fnmatch.fnmatch',
  'fnmatch.translate',
  'glob.glob',
  'shutil.copyfileobj',
  'shutil.which',
  'calendar.weekday',
  'urllib.parse.urlsplit',
  'urllib.parse.urlencode',
  'urllib.parse.unquote',
  'ipaddress.ip_address',
  'email.utils.parseaddr',
  'html.unescape',
  'csv.DictReader.__next__',
  'gettext.translation',
  'pprint.pformat',
  'quopri.encodestring',
  'uu.encode',
  'zipfile.is_zipfile',
  'tempfile.mkdtemp',
  'tokenize.untokenize',
  'collections.namedtuple',
  'dataclasses.asdict',
  'inspect.getmembers',
  'copy.deepcopy',
  'warnings.warn_explicit',
  'locale.format_string',
  'graphlib.TopologicalSorter.static_order',
)
STDLIB_TEMPLATES = (
  'Here is the signature and docstring of a function. Write the body so that it does what '
  'the docstring says.\n\n```python\n{header}```',
  'Explain what this Python function does, line by line:\n\n```python\n{source}```',
)


def _stdlib_source(qualname: str) -> str | None:
  source = code_edit.stdlib_source(qualname)
  return None if source is None else inspect.cleandoc('\n' + source) + '\n'


def source_header(source: str) -> str | None:
  """The def line(s) and docstring of a function's source, or None without a docstring."""
  lines = source.splitlines(keepends=True)
  for i, line in enumerate(lines):
    quote = '"""' if '"""' in line else "'''" if "'''" in line else None
    if quote and i > 0:
      end = (
        i
        if line.count(quote) >= 2
        else next((j for j in range(i + 1, len(lines)) if quote in lines[j]), None)
      )
      return None if end is None else ''.join(lines[: end + 1])
  return None


def stdlib_prompts(max_lines: int = 60) -> list[str]:
  out = []
  for qualname in STDLIB_FUNCTIONS:
    source = _stdlib_source(qualname)
    if source is None or source.count('\n') > max_lines:
      continue
    header = source_header(source)
    if header:
      out.append(STDLIB_TEMPLATES[0].format(header=header))
    out.append(STDLIB_TEMPLATES[1].format(source=source))
  return out


def instruction_prompts(seed: int = 0) -> list[str]:
  """Every distillation prompt (prose, reasoning, code), in a fixed shuffled order."""
  prose = [t.format(topic) for t, topic in itertools.product(PROSE_TEMPLATES, TOPICS)]
  rng = random.Random(seed)
  reasoning = [
    t.format(a=rng.randint(3, 99), b=rng.randint(2, 20)) for t in REASONING for _ in range(8)
  ]
  code = [t.format(task) for t, task in itertools.product(CODE_TEMPLATES, CODE_TASKS)]
  prompts = prose + reasoning + code + stdlib_prompts()
  random.Random(seed).shuffle(prompts)
  return prompts
