"""Draft distillation: optax AdamW, a jitted train step, orbax checkpoints that resume.

    train(config, workdir)   # what `python -m specjax.train_draft` runs

The run keeps in `workdir`:
  checkpoints/     orbax CheckpointManager: {'step', 'params', 'opt_state'} every
                   `checkpoint_every` steps and on exit (also on SIGTERM / Ctrl-C). A new
                   run in the same workdir resumes from the latest one.
  metrics.jsonl    one JSON object per logged step (train) and per evaluation (eval).
  loss.png, acceptance.png
  draft/           the trained draft (specjax.checkpoints.draft_dir format).

Resuming is exact: data order is a function of the step (data.batch_indices), the step's
key is fold_in(key, step), and the restored optimizer state is the saved one, so a run
killed at any moment and restarted ends with the parameters of an uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
import pathlib
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import tqdm

from specjax import registry
from specjax.checkpoints import draft_dir
from specjax.drafters import distilled
from specjax.train import data as data_lib
from specjax.train import dflash_block, dspark_heads, eagle_head
from specjax.train.task import Task, make_optimizer, optimizer_step

log = logging.getLogger(__name__)


def teacher_dense(topk_ids, topk_probs, full_to_sub, size: int) -> jax.Array:
  """The teacher's top-k probabilities as a dense [B, T, K] distribution over the draft
  vocabulary (renormalised: the draft can put no mass elsewhere)."""
  b, t, k = topk_ids.shape
  sub = full_to_sub[topk_ids]  # [B, T, k]; `size` where outside the draft vocabulary
  rows = jnp.arange(b)[:, None, None]
  cols = jnp.arange(t)[None, :, None]
  p = (
    jnp.zeros((b, t, size), jnp.float32)
    .at[rows, cols, sub]
    .add(topk_probs.astype(jnp.float32), mode='drop')
  )
  return p / jnp.maximum(p.sum(-1, keepdims=True), 1e-6)


def draft_logits(params, frozen, tokens, cfg):
  """Draft logits [B, T, K] for whole sequences (teacher forcing)."""
  cache = cfg.family.init_cache(cfg, tokens.shape[0], tokens.shape[1], frozen['embed'].dtype)
  logits, _ = distilled.subset_logits({**params, **frozen}, tokens, cache, cfg)
  return logits


def loss_fn(params, frozen, batch, key, cfg, divergence: str, position_keep: float):
  logits = draft_logits(params, frozen, batch['tokens'], cfg)
  size = logits.shape[-1]
  p = teacher_dense(batch['topk_ids'], batch['topk_probs'], frozen['full_to_sub'], size)
  div = registry.DIVERGENCES.get(divergence)(p, logits)  # [B, T]
  mask = batch['mask'].astype(jnp.float32)
  if position_keep < 1:  # random subset of positions per step
    mask = mask * jax.random.bernoulli(key, position_keep, mask.shape)
  loss = jnp.sum(div * mask) / jnp.maximum(mask.sum(), 1.0)
  agree = (jnp.argmax(logits, -1) == jnp.argmax(p, -1)).astype(jnp.float32)
  return loss, {'agreement': jnp.sum(agree * mask) / jnp.maximum(mask.sum(), 1.0)}


def make_train_step(cfg, optimizer, divergence: str, position_keep: float = 1.0):
  """A jitted (state, frozen, batch, key) -> (state, metrics)."""
  loss = functools.partial(loss_fn, cfg=cfg, divergence=divergence, position_keep=position_keep)
  return optimizer_step(loss, optimizer)


def make_eval_step(cfg):
  """A jitted (params, frozen, batch) -> per-position [B, T] greedy match and T=1 acceptance.

  Greedy match: the draft's argmax is the target's. T=1 acceptance: sum over tokens of
  min(p, q), the probability that rejection sampling accepts the draft's token (p known
  on the teacher's top-k only, so this is a slight underestimate).
  """

  @jax.jit
  def step(params, frozen, batch):
    logits = draft_logits(params, frozen, batch['tokens'], cfg)
    q = jax.nn.softmax(logits, -1)
    sub = frozen['full_to_sub'][batch['topk_ids']]  # [B, T, k]
    q_at = jnp.take_along_axis(q, jnp.minimum(sub, q.shape[-1] - 1), -1)
    q_at = jnp.where(sub < q.shape[-1], q_at, 0.0)
    accept = jnp.sum(jnp.minimum(batch['topk_probs'].astype(jnp.float32), q_at), -1)
    draft_top = frozen['vocab_ids'][jnp.argmax(logits, -1)]
    greedy = (draft_top == batch['topk_ids'][..., 0]).astype(jnp.float32)
    return greedy, accept

  return step


def evaluate(eval_step, params, frozen, dataset: data_lib.Dataset, batch_size: int) -> dict:
  """Mean greedy match and T=1 acceptance over `dataset`'s masked positions, per source."""
  greedy, accept = [], []
  for start in range(0, len(dataset), batch_size):
    batch = as_batch(dataset.take(np.arange(start, min(start + batch_size, len(dataset)))))
    g, a = eval_step(params, frozen, batch)
    greedy.append(np.asarray(g))
    accept.append(np.asarray(a))
  greedy, accept = np.concatenate(greedy), np.concatenate(accept)
  out = {}
  for s, name in enumerate(data_lib.SOURCES):
    rows = dataset.source == s
    m = dataset.mask[rows]
    if m.any():
      out[f'greedy_{name}'] = float(greedy[rows][m].mean())
      out[f'accept_t1_{name}'] = float(accept[rows][m].mean())
  out['greedy'] = float(greedy[dataset.mask].mean())
  out['accept_t1'] = float(accept[dataset.mask].mean())
  return out


