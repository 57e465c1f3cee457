"""Prompt sets: HumanEval, MT-Bench, or a JSONL file of your own.

Every prompt is one user chat message, to be wrapped by the model's chat template:

  load_prompts('humaneval')          # 164 function completions
  load_prompts('mtbench:coding', 5)  # the first 5 MT-Bench coding questions (first turns)
  load_prompts('code_edit')          # return a stdlib function with a small change
  load_prompts('my_prompts.jsonl')   # {"prompt": "...", "category": "...", "id": "..."} a line
  load_prompts('specbench', 3)       # the first 3 Spec-Bench questions of each of its 13
                                     # categories, both turns (specjax/data/specbench.py)
"""

from __future__ import annotations

import dataclasses
import functools
import os

from specjax.data import specbench
from specjax.data.parse import HUMANEVAL_INSTRUCTION, Prompt, read_jsonl

__all__ = ['HUMANEVAL_INSTRUCTION', 'Prompt', 'load_prompts', 'read_jsonl', 'humaneval', 'mtbench']
_KNOWN = (
  'humaneval, mtbench, mtbench:<category>, code_edit, or a path to a .jsonl file; or Spec-Bench: '
  'specbench, specbench:<category>, specbench:<path to question.jsonl>[:<category>]'
)


def load_prompts(spec: str, num_prompts: int | None = None) -> list[Prompt]:
  """Loads a prompt set.

  Args:
    spec: 'humaneval', 'mtbench', 'mtbench:<category>', or the path of a JSONL file whose lines
      are objects with "prompt" (a string) or "turns" (strings; the first is used), and optional
      "category" (default 'default') and "id" (default: the line number); or Spec-Bench:
      'specbench', 'specbench:<category>', 'specbench:<path>[:<category>]' (every turn).
    num_prompts: keep only the first this many (Spec-Bench: the first this many per category).

  Returns:
    The prompts, in file order.

  Raises:
    ValueError: an unknown spec, a missing or malformed file, an empty set, or num_prompts < 1.
  """
  if num_prompts is not None and num_prompts < 1:
    raise ValueError(f'num_prompts must be >= 1 (or None for all), got {num_prompts}.')
  if spec == 'specbench' or spec.startswith('specbench:'):
    return specbench.load(spec, num_prompts)
  prompts = list(_resolve(spec))
  if not prompts:
    raise ValueError(f'Prompt set {spec!r} is empty.')
  return prompts if num_prompts is None else prompts[:num_prompts]


def humaneval() -> tuple[Prompt, ...]:
  """The 164 HumanEval tasks, each as an instruction to complete the function (read from
  its TFDS dataset, specjax/data/tfds_prompts.py)."""
  return _from_tfds('humaneval')


def mtbench(category: str | None = None) -> tuple[Prompt, ...]:
  """The first turns of the 80 MT-Bench questions, or of one category's 10 (read from its
  TFDS dataset, which keeps every turn)."""
  questions = tuple(dataclasses.replace(p, later_turns=()) for p in _from_tfds('mtbench'))
  if category is None:
    return questions
  categories = list(dict.fromkeys(p.category for p in questions))
  if category not in categories:
    raise ValueError(
      f'Unknown MT-Bench category {category!r}; known categories: {", ".join(categories)}.'
    )
  return tuple(p for p in questions if p.category == category)


def _resolve(spec: str) -> tuple[Prompt, ...] | list[Prompt]:
  if spec == 'humaneval':
    return humaneval()
  if spec == 'mtbench':
    return mtbench()
  if spec == 'code_edit':
    return _from_tfds('code_edit')
  if spec.startswith('mtbench:'):
    return mtbench(spec.split(':', 1)[1])
  if _looks_like_path(spec):
    return read_jsonl(spec)
  raise ValueError(f'Unknown prompt set {spec!r}; use {_KNOWN}.')


def _looks_like_path(spec: str) -> bool:
  return spec.endswith(('.jsonl', '.json')) or os.sep in spec or '/' in spec or os.path.exists(spec)


@functools.cache
def _from_tfds(name: str) -> tuple[Prompt, ...]:
  from specjax.data import tfds_prompts  # tensorflow_datasets loads only when a set is read

  return tuple(tfds_prompts.read(name))
