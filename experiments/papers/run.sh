#!/usr/bin/env bash
# The measured runs behind experiments/papers/*/README.md, on SmolLM2-135M-Instruct (CPU):
# 5 HumanEval tasks (code) and 5 MT-bench questions (prose), the distilled draft model and
# the EAGLE-3 feature head at gamma 1, 2, 4, 8, with the cost measurement:
#   t0/        temperature 0, rejection sampling (Leviathan et al.: alpha, E and S over gamma)
#   t1/        temperature 1, rejection sampling (Chen et al.: code vs prose)
#   t1_block/  temperature 1, block verification, same prompts and keys (Sun et al.)
#   chen.md, sun.md  the tables of experiments/papers/tables.py
# Usage: bash experiments/papers/run.sh [OUT]   (about 25 minutes on 2 cores; quiet machine)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-experiments/papers/runs}
common=(--config configs/smollm2.py --config.prompts=experiments/papers/code_and_prose.jsonl
  --config.num_prompts=10 --config.max_new_tokens=96 --config.quick=False
  "--config.drafts=('distilled', 'eagle')" "--config.gammas=(1, 2, 4, 8)"
  "--config.adaptive_gammas=()")
python -m specjax.run "${common[@]}" --config.temperature=0 --workdir "$out/t0"
python -m specjax.run "${common[@]}" --config.temperature=1 --workdir "$out/t1"
python -m specjax.run "${common[@]}" --config.temperature=1 --config.verifier=block \
  --workdir "$out/t1_block"
for run in t0 t1 t1_block; do
  python experiments/papers/leviathan2023/analyse.py "$out/$run"
done
python experiments/papers/tables.py chen "$out/t1" > "$out/chen.md"
python experiments/papers/tables.py sun "$out/t1" "$out/t1_block" > "$out/sun.md"
