"""Spec-Bench: loading question.jsonl, multi-turn chats, the leaderboard, one tiny run."""

import json
import pathlib
import re

import pytest
import tokenizers

from specjax import config_lib, testing
from specjax.bench import leaderboard, specbench_answers
from specjax.data import specbench
from specjax.data.prompts import Prompt, load_prompts
from specjax.formats.tokenizer import Tokenizer
from specjax.harness import run_lib

QUESTIONS = [
  {'question_id': 81, 'category': 'writing', 'turns': ['Write a poem.', 'Now shorter.']},
  {'question_id': 82, 'category': 'writing', 'turns': ['Write a memo.', 'Critique it.']},
  {'question_id': 131, 'category': 'coding', 'turns': ['Sort a list.', 'In place?']},
  {'question_id': 161, 'category': 'translation', 'turns': ['Translate: hallo'], 'reference': []},
  {'question_id': 162, 'category': 'translation', 'turns': ['Translate: danke']},
  {'question_id': 241, 'category': 'qa', 'turns': ['Why is the sky blue?']},
  {'question_id': 'r1', 'category': 'rag', 'turns': ['Context: x. Question: y?']},
]


def _write(tmp_path, lines, name='question.jsonl'):
  path = tmp_path / name
  path.write_text(
    '\n'.join(line if isinstance(line, str) else json.dumps(line) for line in lines) + '\n'
  )
  return path


def test_load_turns_categories_and_per_category_counts(tmp_path):
  path = _write(tmp_path, QUESTIONS)
  ps = load_prompts(f'specbench:{path}')
  assert [p.id for p in ps] == ['81', '82', '131', '161', '162', '241', 'r1']
  assert ps[0] == Prompt('81', 'Write a poem.', 'writing', later_turns=('Now shorter.',))
  assert ps[3] == Prompt('161', 'Translate: hallo', 'translation')
  # num_prompts counts per category: every category is covered.
  assert [p.id for p in load_prompts(f'specbench:{path}', 1)] == ['81', '131', '161', '241', 'r1']
  assert [p.id for p in load_prompts(f'specbench:{path}:translation')] == ['161', '162']
  assert [p.id for p in load_prompts(f'specbench:{path}:writing', 1)] == ['81']


def test_cache_folder_and_category_specs(tmp_path, monkeypatch):
  monkeypatch.setenv('SPECJAX_CACHE', str(tmp_path / 'cache'))
  assert specbench.specbench_path() == tmp_path / 'cache' / 'spec_bench' / 'question.jsonl'
  assert specbench.parse_spec('specbench') == (specbench.specbench_path(), None)
  assert specbench.parse_spec('specbench:rag') == (specbench.specbench_path(), 'rag')
  assert specbench.parse_spec('specbench:/d/q.jsonl:qa') == (pathlib.Path('/d/q.jsonl'), 'qa')
  (tmp_path / 'cache' / 'spec_bench').mkdir(parents=True)
  _write(tmp_path / 'cache' / 'spec_bench', QUESTIONS)
  assert [p.id for p in load_prompts('specbench:qa')] == ['241']
  assert len(load_prompts('specbench')) == len(QUESTIONS)
  with pytest.raises(ValueError, match="no questions of category 'math'; categories in the file"):
    load_prompts('specbench:math')
  with pytest.raises(ValueError, match="'poetry' is neither a Spec-Bench category"):
    load_prompts('specbench:poetry')


def test_missing_file_says_where_to_get_it_and_where_to_put_it(tmp_path, monkeypatch):
  monkeypatch.setenv('SPECJAX_CACHE', str(tmp_path))
  with pytest.raises(ValueError) as e:
    load_prompts('specbench')
  message = str(e.value)
  assert f'not found at {tmp_path}/spec_bench/question.jsonl' in message
  assert 'https://github.com/hemingkx/Spec-Bench' in message
  assert 'data/spec_bench/question.jsonl' in message
  assert "--config.prompts='specbench:/path/to/question.jsonl'" in message
  with pytest.raises(ValueError, match=re.escape(f'not found at {tmp_path}/nope.jsonl')):
    load_prompts(f'specbench:{tmp_path}/nope.jsonl')


