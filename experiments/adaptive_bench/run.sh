#!/usr/bin/env bash
# Adaptive draft length against fixed gammas and autoregressive decoding, on SmolLM2-135M-Instruct.
# Each run is one `python -m specjax.run` (methods interleaved prompt by prompt); results,
# plots, generated texts and advice land in experiments/adaptive_bench/<name>/.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=experiments/adaptive_bench
run() {
  name=$1; shift
  python -m specjax.run --config configs/smollm2.py --workdir "$out/$name" "$@"
  python -m specjax.advise "$out/$name"
}
# Drafts that do not pay: MT-bench writing at temperature 1, with the untrained truncated
# draft and the (weak) distilled draft.
run poor_writing_t1 --config.prompts=mtbench:writing --config.num_prompts=6 \
  --config.temperature=1.0 --config.drafts='("truncated:4", "distilled")' --config.gammas='(1, 4)'
# HumanEval, greedy: adaptive against every fixed gamma it can choose from.
run humaneval --config.prompts=humaneval --config.num_prompts=6 \
  --config.drafts='("ngram", "distilled")' --config.gammas='(1, 2, 4)' --config.adaptive_gammas='(1, 2, 4)'
# Code editing (answers repeat the prompt): where prompt lookup pays most.
run code_edit_ngram --config.prompts=code_edit --config.num_prompts=6 \
  --config.drafts='("ngram",)' --config.gammas='(2, 4, 8)' --config.adaptive_gammas='(2, 4, 8)'
