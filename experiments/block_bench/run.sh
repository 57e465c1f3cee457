#!/usr/bin/env bash
# The shipped block drafter (DFlash, and DSpark with its scheduled verification) against
# the EAGLE head and prompt lookup on HumanEval and MT-bench, greedy, batch 1, methods
# interleaved in one run per prompt set, then HumanEval at batch 8. Quiet machine; about
# 6 min a run on 2 cores.
#   bash experiments/block_bench/run.sh [OUT]        # PROMPTS=mtbench, BATCH8=0 to trim
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-experiments/block_bench/runs}"
mkdir -p "$out"
grep -m1 'model name' /proc/cpuinfo
grep -o -w -E 'avx512[a-z_0-9]*|avx2|fma' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
common=(--config.num_prompts="${NUM_PROMPTS:-8}" --config.quick=False
  "--config.drafts=('ngram', 'eagle', 'dflash', 'dspark')"
  "--config.gammas=(2, 4, 8)" "--config.adaptive_gammas=(1, 2, 4, 8, 15)")
one=autoregressive,ngram@2,eagle@2,dflash@2,dflash@4,dflash@8,dflash@adaptive,dspark@4,dspark@scheduled
for prompts in ${PROMPTS:-humaneval mtbench}; do
  echo "== $prompts, batch 1 -> $out/$prompts"
  python -m specjax.run --config configs/smollm2.py --config.prompts="$prompts" "${common[@]}" \
    --config.methods="$one" --workdir "$out/$prompts" > "$out/$prompts.log" 2>&1 \
    || echo "failed: see $out/$prompts.log"
  grep -E '^(costs|  [a-z]|method|autoregressive|ngram|eagle|dflash|dspark)' "$out/$prompts.log" || true
done
if [[ "${BATCH8:-1}" == 1 ]]; then
  echo "== humaneval, batch 8 -> $out/humaneval-b8"
  python -m specjax.run --config configs/smollm2.py --config.prompts=humaneval "${common[@]}" \
    --config.batch_size=8 --config.methods=autoregressive,ngram@2,eagle@2,dflash@4,dspark@scheduled \
    --workdir "$out/humaneval-b8" > "$out/humaneval-b8.log" 2>&1 || echo "failed: see $out/humaneval-b8.log"
  grep -E '^(costs|  [a-z]|method|autoregressive|ngram|eagle|dflash|dspark)' "$out/humaneval-b8.log" || true
fi