def as_batch(ds: data_lib.Dataset) -> dict:
  return {
    'tokens': ds.tokens,
    'mask': ds.mask,
    'topk_ids': ds.topk_ids,
    'topk_probs': ds.topk_probs,
  }


class MetricsLog:
  """metrics.jsonl: appends records; on resume drops those past the restored step."""

  def __init__(self, path: pathlib.Path, resume_step: int):
    self.path = path
    self.records = []
    if path.exists():
      lines = path.read_text().splitlines()
      for i, line in enumerate(lines):
        try:
          r = json.loads(line)
        except ValueError:
          if i == len(lines) - 1:  # cut while it was written (a kill): logged again
            break
          raise ValueError(f'{path}, line {i + 1}: not JSON (a damaged metrics log)') from None
        if r['step'] <= resume_step:
          self.records.append(r)
    path.write_text(''.join(json.dumps(r) + '\n' for r in self.records))

  def write(self, record: dict) -> None:
    self.records.append(record)
    with self.path.open('a') as f:
      f.write(json.dumps(record) + '\n')

  def plot(self, workdir: pathlib.Path) -> None:
    from matplotlib.figure import Figure  # no pyplot: a notebook's backend stays as it is

    train = [r for r in self.records if r['kind'] == 'train']
    evals = [r for r in self.records if r['kind'] == 'eval']
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    ax.plot([r['step'] for r in train], [r['loss'] for r in train], label='train loss')
    ax.set_xlabel('step')
    ax.set_ylabel('divergence')
    ax.set_yscale('log')
    ax.legend()
    fig.tight_layout()
    fig.savefig(workdir / 'loss.png', dpi=100)
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    keys = sorted({k for r in evals for k in r if k.startswith(('greedy', 'accept_t1'))})
    for k in keys:
      ax.plot([r['step'] for r in evals], [r.get(k, np.nan) for r in evals], marker='.', label=k)
    ax.set_xlabel('step')
    ax.set_ylabel('acceptance on held-aside data')
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(workdir / 'acceptance.png', dpi=100)


class _Stop(Exception):
  pass


class _NonFinite(Exception):
  pass


def _raise_stop(signum, frame):
  raise _Stop(signum)


@dataclasses.dataclass
class Setup:
  """Everything a run needs before its first step (also what tests and notebooks use)."""

  target: object
  train_data: data_lib.Dataset
  eval_data: data_lib.Dataset
  cfg: object  # the draft's LlamaConfig
  init_params: dict  # trained groups only
  frozen: dict  # embed, vocab_ids, full_to_sub
  vocab_coverage: dict


def setup(config, progress=print) -> Setup:
  from specjax.checkpoints.loader import load_model

  target = load_model(config.target)
  train_data, eval_data = data_lib.build(target, config.data, progress=progress)
  v = target.cfg.vocab_size
  vocab_ids = data_lib.draft_vocabulary(
    train_data, v, config.draft.vocab_size, always=(target.tokenizer.eos_id,)
  )
  cov = data_lib.coverage(eval_data, vocab_ids)
  layers = tuple(int(i) % target.cfg.n_layers for i in config.draft.init_layers)
  cfg, params = distilled.init_from_target(
    target.cfg, target.params, layers, vocab_ids, config.draft.ffn_dim or None
  )
  full_to_sub = np.full(v, len(vocab_ids), np.int32)
  full_to_sub[vocab_ids] = np.arange(len(vocab_ids), dtype=np.int32)
  frozen = {
    'embed': jnp.asarray(params.pop('embed')),
    'vocab_ids': jnp.asarray(params.pop('vocab_ids')),
    'full_to_sub': jnp.asarray(full_to_sub),
  }
  params = jax.tree.map(jnp.asarray, params)
  return Setup(target, train_data, eval_data, cfg, params, frozen, cov)


