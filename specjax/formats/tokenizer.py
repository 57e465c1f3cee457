"""Text <-> token ids, and chat templates, for the models specjax runs.

A `Tokenizer` wraps a `tokenizers.Tokenizer` and the model's jinja2 chat template. It is built from
a GGUF file's metadata (`tokenizer.ggml.model` 'gpt2': byte-level BPE; 'llama': Gemma's
SentencePiece BPE with byte fallback) or from a Hugging Face `tokenizer.json`, and can save
itself as a directory that `transformers.AutoTokenizer.from_pretrained` loads.

Prompts: `encode_chat` renders a one-turn chat with the model's template; for a base model
(`use_chat_template=False`) it encodes the plain text instead, after BOS when the model
wants one (`add_bos`, from the GGUF's tokenizer.ggml.add_bos_token).
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox
import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers

PathLike = str | os.PathLike[str]

# ChatML, used when a model brings no template of its own.
CHATML_TEMPLATE = (
  '{% for message in messages %}'
  "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
  '{% endfor %}'
  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_CONTROL = 3  # llama.cpp's token type for control tokens such as '<|im_start|>'.
_USER_DEFINED = 4  # llama.cpp's token type for tokens always matched whole, such as '\n\n'.
_SPIECE_SPACE = '\u2581'  # SentencePiece's spelling of a space
# Architectures whose GGUF 'llama' (SentencePiece) vocabularies _gemma_bpe builds.
_GEMMA_ARCHS = ('gemma', 'gemma2', 'gemma3')
_TOKENIZER_FILE = 'tokenizer.json'
_CONFIG_FILE = 'tokenizer_config.json'


def _gpt2_byte_level() -> pre_tokenizers.PreTokenizer:
  return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


# GGUF `tokenizer.ggml.pre` -> how text is split before BPE (as llama.cpp does it).
_PRE_TOKENIZERS = {
  'smollm': lambda: pre_tokenizers.Sequence(
    [pre_tokenizers.Digits(individual_digits=True), _gpt2_byte_level()]
  ),
  'gpt-2': _gpt2_byte_level,
}


class Tokenizer:
  """A BPE tokenizer with the model's chat template.

  Attributes:
    backend: the wrapped `tokenizers.Tokenizer`.
    bos_id: id of the beginning-of-sequence token (never added by `encode`).
    eos_id: id of the end-of-sequence token; generation stops on it.
    unk_id: id of the unknown token, or None.
    pad_id: id of the padding token, or None.
    chat_template: the model's jinja2 chat template, or None (then ChatML is used).
    add_bos: whether a plain-text prompt starts with BOS (`encode_text`).
    use_chat_template: whether `encode_chat` applies the chat template (an instruction-tuned
      model) or encodes the prompt as plain text (a base model).
  """

  def __init__(
    self,
    backend: tokenizers.Tokenizer,
    *,
    bos_id: int,
    eos_id: int,
    unk_id: int | None = None,
    pad_id: int | None = None,
    chat_template: str | None = None,
    add_bos: bool = False,
    use_chat_template: bool = True,
  ):
    self.backend = backend
    self.bos_id = bos_id
    self.eos_id = eos_id
    self.unk_id = unk_id
    self.pad_id = pad_id
    self.chat_template = chat_template
    self.add_bos = add_bos
    self.use_chat_template = use_chat_template

  @classmethod
  def from_gguf(cls, path: PathLike, use_chat_template: bool = True) -> Tokenizer:
    """Builds the tokenizer described by a GGUF file's `tokenizer.*` metadata.

    `tokenizer.ggml.model` 'gpt2' is byte-level BPE; 'llama' (SentencePiece) is read for
    Gemma's architectures. `use_chat_template=False` is for base models (see the class).

    Raises:
      ValueError: the file's tokenizer is of another kind, or splits text in a way not
        supported here; the message names the file and the setting.
    """
    from specjax.formats import gguf_file  # Imported here: only GGUF users pay for it.

    meta = gguf_file.read_metadata(path)
    arch = meta.get('general.architecture')
    model = meta.get('tokenizer.ggml.model')
    if model == 'gpt2':
      backend = _byte_level_bpe(meta, path)
    elif model == 'llama' and arch in _GEMMA_ARCHS:
      backend = _gemma_bpe(meta, path)
    else:
      raise ValueError(
        f'{path}: tokenizer model {model!r} is not supported for architecture {arch!r}; '
        f"supported: 'gpt2' (byte-level BPE), and 'llama' (SentencePiece) for {_GEMMA_ARCHS}."
      )
    # llama.cpp's default for a SentencePiece vocabulary that does not say is to add BOS.
    add_bos = meta.get('tokenizer.ggml.add_bos_token', model == 'llama')
    return cls(
      backend,
      bos_id=meta['tokenizer.ggml.bos_token_id'],
      eos_id=meta['tokenizer.ggml.eos_token_id'],
      unk_id=meta.get('tokenizer.ggml.unknown_token_id'),
      pad_id=meta.get('tokenizer.ggml.padding_token_id'),
      chat_template=meta.get('tokenizer.chat_template'),
      add_bos=bool(add_bos),
      use_chat_template=use_chat_template,
    )

  @classmethod
  def from_file(
    cls,
    path: PathLike,
    chat_template: str | None = None,
    bos_id: int | None = None,
    eos_id: int | None = None,
  ) -> Tokenizer:
    """Loads a Hugging Face `tokenizer.json` (a file, or a directory holding one).

    Settings not passed are read from a `tokenizer_config.json` next to it, if there is one.
    """
    path = pathlib.Path(path)
    if path.is_dir():
      path = path / _TOKENIZER_FILE
    backend = tokenizers.Tokenizer.from_file(str(path))
    config = _read_config(path.parent / _CONFIG_FILE)
    ids = {
      key: backend.token_to_id(config[f'{key}_token']) if config.get(f'{key}_token') else None
      for key in ('bos', 'eos', 'unk', 'pad')
    }
    bos_id = ids['bos'] if bos_id is None else bos_id
    eos_id = ids['eos'] if eos_id is None else eos_id
    if bos_id is None or eos_id is None:
      raise ValueError(
        f'{path}: pass bos_id and eos_id, or put bos_token and eos_token in {_CONFIG_FILE}.'
      )
    return cls(
      backend,
      bos_id=bos_id,
      eos_id=eos_id,
      unk_id=ids['unk'],
      pad_id=ids['pad'],
      chat_template=chat_template or _config_template(config),
    )

  def save(self, directory: PathLike) -> pathlib.Path:
    """Writes `tokenizer.json` and `tokenizer_config.json`, loadable by `AutoTokenizer`.

    Returns:
      The directory.
    """
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    self.backend.save(str(directory / _TOKENIZER_FILE))
    config = {
      'tokenizer_class': 'PreTrainedTokenizerFast',
      'bos_token': self._token(self.bos_id),
      'eos_token': self._token(self.eos_id),
      'unk_token': self._token(self.unk_id),
      'pad_token': self._token(self.pad_id),
      'add_bos_token': False,
      'add_eos_token': False,
      'clean_up_tokenization_spaces': False,
      'chat_template': self.chat_template,
    }
    with open(directory / _CONFIG_FILE, 'w', encoding='utf-8') as f:
      json.dump(config, f, indent=2, ensure_ascii=False)
    return directory

  @property
  def vocab_size(self) -> int:
    """Number of token ids, special tokens included."""
    return self.backend.get_vocab_size(with_added_tokens=True)

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`; special tokens written in it (e.g. '<|im_end|>') stay whole. No BOS."""
    return self.backend.encode(text, add_special_tokens=False).ids

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    """Text of token ids."""
    return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

  def token_to_id(self, token: str) -> int | None:
    """Id of a token string, or None if it is not in the vocabulary."""
    return self.backend.token_to_id(token)

  def id_to_token(self, token_id: int) -> str | None:
    """Token string of an id, or None if out of range."""
    return self.backend.id_to_token(token_id)

  def apply_chat_template(
    self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
  ) -> str:
    """Renders messages ({'role': ..., 'content': ...}) with the chat template.

    The template is rendered the way transformers renders it (sandboxed jinja2, trim_blocks,
    lstrip_blocks, `raise_exception`), so the text equals `apply_chat_template(tokenize=False)`'s.
    """
    template = _compile_template(self.chat_template or CHATML_TEMPLATE)
    return template.render(
      messages=[dict(m) for m in messages],
      add_generation_prompt=add_generation_prompt,
      bos_token=self._token(self.bos_id) or '',
      eos_token=self._token(self.eos_id) or '',
      unk_token=self._token(self.unk_id) or '',
      pad_token=self._token(self.pad_id) or '',
    )

  def encode_text(self, text: str) -> list[int]:
    """Token ids of plain text as a model's input: BOS first when `add_bos`, then the text's."""
    return ([self.bos_id] if self.add_bos else []) + self.encode(text)

  def encode_chat(self, prompt: str) -> list[int]:
    """Token ids of a prompt: a one-turn chat (`prompt` as the user message, then the
    assistant's turn), or for a base model (`use_chat_template` False) `encode_text(prompt)`.

    Raises:
      ValueError: the prompt is empty or only whitespace.
    """
    if not prompt.strip():
      raise ValueError('empty prompt')
    if not self.use_chat_template:
      return self.encode_text(prompt)
    return self.encode(self.apply_chat_template([{'role': 'user', 'content': prompt}]))

  def encode_conversation(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
    """Token ids of a multi-turn chat ending with a user message (user, assistant, ...,
    user), then the assistant's turn; one user message is `encode_chat`'s. A base model
    (`use_chat_template` False) reads the messages' contents as plain text, a blank line
    apart.

    Raises:
      ValueError: a user message is empty, or the roles do not alternate from user to user.
    """
    check_conversation(messages)
    if not self.use_chat_template:
      return self.encode_text('\n\n'.join(m['content'] for m in messages))
    return self.encode(self.apply_chat_template([dict(m) for m in messages]))

  def _token(self, token_id: int | None) -> str | None:
    return None if token_id is None else self.backend.id_to_token(token_id)

  def __repr__(self) -> str:
    return (
      f'Tokenizer(vocab_size={self.vocab_size}, bos_id={self.bos_id}, eos_id={self.eos_id}, '
      f'chat_template={"yes" if self.chat_template else "ChatML"}, add_bos={self.add_bos}, '
      f'use_chat_template={self.use_chat_template})'
    )


def _byte_level_bpe(meta: Mapping[str, Any], path: PathLike) -> tokenizers.Tokenizer:
  """A `tokenizers.Tokenizer` for GGUF metadata of model 'gpt2' (byte-level BPE)."""
  model = meta.get('tokenizer.ggml.model')
  if model != 'gpt2':
    raise ValueError(
      f'{path}: tokenizer model {model!r} is not supported; only byte-level BPE (gpt2) is.'
    )
  pre = meta.get('tokenizer.ggml.pre')
  if pre not in _PRE_TOKENIZERS:
    raise ValueError(
      f'{path}: pre-tokenizer {pre!r} is not supported; supported: {sorted(_PRE_TOKENIZERS)}.'
    )
  tokens = meta['tokenizer.ggml.tokens']
  vocab = {token: i for i, token in enumerate(tokens)}
  if len(vocab) != len(tokens):
    raise ValueError(f'{path}: the vocabulary has {len(tokens) - len(vocab)} duplicate tokens.')
  merges = [tuple(m.split(' ')) for m in meta['tokenizer.ggml.merges']]
  bpe = models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False)
  tok = tokenizers.Tokenizer(bpe)
  tok.pre_tokenizer = _PRE_TOKENIZERS[pre]()
  tok.decoder = decoders.ByteLevel()
  types = meta.get('tokenizer.ggml.token_type') or [0] * len(tokens)
  control = [
    tokenizers.AddedToken(token, special=True, normalized=False)
    for token, kind in zip(tokens, types, strict=True)
    if kind == _CONTROL
  ]
  tok.add_special_tokens(control)
  return tok


