"""Distillation data that exists offline: tokenised, labelled by the target, and cached.

Three sources, all on any machine with Python and the target:

  responses  the target's own greedy answers to specjax's instruction prompts
             (specjax.train.prompts; prose, reasoning and code). Loss on the answer only.
  code       chunks of Python standard-library sources.
  docs       chunks of the interpreter's own documentation text (pydoc_data.topics).

Each sequence is labelled once by the target (teacher forcing): the top-k next-token
probabilities at every position, kept in float16. Computing the 135M target's logits is
the expensive part on a CPU, so the labels are cached under `cache_dir()/distill/<key>`
and training reads them many times. The last `eval_prompts` prompts' answers (and a few
chunks of files not trained on) are held aside for evaluation.

Batches are a pure function of (seed, step) (`batch_indices`), so a resumed run sees
exactly the data an uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np

from specjax.data import assets

log = logging.getLogger(__name__)

ARRAYS = ('tokens', 'mask', 'topk_ids', 'topk_probs', 'source')
SOURCES = ('responses', 'code', 'docs')


@dataclasses.dataclass
class Dataset:
  """tokens [N, T] int32; mask [N, T] bool (position t's next token counts); teacher
  top-k ids [N, T, k] int32 and probs [N, T, k] float16; source [N] index into SOURCES."""

  tokens: np.ndarray
  mask: np.ndarray
  topk_ids: np.ndarray
  topk_probs: np.ndarray
  source: np.ndarray

  def __len__(self) -> int:
    return len(self.tokens)

  def take(self, index) -> Dataset:
    return Dataset(*(getattr(self, a)[index] for a in ARRAYS))

  def save(self, path: pathlib.Path) -> None:
    tmp = path.with_suffix('.tmp.npz')
    np.savez(tmp, **{a: getattr(self, a) for a in ARRAYS})
    tmp.replace(path)

  @classmethod
  def load(cls, path: pathlib.Path) -> Dataset:
    with np.load(path) as f:
      return cls(*(f[a] for a in ARRAYS))

  @property
  def num_tokens(self) -> int:
    return int(self.mask.sum())


def doc_text() -> str:
  """The interpreter's documentation topics (pydoc_data.topics), a few hundred kB of English,
  read from their TFDS corpus (specjax/train/tfds_corpora.py)."""
  from specjax.train import tfds_corpora

  return '\n\n'.join(tfds_corpora.texts('docs'))


def chunks(ids: list[int], seq_len: int, count: int, rng: np.random.Generator) -> list[list[int]]:
  """`count` random non-overlapping windows of seq_len tokens from a long id list."""
  starts = np.arange(0, len(ids) - seq_len, seq_len)
  picked = rng.choice(starts, size=min(count, len(starts)), replace=False)
  return [ids[s : s + seq_len] for s in sorted(picked)]


def fingerprint(params) -> str:
  """A digest of a model's weights (every array's shape, dtype and 64k values spread over
  it): labels cached for one model are never read for another saved at the same path."""
  h = hashlib.sha256()
  for path, a in jax.tree_util.tree_flatten_with_path(params)[0]:
    h.update(f'{jax.tree_util.keystr(path)}{a.shape}{a.dtype}'.encode())
    flat = a.reshape(-1)  # sampled where it lives: no copy of the whole weight to the host
    h.update(np.ascontiguousarray(np.asarray(flat[:: max(1, flat.size // 65536)])).tobytes())
  return h.hexdigest()[:16]


def _cache_key(target, config) -> str:
  desc = json.dumps(
    {'target': target.source, 'weights': fingerprint(target.params), 'data': config.to_dict()},
    sort_keys=True,
  )
  return hashlib.sha256(desc.encode()).hexdigest()[:16]


def data_dir(target, config) -> pathlib.Path:
  base = pathlib.Path(config.cache_dir) if config.get('cache_dir') else assets.cache_dir()
  path = base / 'distill' / f'{config.name}-{_cache_key(target, config)}'
  path.mkdir(parents=True, exist_ok=True)
  return path


def generate_responses(
  target, prompts: list[str], max_new: int, batch_size: int, progress=None
) -> list[tuple[list[int], list[int]]]:
  """(prompt ids, greedy answer ids) per prompt, from the target itself."""
  from specjax.decode.engine import Engine

  encoded = [target.tokenizer.encode_chat(p) for p in prompts]
  longest = max(len(e) for e in encoded) + max_new
  cache = 1 << (longest - 1).bit_length()
  engine = Engine(target.params, target.cfg, eos_id=target.tokenizer.eos_id, cache_size=cache)
  order = np.argsort([len(e) for e in encoded], kind='stable')  # similar lengths batch together
  out = [None] * len(prompts)
  for start in range(0, len(order), batch_size):
    rows = order[start : start + batch_size]
    gen = engine.generate([encoded[i] for i in rows], max_new_tokens=max_new)
    for i, toks in zip(rows, gen.tokens):
      out[i] = (encoded[i], list(toks))
    if progress:
      progress(start + len(rows), len(order))
  return out


def pack(prompt_ids: list[int], answer_ids: list[int] | None, seq_len: int, pad_id: int = 0):
  """(tokens [seq_len], mask [seq_len]) for one sequence; mask marks positions whose next
  token is learned: the answer's tokens for a response, every token for a chunk."""
  ids = list(prompt_ids) + list(answer_ids or [])
  ids = ids[:seq_len]
  tokens = np.full(seq_len, pad_id, np.int32)
  tokens[: len(ids)] = ids
  mask = np.zeros(seq_len, bool)
  first = len(prompt_ids) - 1 if answer_ids is not None else 0
  mask[first : len(ids) - 1] = True
  return tokens, mask


