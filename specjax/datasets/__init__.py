"""specjax's data as TensorFlow Datasets: importing this registers the builders.

  import specjax.datasets
  import tensorflow_datasets as tfds

  tfds.data_source(
    'specjax_prompts/humaneval',
    split='test',
    data_dir=str(specjax.datasets.data_dir()),
    builder_kwargs={'file_format': 'array_record'},  # the default, TFRecord, needs TensorFlow
  )

`specjax_prompts` (specjax/data/tfds_prompts.py): the evaluation prompt sets (humaneval,
mtbench, code_edit, and a user's Spec-Bench file as `specbench-<sha>`); `specjax_corpus`
(specjax/train/tfds_corpora.py): the training corpora (instructions-seed<N>, stdlib-py<XY>,
docs-py<XY>). Both are built offline from the pinned assets and this interpreter, written as
ArrayRecord and read with `tfds.data_source` (random access, no TensorFlow). The harness and
the trainers read through them; `prompt_set` and `corpus` are the same reads by name.
"""

from specjax.data.tfds_prompts import SpecjaxPrompts, data_dir, read, specbench_config
from specjax.train.tfds_corpora import SpecjaxCorpus, corpus_config, source, texts

BUILDERS = ('specjax_prompts', 'specjax_corpus')


def prompt_set(name: str):
  """The prompts of a set ('humaneval', 'mtbench', 'code_edit', or a Spec-Bench file's path)
  as specjax Prompts, from its TFDS dataset (built on first use)."""
  from specjax.data import specbench, tfds_prompts

  if name in tfds_prompts.SETS:
    return read(name)
  return specbench.load(f'specbench:{name}')  # the file's checks first, then its dataset


def corpus(kind: str, seed: int = 0) -> list[str]:
  """The texts of a training corpus ('instructions', 'stdlib', 'docs') from its TFDS dataset."""
  return texts(kind, seed)


__all__ = [
  'BUILDERS',
  'SpecjaxCorpus',
  'SpecjaxPrompts',
  'corpus',
  'corpus_config',
  'data_dir',
  'prompt_set',
  'read',
  'source',
  'specbench_config',
  'texts',
]
