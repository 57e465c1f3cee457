"""The entry point end to end: configs, work directory outputs and clear errors."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from specjax import config_lib
from specjax.bench import metrics
from specjax.checkpoints import loader
from specjax.decode.engine import Engine
from specjax.harness import report, run_config, run_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_config(**overrides):
  config = config_lib.load_config('smollm2.py', 'tiny')
  config.update(overrides)
  return config


def test_tiny_prompt_set_writes_results(tmp_path):
  prompts = tmp_path / 'mine.jsonl'
  prompts.write_text(
    '{"prompt": "hello there", "category": "greet"}\n'
    '{"turns": ["count to three", "again"], "category": "math"}\n'
    '{"prompt": "bye"}\n'
  )
  summary = run_lib.main(
    tiny_config(
      prompts=str(prompts),
      num_prompts=3,
      batch_size=2,
      # named, so a slow machine does not skip truncated:1@4 as hopeless (see skip_hopeless)
      methods='ngram@4,ngram@adaptive,truncated:1@4,truncated:1@adaptive',
    ),
    str(tmp_path / 'out'),
    verbose=False,
  )
  records = [
    json.loads(l) for l in (tmp_path / 'out' / 'generations.jsonl').read_text().splitlines()
  ]
  assert [r['category'] for r in records] == ['greet', 'math', 'default'] * 5
  assert records[1]['prompt'] == 'count to three'
  assert all(1 <= r['new_tokens'] <= 16 and isinstance(r['output'], str) for r in records)
  saved = json.loads((tmp_path / 'out' / 'results.json').read_text())
  assert saved == summary and saved['num_prompts'] == 3
  names = {'autoregressive', 'ngram@4', 'ngram@adaptive', 'truncated:1@4', 'truncated:1@adaptive'}
  assert set(saved['methods']) == names
  for name, m in saved['methods'].items():
    mine = [r for r in records if r['method'] == name]
    assert m['new_tokens'] == sum(r['new_tokens'] for r in mine)
  ar = saved['methods']['autoregressive']
  assert ar['acceptance_rate'] is None and ar['tokens_per_call'] == 1.0 and ar['speedup'] == 1.0
  for name in names - {'autoregressive'}:
    spec = saved['methods'][name]
    assert spec['acceptance_rate'] is None or 0 <= spec['acceptance_rate'] <= 1
    assert 1 <= spec['tokens_per_call'] <= 5
    assert spec['c'] > 0 and spec['predicted_speedup'] > 0
    assert spec['zero_accept_fraction'] is None or 0 <= spec['zero_accept_fraction'] <= 1
    assert spec['latency_ms_per_token']['p50'] <= spec['latency_ms']['p50']
    assert spec['greedy_mismatches'] == 0  # greedy speculative output is the target's
    assert spec['near_ties'] == 0
    # Per draft position: counts that pool across runs, and their ratio.
    proposed, accepted = spec['proposed_by_position'], spec['accepted_by_position']
    assert len(proposed) == len(accepted) == spec['gamma'] > 0
    assert all(0 <= a <= p for a, p in zip(accepted, proposed))
    assert proposed == sorted(proposed, reverse=True) and accepted == sorted(accepted, reverse=True)
    mine = [r for r in records if r['method'] == name]
    assert sum(accepted) == sum(sum(r['accepted']) for r in mine)
    for key in ('speedup', 'decode_speedup', 'tokens_per_call'):
      lo, hi = spec[f'{key}_ci95']
      assert lo <= hi, key
  assert json.loads((tmp_path / 'out' / 'config.json').read_text())['batch_size'] == 2
  for m in saved['methods'].values():  # per category: the prompts' own categories
    assert set(m['categories']) == {'default', 'greet', 'math'}
    assert sum(c['new_tokens'] for c in m['categories'].values()) == m['new_tokens']
  rows = (tmp_path / 'out' / 'results.csv').read_text().splitlines()
  assert rows[0].startswith('method,category,gamma,acceptance_rate,tokens_per_call')
  figures = ('speedup', 'decode_speedup', 'tokens_per_call', 'acceptance_rate', 'alpha')
  added = ['alpha', *(f'{k}_ci95_{end}' for k in figures for end in ('lo', 'hi'))]
  assert rows[0].split(',')[16:] == [*added, 'accepted_by_position']
  assert saved['provenance']['accelerator']['backend'] == 'cpu'
  assert 'XLA_FLAGS' in saved['provenance']['environment']
  assert len(rows) == 1 + 5 * 4  # 5 methods x (all + 3 categories)
  for png in ('acceptance_by_position', 'speedup_vs_gamma', 'latency_cdf', 'adaptive_gamma'):
    assert (tmp_path / 'out' / f'{png}.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


@pytest.mark.parametrize(
  'field,value,match',
  [
    ('max_new_tokens', 0, r'config.max_new_tokens = 0: expected an integer >= 1'),
    ('batch_size', -1, 'config.batch_size'),
    ('num_prompts', 0, 'config.num_prompts'),
    ('temperature', -0.5, r'temperature must be 0 \(greedy\) or in'),
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
    ('drafts', ('bogus',), "unknown draft 'bogus': expected one of ngram"),
    ('adaptive_gammas', (0,), r'config.adaptive_gammas = \(0,\)'),
    (
      'methods',
      'ngram@4,sometimes',
      "unknown method 'sometimes'.*declares: autoregressive, ngram@4, ngram@adaptive",
    ),
    ('methods', 'ngram@0', 'a draft length >= 1'),
    ('methods', 'ngram@tall', "unknown method 'ngram@tall'.*dynamic:SIZE-DEPTH-WIDTH"),
    ('trees', ('4x0',), "config.trees: tree '4x0': expected 'dynamic:SIZE-DEPTH-WIDTH'"),
    ('methods', 'ngram@2x2', 'method ngram@2x2: .*builds tries of continuations'),
    ('methods', 'truncated:1@dynamic:9-2-2', 'has 6 candidates, fewer than its size 9'),
    ('methods', 'bogus@2', "unknown draft 'bogus'"),
  ],
)
def test_invalid_config_values_are_named(tmp_path, field, value, match):
  with pytest.raises(ValueError, match=match):
    run_lib.main(tiny_config(**{field: value}), str(tmp_path), verbose=False)


REQUIRED = {
  'acceptance_rate',
  'tokens_per_call',
  'tokens_per_second',
  'decode_tokens_per_second',
  'speedup',
  'decode_speedup',
  'latency_ms',
  'latency_ms_per_token',
  'zero_accept_fraction',
  'greedy_mismatches',
  'new_tokens',
  'iteration_ms',
}


def test_results_schema_and_method_selection(tmp_path):
  summary = run_lib.main(
    tiny_config(methods='truncated:1@adaptive, ngram@2', num_prompts=2),
    str(tmp_path),
    verbose=False,
  )
  assert list(summary['methods']) == ['autoregressive', 'truncated:1@adaptive', 'ngram@2']
  assert set(summary['costs']) == {'truncated:1', 'ngram'}
  for _spec, costs in summary['costs'].items():
    assert costs['target_ms'] > 0 and costs['c'] > 0
    assert set(costs['draft_ms']) >= {'1', '2', '4'}
  for name, m in summary['methods'].items():
    assert REQUIRED | {'compile_seconds', 'near_ties', 'categories'} <= set(m), name
    for q in ('p50', 'p90', 'p99'):
      assert m['latency_ms'][q] > 0 and m['latency_ms_per_token'][q] > 0
    for sub in m['categories'].values():
      assert REQUIRED <= set(sub)
    if name != 'autoregressive':
      assert {'c', 'predicted_speedup', 'time_split_ms', 'adaptive', 'draft'} <= set(m)
      split = m['time_split_ms']
      assert split['draft'] >= 0 and split['verify'] > 0
  assert summary['methods']['truncated:1@adaptive']['adaptive'] is True
  for _spec, cats in summary['best_gamma'].items():
    for b in cats.values():
      assert b['gamma'] in (0, 1, 2, 4) and 0 <= b['alpha'] <= 1


def test_advisor(tmp_path):
  from specjax import advise

  run_lib.main(tiny_config(num_prompts=2, adaptive_gammas=()), str(tmp_path), verbose=False)
  assert advise.main([str(tmp_path)]) == 0
  advice = json.loads((tmp_path / 'advice.json').read_text())
  assert set(advice) == {'all', 'writing'}
  for a in advice.values():
    best = a['best']
    assert a['verdict'] in ('on', 'off') and set(best['method'].split('@')[1:]) == {'4'}
    assert best['margin'] == pytest.approx(best['tokens_per_call'] - 1 - best['overhead'])
    assert (a['verdict'] == 'on') == (best['speedup'] >= 1.03 and best['margin'] > 0)
  # A run where speculation cannot pay is 'off' (a fabricated summary: 2 tokens per call
  # with iterations three times as long as autoregressive steps).
  summary = json.loads((tmp_path / 'results.json').read_text())
  for name, m in summary['methods'].items():
    if name != 'autoregressive':
      m.update(
        tokens_per_call=2.0,
        speedup=0.66,
        iteration_ms=3 * summary['methods']['autoregressive']['iteration_ms'],
      )
  assert advise.advise(summary)['all']['verdict'] == 'off'
  for name, m in summary['methods'].items():
    if name != 'autoregressive':
      m.update(
        tokens_per_call=3.0,
        speedup=1.4,
        iteration_ms=1.5 * summary['methods']['autoregressive']['iteration_ms'],
      )
  assert advise.advise(summary)['all']['verdict'] == 'on'


def test_advisor_errors_are_named(tmp_path, capsys):
  from specjax import advise

  assert advise.main([str(tmp_path / 'nothing')]) == 2
  assert 'nothing: no such file' in capsys.readouterr().err
  (tmp_path / 'results.json').write_text('{"methods": {}}')
  assert advise.main([str(tmp_path)]) == 2
  assert 'autoregressive' in capsys.readouterr().err


def test_bad_prompt_files_are_named(tmp_path):
  bad = tmp_path / 'bad.jsonl'
  bad.write_text('{"prompt": "fine"}\n{"prompt": "broken\n')
  with pytest.raises(ValueError, match=r'bad.jsonl:2: malformed JSON'):
    run_lib.main(tiny_config(prompts=str(bad)), str(tmp_path / 'out'), verbose=False)
  empty = tmp_path / 'empty.jsonl'
  empty.write_text('\n')
  with pytest.raises(ValueError, match='empty'):
    run_lib.main(tiny_config(prompts=str(empty)), str(tmp_path / 'out'), verbose=False)


def test_unwritable_workdir_is_named(tmp_path):
  blocker = tmp_path / 'file'
  blocker.write_text('not a directory')
  with pytest.raises(ValueError, match=r"work directory '.*file/sub' cannot be written"):
    run_lib.main(tiny_config(), str(blocker / 'sub'), verbose=False)


def test_missing_gguf_file_is_named():
  with pytest.raises(FileNotFoundError, match='nowhere.gguf'):
    loader.load_model('/nowhere.gguf')


def test_command_line_overrides_and_errors(tmp_path):
  base = [
    sys.executable,
    '-m',
    'specjax.run',
    '--config',
    'configs/smollm2.py:tiny',
    '--workdir',
    str(tmp_path),
  ]
  ok = subprocess.run(
    base + ['--config.prompt=Hi!', '--config.max_new_tokens=5'],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert ok.returncode == 0, ok.stderr[-2000:]
  methods = json.loads((tmp_path / 'results.json').read_text())['methods']
  assert all(m['new_tokens'] <= 5 for m in methods.values())
  # One prompt is a question: autoregressive and the quick method, then a short verdict.
  # Prompt lookup under adaptive control, after a short measurement of this CPU's costs.
  assert set(methods) == {'autoregressive', 'ngram@adaptive'}
  # (whether it paid is timing; a random tiny model is noise)
  assert 'on this prompt: ' in ok.stdout and 'ngram@adaptive: ' in ok.stdout
  assert 'where it pays: code' in ok.stdout and 'costs measured' in ok.stdout
  assert 'measured here: target step' in ok.stdout and 'measured on: ' in ok.stdout
  bad = subprocess.run(
    base + ['--config.max_new_tokens=0'], cwd=ROOT, capture_output=True, text=True, timeout=300
  )
  assert bad.returncode == 2 and 'config.max_new_tokens = 0' in bad.stderr
  assert 'Traceback' not in bad.stderr
  # An override of a field the config lacks: one line naming it and the closest fields.
  typo = subprocess.run(
    base + ['--config.gamas=(2,)'], cwd=ROOT, capture_output=True, text=True, timeout=300
  )
  assert typo.returncode == 2 and 'Traceback' not in typo.stderr
  assert typo.stderr.strip().splitlines() == [
    "error: --config.gamas: configs/smollm2.py has no field 'gamas'; did you mean gammas or "
    'adaptive_gammas? '
    '(known: adaptive_gammas, adaptive_trees, batch_size, cache_size, drafts, dtype, gammas, '
    'max_new_tokens, measure_costs, mesh, methods, model, num_prompts, prompt, prompts, quick, '
    'quick_method, resume, seed, strict, temperature, top_k, top_p, trees, verifier)'
  ]


def test_print_config_lists_every_field_with_its_value_and_meaning(tmp_path):
  out = subprocess.run(
    [sys.executable, '-m', 'specjax.run', '--config', 'configs/smollm2.py', '--print_config']
    + ['--config.gammas=(1, 3)', '--workdir', str(tmp_path / 'none')],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0, out.stderr[-2000:]
  lines = out.stdout.strip().splitlines()
  assert [line.split(' = ')[0] for line in lines] == list(run_config.FIELDS)
  assert 'gammas = (1, 3)' in out.stdout and '# fixed draft lengths' in out.stdout
  assert "model = 'smollm2-135m-instruct'" in out.stdout
  assert not (tmp_path / 'none').exists()  # nothing ran


def test_tree_methods_run_through_the_harness(tmp_path):
  config = tiny_config(
    num_prompts=2,
    trees=('dynamic:6-3-2',),
    methods='truncated:1@dynamic:6-3-2,ngram@dynamic:6-3-2,truncated:1@2x2x1',
    adaptive_gammas=(),
  )
  summary = run_lib.main(config, str(tmp_path), verbose=False)
  for name in ('truncated:1@dynamic:6-3-2', 'ngram@dynamic:6-3-2', 'truncated:1@2x2x1'):
    m = summary['methods'][name]
    assert m['greedy_mismatches'] == 0 and m['tree'] == name.split('@')[1], name
    assert m['tokens_per_call'] >= 1 and m['alpha'] is None
  records = [json.loads(l) for l in (tmp_path / 'generations.jsonl').read_text().splitlines()]
  tree = [r for r in records if r['method'] == 'truncated:1@2x2x1']
  assert tree and all(d == 10 for r in tree for d in r['drafted'])  # nodes verified


def test_adaptive_trees_run_through_the_harness(tmp_path):
  config = tiny_config(
    num_prompts=2, adaptive_trees=('2x1',), methods='truncated:1@adaptive,ngram@adaptive'
  )
  summary = run_lib.main(config, str(tmp_path), verbose=False)
  for name in ('truncated:1@adaptive', 'ngram@adaptive'):
    assert summary['methods'][name]['greedy_mismatches'] == 0, name
  # The draft model's tree was timed for the controller; prompt lookup keeps to chains.
  assert list(summary['costs']['truncated:1']['tree_ms']) == ['0;1;0.0;1.0']
  assert summary['costs']['ngram']['tree_ms'] == {}


def test_config_is_checked_before_any_model_loads(tmp_path, monkeypatch):
  def no_loading(*args, **kwargs):
    raise AssertionError('a model was loaded before the config was checked')

  monkeypatch.setattr(loader, 'load_model', no_loading)
  with pytest.raises(ValueError, match="config.verifier = 'greedy' is only lossless for greedy"):
    run_lib.main(tiny_config(verifier='greedy', temperature=1.0), str(tmp_path), verbose=False)
  with pytest.raises(ValueError, match='config.gama: unknown field; did you mean gammas'):
    run_lib.main(tiny_config(gama=3), str(tmp_path), verbose=False)
  with pytest.raises(ValueError, match="unknown draft 'ngrm'.*did you mean 'ngram'"):
    run_lib.main(tiny_config(drafts=('ngrm',)), str(tmp_path), verbose=False)
  with pytest.raises(ValueError, match='config.adaptive_trees: .*dynamic trees cannot be chosen'):
    run_lib.main(tiny_config(adaptive_trees=('dynamic:4-2-2',)), str(tmp_path), verbose=False)
  with pytest.raises(ValueError, match='k >= 1 and 0 <= max_mismatches < k'):
    run_lib.main(tiny_config(drafts=('consensus:2,k=1,m=1',)), str(tmp_path), verbose=False)
  # Checks that needed the models, or failed mid-run, now come first too.
  bad = {
    r"tree 'chain:100000': 100000 nodes, more than the 512": dict(trees=('chain:100000',)),
    r'method ngram@dynamic:200-6-4: its tree has 200 nodes, but config.cache_size = 128': dict(
      trees=('dynamic:200-6-4',), cache_size=128
    ),
    r'config.adaptive_trees: a tree of 64 nodes.* does not fit config.cache_size = 32': dict(
      adaptive_trees=('4x3x2x1',), cache_size=32, max_new_tokens=4
    ),
    r'method eagle@16: the draft eagle drafts at most 15 tokens deep, but this method asks for '
    r'16': dict(drafts=('eagle',), gammas=(16,)),
    r'method eagle@adaptive: .* at most 15 tokens deep, but this method asks for 20': dict(
      drafts=('eagle',), adaptive_gammas=(2, 20)
    ),
    r'draft consensus:2 drafts 2 consecutive rows together, but the batch of prompts 1-3 has '
    r'3 rows at turn 1': dict(drafts=('consensus:2',), num_prompts=3, batch_size=4),
    r'draft multilevel:truncated:1,consensus:2 drafts 2 consecutive rows together': dict(
      drafts=('multilevel:truncated:1,consensus:2',), num_prompts=3, batch_size=4
    ),
    r'temperature must be 0 \(greedy\) or in \[0.0001': dict(temperature=1e-40),
  }
  for match, overrides in bad.items():
    with pytest.raises(ValueError, match=match):
      run_lib.main(tiny_config(**overrides), str(tmp_path / 'w'), verbose=False)
  assert not (tmp_path / 'w').exists()  # no work directory for a run that never started
  workload = run_lib.load_workload(tiny_config(num_prompts=2))
  config = tiny_config(batch_size=64)  # more rows than prompts: two rows, not 64
  assert run_lib.fit_batches(config, run_config.validate(config), workload).batch_size == 2
  assert config.batch_size == 64  # the user's config is left as it was


def test_quick_runs_can_be_turned_off_and_their_method_is_checked(tmp_path):
  # config.methods names both drafts, so neither is skipped as hopeless on a slow machine
  # (the tiny truncated draft can cost a target step or more there).
  summary = run_lib.main(
    tiny_config(prompt='Hi!', quick=False, adaptive_gammas=(), methods='ngram@4,truncated:1@4'),
    str(tmp_path),
    verbose=False,
  )
  assert set(summary['methods']) == {'autoregressive', 'ngram@4', 'truncated:1@4'}
  with pytest.raises(ValueError, match=r"config.quick_method = 'autoregressive': expected a spec"):
    run_lib.main(tiny_config(prompt='Hi!', quick_method='autoregressive'), str(tmp_path))
  with pytest.raises(ValueError, match='config.quick_method: '):
    run_lib.main(tiny_config(prompt='Hi!', quick_method='ngram@x'), str(tmp_path))
  with pytest.raises(ValueError, match='needs config.adaptive_gammas'):
    run_lib.main(tiny_config(prompt='Hi!', adaptive_gammas=()), str(tmp_path))


def test_edge_inputs_run_to_the_end_or_fail_before_the_model_loads(tmp_path, monkeypatch):
  # One new token (no decode steps: speedups are nan, not a ZeroDivisionError), and a gamma
  # longer than the first batch's cache bucket (it is timed in a larger one).
  one = run_lib.main(tiny_config(max_new_tokens=1), str(tmp_path / 'one'), verbose=False)
  assert np.isnan(one['methods']['ngram@4']['decode_speedup'])
  assert (tmp_path / 'one' / 'results.json').is_file()
  short = tmp_path / 'short.jsonl'
  short.write_text('{"prompt": "hi"}\n')
  long = run_lib.main(
    tiny_config(prompts=str(short), gammas=(1, 100), max_new_tokens=4, adaptive_gammas=()),
    str(tmp_path / 'long'),
    verbose=False,
  )
  assert {'ngram@100', 'truncated:1@100'} <= set(long['methods'])
  monkeypatch.setattr(loader, 'load_model', lambda *a, **k: pytest.fail('loaded a model'))
  with pytest.raises(ValueError, match=r'config.adaptive_gammas = \(100,\).*below config'):
    run_lib.main(tiny_config(adaptive_gammas=(100,), cache_size=64), str(tmp_path / 'x'))
  # A one-prompt run compares quick_method: drafts it would not run are still checked,
  # and a quick_method whose draft is not among them is named.
  with pytest.raises(ValueError, match="unknown draft 'nosuch'"):
    run_lib.main(tiny_config(prompt='Hi!', drafts=('ngram', 'nosuch')), str(tmp_path / 'x'))
  with pytest.raises(ValueError, match='drafts with ngram, which is not among config.drafts'):
    run_lib.main(tiny_config(prompt='Hi!', drafts=('truncated:1',)), str(tmp_path / 'x'))
  # A work directory holding a run is never overwritten.
  with pytest.raises(ValueError, match='already holds a run'):
    run_lib.main(tiny_config(), str(tmp_path / 'one'))


def test_an_interrupted_run_keeps_every_finished_prompt(tmp_path, monkeypatch, capsys):
  from specjax.data.prompts import Prompt

  prompts = tmp_path / 'chat.jsonl'  # (a user's JSONL asks first turns only: the workload
  prompts.write_text('{"prompt": "count to three"}\n{"prompt": "bye"}\n')  # is set below)
  chat = [Prompt('1', 'count to three', 'default', ('again',)), Prompt('2', 'bye', 'default')]
  monkeypatch.setattr(run_lib, 'load_workload', lambda config: list(chat))
  calls, generate = [], Engine.generate

  def interrupted(self, *args, **kwargs):
    calls.append(1)
    if len(calls) == 6:  # the first prompt's second turn, second method (four a turn)
      raise KeyboardInterrupt
    return generate(self, *args, **kwargs)

  monkeypatch.setattr(Engine, 'generate', interrupted)
  measured, measure = [], run_lib.measure_costs

  def same_costs(*args, **kwargs):  # every run here decides from the same costs
    measured.append(1)
    if len(measured) == 1:
      measured.append(measure(*args, **kwargs))
    return measured[1]

  monkeypatch.setattr(run_lib, 'measure_costs', same_costs)
  base = dict(
    prompts=str(prompts),
    methods='ngram@4,truncated:1@4,ngram@adaptive',  # adaptive: its costs are measured
    measure_costs=False,
    temperature=1.0,
    max_new_tokens=8,
  )
  with pytest.raises(KeyboardInterrupt):
    run_lib.main(tiny_config(**base), str(tmp_path / 'run'))
  partial = tmp_path / 'run' / report.PARTIAL
  said = capsys.readouterr().out
  assert f'stopped: the prompts every method finished are in {partial}' in said
  kept = [json.loads(line) for line in partial.read_text().splitlines()]
  assert [(r['method'], r['turn']) for r in kept] == [
    ('autoregressive', 1),
    ('ngram@4', 1),
    ('truncated:1@4', 1),
    ('ngram@adaptive', 1),
  ]
  assert not (tmp_path / 'run' / 'results.json').exists()
  # Resumed: the finished turn is not run again (the second turn follows each method's
  # kept answer), and the texts are an uninterrupted run's (same seeds, T = 1).
  monkeypatch.setattr(Engine, 'generate', generate)
  with pytest.raises(ValueError, match=r'ran another config \(changed: max_new_tokens'):
    run_lib.main(tiny_config(**{**base, 'max_new_tokens': 6}, resume=True), str(tmp_path / 'run'))
  calls.clear()
  monkeypatch.setattr(Engine, 'generate', lambda *a, **k: (calls.append(1), generate(*a, **k))[1])
  before = len(measured)
  resumed = run_lib.main(tiny_config(**base, resume=True), str(tmp_path / 'run'), False)
  assert len(calls) == 8  # turn 2 of the first prompt and the second prompt, four methods
  assert len(measured) == before  # the interrupted run's costs (plan.json), not new ones
  whole = run_lib.main(tiny_config(**base), str(tmp_path / 'whole'), verbose=False)
  texts = lambda d: [json.loads(x)['tokens'] for x in (d / 'generations.jsonl').open()]
  assert texts(tmp_path / 'run') == texts(tmp_path / 'whole')
  assert resumed['methods'].keys() == whole['methods'].keys() and not partial.exists()
  # The resumed run reused the measured costs and the controller where it was left, so the
  # adaptive method made the same choices as in the uninterrupted run.
  drafted = lambda d: [json.loads(x)['drafted'] for x in (d / 'generations.jsonl').open()]
  assert drafted(tmp_path / 'run') == drafted(tmp_path / 'whole')


@pytest.mark.slow
def test_readme_command_answers_paris(tmp_path):
  out = subprocess.run(
    [
      sys.executable,
      '-m',
      'specjax.run',
      '--config',
      'configs/smollm2.py',
      '--config.prompt=What is the capital of France?',
      '--workdir',
      str(tmp_path),
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert 'Paris' in out.stdout
  assert 'quantized@adaptive: ' in out.stdout and 'tok/s against autoregressive' in out.stdout
  assert 'speculation ' in out.stdout and 'where it pays' in out.stdout


def test_near_ties_are_counted_at_the_first_divergence():
  from specjax import testing
  from specjax.decode.engine import Engine

  cfg, params = testing.tiny_model(seed=3)
  engine = Engine(params, cfg, eos_id=-1, cache_size=64)
  prompt = [1, 2, 3]
  base = {'tokens': engine.generate([prompt], max_new_tokens=6).tokens[0]}
  diverged = {'tokens': base['tokens'][:2] + [(base['tokens'][2] + 1) % 64] + base['tokens'][3:]}
  same = {'tokens': list(base['tokens'])}
  count = metrics.count_near_ties
  assert count(engine, [prompt], [same], [base]) == 0  # identical: nothing to explain
  assert count(engine, [prompt], [diverged], [base]) == 0  # a clear argmax: not a tie
  assert count(engine, [prompt], [diverged], [base], threshold=1e9) == 1


def test_the_quick_verdict_says_why():
  from specjax.harness import verdict

  def summary(speedup, alpha, calls):
    m = dict(speedup=speedup, alpha=alpha, tokens_per_call=calls, tokens_per_second=10.0, gamma=4)
    return {'methods': {'autoregressive': dict(m, speedup=1.0), 'ngram@4': m}, 'temperature': 0}

  recs = lambda n: {
    name: [{'output': ' Paris.', 'tokens': [1] * n, 'new_tokens': n}]
    for name in ('autoregressive', 'ngram@4')
  }
  short = verdict.lines(summary(0.8, 0.1, 1.1), recs(8), 'ngram@4')
  assert short[0] == 'Paris.' and 'the same text as autoregressive' in short[2]
  assert short[3].startswith('speculation on this prompt: too short to tell (8 tokens)')
  assert 'rarely accepted' in verdict.lines(summary(0.9, 0.1, 1.1), recs(64), 'ngram@4')[3]
  assert 'did not cover' in verdict.lines(summary(0.95, 0.5, 1.6), recs(64), 'ngram@4')[3]
  assert verdict.lines(summary(1.4, 0.7, 2.5), recs(64), 'ngram@4')[3].startswith(
    'speculation paid on this prompt: the draft was accepted at alpha = 0.70'
  )


def test_the_quick_verdict_says_what_this_cpus_costs_allow():
  from specjax.harness import verdict

  def costs(verify):  # prompt lookup: free drafts; verify[g] in target steps
    return {
      'target_ms': 10.0,
      'draft_ms': {str(g): 0.0 for g in verify},
      'verify_ms': {str(g): 10.0 * v for g, v in verify.items()},
    }

  # Verifying 2 tokens at 1.2 steps pays once alpha > 0.2 (1 + alpha = 1.2).
  line = verdict.cost_line(costs({1: 1.2, 2: 2.9}))
  assert 'verifying n tokens costs (steps) 2: 1.20, 3: 2.90' in line
  assert line.endswith('accepted at alpha >= 0.20 (gamma 1)')
  # Verifying g + 1 tokens costs g + 1 steps or more: nothing pays, and the line says why.
  line = verdict.cost_line(costs({1: 2.0, 2: 3.5}))
  assert line.startswith('speculation cannot pay on this CPU') and 'kept it off' in line
  # Within adaptive control's margin (at most 2 / 1.85 = 1.08x): it stays off, and says so.
  assert verdict.cost_line(costs({1: 1.85})).startswith('speculation cannot pay')
