"""Trains an EAGLE-3-style feature draft head for SmolLM2-135M-Instruct, on this CPU.

  python -m specjax.train_draft --config configs/eagle_smollm2.py --workdir runs/eagle
  python -m specjax.train_draft --config configs/eagle_smollm2.py:steps=100 --workdir ...
  python -m specjax.train_draft --config configs/eagle_smollm2.py:tiny --workdir /tmp/tiny

Arguments after the colon (comma separated): `tiny` trains a head for the random tiny
byte-level target in seconds (for tests); `steps=` overrides the number of steps;
`vocab=` the draft vocabulary size; `unroll=` the training-time-test depth; `more` adds
the target's answers to 'complete this function' prompts (the second training phase of
the shipped head, with `init_from=` the first phase's head directory); `gpu` the
larger run of experiments/eagle_gpu/run_h200.sh (bfloat16 target, ~10x the data).

The head (specjax/drafters/eagle.py): the target's residual stream entering layers
2, L/2 and L-3 fused by one linear map, the target's (frozen) input embedding of the next
token, one decoder layer at the target's width reading both, a norm and an output head
over the draft vocabulary (the tokens the target emits most in the training data). Its
training data (specjax/train/feature_data.py): the target's own answers to instruction
prompts, standard-library sources and the interpreter's docs, with the target's features
and exact next-token distributions computed once and memory-mapped.
"""

import ml_collections

from specjax import config_lib


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = config_lib.parse_arg(
    arg, tiny=False, gpu=False, more=False, init_from='', steps=0, vocab=0, unroll=0
  )
  tiny = args.tiny
  c = ml_collections.ConfigDict()
  c.kind = 'eagle'
  c.target = 'tiny' if tiny else 'smollm2-135m-instruct'
  c.dtype = 'bfloat16' if args.gpu else 'float32'  # the target's, for generation and features
  c.seed = 0
  c.divergence = 'forward_kl'  # forward_kl, reverse_kl, jsd, tvd (specjax.train.divergences)

  c.data = ml_collections.ConfigDict()
  c.data.name = 'tiny' if tiny else 'smollm2'
  c.data.seed = 0
  c.data.num_prompts = 24 if tiny else 1536  # instruction + docstring prompts, answered greedily
  c.data.eval_prompts = 4 if tiny else 32  # the last ones, held aside
  c.data.max_prompt_tokens = 48 if tiny else 128
  c.data.max_new_tokens = 24 if tiny else 192
  c.data.generate_batch = 8 if tiny else 32
  c.data.seq_len = 80 if tiny else 320
  c.data.code_files = 4 if tiny else 400  # stdlib .py files (shuffled), chunked
  c.data.max_file_chars = 4000 if tiny else 40000
  c.data.code_chunks = 12 if tiny else 600
  c.data.doc_chunks = 6 if tiny else 150  # pydoc_data.topics
  c.data.max_doc_chars = 20000 if tiny else 600000
  c.data.eval_chunks = 2 if tiny else 8  # held-aside chunks per corpus
  c.data.label_batch = 8 if tiny else 8
  c.data.cache_dir = ''  # default: specjax.data.assets.cache_dir() (SPECJAX_CACHE)

  c.head = ml_collections.ConfigDict()
  c.head.capture = ()  # target layers read (the stream entering them); () = (2, L // 2, L - 3)
  c.head.vocab_size = args.vocab or (64 if tiny else 8192)
  c.head.ffn_dim = 0  # 0: the target's
  c.head.init_layer = -1  # target layer the decoder layer's weights start from (-1: random)
  c.head.init_from = args.init_from  # an EAGLE-3 head directory to continue training from

  c.unroll = args.unroll or 3  # training-time test: draft steps unrolled per position
  c.step_decay = 0.8  # loss weight of unrolled step k is step_decay ** k
  c.keep = 0 if tiny else 96  # positions per sequence the output head learns at (0: all)

  c.optim = config_lib.optim(3e-3 if tiny else 1e-3, 3 if tiny else 40, clip_norm=0.5)

  c.batch_size = 4 if tiny else 8
  c.num_steps = args.steps or (24 if tiny else 1200)
  c.log_every = 2 if tiny else 10
  c.eval_every = 8 if tiny else 100
  c.eval_batch = 4 if tiny else 8
  c.checkpoint_every = 4 if tiny else 50
  c.keep_checkpoints = 2
  if args.more:  # second phase: + answers to completion and general chat prompts
    m = c.more_data = ml_collections.ConfigDict(c.data.to_dict())
    m.name = 'smollm2-completions'
    m.prompts = 'completions+mixed'  # specjax.train.feature_data: completion, mixed prompts
    m.num_prompts = 1600
    m.eval_prompts = 0
    m.code_chunks = m.doc_chunks = m.eval_chunks = 0
    m.code_files = 0
    c.num_steps = args.steps or 600
    c.optim.lr = 4e-4
    c.optim.warmup_steps = 20
  if args.gpu:  # experiments/eagle_gpu/run_h200.sh: ~10x the data, one H200, < 10 minutes
    c.data.name = 'smollm2-gpu'
    c.data.num_prompts = 6000
    c.data.generate_batch = 512
    c.data.code_files = 531
    c.data.code_chunks = 3000
    c.data.doc_chunks = 500
    c.data.label_batch = 64
    c.batch_size = 64
    c.num_steps = args.steps or 2000
    c.eval_every = 250
    c.checkpoint_every = 250
  return c
