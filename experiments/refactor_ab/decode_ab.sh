#!/bin/bash
# Interleaved A/B of the default config between two checkouts: OLD (a worktree of the
# commit before a refactor) and NEW (this checkout), two runs each, old first. Each run is
# launched from inside its checkout with PYTHONPATH at it, so `python -m` imports that code.
#   OLD=/work/wt_old NEW=/work/main OUT=/tmp/ab bash experiments/refactor_ab/decode_ab.sh
#   python experiments/refactor_ab/same_tokens.py /tmp/ab/old1 /tmp/ab/new1 /tmp/ab/old2 /tmp/ab/new2
set -u
for i in 1 2; do
  for v in old new; do
    dir=$NEW; [ $v = old ] && dir=$OLD
    echo "== $v $i $(date +%T)"
    (cd "$dir" && PYTHONPATH="$dir" python -m specjax.run --config configs/smollm2.py \
      --config.prompts=humaneval --config.num_prompts=4 --config.max_new_tokens=64 \
      --config.quick=False --workdir "$OUT/$v$i" > "$OUT/$v$i.log" 2>&1)
    echo "rc $?"
  done
done
