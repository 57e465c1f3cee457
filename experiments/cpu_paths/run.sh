#!/usr/bin/env bash
# Costs of SmolLM2-135M-Instruct's step, verifications and drafts on every kernel path this
# CPU runs, one path at a time (run it on a quiet machine: nothing else running).
#   bash experiments/cpu_paths/run.sh [OUT]      # ~5 min a path; the first also times dispatch
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-experiments/cpu_paths/results}"
grep -o -w -E 'avx512[a-z_0-9]*|avx2|fma' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
paths="${PATHS:-auto auto:avx2 xla $(python -c 'from specjax.kernels import cpu; print(" ".join(cpu.supported()))')}"
for path in $paths; do
  [ "$path" = scalar ] && continue  # plain C++: for exactness tests, far slower than XLA
  echo "== SPECJAX_CPU_ISA=$path"
  SPECJAX_CPU_ISA="$path" python experiments/cpu_paths/costs.py --out "$out" 2>&1 \
    | grep -E '^(costs|  [a-z]|\{)' || true
done
