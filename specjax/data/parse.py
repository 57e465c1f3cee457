"""Prompt files parsed into Prompts: a JSONL file of your own, HumanEval's and MT-Bench's
files, Spec-Bench's question.jsonl. The bottom of specjax/data: it reads files and imports
nothing of specjax, so the prompt sets (prompts.py, specbench.py) and their TFDS datasets
(tfds_prompts.py) all build on it.
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


def read_jsonl(path: str | os.PathLike[str]) -> list[Prompt]:
  """Reads a JSONL prompt file (see `load_prompts`); every error names the file and line."""
  path = pathlib.Path(path)
  prompts, first_line = [], {}
  for lineno, obj in jsonl_objects(path):
    prompt = prompt_from_object(obj, f'{path}:{lineno}', default_id=str(lineno))
    if prompt.id in first_line:
      raise ValueError(
        f'{path}:{lineno}: duplicate id {prompt.id!r} (first on line {first_line[prompt.id]}).'
      )
    first_line[prompt.id] = lineno
    prompts.append(prompt)
  return prompts


def jsonl_objects(path: pathlib.Path) -> Iterator[tuple[int, Any]]:
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


def prompt_from_object(obj: Any, where: str, default_id: str) -> Prompt:
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
def humaneval_tasks(path: pathlib.Path) -> tuple[Prompt, ...]:
  """HumanEval's tasks (its HumanEval.jsonl.gz), each an instruction to complete the function."""
  prompts = []
  for _, task in jsonl_objects(path):
    code = task['prompt'] if task['prompt'].endswith('\n') else task['prompt'] + '\n'
    text = HUMANEVAL_INSTRUCTION.format(prompt=code)
    prompts.append(Prompt(id=task['task_id'], text=text, category='humaneval'))
  return tuple(prompts)


def mtbench_questions(path: pathlib.Path) -> tuple[Prompt, ...]:
  """MT-Bench's questions (its question.jsonl), every turn kept."""
  return tuple(
    Prompt(
      id=str(q['question_id']),
      text=q['turns'][0],
      category=q['category'],
      later_turns=tuple(q['turns'][1:]),
    )
    for _, q in jsonl_objects(path)
  )


def specbench_questions(path: str | os.PathLike[str]) -> list[Prompt]:
  """Every question of a Spec-Bench question.jsonl, checked line by line: an object with
  "question_id" (an integer or a non-empty string, unique), "category" (a non-empty string)
  and "turns" (a non-empty list of non-empty strings); other keys (e.g. "reference") are
  ignored. Each error names the file, the line and the field."""
  path = pathlib.Path(path)
  out, first_line = [], {}
  for lineno, obj in jsonl_objects(path):
    where = f'{path}:{lineno}'
    if not isinstance(obj, dict):
      raise ValueError(f'{where}: expected a JSON object, got {type(obj).__name__}.')
    for field in ('question_id', 'category', 'turns'):
      if field not in obj:
        raise ValueError(f'{where}: no "{field}" field; keys found: {sorted(obj)}.')
    qid = obj['question_id']
    if isinstance(qid, bool) or not isinstance(qid, int | str) or qid == '':
      raise ValueError(
        f'{where}: "question_id" = {qid!r}: expected an integer or a non-empty string.'
      )
    qid = str(qid)
    if qid in first_line:
      raise ValueError(
        f'{where}: duplicate "question_id" {qid!r} (first on line {first_line[qid]}).'
      )
    first_line[qid] = lineno
    category = obj['category']
    if not isinstance(category, str) or not category.strip():
      raise ValueError(f'{where}: "category" = {category!r}: expected a non-empty string.')
    turns = obj['turns']
    if not isinstance(turns, list) or not turns:
      raise ValueError(f'{where}: "turns" = {turns!r}: expected a non-empty list of strings.')
    for k, turn in enumerate(turns):
      if not isinstance(turn, str) or not turn.strip():
        raise ValueError(
          f'{where}: "turns"[{k}] = {turn!r}: expected a non-empty string (a user turn).'
        )
    out.append(Prompt(id=qid, text=turns[0], category=category, later_turns=tuple(turns[1:])))
  if not out:
    raise ValueError(f'{path}: no questions (the file is empty).')
  return out
