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
import gzip
import json
import os
import pathlib
from collections.abc import Iterator
from typing import Any

HUMANEVAL_INSTRUCTION = (
  'Complete the following Python function. Reply with the full function in a Python code block.'
  '\n\n```python\n{prompt}```'
)
_KNOWN = (
  'humaneval, mtbench, mtbench:<category>, code_edit, or a path to a .jsonl file; or Spec-Bench: '
  'specbench, specbench:<category>, specbench:<path to question.jsonl>[:<category>]'
)


@dataclasses.dataclass(frozen=True)
class Prompt:
  """One user message.

  Attributes:
    id: unique within its set (HumanEval task_id, MT-Bench question_id, JSONL id or line number).
    text: the user message, to be rendered with the chat template.
    category: e.g. 'humaneval', an MT-Bench category, or a JSONL file's 'category'.
    later_turns: the user's next messages of a multi-turn question (Spec-Bench's MT-bench
      questions), each asked after the model's own answer to the one before; () for one turn.
  """

  id: str
  text: str
  category: str
  later_turns: tuple[str, ...] = ()


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
    from specjax.data import specbench

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


def read_jsonl(path: str | os.PathLike[str]) -> list[Prompt]:
  """Reads a JSONL prompt file (see `load_prompts`); every error names the file and line."""
  path = pathlib.Path(path)
  prompts, first_line = [], {}
  for lineno, obj in _jsonl_objects(path):
    prompt = _prompt_from_object(obj, f'{path}:{lineno}', default_id=str(lineno))
    if prompt.id in first_line:
      raise ValueError(
        f'{path}:{lineno}: duplicate id {prompt.id!r} (first on line {first_line[prompt.id]}).'
      )
    first_line[prompt.id] = lineno
    prompts.append(prompt)
  return prompts


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


def _jsonl_objects(path: pathlib.Path) -> Iterator[tuple[int, Any]]:
  """(line number, parsed JSON) for each non-blank line."""
  opener = gzip.open if path.suffix == '.gz' else open
  try:
    f = opener(path, 'rt', encoding='utf-8')
  except FileNotFoundError:
    raise ValueError(f'{path}: no such prompt file.') from None
  with f:
    for lineno, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        yield lineno, json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f'{path}:{lineno}: malformed JSON: {e}') from None


def _prompt_from_object(obj: Any, where: str, default_id: str) -> Prompt:
  """A Prompt from one JSONL object; `where` ('path:line') prefixes every error."""
  if not isinstance(obj, dict):
    raise ValueError(f'{where}: expected a JSON object, got {type(obj).__name__}.')
  if 'prompt' in obj:
    text = obj['prompt']
    if not isinstance(text, str):
      raise ValueError(f'{where}: "prompt" must be a string, got {type(text).__name__}.')
  elif 'turns' in obj:
    turns = obj['turns']
    if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
      raise ValueError(f'{where}: "turns" must be a non-empty list of strings.')
    text = turns[0]
  else:
    raise ValueError(f'{where}: no "prompt" or "turns" key; keys found: {sorted(obj)}.')
  if not text.strip():
    raise ValueError(f'{where}: empty prompt.')
  category = obj.get('category', 'default')
  if not isinstance(category, str) or not category:
    raise ValueError(f'{where}: "category" must be a non-empty string, got {category!r}.')
  return Prompt(id=str(obj.get('id', default_id)), text=text, category=category)


@functools.cache
def _humaneval(path: pathlib.Path) -> tuple[Prompt, ...]:
  prompts = []
  for _, task in _jsonl_objects(path):
    code = task['prompt'] if task['prompt'].endswith('\n') else task['prompt'] + '\n'
    text = HUMANEVAL_INSTRUCTION.format(prompt=code)
    prompts.append(Prompt(id=task['task_id'], text=text, category='humaneval'))
  return tuple(prompts)


def _mtbench_all_turns(path: pathlib.Path) -> tuple[Prompt, ...]:
  return tuple(
    Prompt(
      id=str(q['question_id']),
      text=q['turns'][0],
      category=q['category'],
      later_turns=tuple(q['turns'][1:]),
    )
    for _, q in _jsonl_objects(path)
  )


@functools.cache
def _from_tfds(name: str) -> tuple[Prompt, ...]:
  from specjax.data import tfds_prompts  # tensorflow_datasets loads only when a set is read

  return tuple(tfds_prompts.read(name))
