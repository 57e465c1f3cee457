#!/usr/bin/env bash
# The default config's methods (every draft at gamma 2 and 4, and adaptive) on HumanEval
# and MT-bench, methods interleaved in one run, once per kernel dispatch this CPU can show:
# auto (the best ISA it has) and, on an AVX-512 machine, auto:avx2 (what an AVX2 machine
# would dispatch). Run it on a quiet machine; ~8 min a run.
#   bash experiments/cpu_paths/decode.sh [OUT]       # PATHS="auto" to run only one
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-experiments/cpu_paths/runs}"
mkdir -p "$out"
grep -o -w -E 'avx512[a-z_0-9]*|avx2|fma' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
for path in ${PATHS:-auto auto:avx2}; do
  for prompts in ${PROMPTS:-humaneval mtbench}; do
    name="${path/:/-}-$prompts"
    echo "== SPECJAX_CPU_ISA=$path $prompts -> $out/$name"
    SPECJAX_CPU_ISA="$path" python -m specjax.run --config configs/smollm2.py \
      --config.prompts="$prompts" --config.num_prompts="${NUM_PROMPTS:-8}" --config.quick=False \
      --workdir "$out/$name" > "$out/$name.log" 2>&1 || echo "failed: see $out/$name.log"
    grep -E '^(costs|  [a-z]|[a-z]+ cannot pay|method|autoregressive|ngram|eagle|quantized)' \
      "$out/$name.log" || true
  done
done