def teacher_topk(target, tokens: np.ndarray, k: int, batch_size: int, progress=None):
  """Top-k next-token (ids [N, T, k] int32, probs [N, T, k] float16) of the target."""
  cfg = target.cfg

  @jax.jit
  def label(params, toks):
    cache = cfg.family.init_cache(cfg, toks.shape[0], toks.shape[1], params['embed'].dtype)
    logits = cfg.family.forward(params, toks, cache, cfg).logits
    probs, ids = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), k)
    return ids.astype(jnp.int32), probs.astype(jnp.float16)

  params = jax.device_put(target.params)
  ids, probs = [], []
  n = len(tokens)
  for start in range(0, n, batch_size):
    batch = tokens[start : start + batch_size]
    pad = batch_size - len(batch)
    if pad:
      batch = np.concatenate([batch, np.zeros((pad,) + batch.shape[1:], batch.dtype)])
    i, p = label(params, jnp.asarray(batch))
    ids.append(np.asarray(i)[: batch_size - pad])
    probs.append(np.asarray(p)[: batch_size - pad])
    if progress:
      progress(min(start + batch_size, n), n)
  return np.concatenate(ids), np.concatenate(probs)


def build(target, config, progress=print) -> tuple[Dataset, Dataset]:
  """(train, eval) datasets for `config` (the `data` part of a distillation config), built
  from scratch or read from the cache."""
  folder = data_dir(target, config)
  train_path, eval_path = folder / 'train.npz', folder / 'eval.npz'
  if train_path.exists() and eval_path.exists():
    return Dataset.load(train_path), Dataset.load(eval_path)
  tok, seq_len = target.tokenizer, config.seq_len
  rng = np.random.default_rng(config.seed)
  sequences = []  # (tokens, mask, source, is_eval)

  responses_path = folder / 'responses.json'
  limit = seq_len - config.max_new_tokens
  # The corpora are read from their TFDS datasets (built on first use; tfds_corpora.py).
  from specjax.train import tfds_corpora

  instructions = tfds_corpora.texts('instructions', config.seed)
  prompts = [p for p in instructions if len(tok.encode_chat(p)) <= limit][: config.num_prompts]
  if responses_path.exists():
    responses = json.loads(responses_path.read_text())
  else:
    start = time.time()
    responses = generate_responses(
      target,
      prompts,
      config.max_new_tokens,
      config.generate_batch,
      progress=lambda i, n: progress(f'responses {i}/{n} ({time.time() - start:.0f} s)'),
    )
    responses_path.write_text(json.dumps(responses))
  for i, (p, a) in enumerate(responses):
    sequences.append((*pack(p, a, seq_len), 0, i >= len(responses) - config.eval_prompts))

  files = tfds_corpora.texts('stdlib')  # tfds_corpora.stdlib_files()' sources, in order
  rng.shuffle(files)
  code_ids = []
  for text in files[: config.code_files]:
    code_ids += tok.encode(text[: config.max_file_chars]) + [tok.eos_id]
  n_eval_code = config.eval_chunks
  for j, c in enumerate(chunks(code_ids, seq_len, config.code_chunks + n_eval_code, rng)):
    sequences.append((*pack(c, None, seq_len), 1, j < n_eval_code))
  if config.doc_chunks:
    doc_ids = tok.encode(doc_text()[: config.max_doc_chars])
    for j, c in enumerate(chunks(doc_ids, seq_len, config.doc_chunks + n_eval_code, rng)):
      sequences.append((*pack(c, None, seq_len), 2, j < n_eval_code))

  tokens = np.stack([s[0] for s in sequences])
  start = time.time()
  ids, probs = teacher_topk(
    target,
    tokens,
    config.top_k,
    config.label_batch,
    progress=lambda i, n: progress(f'teacher labels {i}/{n} ({time.time() - start:.0f} s)'),
  )
  full = Dataset(
    tokens,
    np.stack([s[1] for s in sequences]),
    ids,
    probs,
    np.array([s[2] for s in sequences], np.int32),
  )
  is_eval = np.array([s[3] for s in sequences])
  train, evals = full.take(~is_eval), full.take(is_eval)
  train.save(train_path)
  evals.save(eval_path)
  return train, evals


