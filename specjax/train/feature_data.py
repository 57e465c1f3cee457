"""Training data for feature draft heads (EAGLE-3 style): the target's own features.

For every training sequence the target runs once (teacher forcing) and we keep, per
position t:

  features[t]  the residual stream entering the captured target layers, concatenated
               ([len(capture) * D], float16): what the head reads in place of the target
  hidden[t]    the target's final-normed hidden state ([D], float16) and
  lse[t]       the log-sum-exp of its logits over the full vocabulary (float32):
               together they give the target's exact next-token probabilities on any
               subset of the vocabulary, p(v) = exp(hidden[t] . embed[v] - lse[t]),
               without storing 49k probabilities per token.

Text comes from what exists on any machine (see specjax.train.data): the target's own
greedy answers to instruction prompts, generated with specjax at a large batch (the slow
part; progress and tokens/s are logged, answers are appended to a JSONL file so an
interrupted run resumes), the pure-Python standard library's sources and the
interpreter's documentation. The sources of modules the code-editing benchmark draws from
(specjax.data.code_edit) are left out, like every evaluation prompt (tests check both).

The arrays are .npy files under `cache_dir()/features/<name>-<key>`, memory-mapped, filled
batch by batch with a progress marker, so labelling resumes where it stopped too.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import logging
import pathlib
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np

from specjax.data import assets, code_edit
from specjax.train import data as data_lib
from specjax.train import prompts as prompts_lib

log = logging.getLogger(__name__)

ARRAYS = ('tokens', 'mask', 'source', 'is_eval')
FEATURE_ARRAYS = ('features', 'hidden', 'lse')


def excluded_modules() -> set[str]:
  """Top-level stdlib modules the code-editing benchmark draws its functions from."""
  out = set()
  for qualname in code_edit.CANDIDATES:
    parts = qualname.split('.')
    out.add(parts[0])
    out.add('/'.join(parts[:2]))  # e.g. urllib/parse
  return out


def training_sources() -> list[tuple[str, str]]:
  """(path under the stdlib folder, source) for training, in path order: the stdlib corpus
  (TFDS, specjax/train/tfds_corpora.py: tfds_corpora.stdlib_files()' sources) minus
  the modules of the code-editing benchmark (specjax.data.code_edit.CANDIDATES)."""
  from specjax.train import tfds_corpora

  skip = excluded_modules()
  corpus = tfds_corpora.source('stdlib')
  out = []
  for i in range(len(corpus)):
    name = corpus[i]['name'].decode()
    path = pathlib.PurePosixPath(name)
    parts = path.with_suffix('').parts
    names = {parts[-1], '/'.join(parts[-2:])}
    if path.name == '__init__.py':
      names |= {parts[-2], '/'.join(parts[-3:-1])}
    if not names & skip:
      out.append((name, corpus[i]['text'].decode()))
  return out


def docstring_prompts(sources: list[tuple[str, str]], limit: int, max_lines: int = 40) -> list[str]:
  """Instruction prompts from documented stdlib functions of `sources` ((name, source)
  pairs; ast, no imports):
  'write the body of this signature and docstring' and 'explain this function'."""
  out = []
  for _, text in sources:
    try:
      tree = ast.parse(text)
    except (SyntaxError, ValueError):
      continue
    for node in ast.walk(tree):
      if not isinstance(node, ast.FunctionDef) or node.name.startswith('_'):
        continue
      doc = ast.get_docstring(node)
      source = ast.get_source_segment(text, node)
      if not doc or not source or source.count('\n') > max_lines or len(doc) < 40:
        continue
      first = doc.strip().split('\n\n')[0]
      args = ast.unparse(node.args)
      out.append(
        f'Write a Python function `{node.name}({args})` that does the following: {first}\n'
        'Reply with the code and a one-sentence explanation.'
      )
      out.append(prompts_lib.STDLIB_TEMPLATES[1].format(source=textwrap.dedent(source) + '\n'))
      if len(out) >= limit:
        return out
  return out


COMPLETION_TEMPLATE = (
  'Complete the following Python function. Reply with the full function in a Python code '
  'block.\n\n```python\n{header}```'
)


def completion_prompts(sources: list[tuple[str, str]], max_lines: int = 40) -> list[str]:
  """'Complete this function' prompts: the def line and docstring of documented, public
  stdlib functions of `sources`, (name, source) pairs (the task shape of code-completion
  benchmarks, on code that is none of theirs)."""
  out = []
  for _, text in sources:
    try:
      tree = ast.parse(text)
    except (SyntaxError, ValueError):
      continue
    lines = text.splitlines(keepends=True)
    for node in ast.walk(tree):
      if not isinstance(node, ast.FunctionDef) or node.name.startswith('_'):
        continue
      doc = ast.get_docstring(node)
      if not doc or node.end_lineno - node.lineno > max_lines or len(doc) < 40:
        continue
      if node.args.args and node.args.args[0].arg in ('self', 'cls'):
        continue  # methods need their class
      source = textwrap.dedent(''.join(lines[node.lineno - 1 : node.end_lineno]))
      header = prompts_lib.source_header(source)
      if header:
        out.append(COMPLETION_TEMPLATE.format(header=header))
  return out


# Task shapes of general chat benchmarks (writing, role-play, extraction, summaries, STEM,
# humanities, math, reasoning), written for specjax and filled with specjax's own topics,
# numbers and passages of the interpreter's documentation: none is a benchmark question.
MIXED_TEMPLATES = (
  'Write a persuasive paragraph arguing that everyone should learn about {topic}.',
  'You are a museum curator. Introduce an exhibition about {topic} to a group of children.',
  'Act as a job interviewer and ask me five questions about {topic}, one at a time.',
  'Write a dialogue between a teacher and a curious student about {topic}.',
  'Explain {topic} in exactly three sentences, then give one everyday example.',
  'Describe how {topic} has changed over the last hundred years.',
  'What ethical questions does {topic} raise? Discuss two of them.',
  'Write a limerick about {topic}, then explain the joke.',
)
PASSAGE_TEMPLATES = (
  'Summarize the following passage in three bullet points:\n\n{passage}',
  'Extract every technical term from the text below and return them as a JSON list.\n\n{passage}',
  'Rewrite the following paragraph in plain language for a beginner:\n\n{passage}',
  'Write two quiz questions, with answers, based on this text:\n\n{passage}',
)
MATH_TEMPLATES = (
  'A shop sells pencils at {a} cents each and notebooks at {b} times that price. How much '
  'do {c} pencils and {d} notebooks cost? Show your reasoning step by step.',
  'A train travels {a} km in {b} hours, then {c} km in {d} hours. What is its average '
  'speed over the whole trip? Explain each step.',
  'Solve for x: {a}x + {b} = {c}x - {d}. Show your work.',
  'If a rectangle has a perimeter of {e} cm and one side is {a} cm, what is its area?',
)


def mixed_prompts(seed: int = 0) -> list[str]:
  """General chat prompts of several task shapes (see the templates above)."""
  import random

  rng = random.Random(seed)
  out = [t.format(topic=x) for t in MIXED_TEMPLATES for x in prompts_lib.TOPICS]
  paragraphs = [
    p.strip() for p in data_lib.doc_text().split('\n\n') if 300 <= len(p.strip()) <= 700
  ]
  rng.shuffle(paragraphs)
  for i, passage in enumerate(paragraphs[:240]):
    out.append(PASSAGE_TEMPLATES[i % len(PASSAGE_TEMPLATES)].format(passage=passage))
  for _ in range(40):
    for t in MATH_TEMPLATES:
      a, b, c, d = (rng.randint(2, 60) for _ in range(4))
      out.append(t.format(a=a, b=b, c=c, d=d, e=2 * a + 2 * rng.randint(2, 40)))
  return out


def all_prompts(config) -> list[str]:
  """The prompts of a data config, in a fixed order (the first num_prompts are used).

  config.prompts 'instructions' (default): specjax's instruction prompts, then docstring
  prompts; 'completions': completion_prompts of the training sources; 'completions+mixed':
  those and mixed_prompts, shuffled together.
  """
  kind = config.get('prompts', 'instructions')
  if kind in ('completions', 'completions+mixed'):
    sources = training_sources()
    np.random.default_rng(config.seed).shuffle(sources)
    prompts = completion_prompts(sources)
    if kind == 'completions+mixed':
      prompts += mixed_prompts(config.seed)
    np.random.default_rng(config.seed + 1).shuffle(prompts)
    return prompts
  from specjax.train import tfds_corpora

  prompts = tfds_corpora.texts('instructions', config.seed)  # instruction_prompts, via TFDS
  sources = training_sources()
  np.random.default_rng(config.seed).shuffle(sources)
  extra = docstring_prompts(sources, max(config.num_prompts - len(prompts), 0) * 2)
  np.random.default_rng(config.seed + 1).shuffle(extra)
  return prompts + extra


def data_dir(target, config) -> pathlib.Path:
  desc = json.dumps({'target': target.source, 'data': config.to_dict()}, sort_keys=True)
  key = hashlib.sha256(desc.encode()).hexdigest()[:16]
  base = pathlib.Path(config.cache_dir) if config.get('cache_dir') else assets.cache_dir()
  path = base / 'features' / f'{config.name}-{key}'
  path.mkdir(parents=True, exist_ok=True)
  return path


def responses(target, config, folder: pathlib.Path, progress=print) -> list[tuple]:
  """(prompt ids, answer ids) for config.num_prompts prompts, resumable (responses.jsonl)."""
  tok = target.tokenizer
  limit = config.max_prompt_tokens
  prompts = [p for p in all_prompts(config) if len(tok.encode_chat(p)) <= limit]
  prompts = prompts[: config.num_prompts]
  path = folder / 'responses.jsonl'
  done = []
  if path.exists():
    for line in path.read_text().splitlines():
      try:
        done.append(json.loads(line))
      except json.JSONDecodeError:  # a line cut by a kill: regenerate from there
        break
  todo = prompts[len(done) :]
  if not todo:
    return [tuple(r) for r in done[: len(prompts)]]
  start, made = time.time(), 0
  b = config.generate_batch
  with path.open('w') as f:
    for r in done:
      f.write(json.dumps(r) + '\n')
    for i in range(0, len(todo), b):
      chunk = todo[i : i + b]
      out = data_lib.generate_responses(target, chunk, config.max_new_tokens, b)
      for r in out:
        f.write(json.dumps(r) + '\n')
        made += len(r[1])
      f.flush()
      elapsed = time.time() - start
      progress(
        f'responses {len(done) + len(out)}/{len(prompts)}: {made} tokens in '
        f'{elapsed:.0f} s ({made / elapsed:.0f} tokens/s at batch {b})'
      )
      done += out
  return [tuple(r) for r in done]


def sequences(target, config, folder: pathlib.Path, progress=print) -> dict[str, np.ndarray]:
  """tokens, mask, source and is_eval arrays of every training and held-aside sequence."""
  path = folder / 'sequences.npz'
  if path.exists():
    with np.load(path) as f:
      return {a: f[a] for a in ARRAYS}
  tok, seq_len = target.tokenizer, config.seq_len
  rng = np.random.default_rng(config.seed)
  rows = []  # (tokens, mask, source, is_eval)
  answers = responses(target, config, folder, progress)
  for i, (p, a) in enumerate(answers):
    rows.append((*data_lib.pack(p, a, seq_len), 0, i >= len(answers) - config.eval_prompts))
  sources = training_sources()
  rng.shuffle(sources)
  code_ids = []
  for _, text in sources[: config.code_files]:
    code_ids += tok.encode(text[: config.max_file_chars]) + [tok.eos_id]
  picked = data_lib.chunks(code_ids, seq_len, config.code_chunks + config.eval_chunks, rng)
  for j, c in enumerate(picked):
    rows.append((*data_lib.pack(c, None, seq_len), 1, j < config.eval_chunks))
  if config.doc_chunks:
    doc_ids = tok.encode(data_lib.doc_text()[: config.max_doc_chars])
    picked = data_lib.chunks(doc_ids, seq_len, config.doc_chunks + config.eval_chunks, rng)
    for j, c in enumerate(picked):
      rows.append((*data_lib.pack(c, None, seq_len), 2, j < config.eval_chunks))
  out = {a: np.stack([np.asarray(r[i]) for r in rows]) for i, a in enumerate(ARRAYS)}
  np.savez(folder / 'sequences.tmp.npz', **out)
  (folder / 'sequences.tmp.npz').replace(path)
  return out


@dataclasses.dataclass
class FeatureSet:
  """Some rows of the sequences and of the target's features for them (memory-mapped
  arrays over every row; `rows` says which belong to this set; see the module doc)."""

  tokens: np.ndarray  # [N, T] int32
  mask: np.ndarray  # [N, T] bool: position t's next token is learned
  source: np.ndarray  # [N] index into data.SOURCES
  features: np.ndarray  # [N, T, C * D] float16
  hidden: np.ndarray  # [N, T, D] float16
  lse: np.ndarray  # [N, T] float32
  rows: np.ndarray  # [M] the rows of this set
  capture: tuple[int, ...]

  def __len__(self) -> int:
    return len(self.rows)

  def batch(self, index: np.ndarray) -> dict[str, np.ndarray]:
    """The arrays of rows[index] (sorted reads from the memory maps)."""
    rows = self.rows[np.asarray(index)]
    return {
      a: np.asarray(getattr(self, a)[rows]) for a in ('tokens', 'mask', 'source', *FEATURE_ARRAYS)
    }

  @property
  def num_tokens(self) -> int:
    return int(self.mask[self.rows].sum())


class Concat:
  """Several FeatureSets (of the same sequence length and capture) as one training set."""

  def __init__(self, sets: list[FeatureSet]):
    self.sets = sets
    self.capture = sets[0].capture
    self.offsets = np.cumsum([0] + [len(x) for x in sets])
    # Token and mask arrays of the selected rows only (small): what vocabulary() reads.
    self.tokens = np.concatenate([x.tokens[x.rows] for x in sets])
    self.mask = np.concatenate([x.mask[x.rows] for x in sets])
    self.source = np.concatenate([x.source[x.rows] for x in sets])
    self.rows = np.arange(len(self.tokens))

  def __len__(self) -> int:
    return int(self.offsets[-1])

  def batch(self, index: np.ndarray) -> dict[str, np.ndarray]:
    index = np.asarray(index)
    which = np.searchsorted(self.offsets, index, side='right') - 1
    parts = [
      (np.flatnonzero(which == i), x.batch(index[which == i] - self.offsets[i]))
      for i, x in enumerate(self.sets)
      if np.any(which == i)
    ]
    out = {}
    for key in parts[0][1]:
      value = np.empty((len(index),) + parts[0][1][key].shape[1:], parts[0][1][key].dtype)
      for where, part in parts:
        value[where] = part[key]
      out[key] = value
    return out

  @property
  def num_tokens(self) -> int:
    return int(self.mask.sum())


def label_features(target, tokens: np.ndarray, capture, folder, batch: int, progress=print):
  """Fills folder/{features,hidden,lse}.npy for `tokens` [N, T], resuming after a kill."""
  cfg = target.cfg
  n, t = tokens.shape
  d = cfg.d_model
  shapes = {
    'features': ((n, t, len(capture) * d), np.float16),
    'hidden': ((n, t, d), np.float16),
    'lse': ((n, t), np.float32),
  }
  marker = folder / 'labelled.json'
  saved = json.loads(marker.read_text()) if marker.exists() else {'rows': 0}
  if saved.get('capture', list(capture)) != list(capture):  # the folder's key leaves it out
    raise ValueError(
      f'{folder} holds the features of target layers {saved["capture"]}, not {list(capture)}: '
      'capture the same layers as the run that labelled it, or give the data another name'
    )
  done = saved['rows']
  arrays = {}
  for name, (shape, dtype) in shapes.items():
    path = folder / f'{name}.npy'
    mode = 'r+' if path.exists() and done else 'w+'
    arrays[name] = np.lib.format.open_memmap(path, mode=mode, dtype=dtype, shape=shape)
  if done >= n:
    return

  @jax.jit
  def label(params, toks):
    cache = cfg.family.init_cache(cfg, toks.shape[0], toks.shape[1], params['embed'].dtype)
    out = cfg.family.forward(params, toks, cache, cfg, capture=capture, head=False)
    hidden, feats = out.hidden, out.features
    logits = cfg.family.logits(params, hidden, cfg)
    lse = jax.nn.logsumexp(logits, axis=-1)
    return feats.astype(jnp.float16), hidden.astype(jnp.float16), lse

  params = jax.device_put(target.params)
  start = time.time()
  first = done
  for lo in range(done, n, batch):
    rows = tokens[lo : lo + batch]
    pad = batch - len(rows)
    if pad:
      rows = np.concatenate([rows, np.zeros((pad, t), rows.dtype)])
    out = jax.device_get(label(params, jnp.asarray(rows)))
    for name, value in zip(('features', 'hidden', 'lse'), out):
      arrays[name][lo : lo + batch - pad] = value[: batch - pad]
    for a in arrays.values():
      a.flush()
    done = lo + batch - pad
    marker.write_text(json.dumps({'rows': done, 'capture': list(capture)}))
    elapsed = time.time() - start
    progress(f'target features {done}/{n} sequences ({(done - first) * t / elapsed:.0f} tokens/s)')


def build(target, config, capture: tuple[int, ...], progress=print):
  """(train, eval) FeatureSets for the `data` part of a feature-head config."""
  folder = data_dir(target, config)
  seqs = sequences(target, config, folder, progress)
  label_features(target, seqs['tokens'], capture, folder, config.label_batch, progress)
  arrays = {a: np.load(folder / f'{a}.npy', mmap_mode='r') for a in FEATURE_ARRAYS}
  make = lambda rows: FeatureSet(
    tokens=seqs['tokens'],
    mask=seqs['mask'],
    source=seqs['source'],
    rows=rows,
    capture=tuple(capture),
    **arrays,
  )
  is_eval = seqs['is_eval']
  return make(np.flatnonzero(~is_eval)), make(np.flatnonzero(is_eval))
