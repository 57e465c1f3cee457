"""The entry point end to end: configs, work directory outputs and clear errors."""

import json
import os
import subprocess
import sys

import pytest

from specjax import run_lib
from specjax.models import loader

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_config(**overrides):
  sys.path.insert(0, os.path.join(ROOT, 'configs'))
  import smollm2  # noqa: E402  (configs/ is not a package)
  config = smollm2.get_config('tiny')
  config.update(overrides)
  return config


def test_tiny_prompt_set_writes_results(tmp_path):
  prompts = tmp_path / 'mine.jsonl'
  prompts.write_text('{"prompt": "hello there", "category": "greet"}\n'
                     '{"turns": ["count to three", "again"], "category": "math"}\n'
                     '{"prompt": "bye"}\n')
  summary = run_lib.main(tiny_config(prompts=str(prompts), num_prompts=3, batch_size=2),
                         str(tmp_path / 'out'), verbose=False)
  records = [json.loads(l) for l in (tmp_path / 'out' / 'generations.jsonl').read_text()
             .splitlines()]
  assert [r['category'] for r in records] == ['greet', 'math', 'default'] * 3
  assert records[1]['prompt'] == 'count to three'
  assert all(1 <= r['new_tokens'] <= 16 and isinstance(r['output'], str) for r in records)
  saved = json.loads((tmp_path / 'out' / 'results.json').read_text())
  assert saved == summary and saved['num_prompts'] == 3
  assert set(saved['methods']) == {'autoregressive', 'ngram gamma=4', 'truncated:1 gamma=4'}
  for name, m in saved['methods'].items():
    mine = [r for r in records if r['method'] == name]
    assert m['new_tokens'] == sum(r['new_tokens'] for r in mine)
  ar = saved['methods']['autoregressive']
  assert ar['acceptance_rate'] is None and ar['tokens_per_call'] == 1.0 and ar['speedup'] == 1.0
  for name in ('ngram gamma=4', 'truncated:1 gamma=4'):
    spec = saved['methods'][name]
    assert spec['acceptance_rate'] is None or 0 <= spec['acceptance_rate'] <= 1
    assert 1 <= spec['tokens_per_call'] <= 5
    assert spec['zero_accept_fraction'] is None or 0 <= spec['zero_accept_fraction'] <= 1
    assert spec['latency_ms_per_token']['p50'] <= spec['latency_ms']['p50']
    assert spec['greedy_mismatches'] == 0  # greedy speculative output is the target's
    assert spec['near_ties'] == 0
  assert json.loads((tmp_path / 'out' / 'config.json').read_text())['batch_size'] == 2
  for m in saved['methods'].values():  # per category: the prompts' own categories
    assert set(m['categories']) == {'default', 'greet', 'math'}
    assert sum(c['new_tokens'] for c in m['categories'].values()) == m['new_tokens']
  rows = (tmp_path / 'out' / 'results.csv').read_text().splitlines()
  assert rows[0].startswith('method,category,gamma,acceptance_rate,tokens_per_call')
  assert len(rows) == 1 + 3 * 4  # 3 methods x (all + 3 categories)
  for png in ('acceptance_by_position', 'speedup_vs_gamma', 'latency_cdf'):
    assert (tmp_path / 'out' / f'{png}.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


@pytest.mark.parametrize('field,value,match', [
    ('max_new_tokens', 0, r'config.max_new_tokens = 0: expected an integer >= 1'),
    ('batch_size', -1, 'config.batch_size'),
    ('num_prompts', 0, 'config.num_prompts'),
    ('temperature', -0.5, 'temperature must be >= 0'),
    ('top_p', 0.0, 'top_p'),
    ('dtype', 'float8', "config.dtype = 'float8'"),
    ('model', 'gpt-17', "unknown model 'gpt-17'"),
    ('prompts', 'nosuchset', 'nosuchset'),
    ('verifier', 'maybe', "config.verifier = 'maybe'"),
    ('gammas', (2, 0), r'config.gammas = \(2, 0\)'),
    ('drafts', ('truncated:x',), 'truncated:<number of layers>'),
    ('drafts', ('truncated:9',), '1 <= layers < 2'),
    ('drafts', ('ngram:two',), 'ngram:<longest n-gram>'),
    ('drafts', ('',), 'config.drafts'),
])
def test_invalid_config_values_are_named(tmp_path, field, value, match):
  with pytest.raises(ValueError, match=match):
    run_lib.main(tiny_config(**{field: value}), str(tmp_path), verbose=False)


def test_unwritable_workdir_is_named(tmp_path):
  blocker = tmp_path / 'file'
  blocker.write_text('not a directory')
  with pytest.raises(ValueError, match=r"work directory '.*file/sub' cannot be written"):
    run_lib.main(tiny_config(), str(blocker / 'sub'), verbose=False)


def test_missing_gguf_file_is_named():
  with pytest.raises(FileNotFoundError, match='nowhere.gguf'):
    loader.load_model('/nowhere.gguf')


def test_command_line_overrides_and_errors(tmp_path):
  base = [sys.executable, '-m', 'specjax.run', '--config', 'configs/smollm2.py:tiny',
          '--workdir', str(tmp_path)]
  ok = subprocess.run(base + ['--config.prompt=Hi!', '--config.max_new_tokens=5'], cwd=ROOT,
                      capture_output=True, text=True, timeout=300)
  assert ok.returncode == 0, ok.stderr[-2000:]
  methods = json.loads((tmp_path / 'results.json').read_text())['methods']
  assert all(m['new_tokens'] <= 5 for m in methods.values())
  bad = subprocess.run(base + ['--config.max_new_tokens=0'], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
  assert bad.returncode == 2 and 'config.max_new_tokens = 0' in bad.stderr
  assert 'Traceback' not in bad.stderr


@pytest.mark.slow
def test_readme_command_answers_paris(tmp_path):
  out = subprocess.run([sys.executable, '-m', 'specjax.run', '--config', 'configs/smollm2.py',
                        '--config.prompt=What is the capital of France?', '--workdir',
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-2000:]
  assert 'Paris' in out.stdout
  assert 'tok/s' in out.stdout


def test_near_ties_are_counted_at_the_first_divergence():
  from specjax import testing
  from specjax.decode.engine import Engine
  cfg, params = testing.tiny_model(seed=3)
  engine = Engine(params, cfg, eos_id=-1, cache_size=64)
  prompt = [1, 2, 3]
  base = {'tokens': engine.generate([prompt], 6).tokens[0]}
  diverged = {'tokens': base['tokens'][:2] + [(base['tokens'][2] + 1) % 64] + base['tokens'][3:]}
  same = {'tokens': list(base['tokens'])}
  count = run_lib.count_near_ties
  assert count(engine, [prompt], [same], [base]) == 0  # identical: nothing to explain
  assert count(engine, [prompt], [diverged], [base]) == 0  # a clear argmax: not a tie
  assert count(engine, [prompt], [diverged], [base], threshold=1e9) == 1