def token_frequencies(data: Dataset, vocab_size: int) -> np.ndarray:
  """Teacher probability mass per token [V], summed over the masked positions."""
  ids = data.topk_ids[data.mask]
  probs = data.topk_probs[data.mask].astype(np.float64)
  return np.bincount(ids.ravel(), probs.ravel(), minlength=vocab_size)


def draft_vocabulary(
  data: Dataset, vocab_size: int, size: int, always: tuple[int, ...] = ()
) -> np.ndarray:
  """The `size` tokens with the most teacher mass (plus `always`, e.g. EOS), sorted by id."""
  if size >= vocab_size:
    return np.arange(vocab_size, dtype=np.int32)
  freq = token_frequencies(data, vocab_size)
  freq[list(always)] = np.inf
  return np.sort(np.argsort(-freq, kind='stable')[:size]).astype(np.int32)


def coverage(data: Dataset, vocab_ids: np.ndarray) -> dict[str, float]:
  """Share of the teacher's argmax tokens and of its top-k mass inside `vocab_ids`."""
  inside = np.zeros(int(max(data.topk_ids.max(), vocab_ids.max())) + 1, bool)
  inside[vocab_ids] = True
  top1 = data.topk_ids[..., 0][data.mask]
  ids, probs = data.topk_ids[data.mask], data.topk_probs[data.mask].astype(np.float64)
  return {
    'argmax': float(inside[top1].mean()),
    'mass': float((probs * inside[ids]).sum() / probs.sum()),
  }


def batch_indices(num_examples: int, batch_size: int, step: int, seed: int) -> np.ndarray:
  """The examples of training step `step`: epoch e is a permutation seeded by (seed, e)."""
  per_epoch = max(num_examples // batch_size, 1)
  epoch, i = divmod(step, per_epoch)
  perm = np.random.default_rng([seed, epoch]).permutation(num_examples)
  return perm[i * batch_size : (i + 1) * batch_size]
