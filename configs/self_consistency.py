"""Self-consistency on SmolLM2-135M-Instruct: N sampled answers per math prompt, one batch.

  python -m specjax.self_consistency --config configs/self_consistency.py
  python -m specjax.self_consistency \
      --config configs/self_consistency.py:n=4,prompts=mtbench:reasoning
  python -m specjax.self_consistency --config configs/self_consistency.py:tiny  # no download

Arguments after the colon (comma separated): `tiny` swaps in a random 2-layer byte-level
model and shrinks everything; `n=` paths per prompt; `prompts=` the prompt set.
"""

import ml_collections

from specjax import config_lib


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = config_lib.parse_arg(arg, tiny=False, n=8, prompts='mtbench:math')
  c = ml_collections.ConfigDict()
  c.model = 'tiny' if args.tiny else 'smollm2-135m-instruct'
  c.dtype = 'float32'  # bfloat16 on accelerators (6-10x slower than float32 on XLA:CPU)
  c.prompt = 'What is 12 + 30?' if args.tiny else ''  # one prompt instead of a prompt set
  c.prompts = args.prompts
  c.num_prompts = 1 if args.tiny else 4
  c.n = args.n  # paths per prompt, decoded as one batch
  c.temperature = 0.7  # > 0: the paths must differ
  c.top_k = 0
  c.top_p = 1.0
  c.max_new_tokens = 24 if args.tiny else 128
  c.cache_size = 256 if args.tiny else 1024
  c.seed = 0
  # Consensus drafts: match the last k tokens against the other paths with at most
  # max_mismatches differences; fall back to own-context n-grams of n_max..1 tokens.
  c.gamma = 4
  c.k = 4
  c.max_mismatches = 1
  c.n_max = 3
  c.proposal = 'mode'  # mode: the best-supported path, q one-hot; sample: drawn from the votes
  c.verifier = 'rejection'  # or block
  c.compare_plain = True  # also decode the same N paths autoregressively: the speedup
  c.compare_ngram = True  # and with each path's own prompt lookup alone
  return c
