#!/usr/bin/env bash
# Trains the SmolLM2-135M-Instruct EAGLE-3 head on ~10x the CPU run's data, on one NVIDIA
# H200, in under 10 minutes (the device tool's per-command limit), and leaves the head
# where the CPU side picks it up:
#
#   run(command='bash experiments/eagle_gpu/run_h200.sh', timeout_s=600)
#   python -m specjax.run --config configs/smollm2.py --config.drafts="('eagle:<files_at>/head',)"
#
# Data (the target's own answers at batch 512, stdlib sources, docs; features computed
# in bfloat16) and training go to $OUT/run; the final head to $OUT/head (EAGLE-3 layout,
# ~20 MB). A run that is cut short still writes its latest head (SIGTERM saves first).
set -euo pipefail
OUT=${OUT:-/tmp/eagle_gpu}
pip install -q -e . 'jax[cuda12]' 2>&1 | tail -2
python -c 'import jax; print(jax.devices())'
export SPECJAX_CACHE=${SPECJAX_CACHE:-$OUT/cache}
timeout -s TERM 540 python -m specjax.train_draft --config configs/eagle_smollm2.py:gpu \
  --workdir "$OUT/run" --noprogress || true
if [ -d "$OUT/run/head" ]; then
  cp -r "$OUT/run/head" "$OUT/head"
  cp "$OUT/run/metrics.jsonl" "$OUT/run/"*.png "$OUT/head/" 2>/dev/null || true
fi
rm -rf "$OUT/cache" "$OUT/run/checkpoints"  # do not ship gigabytes of features back
ls -la "$OUT/head" || echo 'no head was written'
