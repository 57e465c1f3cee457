"""Tests for specjax.formats.tokenizer: a tiny GGUF written here, and the real SmolLM2 one
(slow)."""

import importlib
import json
import pathlib

import gguf
import pytest
import tokenizers
from tokenizers import pre_tokenizers

from specjax.data import assets
from specjax.formats.tokenizer import CHATML_TEMPLATE, Tokenizer

_CONTROL = ['<|endoftext|>', '<|im_start|>', '<|im_end|>']
_MERGES = ['h e', 'l l', 'he ll', 'Ġ w', 'Ġ Ġ']


def _byte_alphabet() -> list[str]:
  """GPT-2's printable spelling of the 256 bytes."""
  printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
  extra = iter(range(256, 512))
  return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def _write_tiny_gguf(path: pathlib.Path, model='gpt2', pre='smollm', template=None) -> pathlib.Path:
  tokens = _CONTROL + _byte_alphabet() + [m.replace(' ', '') for m in _MERGES]
  writer = gguf.GGUFWriter(path, arch='llama')
  writer.add_tokenizer_model(model)
  writer.add_tokenizer_pre(pre)
  writer.add_token_list(tokens)
  writer.add_token_merges(_MERGES)
  writer.add_token_types([3] * len(_CONTROL) + [1] * (len(tokens) - len(_CONTROL)))
  writer.add_bos_token_id(1)
  writer.add_eos_token_id(2)
  writer.add_unk_token_id(0)
  if template is not None:
    writer.add_chat_template(template)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return path


@pytest.fixture(scope='module')
def tiny(tmp_path_factory) -> Tokenizer:
  return Tokenizer.from_gguf(_write_tiny_gguf(tmp_path_factory.mktemp('tiny') / 'tiny.gguf'))


def test_tiny_properties(tiny):
  assert (tiny.vocab_size, tiny.bos_id, tiny.eos_id, tiny.unk_id) == (3 + 256 + 5, 1, 2, 0)
  assert tiny.chat_template is None


def test_tiny_merges_and_no_bos(tiny):
  ids = tiny.encode('hello world')
  assert [tiny.id_to_token(i) for i in ids] == ['hell', 'o', 'Ġw', 'o', 'r', 'l', 'd']


def test_control_tokens_stay_whole(tiny):
  ids = tiny.encode('<|im_start|>user\nhi<|im_end|>')
  assert ids[0] == 1 and ids[-1] == 2
  assert tiny.decode(ids) == 'user\nhi'
  assert tiny.decode(ids, skip_special_tokens=False) == '<|im_start|>user\nhi<|im_end|>'


def test_digits_are_split_before_byte_level(tiny):
  # llama.cpp's 'smollm' splits every digit off first, so the spaces before '12' stay one piece.
  assert [tiny.id_to_token(i) for i in tiny.encode('  12')] == ['ĠĠ', '1', '2']


@pytest.mark.parametrize('text', ['', 'hello  world', 'naïve 😀 日本', '\t\n 42\n'])
def test_tiny_round_trip(tiny, text):
  assert tiny.decode(tiny.encode(text)) == text


def test_chatml_fallback(tiny):
  text = tiny.apply_chat_template([{'role': 'user', 'content': 'hi'}])
  assert text == '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n'
  no_prompt = tiny.apply_chat_template([{'role': 'user', 'content': 'hi'}], False)
  assert no_prompt == '<|im_start|>user\nhi<|im_end|>\n'
  assert tiny.encode_chat('hi') == tiny.encode(text)


def test_template_from_gguf_and_raise_exception(tmp_path):
  template = (
    "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
    '{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}'
  )
  tok = Tokenizer.from_gguf(_write_tiny_gguf(tmp_path / 't.gguf', template=template))
  assert tok.chat_template == template
  assert tok.apply_chat_template([{'role': 'user', 'content': 'x'}]) == '<|im_start|>x'
  with pytest.raises(Exception, match='user first'):
    tok.apply_chat_template([{'role': 'system', 'content': 'x'}])


@pytest.mark.parametrize('prompt', ['', '   ', '\n\t'])
def test_empty_prompt(tiny, prompt):
  with pytest.raises(ValueError, match='empty prompt'):
    tiny.encode_chat(prompt)


