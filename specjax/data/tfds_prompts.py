"""specjax's prompt sets as TensorFlow Datasets, built offline and read without TensorFlow.

One builder, `specjax_prompts`, with a config per set:

  humaneval    the 164 HumanEval tasks as instructions (from the pinned asset)
  mtbench      the 80 MT-Bench questions, every turn (from the pinned asset)
  code_edit    the editing prompts built from this Python's standard library
  specbench-<sha256 of the file, 12 digits>
               a Spec-Bench question.jsonl of the user's (see specjax/data/specbench.py); the
               name changes with the file, so an edited file builds anew

Each example is {'id', 'text' (the first user turn), 'category', 'turns' (every user turn)},
kept in file order (`disable_shuffling`). The sets are written as ArrayRecord files under
`$SPECJAX_CACHE/tfds` on first use and read with `tfds.data_source`: random access, no
TensorFlow (tensorflow-datasets builds and reads ArrayRecord with numpy alone). The harness
reads its prompt sets through `read` (specjax/data/prompts.py); `specjax.datasets` registers
this builder and the training corpora's for `tfds.builder` / `tfds.data_source`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import io
import logging
import pathlib

import tensorflow_datasets as tfds

from specjax.data import assets, parse

VERSION = '1.0.0'
SETS = ('humaneval', 'mtbench', 'code_edit')


def data_dir() -> pathlib.Path:
  """Where specjax's TFDS datasets are written: `$SPECJAX_CACHE/tfds` (assets.cache_dir)."""
  return assets.cache_dir() / 'tfds'


@dataclasses.dataclass(eq=False)  # as tfds.core.BuilderConfig
class PromptSetConfig(tfds.core.BuilderConfig):
  """A prompt set; `path` only for a Spec-Bench file (its sha256 is in the name)."""

  path: str = ''


def specbench_config(path: str | pathlib.Path) -> PromptSetConfig:
  """The config of a Spec-Bench question file: named by the first 12 digits of its sha256."""
  digest = hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()[:12]
  return PromptSetConfig(
    name=f'specbench-{digest}',
    version=VERSION,
    description=f'Spec-Bench questions from {path}',
    path=str(path),
  )


class SpecjaxPrompts(tfds.core.GeneratorBasedBuilder):
  """specjax's evaluation prompt sets (see the module docstring)."""

  VERSION = tfds.core.Version(VERSION)
  BUILDER_CONFIGS = [
    PromptSetConfig(name=name, version=VERSION, description=f'the {name} prompt set')
    for name in SETS
  ]

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
      builder=self,
      description=__doc__.split('\n\n')[0],
      features=tfds.features.FeaturesDict(
        {
          'id': tfds.features.Text(),
          'text': tfds.features.Text(),
          'category': tfds.features.Text(),
          'turns': tfds.features.Sequence(tfds.features.Text()),
        }
      ),
      disable_shuffling=True,  # file order is part of the data (num_prompts keeps the first N)
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # everything is local: pinned assets, the stdlib, or the user's file
    return {'test': self._generate_examples()}

  def _generate_examples(self):
    for i, p in enumerate(_source_prompts(self.builder_config)):
      yield (
        i,
        {
          'id': p.id,
          'text': p.text,
          'category': p.category,
          'turns': [p.text, *p.later_turns],
        },
      )


def _source_prompts(config: PromptSetConfig):
  """The prompts a config's dataset is built from, parsed from their sources."""
  if config.path:
    return parse.specbench_questions(config.path)
  if config.name == 'humaneval':
    return parse.humaneval_tasks(assets.fetch('humaneval'))
  if config.name == 'mtbench':
    return parse.mtbench_questions(assets.fetch('mtbench'))
  if config.name == 'code_edit':
    from specjax.data.code_edit import code_edit_prompts

    return [parse.Prompt(id=i, text=t, category='code_edit') for i, t in code_edit_prompts()]
  raise ValueError(f'specjax_prompts has no config {config.name!r}; configs: {", ".join(SETS)}.')


@contextlib.contextmanager
def quiet():
  """tensorflow-datasets without its banner, warnings and progress bars (specjax's sets
  build in about a second; a new folder warns that it has no dataset_info.json yet)."""
  absl_logger = logging.getLogger('absl')
  level = absl_logger.level
  tfds.display_progress_bar(False)
  absl_logger.setLevel(logging.ERROR)
  try:
    with contextlib.redirect_stdout(io.StringIO()):
      yield
  finally:
    absl_logger.setLevel(level)
    tfds.display_progress_bar(True)


def prepare(make_builder, folder: str) -> tfds.core.DatasetBuilder:
  """`make_builder()`, its dataset built if missing, quietly; one process builds at a time
  (test workers and several processes share the cache folder)."""
  pathlib.Path(folder).mkdir(parents=True, exist_ok=True)
  with open(pathlib.Path(folder) / '.build.lock', 'w') as lock, quiet():
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
    b = make_builder()
    if not b.is_prepared():
      b.download_and_prepare()
  return b


def builder(config: str | PromptSetConfig, folder: str | pathlib.Path | None = None):
  """The builder of a prompt set (by name, or a `specbench_config`), prepared on first use."""
  folder = str(folder or data_dir())
  if isinstance(config, PromptSetConfig) and config.name in SETS:
    config = config.name  # tfds wants its own config object for a listed name
  make = lambda: SpecjaxPrompts(config=config, data_dir=folder, file_format='array_record')
  return prepare(make, folder)


def read(config: str | PromptSetConfig, folder: str | pathlib.Path | None = None):
  """Every prompt of a set, in file order, read from its TFDS dataset (built if missing)."""
  source = builder(config, folder).as_data_source(split='test')
  out = []
  for i in range(len(source)):
    ex = source[i]
    turns = [t.decode() for t in ex['turns']]
    out.append(
      parse.Prompt(
        id=ex['id'].decode(),
        text=ex['text'].decode(),
        category=ex['category'].decode(),
        later_turns=tuple(turns[1:]),
      )
    )
  return out
