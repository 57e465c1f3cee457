"""specjax's prompt sets and training corpora as TFDS datasets: built offline, read without
TensorFlow, equal to their sources, and what the harness and the trainers read."""

import json
import os
import pathlib

import pytest
import tensorflow_datasets as tfds

import specjax.datasets
from specjax.data import prompts, specbench, tfds_prompts
from specjax.train import prompts as train_prompts
from specjax.train import tfds_corpora


@pytest.mark.parametrize('name', tfds_prompts.SETS)
def test_prompt_sets_equal_their_sources(name, tmp_path):
  built = tfds_prompts.read(name, tmp_path)
  direct = tfds_prompts._source_prompts(tfds_prompts.PromptSetConfig(name=name))
  assert built == list(direct)  # every field, in file order (no shuffling)
  files = list((tmp_path / 'specjax_prompts' / name).rglob('*.array_record*'))
  assert files, 'written as ArrayRecord'


def test_mtbench_keeps_every_turn_and_the_harness_its_first():
  built = tfds_prompts.read('mtbench')
  assert len(built) == 80 and all(len(p.later_turns) == 1 for p in built)
  assert prompts.load_prompts('mtbench') == [
    prompts.Prompt(p.id, p.text, p.category) for p in built
  ]


def test_the_harness_reads_through_tfds(monkeypatch):
  calls = []
  real = tfds_prompts.read
  monkeypatch.setattr(tfds_prompts, 'read', lambda c, f=None: calls.append(c) or real(c, f))
  prompts._from_tfds.cache_clear()
  try:
    assert len(prompts.load_prompts('humaneval', 3)) == 3
    assert len(prompts.load_prompts('code_edit', 2)) == 2
  finally:
    prompts._from_tfds.cache_clear()
  assert calls == ['humaneval', 'code_edit']


def _questions(path, n):
  rows = [
    {'question_id': i, 'category': 'qa' if i % 2 else 'writing', 'turns': [f'q{i}', f'r{i}']}
    for i in range(n)
  ]
  path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
  return path


def test_a_spec_bench_file_builds_anew_when_it_changes(tmp_path, monkeypatch):
  monkeypatch.setenv('SPECJAX_CACHE', str(tmp_path / 'cache'))
  path = _questions(tmp_path / 'question.jsonl', 4)
  first = specbench.load(f'specbench:{path}')
  assert first == specbench.read_questions(path)
  assert first[1].later_turns == ('r1',)
  name = tfds_prompts.specbench_config(path).name
  _questions(path, 6)
  assert tfds_prompts.specbench_config(path).name != name
  assert len(specbench.load(f'specbench:{path}')) == 6
  built = sorted(p.name for p in (tmp_path / 'cache' / 'tfds' / 'specjax_prompts').iterdir())
  built = [b for b in built if not b.startswith('.')]  # tfds keeps a .config folder
  assert len(built) == 2 and all(b.startswith('specbench-') for b in built), built


def test_a_bad_spec_bench_file_is_refused_before_any_build(tmp_path, monkeypatch):
  monkeypatch.setenv('SPECJAX_CACHE', str(tmp_path / 'cache'))
  path = tmp_path / 'question.jsonl'
  path.write_text('{"question_id": 1, "category": "qa"}\n')
  with pytest.raises(ValueError, match=r'question.jsonl:1: no "turns" field'):
    specbench.load(f'specbench:{path}')
  assert not (tmp_path / 'cache' / 'tfds').exists()


def test_importing_specjax_datasets_registers_the_builders(tmp_path):
  assert set(specjax.datasets.BUILDERS) <= set(tfds.list_builders(with_community_datasets=False))
  source = tfds.data_source(
    'specjax_prompts/code_edit',
    split='test',
    data_dir=str(tmp_path),
    builder_kwargs={'file_format': 'array_record'},
  )
  first = source[0]
  assert first['category'] == b'code_edit' and first['text'].decode().startswith('Here is')


@pytest.mark.parametrize('kind', ['instructions', 'stdlib', 'docs'])
def test_corpora_equal_their_sources(kind, tmp_path):
  texts = tfds_corpora.texts(kind, folder=tmp_path)
  if kind == 'instructions':
    assert texts == train_prompts.instruction_prompts(0)
    assert tfds_corpora.texts(kind, 3, tmp_path) == train_prompts.instruction_prompts(3)
  elif kind == 'stdlib':
    files = tfds_corpora.stdlib_files()
    assert texts == [f.read_text(errors='replace') for f in files]
    names = tfds_corpora.names(kind, folder=tmp_path)
    assert [pathlib.PurePosixPath(n).name for n in names] == [f.name for f in files]
  else:
    from pydoc_data import topics

    assert '\n\n'.join(texts) == '\n\n'.join(topics.topics[k] for k in sorted(topics.topics))


def test_corpora_are_read_by_index(tmp_path):
  source = tfds_corpora.source('instructions', folder=tmp_path)
  expected = train_prompts.instruction_prompts(0)
  assert len(source) == len(expected)
  for i in (len(expected) - 1, 0, 7):  # any order: random access
    assert source[i]['text'].decode() == expected[i]
  assert os.listdir(tmp_path / 'specjax_corpus')