def distill_task(config, progress=print) -> Task:
  """The distilled draft (DistillSpec) as a Task."""
  s = setup(config, progress)
  optimizer = make_optimizer(config)
  eval_step = make_eval_step(s.cfg)

  def batch(step):
    idx = data_lib.batch_indices(len(s.train_data), config.batch_size, step, config.seed)
    return as_batch(s.train_data.take(idx))

  def save(workdir, params, steps, evals):
    params = {**jax.tree.map(np.asarray, params), 'vocab_ids': np.asarray(s.frozen['vocab_ids'])}
    info = {
      'target': s.target.source,
      'divergence': config.divergence,
      'steps': steps,
      'init_layers': list(config.draft.init_layers),
      'coverage': s.vocab_coverage,
    }
    draft_dir.save_draft(workdir / 'draft', s.cfg, params, info)

  return Task(
    describe=(
      f'data: {len(s.train_data)} train sequences ({s.train_data.num_tokens} tokens), '
      f'{len(s.eval_data)} eval; draft vocabulary {config.draft.vocab_size} covers '
      f"{s.vocab_coverage['argmax']:.3f} of the target's argmax tokens on eval data"
    ),
    init_params=s.init_params,
    frozen=s.frozen,
    train_step=make_train_step(s.cfg, optimizer, config.divergence, config.position_keep),
    optimizer=optimizer,
    evaluate=lambda params: evaluate(eval_step, params, s.frozen, s.eval_data, config.eval_batch),
    batch=batch,
    save=save,
    summary=lambda ev: (
      f'held-aside greedy match {ev["greedy"]:.3f}, T=1 acceptance {ev["accept_t1"]:.3f}'
    ),
  )


# What a resumed run may change: how long it runs and how often it logs and saves.
RESUMABLE = ('num_steps', 'log_every', 'eval_every', 'checkpoint_every', 'keep_checkpoints')


def _check(condition: bool, field: str, value, expected: str) -> None:
  if not condition:
    raise ValueError(f'config.{field} = {value!r}: expected {expected}')


def check_config(config) -> None:
  """The loop's settings, before the target loads or any data is built."""
  for field, low in (
    ('batch_size', 1),
    ('num_steps', 1),
    ('log_every', 1),
    ('eval_every', 0),
    ('eval_batch', 1),
    ('checkpoint_every', 1),
    ('keep_checkpoints', 1),
  ):
    value = config.get(field)
    _check(
      isinstance(value, int) and not isinstance(value, bool) and value >= low,
      field,
      value,
      f'an integer >= {low}',
    )
  lr = config.optim.lr
  _check(isinstance(lr, (int, float)) and 0 < lr < math.inf, 'optim.lr', lr, 'a finite rate > 0')


def check_resume(config, workdir: pathlib.Path) -> None:
  """A workdir's saved config.json against this config: a resumed run must train the same
  draft on the same data (only RESUMABLE fields may change); a new one is written."""
  saved = workdir / 'config.json'
  now = json.loads(config.to_json_best_effort())
  if saved.exists() and (workdir / 'checkpoints').exists():
    before = json.loads(saved.read_text())
    changed = sorted(
      k for k in before.keys() | now.keys() if k not in RESUMABLE and before.get(k) != now.get(k)
    )
    if changed:
      raise ValueError(
        f'{workdir} holds a run of another config (changed: {", ".join(changed)}): resuming '
        'would mix two trainings; pass another --workdir (only '
        f'{", ".join(RESUMABLE)} may change on resume)'
      )
  tmp = saved.with_suffix('.json.tmp')
  tmp.write_text(json.dumps(now, indent=2) + '\n')
  os.replace(tmp, saved)


def _checkpoints(config, workdir: pathlib.Path, state: dict):
  """(the run's orbax CheckpointManager, `state` or the latest checkpoint's restored)."""
  options = ocp.CheckpointManagerOptions(
    max_to_keep=config.keep_checkpoints,
    save_interval_steps=config.checkpoint_every,
    enable_async_checkpointing=False,
  )
  manager = ocp.CheckpointManager(workdir / 'checkpoints', options=options)
  start = manager.latest_step()
  if start is not None:
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    state = manager.restore(start, args=ocp.args.StandardRestore(abstract))
    print(f'resumed from step {start}', flush=True)
  return manager, state