@pytest.mark.parametrize(
  'line, message',
  [
    ({'category': 'qa', 'turns': ['x']}, 'no "question_id" field'),
    ({'question_id': 9, 'turns': ['x']}, 'no "category" field'),
    ({'question_id': 9, 'category': 'qa'}, 'no "turns" field'),
    ({'question_id': True, 'category': 'qa', 'turns': ['x']}, '"question_id" = True: expected'),
    ({'question_id': 9, 'category': '', 'turns': ['x']}, '"category" = \'\': expected a non-empty'),
    ({'question_id': 9, 'category': 'qa', 'turns': []}, '"turns" = []: expected a non-empty list'),
    ({'question_id': 9, 'category': 'qa', 'turns': ['x', 3]}, '"turns"[1] = 3: expected a non-'),
    ({'question_id': 9, 'category': 'qa', 'turns': ['  ']}, '"turns"[0] = \'  \': expected'),
    ({'question_id': 81, 'category': 'qa', 'turns': ['x']}, 'duplicate "question_id" \'81\''),
    ('[1, 2]', 'expected a JSON object, got list'),
    ('{"question_id": 9,', 'malformed JSON'),
  ],
)
def test_bad_lines_name_file_line_and_field(tmp_path, line, message):
  path = _write(tmp_path, [QUESTIONS[0], '', line])
  with pytest.raises(ValueError, match=re.escape(f'{path}:3: {message}')):
    load_prompts(f'specbench:{path}')


def _chatml_tokenizer() -> Tokenizer:
  words = ['<|im_start|>', '<|im_end|>', 'user', 'assistant', '\n', 'Q1', 'A1', 'Q2', '[UNK]']
  backend = tokenizers.Tokenizer(
    tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token='[UNK]')
  )
  backend.pre_tokenizer = tokenizers.pre_tokenizers.Split(
    tokenizers.Regex(r'<\|im_start\|>|<\|im_end\|>|\n|[A-Za-z0-9]+'), behavior='isolated'
  )
  backend.add_special_tokens(['<|im_start|>', '<|im_end|>'])
  return Tokenizer(backend, bos_id=0, eos_id=1)


def test_second_turn_follows_the_first_answer():
  tok = _chatml_tokenizer()
  chat = [
    {'role': 'user', 'content': 'Q1'},
    {'role': 'assistant', 'content': 'A1'},
    {'role': 'user', 'content': 'Q2'},
  ]
  text = tok.apply_chat_template(chat)
  assert text == (
    '<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n'
    '<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n'
  )
  assert tok.encode_conversation(chat) == tok.encode(text)
  assert tok.encode_conversation(chat[:1]) == tok.encode_chat('Q1')
  byte = testing.ByteTokenizer()
  assert byte.encode_conversation(chat) == [1] + byte.encode('Q1\n\nA1\n\nQ2')
  assert byte.encode_conversation(chat[:1]) == byte.encode_chat('Q1')
  with pytest.raises(ValueError, match="message 1: role 'user', expected 'assistant'"):
    tok.encode_conversation([chat[0], chat[2], chat[0]])
  with pytest.raises(ValueError, match='odd number of messages'):
    byte.encode_conversation(chat[:2])


def _rec(method, category, new_tokens, calls, ms, batch, gamma=0):
  return {
    'method': method,
    'id': f'{category}{batch}',
    'category': category,
    'tokens': [5] * new_tokens,
    'new_tokens': new_tokens,
    'target_calls': calls,
    'accepted': [0] * (calls - 1),
    'drafted': [gamma] * (calls - 1),
    'gamma': gamma,
    'batch': batch,
    'prefill_ms': 0.0,
    'decode_ms': ms,
    'batch_steps': calls - 1,
    'switches': 0,
    'latency_ms': ms,
  }


