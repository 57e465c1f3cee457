#!/usr/bin/env bash
# The quantisation probe on SmolLM2-135M-Instruct (five injected defects, two calibrations)
# and on Gemma 3 270M (its q4_k_m file re-quantised to every type the gguf package writes).
# Writes experiments/quant_probe/{smollm2,gemma3}/. About 10 minutes on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=experiments/quant_probe
defects=${DEFECTS:-/tmp/specjax_defects}
python experiments/quant_probe/make_defects.py --out "$defects"
cands=$(ls "$defects"/*.gguf | sed "s/.*/'&',/" | tr -d '\n')
time python -m specjax.quant_probe --config configs/quant_probe.py:demo \
  "--config.candidates=($cands)" "--config.make=('q8_0', 'q4_1')" --workdir $out/smollm2
time python -m specjax.quant_probe --config configs/quant_probe.py:demo \
  --config.reference=gemma3-270m "--config.make=('q8_0', 'q5_1', 'q5_0', 'q4_1', 'q4_0')" \
  --workdir $out/gemma3
