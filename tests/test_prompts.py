"""Tests for specjax.data.prompts."""

import collections
import gzip
import json
import re

import pytest

from specjax.data.prompts import Prompt, load_prompts


def _write(tmp_path, lines, name='p.jsonl'):
  path = tmp_path / name
  path.write_text('\n'.join(line if isinstance(line, str) else json.dumps(line) for line in lines))
  return path


def test_jsonl_prompts_turns_ids_categories(tmp_path):
  path = _write(
    tmp_path,
    [
      {'prompt': 'Say hi.'},
      '',
      {'turns': ['First turn.', 'Second turn.'], 'category': 'chat', 'id': 7},
      '   ',
      {'prompt': 'Write code.', 'category': 'code', 'id': 'task-3'},
    ],
  )
  assert load_prompts(str(path)) == [
    Prompt(id='1', text='Say hi.', category='default'),
    Prompt(id='7', text='First turn.', category='chat'),
    Prompt(id='task-3', text='Write code.', category='code'),
  ]


def test_num_prompts_keeps_the_first(tmp_path):
  path = _write(tmp_path, [{'prompt': f'p{i}'} for i in range(5)])
  assert [p.text for p in load_prompts(str(path), num_prompts=2)] == ['p0', 'p1']
  assert len(load_prompts(str(path), num_prompts=50)) == 5


def test_gzipped_jsonl(tmp_path):
  path = tmp_path / 'p.jsonl.gz'
  with gzip.open(path, 'wt') as f:
    f.write(json.dumps({'prompt': 'zipped'}) + '\n')
  assert load_prompts(str(path)) == [Prompt(id='1', text='zipped', category='default')]


@pytest.mark.parametrize('n', [0, -3])
def test_num_prompts_must_be_positive(tmp_path, n):
  path = _write(tmp_path, [{'prompt': 'x'}])
  with pytest.raises(ValueError, match=f'num_prompts must be >= 1.*got {n}'):
    load_prompts(str(path), num_prompts=n)


def test_missing_file(tmp_path):
  path = tmp_path / 'nope.jsonl'
  with pytest.raises(ValueError, match=re.escape(f'{path}: no such prompt file')):
    load_prompts(str(path))


def test_malformed_json_line(tmp_path):
  path = _write(tmp_path, [{'prompt': 'ok'}, '', '{"prompt": "unterminated'])
  with pytest.raises(ValueError, match=re.escape(f'{path}:3: malformed JSON: Unterminated string')):
    load_prompts(str(path))


def test_line_without_prompt_or_turns(tmp_path):
  path = _write(tmp_path, [{'prompt': 'ok'}, {'question': 'x', 'category': 'c'}])
  match = re.escape(
    f'{path}:2: no "prompt" or "turns" key; keys found: [\'category\', \'question\']'
  )
  with pytest.raises(ValueError, match=match):
    load_prompts(str(path))


@pytest.mark.parametrize(
  'line, message',
  [
    ({'prompt': 42}, '"prompt" must be a string, got int'),
    ({'prompt': ['a']}, '"prompt" must be a string, got list'),
    ({'turns': []}, '"turns" must be a non-empty list of strings'),
    ({'turns': [1, 2]}, '"turns" must be a non-empty list of strings'),
    ({'prompt': 'x', 'category': 3}, '"category" must be a non-empty string'),
    (['prompt'], 'expected a JSON object, got list'),
  ],
)
def test_bad_values(tmp_path, line, message):
  path = _write(tmp_path, [{'prompt': 'ok'}, line])
  with pytest.raises(ValueError, match=re.escape(f'{path}:2: {message}')):
    load_prompts(str(path))


@pytest.mark.parametrize('text', ['', '  \n\t'])
def test_empty_prompt(tmp_path, text):
  path = _write(tmp_path, [{'prompt': 'ok'}, {'turns': [text, 'second']}])
  with pytest.raises(ValueError, match=re.escape(f'{path}:2: empty prompt')):
    load_prompts(str(path))


def test_duplicate_ids(tmp_path):
  path = _write(tmp_path, [{'prompt': 'a', 'id': 'x'}, {'prompt': 'b', 'id': 'x'}])
  with pytest.raises(ValueError, match=re.escape(f"{path}:2: duplicate id 'x' (first on line 1)")):
    load_prompts(str(path))


def test_empty_prompt_set(tmp_path):
  path = _write(tmp_path, ['', '  '])
  with pytest.raises(ValueError, match=re.escape(f"Prompt set '{path}' is empty")):
    load_prompts(str(path))


@pytest.mark.parametrize('spec', ['alpaca', 'human_eval', ''])
def test_unknown_spec(spec):
  with pytest.raises(ValueError, match='mtbench:<category>, code_edit, or a path'):
    load_prompts(spec)


@pytest.mark.slow
def test_humaneval():
  ps = load_prompts('humaneval')
  assert len(ps) == 164
  assert len({p.id for p in ps}) == 164
  assert ps[0].id == 'HumanEval/0' and {p.category for p in ps} == {'humaneval'}
  assert ps[0].text.startswith(
    'Complete the following Python function. Reply with the full function in a Python code block.'
    '\n\n```python\nfrom typing import List\n'
  )
  assert all(p.text.endswith('\n```') for p in ps)
  assert [p.id for p in load_prompts('humaneval', num_prompts=3)] == [
    f'HumanEval/{i}' for i in range(3)
  ]


@pytest.mark.slow
def test_mtbench():
  ps = load_prompts('mtbench')
  assert len(ps) == 80
  assert collections.Counter(p.category for p in ps) == {
    c: 10
    for c in [
      'writing',
      'roleplay',
      'reasoning',
      'math',
      'coding',
      'extraction',
      'stem',
      'humanities',
    ]
  }
  assert ps[0] == Prompt(
    id='81',
    text='Compose an engaging travel blog post about a recent trip to Hawaii, highlighting '
    'cultural experiences and must-see attractions.',
    category='writing',
  )


@pytest.mark.slow
def test_mtbench_category():
  coding = load_prompts('mtbench:coding', num_prompts=4)
  assert len(coding) == 4 and {p.category for p in coding} == {'coding'}
  assert len(load_prompts('mtbench:math')) == 10


@pytest.mark.slow
def test_mtbench_unknown_category():
  with pytest.raises(
    ValueError, match='Unknown MT-Bench category .poetry.; known categories: writing'
  ):
    load_prompts('mtbench:poetry')


def test_code_edit_prompt_set_is_built_offline_from_the_stdlib():
  prompts = load_prompts('code_edit')
  assert len(prompts) >= 15
  assert len({p.id for p in prompts}) == len(prompts)
  for p in prompts:
    assert p.category == 'code_edit'
    source = p.text.split('```python\n', 1)[1].split('```', 1)[0]
    assert source.startswith('def ') and 5 <= source.count('\n') <= 40
    assert 'Return the complete function with one change' in p.text
  assert load_prompts('code_edit', 3) == prompts[:3]
