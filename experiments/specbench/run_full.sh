#!/usr/bin/env bash
# The whole of Spec-Bench (480 questions, 560 turns) on SmolLM2-135M-Instruct, one run of
# python -m specjax.run per category so that it resumes: a category whose results.json
# exists is kept, one stopped halfway starts again. Then one leaderboard over all the
# categories that finished (python -m specjax.bench.leaderboard), in OUT.
# About 100 minutes for autoregressive decoding and one method on 2 CPU cores; quiet machine.
# Usage: bash experiments/specbench/run_full.sh [QUESTIONS] [OUT] [METHODS]
#   QUESTIONS: Spec-Bench's question.jsonl (default: the cache's spec_bench/question.jsonl)
#   METHODS:   besides autoregressive decoding (default ngram@2; e.g. 'ngram@2,eagle@2')
set -euo pipefail
cd "$(dirname "$0")/../.."
questions=${1:-${SPECJAX_CACHE:-$HOME/.cache/specjax}/spec_bench/question.jsonl}
out=${2:-experiments/specbench/full}
methods=${3:-ngram@2}
categories=(writing roleplay reasoning math coding extraction stem humanities
  translation summarization qa math_reasoning rag)
done_runs=()
for cat in "${categories[@]}"; do
  if [ ! -f "$out/$cat/results.json" ]; then
    rm -rf "$out/$cat"
    echo "== $cat"
    python -m specjax.run --config configs/smollm2.py --workdir "$out/$cat" \
      --config.prompts="specbench:$questions:$cat" --config.num_prompts=80 \
      --config.max_new_tokens=128 --config.cache_size=2048 --config.methods="$methods" \
      --config.measure_costs=False
  fi
  done_runs+=("$out/$cat")
done
python -m specjax.bench.leaderboard "$out" "${done_runs[@]}"