def test_not_byte_level_bpe(tmp_path):
  path = _write_tiny_gguf(tmp_path / 'spm.gguf', model='llama')
  with pytest.raises(ValueError, match=r"spm\.gguf: tokenizer model 'llama' is not supported"):
    Tokenizer.from_gguf(path)


def _write_tiny_gemma_gguf(path: pathlib.Path, pieces=None) -> pathlib.Path:
  """A tiny Gemma-style SentencePiece vocabulary as llama.cpp writes it: control tokens,
  user-defined runs of newlines and spaces (spaces stored as real spaces), the 256 byte
  tokens, and pieces in merge order; no merges, and scores that say nothing."""
  control = ['<pad>', '<eos>', '<bos>', '<unk>', '<start_of_turn>', '<end_of_turn>']
  user = ['\n', '\n\n', '  ', '   ']
  pieces = pieces or [
    *'\u2581helowrdx\u00e9',
    'he',
    'll',
    'hell',
    'hello',
    '\u2581w',
    '\u2581wor',
    'or',
    'ld',
    '\u2581world',
    '\u2581x',
  ]
  tokens = control + user + [f'<0x{b:02X}>' for b in range(256)] + list(pieces)
  writer = gguf.GGUFWriter(path, arch='gemma3')
  writer.add_tokenizer_model('llama')
  writer.add_tokenizer_pre('default')
  writer.add_token_list(tokens)
  writer.add_token_scores([0.0] * len(tokens))
  writer.add_token_types([3] * len(control) + [4] * len(user) + [6] * 256 + [1] * len(pieces))
  writer.add_bos_token_id(2)
  writer.add_eos_token_id(1)
  writer.add_unk_token_id(3)
  writer.add_pad_token_id(0)
  writer.add_add_bos_token(True)
  writer.add_add_space_prefix(False)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return path


GEMMA_TEXTS = [
  'hello world',
  'hello  world\n\nx',  # two spaces and two newlines: user-defined tokens, matched whole
  'h\u00e9llo w\u00f6rld \U0001f600',  # '\u00f6' and the emoji only as bytes: byte fallback
  '<start_of_turn>hello<end_of_turn>',
  '  x',
  'ello',
  '',
]


@pytest.mark.parametrize('text', GEMMA_TEXTS)
def test_gemma_sentencepiece_matches_transformers(tmp_path, text):
  transformers = pytest.importorskip('transformers')
  path = _write_tiny_gemma_gguf(tmp_path / 'gemma.gguf')
  tok = Tokenizer.from_gguf(path)
  want = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
  assert tok.encode_text(text) == want(text)['input_ids']
  assert tok.decode(tok.encode(text), skip_special_tokens=False) == text


def test_gemma_sentencepiece_details(tmp_path):
  tok = Tokenizer.from_gguf(_write_tiny_gemma_gguf(tmp_path / 'gemma.gguf'))
  assert (tok.bos_id, tok.eos_id, tok.unk_id, tok.pad_id, tok.add_bos) == (2, 1, 3, 0, True)
  pieces = lambda text: [tok.id_to_token(i) for i in tok.encode(text)]
  assert pieces('hello world') == ['hello', '\u2581world']
  assert pieces('x  x') == ['x', '\u2581\u2581', 'x']  # '  ' is looked up as two '\u2581'
  assert pieces('\u00f6') == ['<0xC3>', '<0xB6>']
  assert tok.decode(tok.encode('<start_of_turn>hi')) == 'hi'
  # Prompts: the chat template by default; a base model's plain text after BOS.
  assert tok.encode_chat('hello') == tok.encode(
    tok.apply_chat_template([{'role': 'user', 'content': 'hello'}])
  )
  plain = Tokenizer.from_gguf(tmp_path / 'gemma.gguf', use_chat_template=False)
  assert plain.encode_chat('hello world') == [2, *tok.encode('hello world')]
  with pytest.raises(ValueError, match='empty prompt'):
    plain.encode_chat(' ')


def test_gemma_sentencepiece_duplicates_are_named(tmp_path):
  path = _write_tiny_gemma_gguf(tmp_path / 'dup.gguf', pieces=['h', '\u2581\u2581'])
  with pytest.raises(ValueError, match=r'dup\.gguf: the vocabulary has 1 duplicate'):
    Tokenizer.from_gguf(path)


