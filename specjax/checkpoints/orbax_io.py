"""Parameter trees saved and restored with orbax-checkpoint, with the LlamaConfig beside them.

    save_params(directory, params, cfg)
    cfg, params = restore_params(directory)

A checkpoint is one orbax directory with two items: `params` (StandardCheckpointHandler, the
arrays with their dtypes) and `config` (JsonCheckpointHandler, the LlamaConfig fields; absent
when saved without a config). Saving is atomic: orbax writes a temporary directory and renames
it when complete.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

import jax
import orbax.checkpoint as ocp

from specjax.models.llama import LlamaConfig, Params, check_params

_PARAMS = 'params'
_CONFIG = 'config'


def _checkpointer() -> ocp.Checkpointer:
  handlers = {_PARAMS: ocp.StandardCheckpointHandler(), _CONFIG: ocp.JsonCheckpointHandler()}
  return ocp.Checkpointer(ocp.CompositeCheckpointHandler(**handlers))


def save_params(
  directory: str | os.PathLike,
  params: Params,
  cfg: LlamaConfig | None = None,
  overwrite: bool = False,
) -> pathlib.Path:
  """Saves `params` (numpy or jax arrays) and, if given, `cfg` as a checkpoint at `directory`.

  Raises:
    ValueError: `params` do not match `cfg`, or `directory` exists and not `overwrite`.
  """
  directory = pathlib.Path(directory).absolute()
  if cfg is not None:
    check_params(cfg, params, source=str(directory))
  if directory.exists() and not overwrite:
    raise ValueError(f'checkpoint directory {directory} already exists (pass overwrite=True)')
  items = {_PARAMS: ocp.args.StandardSave(params)}
  if cfg is not None:
    items[_CONFIG] = ocp.args.JsonSave(dataclasses.asdict(cfg))
  _checkpointer().save(directory, args=ocp.args.Composite(**items), force=overwrite)
  return directory


def _lists(tree: Any) -> Any:
  """Turns dicts keyed '0'..'n-1' (how some orbax versions store lists) back into lists."""
  if isinstance(tree, dict):
    tree = {k: _lists(v) for k, v in tree.items()}
    if tree and set(tree) == {str(i) for i in range(len(tree))}:
      return [tree[str(i)] for i in range(len(tree))]
  elif isinstance(tree, (list, tuple)):
    return [_lists(v) for v in tree]
  return tree


def _abstract(cfg: LlamaConfig, stored: Any) -> Params:
  """Restore target: the tree of `cfg.param_shapes()` (lists stay lists) with stored dtypes."""
  return jax.tree.map(
    lambda shape, meta: jax.ShapeDtypeStruct(shape, meta.dtype),
    cfg.param_shapes(),
    stored,
    is_leaf=lambda x: isinstance(x, tuple),
  )


def restore_params(
  directory: str | os.PathLike, cfg: LlamaConfig | None = None
) -> tuple[LlamaConfig | None, Params]:
  """Restores (config, params) saved by `save_params`.

  Args:
    directory: the checkpoint directory.
    cfg: the config to restore for; None uses the config saved beside the params (and, when none
      was saved, restores the stored tree as it is and returns None for the config).

  Returns:
    (cfg, params), the leaves with their saved dtypes.

  Raises:
    FileNotFoundError: `directory` does not exist.
    ValueError: the stored parameters do not match `cfg`.
  """
  directory = pathlib.Path(directory).absolute()
  if not directory.is_dir():
    raise FileNotFoundError(f'checkpoint directory not found: {directory}')
  checkpointer = _checkpointer()
  metadata = checkpointer.metadata(directory).item_metadata
  if cfg is None and _CONFIG in metadata:
    saved = checkpointer.restore(
      directory, args=ocp.args.Composite(**{_CONFIG: ocp.args.JsonRestore()})
    )[_CONFIG]
    cfg = LlamaConfig(**saved)
  stored = _lists(metadata[_PARAMS].tree)
  if cfg is None:
    target = None
  else:
    check_params(cfg, stored, source=str(directory))
    target = _abstract(cfg, stored)
  restored = checkpointer.restore(
    directory, args=ocp.args.Composite(**{_PARAMS: ocp.args.StandardRestore(target)})
  )
  return cfg, restored[_PARAMS]