def test_leaderboard_rolls_mt_bench_up_and_pools_turns():
  # (category, autoregressive (tokens, ms), speculative (tokens, target calls, ms))
  rows = [
    ('writing', (10, 100.0), (10, 4, 50.0)),
    ('writing', (20, 200.0), (20, 5, 50.0)),  # a second turn
    ('coding', (30, 300.0), (30, 10, 200.0)),
    ('translation', (10, 100.0), (10, 10, 125.0)),
  ]
  records = {'autoregressive': [], 'draft@2': []}
  for k, (cat, (n, ms), (sn, calls, sms)) in enumerate(rows):
    records['autoregressive'].append(_rec('autoregressive', cat, n, n, ms, k))
    records['draft@2'].append(_rec('draft@2', cat, sn, calls, sms, k, gamma=2))
  board = leaderboard.leaderboard(records)
  mt = board['columns']['Multi-turn Conversation']['draft@2']
  assert mt['speedup'] == pytest.approx((60 / 0.3) / (60 / 0.6))  # 2.0
  assert mt['tokens_per_call'] == pytest.approx(60 / 19)
  assert mt['records'] == 3
  tr = board['columns']['Translation']['draft@2']
  assert tr['speedup'] == pytest.approx(0.8) and tr['tokens_per_call'] == 1.0
  assert board['columns']['Summarization']['draft@2'] is None
  overall = board['columns']['Overall']['draft@2']
  assert overall['speedup'] == pytest.approx((70 / 0.425) / (70 / 0.7))
  assert overall['tokens_per_call'] == pytest.approx(70 / 29)
  assert list(board['categories']) == ['writing', 'coding', 'translation']  # Spec-Bench order
  assert board['categories']['coding']['draft@2']['speedup'] == pytest.approx(1.5)
  config = config_lib.load_config('smollm2.py', 'tiny')
  text = leaderboard.markdown(records, {'model': 'm'}, config)
  assert (
    '| Method | Multi-turn Conversation | Translation | Summarization | Question Answering | '
    'Mathematical Reasoning | Retrieval-aug. Generation | #Mean Accepted Tokens | Overall |'
  ) in text
  assert '| draft@2 | 2.00x | 0.80x | - | - | - | - | 2.41 | 1.65x |' in text
  assert '| coding | 1 | 1.00x / 1.00x / 1.00 | 1.50x / 1.50x / 3.00 |' in text


