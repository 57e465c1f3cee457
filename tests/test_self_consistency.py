"""Self-consistency: answer extraction, majority vote, and the whole mode on a tiny model."""

import json

import pytest

from specjax import self_consistency as sc
from specjax.core.sampling import SamplingConfig


@pytest.mark.parametrize(
  'text,answer',
  [
    ('So the total is 42.', '42'),
    ('First 3 apples, then 5 more: 8 apples in all.', '8'),
    ('The answer is 1,250 dollars, not 7.', '1250'),
    ('Answer: **-3.50**', '-3.5'),
    ('We get \\boxed{17} after checking 2 cases.', '17'),
    ('x = 6/4 so x = 3/2', '3/2'),
    ('It weighs 12.0 kg.', '12'),
    ('No numbers here.', None),
  ],
)
def test_extract_answer(text, answer):
  assert sc.extract_answer(text) == answer


def test_majority_vote():
  assert sc.majority_vote(['3', '5', '3', None, '5', '3']) == ('3', 3)
  assert sc.majority_vote(['5', '3', '3', '5']) == ('5', 2)  # a tie goes to the first seen
  assert sc.majority_vote([None, None]) == (None, 0)
  assert sc.majority_vote([]) == (None, 0)


def tiny_config(**overrides):
  import importlib.util

  spec = importlib.util.spec_from_file_location('sc_config', 'configs/self_consistency.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config('tiny,n=4')
  c.max_new_tokens = 12
  c.compare_ngram = False
  c.update(overrides)
  return c


def test_self_consistency_writes_answers_votes_and_speedup(tmp_path):
  results = sc.main(tiny_config(), str(tmp_path), say=lambda *a: None)
  saved = json.loads((tmp_path / 'results.json').read_text())
  assert saved['summary'] == results['summary']
  (record,) = saved['prompts']
  assert len(record['answers']) == 4
  assert record['vote'] == sc.majority_vote(record['answers'])[0]
  assert set(record['methods']) == {'consensus', 'autoregressive'}
  assert record['methods']['autoregressive']['tokens_per_call'] == 1.0
  assert record['speedup']['autoregressive'] == 1.0
  texts = [json.loads(line) for line in (tmp_path / 'texts.jsonl').read_text().splitlines()]
  assert len(texts) == 8 and {t['path'] for t in texts} == {0, 1, 2, 3}


def test_the_n_paths_are_different_samples_of_one_prompt():
  from specjax.checkpoints import loader

  model = loader.load_model('tiny')
  engines = sc.build_engines(tiny_config(), model)
  ids = model.tokenizer.encode_chat('Count: 1 2 3')
  out = sc.run_paths(
    engines['consensus'], ids, 4, 12, SamplingConfig(temperature=1.0), seed=0, gamma=3
  )
  assert len(out.tokens) == 4 and len({tuple(t) for t in out.tokens}) > 1


@pytest.mark.parametrize(
  'overrides,match',
  [
    ({'n': 1}, r'config.n = 1: expected an integer >= 2'),
    ({'temperature': 0.0}, 'temperature = 0.0: expected > 0'),
    ({'gamma': 0}, 'gamma = 0: expected an integer >= 1'),
    ({'verifier': 'greedy'}, "verifier = 'greedy': expected one of"),
    ({'dtype': 'float64'}, "dtype = 'float64': expected one of"),
  ],
)
def test_bad_settings_are_named(tmp_path, overrides, match):
  with pytest.raises(ValueError, match=match):
    sc.main(tiny_config(**overrides), str(tmp_path), say=lambda *a: None)
