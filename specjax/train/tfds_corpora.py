"""The training corpora as TensorFlow Datasets, built offline and read without TensorFlow.

One builder, `specjax_corpus`, whose examples are {'name', 'text'}, in a fixed order:

  instructions-seed<N>  the distillation and feature-head instruction prompts
                        (specjax.train.prompts.instruction_prompts(N)); name: the index
  stdlib-py<XY>         this interpreter's pure-Python standard library sources (the code
                        the drafts learn from); name: the path under the stdlib folder
  docs-py<XY>           its documentation topics (pydoc_data.topics); name: the topic

They are written as ArrayRecord files under `$SPECJAX_CACHE/tfds` on first use (the same
folder as the prompt sets, specjax/data/tfds_prompts.py) and read by index with
`tfds.data_source`, so a resumed run reads exactly the entries an uninterrupted one would.
The distillation data (specjax/train/data.py) and the feature-head prompts
(specjax/train/feature_data.py) read their texts through `texts`.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
import sysconfig

import tensorflow_datasets as tfds

from specjax.data import tfds_prompts

VERSION = '1.0.0'
PYTHON = f'py{sys.version_info.major}{sys.version_info.minor}'


@dataclasses.dataclass(eq=False)  # as tfds.core.BuilderConfig
class CorpusConfig(tfds.core.BuilderConfig):
  """A corpus: `kind` 'instructions' (with `seed`), 'stdlib' or 'docs'."""

  kind: str = ''
  seed: int = 0


def corpus_config(kind: str, seed: int = 0) -> CorpusConfig:
  """The config of a corpus; the stdlib and docs name this interpreter's version."""
  if kind == 'instructions':
    name = f'instructions-seed{seed}'
  elif kind in ('stdlib', 'docs'):
    name = f'{kind}-{PYTHON}'
  else:
    raise ValueError(f"unknown corpus {kind!r}; corpora: 'instructions', 'stdlib', 'docs'.")
  return CorpusConfig(
    name=name, version=VERSION, description=f'the {kind} corpus', kind=kind, seed=seed
  )


class SpecjaxCorpus(tfds.core.GeneratorBasedBuilder):
  """specjax's training corpora (see the module docstring)."""

  VERSION = tfds.core.Version(VERSION)
  BUILDER_CONFIGS = [corpus_config('instructions'), corpus_config('stdlib'), corpus_config('docs')]

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
      builder=self,
      description=__doc__.split('\n\n')[0],
      features=tfds.features.FeaturesDict(
        {'name': tfds.features.Text(), 'text': tfds.features.Text()}
      ),
      disable_shuffling=True,  # the corpus order (training shuffles with its own seed)
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # everything is generated or read from this interpreter
    return {'train': self._generate_examples()}

  def _generate_examples(self):
    for i, (name, text) in enumerate(_entries(self.builder_config)):
      yield i, {'name': name, 'text': text}


def stdlib_files() -> list[pathlib.Path]:
  """The interpreter's pure-Python standard library, tests and bundled apps left out, sorted."""
  root = pathlib.Path(sysconfig.get_paths()['stdlib'])
  skip = {
    'test',
    'tests',
    'idlelib',
    'lib2to3',
    'site-packages',
    'turtledemo',
    'pydoc_data',
    'ensurepip',
    'tkinter',
    'unittest',
  }
  return sorted(f for f in root.rglob('*.py') if not skip & set(f.relative_to(root).parts))


def _entries(config: CorpusConfig) -> list[tuple[str, str]]:
  from specjax.train import prompts

  if config.kind == 'instructions':
    return [(str(i), p) for i, p in enumerate(prompts.instruction_prompts(config.seed))]
  if config.kind == 'stdlib':
    root = pathlib.Path(sysconfig.get_paths()['stdlib'])
    return [(f.relative_to(root).as_posix(), f.read_text(errors='replace')) for f in stdlib_files()]
  from pydoc_data import topics

  return [(k, topics.topics[k]) for k in sorted(topics.topics)]


def source(kind: str, seed: int = 0, folder: str | pathlib.Path | None = None):
  """The `tfds.data_source` of a corpus (random access by index), built on first use."""
  folder = str(folder or tfds_prompts.data_dir())
  config = corpus_config(kind, seed)
  listed = {c.name for c in SpecjaxCorpus.BUILDER_CONFIGS}
  config = config.name if config.name in listed else config  # tfds wants its listed objects
  make = lambda: SpecjaxCorpus(config=config, data_dir=folder, file_format='array_record')
  return tfds_prompts.prepare(make, folder).as_data_source(split='train')


def texts(kind: str, seed: int = 0, folder: str | pathlib.Path | None = None) -> list[str]:
  """Every text of a corpus, in its order."""
  data = source(kind, seed, folder)
  return [data[i]['text'].decode() for i in range(len(data))]


def names(kind: str, seed: int = 0, folder: str | pathlib.Path | None = None) -> list[str]:
  """Every name of a corpus, in its order (for the stdlib: paths under the stdlib folder)."""
  data = source(kind, seed, folder)
  return [data[i]['name'].decode() for i in range(len(data))]