def test_byte_level_bpe_adds_no_bos(tiny):
  assert not tiny.add_bos and tiny.use_chat_template
  assert tiny.encode_text('hello') == tiny.encode('hello')


def test_unknown_pre_tokenizer(tmp_path):
  path = _write_tiny_gguf(tmp_path / 'q.gguf', pre='qwen2')
  with pytest.raises(ValueError, match="pre-tokenizer 'qwen2' is not supported"):
    Tokenizer.from_gguf(path)


def test_save_and_from_file(tiny, tmp_path):
  tok = Tokenizer(tiny.backend, bos_id=1, eos_id=2, unk_id=0, chat_template=CHATML_TEMPLATE)
  tok.save(tmp_path)
  config = json.loads((tmp_path / 'tokenizer_config.json').read_text())
  assert config['tokenizer_class'] == 'PreTrainedTokenizerFast'
  assert [config[f'{k}_token'] for k in ('unk', 'bos', 'eos')] == _CONTROL
  loaded = Tokenizer.from_file(tmp_path / 'tokenizer.json')
  assert (loaded.bos_id, loaded.eos_id, loaded.unk_id) == (1, 2, 0)
  assert loaded.chat_template == CHATML_TEMPLATE
  assert loaded.encode('hello  12<|im_end|>') == tok.encode('hello  12<|im_end|>')
  overridden = Tokenizer.from_file(tmp_path, chat_template='{{ 1 }}', bos_id=0, eos_id=0)
  assert (overridden.bos_id, overridden.eos_id, overridden.chat_template) == (0, 0, '{{ 1 }}')


def test_from_file_needs_bos_and_eos(tiny, tmp_path):
  tiny.backend.save(str(tmp_path / 'tokenizer.json'))
  with pytest.raises(ValueError, match='bos_id and eos_id'):
    Tokenizer.from_file(tmp_path / 'tokenizer.json')


# The real SmolLM2-135M-Instruct tokenizer, against transformers.

TEXTS = [
  'Hello world! How are you today?',
  "The quick brown fox jumps over the lazy dog. It's 5 o'clock, isn't it?",
  'def fib(n: int) -> int:\n    """Fibonacci."""\n    if n < 2:\n        return n\n'
  '    return fib(n - 1) + fib(n - 2)\n',
  'for (int i = 0; i < 10; ++i) { x[i] = i * 2; }',
  'naïve café, résumé, Ærøskøbing',
  'Emoji: 😀🎉👍🏽 and ZWJ 👨‍👩‍👧',
  '日本語のテキスト、中文文本，한국어 텍스트',
  '1234567890 3.14159 2,000,000 x²',
  'tabs\tand\nnewlines\r\n\n\nend',
  'trailing spaces   ',
  '   leading spaces',
  'a  b   c    d',
  '<|im_start|>user\nWrite a haiku.<|im_end|>\n<|im_start|>assistant\n',
  '',
]
# Whitespace before a number: llama.cpp's 'smollm' pre-tokenizer (like the model's own
# tokenizer.json) splits every \p{N} character off first, while transformers 5's GGUF loader
# ignores 'smollm' and uses the plain GPT-2 split, so these ids differ from transformers'.
NUMBER_AFTER_SPACE = ['  12', 'x  123 45', 'a\n\n  9', 'items:\n    1. one\n    2. two', 'a ½']

CONVERSATIONS = [
  [{'role': 'user', 'content': 'What is 2 + 2?'}],
  [{'role': 'system', 'content': 'Be terse.'}, {'role': 'user', 'content': 'Hi'}],
  [
    {'role': 'user', 'content': 'Name a color.'},
    {'role': 'assistant', 'content': 'Blue.'},
    {'role': 'user', 'content': 'Another, with émoji 🎨.'},
  ],
]


@pytest.fixture(scope='module')
def gguf_path() -> pathlib.Path:
  return assets.fetch('smollm2-135m-instruct')


@pytest.fixture(scope='module')
def tok(gguf_path) -> Tokenizer:
  return Tokenizer.from_gguf(gguf_path)


@pytest.fixture(scope='module')
def hf(gguf_path):
  transformers = importlib.import_module('transformers')
  return transformers.AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)


