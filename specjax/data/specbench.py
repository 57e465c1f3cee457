"""Spec-Bench (Xia et al. 2024): 480 questions in 13 categories, read from a local file.

  load_prompts('specbench')                       # $SPECJAX_CACHE/spec_bench/question.jsonl
  load_prompts('specbench:rag')                   # one category
  load_prompts('specbench:/data/question.jsonl')  # a file of your own
  load_prompts('specbench:/data/question.jsonl:qa', 5)

The questions are Spec-Bench's `data/spec_bench/question.jsonl` (one JSON object a line with
"question_id", "category" and "turns"). Its license is not stated, so specjax neither ships nor
downloads it: put a copy in the cache folder (`specbench_path()`) or pass its path.

Spec-Bench keeps both turns of its MT-bench questions: a `Prompt`'s `text` is the first turn and
`later_turns` the rest, each asked after the model's own previous answer. `num_prompts` counts
per category (the first that many of each, in file order), so a small run covers every category:
num_prompts=80 (the largest category) is the whole set.
"""

from __future__ import annotations

import os
import pathlib

from specjax.data import assets, parse
from specjax.data.parse import Prompt

REPOSITORY = 'https://github.com/hemingkx/Spec-Bench'
REPOSITORY_PATH = 'data/spec_bench/question.jsonl'
# MT-bench's 8 categories (10 questions, 2 turns each), then Spec-Bench's 5 (80 questions, 1 turn).
MT_BENCH = (
  'writing',
  'roleplay',
  'reasoning',
  'math',
  'coding',
  'extraction',
  'stem',
  'humanities',
)
CATEGORIES = (*MT_BENCH, 'translation', 'summarization', 'qa', 'math_reasoning', 'rag')
# Spec-Bench's leaderboard columns, and the categories each pools.
LEADERBOARD = {
  'Multi-turn Conversation': MT_BENCH,
  'Translation': ('translation',),
  'Summarization': ('summarization',),
  'Question Answering': ('qa',),
  'Mathematical Reasoning': ('math_reasoning',),
  'Retrieval-aug. Generation': ('rag',),
}
USAGE = 'specbench, specbench:<category>, specbench:<path to question.jsonl>[:<category>]'


def is_specbench(spec: str) -> bool:
  return spec == 'specbench' or spec.startswith('specbench:')


def specbench_path() -> pathlib.Path:
  """Where `specbench` looks for question.jsonl: specjax's cache folder (assets.cache_dir)."""
  return assets.cache_dir() / 'spec_bench' / 'question.jsonl'


def parse_spec(spec: str) -> tuple[pathlib.Path, str | None]:
  """(question file, category or None) of 'specbench[:<category>|:<path>[:<category>]]'."""
  if not is_specbench(spec):
    raise ValueError(f'{spec!r} is not a Spec-Bench prompt set; use {USAGE}.')
  rest = spec[len('specbench:') :] if spec != 'specbench' else ''
  if not rest:
    return specbench_path(), None
  if rest in CATEGORIES:
    return specbench_path(), rest
  if _is_path(rest) and (os.path.exists(rest) or ':' not in rest):
    return pathlib.Path(rest), None
  path, colon, category = rest.rpartition(':')
  if colon and path and category and _is_path(path):
    return pathlib.Path(path), category
  raise ValueError(
    f'prompt set {spec!r}: {rest!r} is neither a Spec-Bench category ({", ".join(CATEGORIES)}) '
    f'nor a path to a question.jsonl; use {USAGE}.'
  )


def _is_path(text: str) -> bool:
  return text.endswith(('.jsonl', '.json')) or '/' in text or os.sep in text


def missing_file_message(path: pathlib.Path) -> str:
  return (
    f'Spec-Bench questions not found at {path}. Spec-Bench is not shipped with specjax (its '
    f'license is not stated): download {REPOSITORY_PATH} from the Spec-Bench repository '
    f'({REPOSITORY}) and put it at {specbench_path()} (the cache folder; $SPECJAX_CACHE moves '
    "it), or pass its path: --config.prompts='specbench:/path/to/question.jsonl'."
  )


def load(spec: str, num_prompts: int | None = None) -> list[Prompt]:
  """The questions of a Spec-Bench spec as Prompts (`num_prompts`: the first per category).

  Raises:
    ValueError: a missing file (where to get it and where to put it), a malformed line
      (file, line and field), an unknown category (the known ones), an empty selection.
  """
  path, category = parse_spec(spec)
  if not path.is_file():
    raise ValueError(missing_file_message(path))
  read_questions(path)  # every check, naming file, line and field, before anything is built
  from specjax.data import tfds_prompts  # the questions are read from their TFDS dataset

  questions = tfds_prompts.read(tfds_prompts.specbench_config(path))
  if category is not None:
    known = list(dict.fromkeys(q.category for q in questions))
    if category not in known:
      raise ValueError(
        f'{path}: no questions of category {category!r}; categories in the file: '
        f'{", ".join(known)}.'
      )
    questions = [q for q in questions if q.category == category]
  if num_prompts is not None:
    taken: dict[str, int] = {}
    kept = []
    for q in questions:
      if taken.get(q.category, 0) < num_prompts:
        taken[q.category] = taken.get(q.category, 0) + 1
        kept.append(q)
    questions = kept
  return questions


def read_questions(path: str | os.PathLike[str]) -> list[Prompt]:
  """Every question of a Spec-Bench question.jsonl, each line checked (see parse.py)."""
  return parse.specbench_questions(path)
