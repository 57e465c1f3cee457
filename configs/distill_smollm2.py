"""Distils a draft for SmolLM2-135M-Instruct (DistillSpec), on this machine's CPU.

  python -m specjax.train_draft --config configs/distill_smollm2.py --workdir runs/distill
  python -m specjax.train_draft --config configs/distill_smollm2.py:divergence=tvd --workdir ...
  python -m specjax.train_draft --config configs/distill_smollm2.py:tiny --workdir /tmp/tiny

Arguments after the colon (comma separated): `tiny` distils a tiny draft from the random
tiny byte-level target in seconds (for tests); `divergence=` forward_kl, reverse_kl, jsd or
tvd; `steps=` overrides the number of training steps.

The draft: the target's width, its input embeddings (shared, frozen), two decoder layers
initialised from the target's first two, and an output head over the 8192 tokens the
target uses most in the training data (q = 0 elsewhere keeps verification lossless).
"""

import ml_collections

from specjax import config_lib


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = config_lib.parse_arg(arg, tiny=False, divergence='forward_kl', steps=0)
  tiny = args.tiny
  c = ml_collections.ConfigDict()
  c.target = 'tiny' if tiny else 'smollm2-135m-instruct'
  c.seed = 0
  c.divergence = args.divergence  # forward_kl, reverse_kl, jsd, tvd
  c.position_keep = 1.0  # < 1: each step learns a random subset of positions (fold_in key)

  c.data = ml_collections.ConfigDict()
  c.data.name = 'tiny' if tiny else 'smollm2'
  c.data.seed = 0
  c.data.num_prompts = 24 if tiny else 448  # specjax.train.prompts, target answers greedily
  c.data.eval_prompts = 4 if tiny else 24  # the last ones, held aside
  c.data.max_new_tokens = 24 if tiny else 192
  c.data.generate_batch = 8 if tiny else 16
  c.data.seq_len = 96 if tiny else 320  # prompts longer than seq_len - max_new are skipped
  c.data.code_files = 4 if tiny else 300  # stdlib .py files (shuffled), chunked
  c.data.max_file_chars = 4000 if tiny else 40000
  c.data.code_chunks = 12 if tiny else 256
  c.data.doc_chunks = 6 if tiny else 96  # pydoc_data.topics
  c.data.max_doc_chars = 20000 if tiny else 400000
  c.data.eval_chunks = 2 if tiny else 8  # held-aside chunks per corpus
  c.data.top_k = 8 if tiny else 32  # teacher probabilities kept per position
  c.data.label_batch = 8 if tiny else 4
  c.data.cache_dir = ''  # default: specjax.data.assets.cache_dir() (SPECJAX_CACHE)

  c.draft = ml_collections.ConfigDict()
  c.draft.init_layers = (0,) if tiny else (0, 1)  # target layers copied (negative: from the end)
  c.draft.ffn_dim = 0  # 0: the target's
  c.draft.vocab_size = 64 if tiny else 8192

  c.optim = config_lib.optim(
    3e-3 if tiny else 8e-4, 3 if tiny else 30, clip_norm=1.0, weight_decay=0.01, b2=0.98
  )

  c.batch_size = 4 if tiny else 16
  c.num_steps = args.steps or (24 if tiny else 260)
  c.log_every = 2 if tiny else 10
  c.eval_every = 8 if tiny else 40
  c.eval_batch = 8 if tiny else 16
  c.checkpoint_every = 4 if tiny else 20
  c.keep_checkpoints = 2
  return c