def _gemma_bpe(meta: Mapping[str, Any], path: PathLike) -> tokenizers.Tokenizer:
  """A `tokenizers.Tokenizer` for a Gemma GGUF's SentencePiece vocabulary (model 'llama').

  Gemma's SentencePiece model is BPE with byte fallback (<0x00>..<0xFF>), spaces spelled
  '\u2581', no prefix space, and no splitting of the text before BPE. The file has tokens,
  scores and types but no merges; they are rebuilt from the vocabulary as transformers'
  GGUF converter rebuilds them, so the ids equal `AutoTokenizer.from_pretrained(dir,
  gguf_file=...)`'s: every way of cutting a token into two tokens is a merge, ranked by the
  token's position in the file (Gemma's scores do not follow the merge order), and among the
  cuts of one token the longer left part first. Tokens of two or more spaces are stored as
  real spaces and looked up as '\u2581\u2581...'. Control tokens (type 3) are special and
  stay whole; user-defined ones (type 4, e.g. '\n\n') are matched whole too.
  """
  if meta.get('tokenizer.ggml.add_space_prefix', False):
    raise ValueError(
      f'{path}: tokenizer.ggml.add_space_prefix=True is not supported (Gemma has no prefix space)'
    )
  tokens = list(meta['tokenizer.ggml.tokens'])
  spelled = [_SPIECE_SPACE * len(t) if ' ' in t and not t.strip() else t for t in tokens]
  vocab = {token: i for i, token in enumerate(spelled)}
  if len(vocab) != len(spelled):
    raise ValueError(f'{path}: the vocabulary has {len(spelled) - len(vocab)} duplicate tokens.')
  merges = [
    (token[:cut], token[cut:])
    for token in spelled
    for cut in range(len(token) - 1, 0, -1)
    if token[:cut] in vocab and token[cut:] in vocab
  ]
  unk_id = meta.get('tokenizer.ggml.unknown_token_id')
  bpe = models.BPE(
    vocab=vocab,
    merges=merges,
    unk_token=None if unk_id is None else tokens[unk_id],
    fuse_unk=True,
    byte_fallback=True,
  )
  tok = tokenizers.Tokenizer(bpe)
  tok.normalizer = normalizers.Replace(' ', _SPIECE_SPACE)
  # A no-op once spaces are '\u2581' (as in Gemma's own tokenizer.json): BPE sees whole texts.
  tok.pre_tokenizer = pre_tokenizers.Split(' ', behavior='merged_with_previous')
  tok.decoder = decoders.Sequence(
    [decoders.Replace(_SPIECE_SPACE, ' '), decoders.ByteFallback(), decoders.Fuse()]
  )
  types = meta.get('tokenizer.ggml.token_type') or [0] * len(tokens)
  tok.add_special_tokens(
    [
      tokenizers.AddedToken(token, special=True, normalized=False)
      for token, kind in zip(tokens, types, strict=True)
      if kind == _CONTROL
    ]
  )
  tok.add_tokens(
    [
      tokenizers.AddedToken(token, special=False, normalized=False)
      for token, kind in zip(tokens, types, strict=True)
      if kind == _USER_DEFINED and token in vocab
    ]
  )
  return tok