def _log_train(metrics_log, bar, metrics: dict, step: int, rate: float, tokens: int) -> None:
  """Writes a training record (the step's metrics, tokens/s, tokens so far) and shows it."""
  metrics = {k: float(v) for k, v in metrics.items()}
  metrics_log.write(
    {'kind': 'train', 'step': step, 'tokens_per_s': rate, 'tokens': tokens, **metrics}
  )
  bar.set_postfix(loss=f'{metrics["loss"]:.4f}', tok_s=f'{rate:.0f}')


# Kinds of trainable draft (config.kind) -> config -> Task.
TASKS = {
  'distilled': distill_task,
  'eagle': eagle_head.task,
  'dflash': dflash_block.task,
  'dspark': dspark_heads.task,
}


def train(config, workdir: str | os.PathLike, progress_bar: bool = True) -> dict:
  """Trains (or resumes) a draft per `config` in `workdir`; returns the final evaluation.

  `config.kind` picks the draft: 'distilled' (default), 'eagle' (a feature head),
  'dflash' (a block drafter) or 'dspark' (a block drafter with DSpark's heads).
  """
  check_config(config)
  workdir = pathlib.Path(workdir).absolute()
  workdir.mkdir(parents=True, exist_ok=True)
  check_resume(config, workdir)
  kind = config.get('kind', 'distilled')
  if kind not in TASKS:
    raise ValueError(
      f'config.kind: unknown draft kind {kind!r}, expected one of {", ".join(map(repr, TASKS))}'
    )
  task = TASKS[kind](config)
  print(task.describe, flush=True)
  state = {
    'step': jnp.zeros((), jnp.int32),
    'params': task.init_params,
    'opt_state': task.optimizer.init(task.init_params),
  }
  manager, state = _checkpoints(config, workdir, state)
  start = int(state['step'])
  metrics_log = MetricsLog(workdir / 'metrics.jsonl', start)
  key = jax.random.key(config.seed)
  if start == 0 and config.eval_every:
    metrics_log.write({'kind': 'eval', 'step': 0, **task.evaluate(state['params'])})
  old_handler = signal.signal(signal.SIGTERM, _raise_stop)
  bar = tqdm.tqdm(
    total=config.num_steps, initial=start, disable=not progress_bar, dynamic_ncols=True
  )
  step, tokens_seen, t0 = start, 0, time.perf_counter()
  diverged = None  # a non-finite loss: training stops at the last finite state
  try:
    for step in range(start, config.num_steps):
      batch = task.batch(step)
      state, metrics = task.train_step(state, task.frozen, batch, jax.random.fold_in(key, step))
      if not bool(metrics.pop('finite', True)):
        raise _NonFinite(f'step {step + 1}: loss {float(metrics["loss"])}')
      tokens_seen += batch['tokens'].size
      done = step + 1
      if done % config.log_every == 0 or done == config.num_steps:
        rate = tokens_seen / (time.perf_counter() - t0)
        _log_train(metrics_log, bar, metrics, done, rate, done * int(batch['tokens'].size))
      if config.eval_every and (done % config.eval_every == 0 or done == config.num_steps):
        ev = task.evaluate(state['params'])
        metrics_log.write({'kind': 'eval', 'step': done, **ev})
        bar.write(f'step {done}: {task.summary(ev)}')
        metrics_log.plot(workdir)
      manager.save(done, args=ocp.args.StandardSave(state))
      bar.update(1)
  except (_Stop, KeyboardInterrupt):
    print(f'stopping at step {int(state["step"])}: saving a checkpoint', flush=True)
  except _NonFinite as e:
    diverged = f'{e}, gradient norm {float(metrics["grad_norm"])}'
  finally:
    signal.signal(signal.SIGTERM, old_handler)
    bar.close()
    final = int(state['step'])
    if manager.latest_step() != final:
      manager.save(final, args=ocp.args.StandardSave(state), force=True)
    manager.wait_until_finished()
    manager.close()
  metrics_log.plot(workdir)
  evals = [r for r in metrics_log.records if r['kind'] == 'eval']
  task.save(workdir, state['params'], final, evals)
  if diverged:
    raise ValueError(
      f'training diverged at {diverged} (not finite): stopped; the checkpoint and the draft in '
      f'{workdir} are those of step {final}, the last finite one (a lower learning rate?)'
    )
  return evals[-1] if evals else {}
