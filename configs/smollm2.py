"""The embedded default: SmolLM2-135M-Instruct on this machine's CPU.

  python -m specjax.run --config configs/smollm2.py --config.prompt="What is the capital of France?"
  python -m specjax.run --config configs/smollm2.py --config.prompts=humaneval \
      --config.num_prompts=4
  python -m specjax.run --config configs/smollm2.py:tiny  # random tiny model, no download

Arguments after the colon (comma separated): `tiny` swaps in a random 2-layer byte-level
model and shrinks everything so the whole path runs in seconds; `sweep` sets gammas to
(1, 2, 4, 8).

Methods are named 'autoregressive', '<draft>@<gamma>' and '<draft>@adaptive'; pick some
with e.g. --config.methods='ngram@4,ngram@adaptive'.
"""

import ml_collections

from specjax import config_lib


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = config_lib.parse_arg(arg, tiny=False, sweep=False)
  c = ml_collections.ConfigDict()
  c.model = 'tiny' if args.tiny else 'smollm2-135m-instruct'  # asset name, .gguf, HF dir, tiny
  c.dtype = 'float32'  # bfloat16 is 6-10x slower on XLA:CPU; use it on accelerators
  # What to generate from: one chat prompt, or a prompt set (humaneval, mtbench,
  # mtbench:<category>, or a JSONL file with "prompt" or "turns" and optional "category").
  c.prompt = ''
  c.prompts = 'mtbench'
  c.num_prompts = 2 if args.tiny else 8
  c.batch_size = 1
  c.max_new_tokens = 16 if args.tiny else 128
  c.cache_size = 1024
  c.temperature = 0.0  # 0 is greedy
  c.top_k = 0
  c.top_p = 1.0
  c.seed = 0
  # Devices: --config.mesh.data=2 --config.mesh.model=4 shards rows over 'data' and heads,
  # MLP columns and the vocabulary over 'model' (on CPU simulate 8 devices with
  # XLA_FLAGS=--xla_force_host_platform_device_count=8). Partition rules 'REGEX=AXES' go
  # before the defaults of specjax/models/sharding.py (target: DEFAULT_RULES; drafts:
  # their own), e.g. --config.mesh.rules='("lm_head$=None,model",)'; cache: KV axes.
  c.mesh = ml_collections.ConfigDict(
    {'data': 1, 'model': 1, 'rules': (), 'draft_rules': (), 'cache': 'data,model,None,None'}
  )
  # Speculative decoding with every draft below, compared with autoregressive decoding in
  # the same run: prompt lookup ('ngram'), the EAGLE-3-style feature head trained for
  # SmolLM2 that ships with specjax ('eagle': it drafts from the target's own hidden
  # states; the tiny model uses its first layer, 'truncated:1'), and the target itself in
  # its GGUF file's q4_1 blocks with 8-bit products ('quantized': the best-paying draft on
  # this CPU, at long drafts: --config.gammas='(4, 8)', and its adaptive method). Each
  # draft runs at every gamma in `gammas`, and adaptively (gamma chosen every iteration
  # among 0 and `adaptive_gammas` from the measured costs and the acceptance seen so far).
  # More drafts: 'distilled' (the distilled draft model), 'truncated:K', 'layers:...'
  # (configs/layerskip_smollm2.py), 'eagle:DIR', a model path.
  # An empty tuple runs autoregressive decoding only.
  c.drafts = ('ngram', 'truncated:1') if args.tiny else ('ngram', 'eagle', 'quantized')
  c.verifier = 'rejection'  # rejection, block, or greedy (temperature 0 only)
  # Fixed draft lengths, or --config.gammas='(1, 2, 4, 8)'; the feature head is best at 2.
  c.gammas = (1, 2, 4, 8) if args.sweep else (4,) if args.tiny else (2, 4)
  # Settings adaptive control chooses among (() runs no adaptive methods). 8: the quantized
  # draft pays best at 8 on this project's CPU (quantized@8 1.92x on HumanEval, 1.76x on
  # MT-bench; BENCHMARKS.md, issue 29), so its adaptive method may go there too.
  c.adaptive_gammas = (1, 2, 4) if args.tiny else (1, 2, 4, 8)
  # Token trees each draft also runs, verified in one target forward (specjax/core/tree.py):
  # 'dynamic:SIZE-DEPTH-WIDTH' (EAGLE-2's dynamic tree; for prompt lookup a trie of WIDTH
  # earlier matches) or a static shape such as '4x2x1x1' (draft models and the head).
  c.trees = ()
  # Static shapes adaptive control may also choose, e.g. ('2x1', '3x2x1') (drafts that can
  # fill a static shape: draft models and the head; prompt lookup keeps to chains).
  c.adaptive_trees = ()
  c.methods = ''  # a comma-separated subset of the methods above ('' runs them all)
  c.measure_costs = True  # time draft and verify steps: c, the cost model, adaptive control
  # One --config.prompt is a question: answered with autoregressive decoding and this one
  # method, and a few lines on whether speculation paid. Prompt lookup under adaptive
  # control times this CPU's target step and verifications first and drafts only at the
  # lengths those costs let pay (or never, saying why). --config.quick=False runs everything.
  # A draft that hands the verifier NaN, negative or zero-at-its-proposal probabilities
  # has those positions rejected (the output stays the target's) and is reported; True
  # makes that an error once the results are written.
  c.strict = False
  # True: finish the interrupted run in --workdir (prompts it finished are not rerun).
  c.resume = False
  c.quick = True
  # The q4 self-draft under adaptive control (on machines where its costs cannot pay, the
  # controller keeps speculation off and the verdict says why); the tiny model has none.
  c.quick_method = 'ngram@adaptive' if args.tiny else 'quantized@adaptive'
  return c