def test_tiny_run_writes_the_leaderboard_and_charts(tmp_path):
  path = _write(tmp_path, QUESTIONS)
  config = config_lib.load_config('smollm2.py', 'tiny')
  config.update(
    prompts=f'specbench:{path}',
    num_prompts=1,
    max_new_tokens=6,
    methods='ngram@2',
    measure_costs=False,
    adaptive_gammas=(),
  )
  out = tmp_path / 'out'
  summary = run_lib.main(config, str(out), verbose=False)
  records = [json.loads(line) for line in (out / 'generations.jsonl').read_text().splitlines()]
  base = [r for r in records if r['method'] == 'autoregressive']
  # 5 questions, 2 of them two-turn: 7 turns a method, each second turn after its first.
  assert [(r['id'], r['turn']) for r in base] == [
    ('81', 1),
    ('81', 2),
    ('131', 1),
    ('131', 2),
    ('161', 1),
    ('241', 1),
    ('r1', 1),
  ]
  assert base[1]['prompt'] == 'Now shorter.'
  first = testing.ByteTokenizer().encode_chat('Write a poem.')
  assert base[1]['prompt_tokens'] == len(first) + len(
    f'\n\n{base[0]["output"].strip()}\n\nNow shorter.'.encode()
  )
  assert summary['methods']['ngram@2']['greedy_mismatches'] == 0
  assert summary['methods']['autoregressive']['new_tokens'] == sum(r['new_tokens'] for r in base)
  text = (out / 'results_specbench.md').read_text()
  assert '5 questions, 7 turns' in text and '| ngram@2 |' in text
  # No summarization or math_reasoning questions: '-' in their columns.
  assert '| autoregressive | 1.00x | 1.00x | - | 1.00x | - | 1.00x | 1.00 | 1.00x |' in text
  assert (out / 'specbench_ngram_2.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  check_specbench_answers(out, records, summary)


def check_specbench_answers(out, records, summary):
  """Spec-Bench's answer files of a batch-1 run: its fields, and speed.py's figures from them
  against the run's own."""
  folder = out / 'specbench_answers'
  assert sorted(p.name for p in folder.iterdir()) == ['autoregressive.jsonl', 'ngram@2.jsonl']
  lines = specbench_answers.read(folder / 'ngram@2.jsonl')
  base = specbench_answers.read(folder / 'autoregressive.jsonl')
  assert [a['question_id'] for a in base] == [81, 131, 161, 241, 'r1']
  assert set(base[0]) == {'question_id', 'category', 'answer_id', 'model_id', 'choices', 'tstamp'}
  assert base[0]['model_id'].endswith('-autoregressive') and base[0]['category'] == 'writing'
  turns = [r for r in records if r['method'] == 'ngram@2' and r['id'] == '81']
  choice = lines[0]['choices'][0]
  assert choice['index'] == 0 and choice['turns'] == [r['output'].strip() for r in turns]
  assert choice['new_tokens'] == [r['new_tokens'] for r in turns]
  assert choice['decoding_steps'] == [r['target_calls'] for r in turns]
  assert choice['wall_time'] == pytest.approx([r['latency_ms'] / 1e3 for r in turns])
  assert sum(choice['accept_lengths']) == sum(choice['new_tokens'])
  assert len(choice['accept_lengths']) == sum(choice['decoding_steps'])
  assert base[0]['choices'][0]['accept_lengths'] == [1] * sum(base[0]['choices'][0]['new_tokens'])
  # Mean accepted tokens is tokens per call; the pooled speedup is specjax's (batch 1), per
  # category too, and MT-bench's is the leaderboard's Multi-turn Conversation column.
  m = summary['methods']['ngram@2']
  fig = specbench_answers.speed(lines, base, pooled=True)
  assert fig['speedup'] == pytest.approx(m['speedup'], rel=1e-9)
  assert fig['mean_accepted_tokens'] == pytest.approx(m['tokens_per_call'], rel=1e-12)
  for cat, sub in m['categories'].items():
    fig = specbench_answers.speed(lines, base, cat, pooled=True)
    assert fig['speedup'] == pytest.approx(sub['speedup'], rel=1e-9)
    assert fig['mean_accepted_tokens'] == pytest.approx(sub['tokens_per_call'], rel=1e-12)
  by_method = {}
  for r in records:
    by_method.setdefault(r['method'], []).append(r)
  mt = leaderboard.leaderboard(by_method)['columns']['Multi-turn Conversation']['ngram@2']
  fig = specbench_answers.speed(lines, base, 'mt_bench', pooled=True)
  assert fig['speedup'] == pytest.approx(mt['speedup'], rel=1e-9)

  # speed.py's own speedup: the mean over questions of tokens / seconds, turns summed.
  def mean_rate(method):
    per_question = {}
    for r in by_method[method]:
      n, s = per_question.get(r['id'], (0, 0.0))
      per_question[r['id']] = (n + r['new_tokens'], s + r['latency_ms'] / 1e3)
    return sum(n / s for n, s in per_question.values()) / len(per_question)

  fig = specbench_answers.speed(lines, base)
  assert fig['tokens_per_second'] == pytest.approx(mean_rate('ngram@2'), rel=1e-12)
  assert fig['speedup'] == pytest.approx(mean_rate('ngram@2') / mean_rate('autoregressive'))
  # speed.py counts the baseline's tokens from its texts: a tokenizer passed in does that.
  counted = specbench_answers.speed(lines, base, baseline_tokens=lambda text: 2 * len(text) + 1)
  assert counted['tokens_per_second'] == fig['tokens_per_second']
  assert counted['baseline_tokens_per_second'] != fig['baseline_tokens_per_second']


def test_speed_of_hand_made_answers():
  # Two questions: speed.py's mean of per-question rates differs from the pooled ratio.
  def line(cat, tokens, seconds, lengths):
    choice = {'new_tokens': tokens, 'wall_time': seconds, 'accept_lengths': lengths}
    return {'category': cat, 'choices': [choice | {'turns': ['x'] * len(tokens)}]}

  ours = [line('writing', [6, 4], [1.0, 1.0], [1, 3, 2, 1, 3]), line('qa', [6], [3.0], [1, 5])]
  base = [line('writing', [10], [4.0], [1] * 10), line('qa', [6], [6.0], [1] * 6)]
  fig = specbench_answers.speed(ours, base)
  assert fig['tokens_per_second'] == pytest.approx((10 / 2 + 6 / 3) / 2)  # 3.5
  assert fig['baseline_tokens_per_second'] == pytest.approx((10 / 4 + 6 / 6) / 2)  # 1.75
  assert fig['speedup'] == pytest.approx(2.0)
  assert fig['mean_accepted_tokens'] == pytest.approx(16 / 7)
  pooled = specbench_answers.speed(ours, base, pooled=True)
  assert pooled['speedup'] == pytest.approx((16 / 5) / (16 / 10))
  assert specbench_answers.speed(ours, base, 'mt_bench')['speedup'] == pytest.approx(2.0)
  assert specbench_answers.speed(ours, base, 'qa')['mean_accepted_tokens'] == 3.0


def test_accept_lengths_add_up_to_the_tokens_kept():
  assert specbench_answers.accept_lengths({'accepted': [2, 0, 3], 'new_tokens': 8}) == [1, 3, 1, 3]
  assert specbench_answers.accept_lengths({'accepted': [], 'new_tokens': 1}) == [1]
  assert specbench_answers.file_name('truncated:1@4') == 'truncated_1@4.jsonl'


def test_cache_too_small_for_the_second_turn_is_named_before_decoding(tmp_path):
  path = _write(tmp_path, [QUESTIONS[0]])
  config = config_lib.load_config('smollm2.py', 'tiny')
  config.update(prompts=f'specbench:{path}', max_new_tokens=10, cache_size=48, methods='ngram@2')
  with pytest.raises(ValueError, match=r"prompt '81' \(writing\), turn 2: needs up to 5\d cache"):
    run_lib.main(config, str(tmp_path / 'out'), verbose=False)


def _fake_run(path, rows, batch0=0, max_new_tokens=16):
  """A run directory with config.json and generations.jsonl (rows as in the test above)."""
  path.mkdir()
  config = {'model': 'm', 'max_new_tokens': max_new_tokens, 'temperature': 0.0}
  config |= {'batch_size': 1, 'verifier': 'rejection'}
  (path / 'config.json').write_text(json.dumps(config))
  recs = []
  for k, (cat, (n, ms), (sn, calls, sms)) in enumerate(rows):
    recs.append(_rec('autoregressive', cat, n, n, ms, batch0 + k))
    recs.append(_rec('draft@2', cat, sn, calls, sms, batch0 + k, gamma=2))
  (path / 'generations.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in recs))
  return recs


def test_merged_runs_make_the_leaderboard_of_one_run(tmp_path, capsys):
  rows = [
    ('writing', (10, 100.0), (10, 4, 50.0)),
    ('writing', (20, 200.0), (20, 5, 50.0)),
    ('translation', (10, 100.0), (10, 10, 125.0)),
    ('qa', (30, 300.0), (30, 10, 200.0)),
  ]
  # Both runs number their batches from 0; merged, each batch's time must count once.
  _fake_run(tmp_path / 'a', rows[:2])
  _fake_run(tmp_path / 'b', rows[2:])
  records, summary, config = leaderboard.merge([tmp_path / 'a', tmp_path / 'b'])
  assert [r['batch'] for r in records['draft@2']] == [0, 1, 2, 3]
  whole = {'autoregressive': [], 'draft@2': []}
  for r in [*_fake_run(tmp_path / 'c', rows[:2]), *_fake_run(tmp_path / 'd', rows[2:], 2)]:
    whole[r['method']].append(r)
  assert leaderboard.leaderboard(records) == leaderboard.leaderboard(whole)
  overall = leaderboard.leaderboard(records)['columns']['Overall']['draft@2']
  assert overall['speedup'] == pytest.approx((70 / 0.425) / (70 / 0.7))
  assert config.max_new_tokens == 16 and summary == {'model': 'm'}
  out = tmp_path / 'merged'
  assert leaderboard.main([str(out), str(tmp_path / 'a'), str(tmp_path / 'b')]) == 0
  assert '4 questions, 4 turns' in (out / 'results_specbench.md').read_text()
  assert (out / 'specbench_draft_2.png').is_file()


def test_merge_refuses_runs_of_different_settings(tmp_path, capsys):
  _fake_run(tmp_path / 'a', [('qa', (10, 100.0), (10, 4, 50.0))])
  _fake_run(tmp_path / 'b', [('rag', (10, 100.0), (10, 4, 50.0))], max_new_tokens=32)
  with pytest.raises(ValueError, match=r'b: max_new_tokens is 32, but .*a has 16'):
    leaderboard.merge([tmp_path / 'a', tmp_path / 'b'])
  (tmp_path / 'c').mkdir()
  assert leaderboard.main([str(tmp_path / 'out'), str(tmp_path / 'a'), str(tmp_path / 'c')]) == 2
  assert 'c: no config.json, generations.jsonl' in capsys.readouterr().err
  with open(tmp_path / 'a' / 'generations.jsonl', 'a') as f:
    f.write('{"method": "autoregressive", \n')
  with pytest.raises(ValueError, match=r'a/generations.jsonl line 3: not valid JSON'):
    leaderboard.merge([tmp_path / 'a'])
