"""Models on the Hugging Face Hub: `hf:<org>/<name>[@<revision>]` (a transformers directory:
config.json, safetensors, tokenizer.json) or `hf:<org>/<name>/<file>.gguf[@<revision>]` (one
GGUF file of the repository), fetched through huggingface_hub into the user's cache, with
the user's token (`hf auth login` or HF_TOKEN) and HF_HUB_OFFLINE honoured. A revision (a
branch, tag or commit) pins what is read; without one, the repository's main branch.

Every failure the Hub can give (no such repository, gated or private, no such revision or
file, no network and nothing cached) is one line naming the spec, raised before any weight
is downloaded.
"""

from __future__ import annotations

import dataclasses
import re

PREFIX = 'hf:'
USAGE = 'hf:<org>/<name>[@<revision>] or hf:<org>/<name>/<file>.gguf[@<revision>]'
# What a transformers directory needs (and what load_hf reads); nothing else is fetched.
DIRECTORY_FILES = (
  'config.json',
  '*.safetensors',
  '*.safetensors.index.json',
  'tokenizer.json',
  'tokenizer_config.json',
)
_NAME = re.compile(r'^[A-Za-z0-9][A-Za-z0-9._-]*$')


@dataclasses.dataclass(frozen=True)
class HubModel:
  repo_id: str
  revision: str | None  # None: the main branch
  filename: str | None  # a .gguf file inside the repository, or None for the directory


def is_hub(spec: str) -> bool:
  return isinstance(spec, str) and spec.startswith(PREFIX)


def parse(spec: str) -> HubModel:
  """'hf:org/name[/file.gguf][@revision]' -> HubModel; anything else is a ValueError."""
  body, _, revision = spec[len(PREFIX) :].partition('@')
  parts = body.split('/')
  filename = '/'.join(parts[2:]) or None
  bad = (
    len(parts) < 2
    or not all(_NAME.match(p) and '--' not in p and '..' not in p for p in parts[:2])
    or parts[1].endswith('.git')
    or not all(parts[2:])  # no empty path segment ('hf:org/x/', 'hf:org/x//a.gguf')
    or (filename is not None and not filename.endswith('.gguf'))
    or ('@' in spec and not revision)
    or '@' in revision
  )
  if bad:
    raise ValueError(f'bad Hugging Face model {spec!r}: expected {USAGE}')
  return HubModel('/'.join(parts[:2]), revision or None, filename)


def fetch(spec: str) -> str:
  """The local path of `spec` (a directory, or a .gguf file), downloaded into the Hugging
  Face cache if it is not there yet."""
  import huggingface_hub  # noqa: PLC0415 (only hf: specs need it)
  from huggingface_hub import errors  # noqa: PLC0415

  model = parse(spec)
  where = f'https://huggingface.co/{model.repo_id}'
  login = 'log in with `hf auth login` or set HF_TOKEN'
  try:
    if model.filename:
      return huggingface_hub.hf_hub_download(model.repo_id, model.filename, revision=model.revision)
    return huggingface_hub.snapshot_download(
      model.repo_id, revision=model.revision, allow_patterns=list(DIRECTORY_FILES)
    )
  except errors.GatedRepoError:
    raise ValueError(
      f'{spec}: the repository is gated: accept its terms at {where}, then {login}'
    ) from None
  except errors.RevisionNotFoundError:
    raise ValueError(f'{spec}: {model.repo_id} has no revision {model.revision!r}') from None
  except errors.RepositoryNotFoundError:
    raise ValueError(
      f'{spec}: no repository {model.repo_id} on the Hugging Face Hub (if it is private, {login})'
    ) from None
  except errors.LocalEntryNotFoundError:  # (an EntryNotFoundError too: before it)
    raise ValueError(
      f'{spec}: not in the Hugging Face cache, and the Hub cannot be reached (offline, or '
      'HF_HUB_OFFLINE is set)'
    ) from None
  except errors.EntryNotFoundError:
    raise ValueError(f'{spec}: {model.repo_id} has no file {model.filename!r}') from None
  except errors.HfHubHTTPError as e:
    raise ValueError(f'{spec}: the Hugging Face Hub answered {e}'.splitlines()[0]) from None
