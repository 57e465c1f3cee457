"""What a kind of trainable draft gives the training loop (`Task`), and the optimizer
pieces every kind shares. The bottom of specjax/train's loop: the distilled draft
(trainer.distill_task) and the EAGLE head (eagle_head.task) build Tasks from these, and
trainer.train runs whichever `TASKS` (trainer.py) names.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax


def make_optimizer(config) -> optax.GradientTransformation:
  """Gradient clipping, then AdamW with linear warm-up and cosine decay."""
  o = config.optim
  schedule = optax.warmup_cosine_decay_schedule(
    init_value=0.0,
    peak_value=o.lr,
    warmup_steps=o.warmup_steps,
    decay_steps=max(config.num_steps, o.warmup_steps + 1),
    end_value=o.lr * o.end_lr_fraction,
  )
  return optax.chain(
    optax.clip_by_global_norm(o.clip_norm),
    optax.adamw(schedule, b1=o.b1, b2=o.b2, weight_decay=o.weight_decay),
  )


def optimizer_step(loss, optimizer):
  """A jitted (state, frozen, batch, key) -> (state, metrics) for any
  loss(params, frozen, batch, key) -> (loss, metrics): one optax update. A step whose loss,
  gradients or new parameters are not finite returns the state unchanged, with
  metrics['finite'] False."""
  grad_fn = jax.value_and_grad(loss, has_aux=True)

  @functools.partial(jax.jit, donate_argnums=0)
  def step(state, frozen, batch, key):
    (loss, aux), grads = grad_fn(state['params'], frozen, batch, key)
    updates, opt_state = optimizer.update(grads, state['opt_state'], state['params'])
    params = optax.apply_updates(state['params'], updates)
    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & jnp.isfinite(optax.global_norm(params))
    metrics = {'loss': loss, 'grad_norm': grad_norm, 'finite': finite, **aux}
    new = {'step': state['step'] + 1, 'params': params, 'opt_state': opt_state}
    return jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, state), metrics

  return step


@dataclasses.dataclass
class Task:
  """What `train` needs of a kind of draft: its parameters, steps, data and saving.

  The distilled draft (`distill_task`) and the EAGLE head (specjax.train.eagle_head.task)
  share the loop of specjax/train/trainer.py: checkpoints, resume, progress, metrics and plots.
  """

  describe: str  # printed before the first step
  init_params: dict  # trained parameters
  frozen: dict  # arrays the steps read but do not train
  train_step: Callable  # jitted (state, frozen, batch, key) -> (state, metrics)
  optimizer: optax.GradientTransformation
  evaluate: Callable  # params -> dict of held-aside metrics
  batch: Callable  # step -> the batch of that step (a pure function of it)
  save: Callable  # (workdir, params, steps, eval records) -> None: the trained draft
  summary: Callable  # eval dict -> one line for the progress bar
