#!/usr/bin/env bash
# Real 2-GPU traces of set-ups fsdp-trace did not make itself (issue 20): each written by
# benchmarks/foreign_setups.py under plain torch.profiler + tensorboard_trace_handler (no
# run.json), into $R/NAME; all of them tarred into $OUT/foreign.tgz.
#   device tool `run`, kind nvidia-h100-x2, carry [".gpu"] (.gpu/ao: a torchao wheel for float8):
#     bash benchmarks/gpu_runs_foreign.sh [NAME ...]      (default: every set-up below)
#   EXTRA: more foreign_setups.py options for every run, e.g. a GPU-bound size (the shipped
#   foreign-2gpu/ runs used the defaults, small enough that the host is the limit):
#     EXTRA="--layers 12 --d-model 2048 --seq-len 2048 --batch-size 8" R=/tmp/captures/foreign-big
set -u
R=${R:-/tmp/captures/foreign}
OUT=${OUT:-/tmp/out}
RUN_TIMEOUT=${RUN_TIMEOUT:-90}
mkdir -p "$R" "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -c "import torchao" 2>/dev/null || python3 -m pip install -q --no-index --no-deps .gpu/ao/torchao-*.whl
NAMES=("$@")
[ ${#NAMES[@]} -gt 0 ] || NAMES=(fsdp2 fsdp2-root-only fsdp1 ddp slow-gpu float8 fsdp2-offload)
DEADLINE=${DEADLINE:-0}  # epoch seconds: skip a run that could not end before it (0: none)
for name in "${NAMES[@]}"; do
  if [ "$DEADLINE" -gt 0 ] && [ $(( $(date +%s) + RUN_TIMEOUT )) -gt "$DEADLINE" ]; then
    echo "== $name skipped: no time left"; continue
  fi
  rm -rf "$R/$name"; s=$(date +%s)
  timeout "$RUN_TIMEOUT" torchrun --nproc-per-node 2 benchmarks/foreign_setups.py --setup "$name" \
    --out "$R/$name" ${EXTRA:-} > "$R/$name.log" 2>&1
  printf '== %-18s rc=%s %ss %s\n' "$name" "$?" "$(( $(date +%s) - s ))" "$(du -sh "$R/$name" 2>/dev/null | cut -f1)"
  grep -E "^\[rank|foreign_setups:|Error|error" "$R/$name.log" | tail -4
done
(cd "$R/.." && tar czf "$OUT/foreign.tgz" "$(basename "$R")")
ls -la "$OUT"