@pytest.fixture(scope='module')
def hf_smollm_split(hf) -> tokenizers.Tokenizer:
  """transformers' tokenizer with llama.cpp's 'smollm' pre-tokenizer put back."""
  backend = tokenizers.Tokenizer.from_str(hf.backend_tokenizer.to_str())
  backend.pre_tokenizer = pre_tokenizers.Sequence(
    [pre_tokenizers.Digits(individual_digits=True), backend.pre_tokenizer]
  )
  return backend


@pytest.mark.slow
def test_real_properties(tok):
  assert (tok.vocab_size, tok.bos_id, tok.eos_id, tok.unk_id) == (49152, 1, 2, 0)
  assert tok.id_to_token(1) == '<|im_start|>' and tok.id_to_token(2) == '<|im_end|>'
  assert 'SmolLM' in tok.chat_template


@pytest.mark.slow
@pytest.mark.parametrize('text', TEXTS)
def test_ids_match_transformers(tok, hf, text):
  assert tok.encode(text) == hf.encode(text, add_special_tokens=False)


@pytest.mark.slow
@pytest.mark.parametrize('text', TEXTS + NUMBER_AFTER_SPACE)
def test_ids_match_smollm_pre_tokenizer(tok, hf_smollm_split, text):
  assert tok.encode(text) == hf_smollm_split.encode(text, add_special_tokens=False).ids


@pytest.mark.slow
def test_digits_split_first(tok):
  assert [tok.id_to_token(i) for i in tok.encode('x  12')] == ['x', 'ĠĠ', '1', '2']


@pytest.mark.slow
@pytest.mark.parametrize('text', TEXTS + NUMBER_AFTER_SPACE)
def test_real_round_trip(tok, text):
  assert tok.decode(tok.encode(text), skip_special_tokens=False) == text


@pytest.mark.slow
def test_decode_skips_special_tokens(tok):
  ids = tok.encode('<|im_start|>assistant\nHi!<|im_end|>')
  assert tok.decode(ids) == 'assistant\nHi!'


@pytest.mark.slow
@pytest.mark.parametrize('messages', CONVERSATIONS)
@pytest.mark.parametrize('add_generation_prompt', [True, False])
def test_chat_template_matches_transformers(tok, hf, messages, add_generation_prompt):
  ours = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
  theirs = hf.apply_chat_template(
    messages, tokenize=False, add_generation_prompt=add_generation_prompt
  )
  assert ours == theirs


@pytest.mark.slow
def test_default_system_prompt(tok):
  text = tok.apply_chat_template([{'role': 'user', 'content': 'Hi'}])
  assert text.startswith('<|im_start|>system\nYou are a helpful AI assistant named SmolLM')
  assert text.endswith('<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n')


@pytest.mark.slow
def test_encode_chat_matches_transformers(tok, hf):
  prompt = 'Write a Python function that returns the 10th prime.'
  theirs = hf.apply_chat_template(
    [{'role': 'user', 'content': prompt}], add_generation_prompt=True, return_dict=False
  )
  assert tok.encode_chat(prompt) == list(theirs)


@pytest.mark.slow
def test_real_empty_prompt(tok):
  with pytest.raises(ValueError, match='empty prompt'):
    tok.encode_chat(' \n ')


@pytest.mark.slow
def test_saved_directory_loads_in_transformers(tok, tmp_path):
  transformers = importlib.import_module('transformers')
  tok.save(tmp_path)
  loaded = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  assert (loaded.bos_token, loaded.eos_token, loaded.unk_token) == (
    '<|im_start|>',
    '<|im_end|>',
    '<|endoftext|>',
  )
  for text in TEXTS + NUMBER_AFTER_SPACE:
    assert loaded.encode(text, add_special_tokens=False) == tok.encode(text), text
    assert loaded.decode(tok.encode(text)) == text
  for messages in CONVERSATIONS:
    assert loaded.apply_chat_template(
      messages, tokenize=False, add_generation_prompt=True
    ) == tok.apply_chat_template(messages)


@pytest.mark.slow
def test_saved_directory_round_trip(tok, tmp_path):
  tok.save(tmp_path)
  loaded = Tokenizer.from_file(tmp_path / 'tokenizer.json')
  assert (loaded.vocab_size, loaded.bos_id, loaded.eos_id) == (49152, 1, 2)
  assert loaded.chat_template == tok.chat_template
  for text in TEXTS + NUMBER_AFTER_SPACE:
    assert loaded.encode(text) == tok.encode(text)