def check_conversation(messages: Sequence[Mapping[str, str]]) -> None:
  """A conversation `encode_conversation` renders: user and assistant messages in turn,
  first and last the user's; no user message empty (an answer may be: a model can stop at once)."""
  if not messages or len(messages) % 2 == 0:
    raise ValueError(
      f'a conversation needs an odd number of messages (user, assistant, ..., user), '
      f'got {len(messages)}'
    )
  for k, m in enumerate(messages):
    role = 'user' if k % 2 == 0 else 'assistant'
    if m.get('role') != role:
      raise ValueError(f'message {k}: role {m.get("role")!r}, expected {role!r}')
    if not isinstance(m.get('content'), str):
      raise ValueError(f'message {k} ({role}): content must be a string')
    if role == 'user' and not m['content'].strip():
      raise ValueError(f'message {k} (user): empty content')


def _read_config(path: pathlib.Path) -> dict[str, Any]:
  if not path.exists():
    return {}
  with open(path, encoding='utf-8') as f:
    config = json.load(f)
  # Special tokens may be stored as AddedToken dicts.
  for key in ('bos_token', 'eos_token', 'unk_token', 'pad_token'):
    if isinstance(config.get(key), dict):
      config[key] = config[key].get('content')
  return config


def _config_template(config: Mapping[str, Any]) -> str | None:
  """The chat template of a tokenizer_config.json: a string, or the 'default' of named ones."""
  template = config.get('chat_template')
  if isinstance(template, list):
    named = {t['name']: t['template'] for t in template}
    template = named.get('default')
  return template


def _raise_exception(message: str):
  raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
  # Jinja's own tojson escapes HTML characters; chat templates expect plain JSON.
  return json.dumps(
    x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
  )


def _strftime_now(fmt: str) -> str:
  return datetime.datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=16)
def _compile_template(source: str) -> jinja2.Template:
  """Compiles a chat template in the sandboxed environment transformers uses."""
  env = jinja2.sandbox.ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
  )
  env.filters['tojson'] = _tojson
  env.globals['raise_exception'] = _raise_exception
  env.globals['strftime_now'] = _strftime_now
  return env.from_string(source)
