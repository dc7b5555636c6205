#!/usr/bin/env bash
# Fourth GPU session (device tool, `nvidia-h100-x1`: one GPU; the multi-GPU kinds were
# withheld). The package is carried as committed:
#   rm -rf .gpu && mkdir .gpu && git archive HEAD fsdp_trace | tar -x -C .gpu
#   cp benchmarks/gpu_runs_1gpu.sh .gpu/ && cd .gpu && PYTHONPATH=$PWD bash gpu_runs_1gpu.sh pairs
#   ... bash gpu_runs_1gpu.sh tune
# pairs: what-if validation pairs on one GPU, one knob changed at a time (activation-checkpoint
# coverage, local batch), 30 un-profiled timed steps each and the host probe (the host's own
# speed, for the replay); gpt-small b16 captured twice (run-to-run noise). Timing traces and
# run.json come back; one detailed trace (record_shapes + with_stack) of gpt-1.3b for the
# speed benchmark against HTA.
# tune: `fsdp-trace tune` on one GPU (gpt-small b16, budget 2).
set -u
export PYTHONPATH=${PYTHONPATH:-$PWD} FSDP_TRACE_QUIET=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
R=/tmp/captures/whatif
python3 -c "import torch, fsdp_trace; print('torch', torch.__version__, fsdp_trace.__file__)"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

cap() {  # cap NAME -- capture args
  local dir=$R/$1; shift 2
  local s=$(date +%s)
  timeout 150 python3 -m fsdp_trace capture --out "$dir" "$@" > "$dir.log" 2>&1
  local rc=$?
  printf '== %-28s rc=%s %ss\n' "$(basename $dir)" "$rc" "$(( $(date +%s) - s ))"
  [ $rc -eq 0 ] || tail -5 "$dir.log"
}

if [ "${1:-pairs}" = pairs ]; then
  rm -rf $R && mkdir -p $R
  one="--nproc-per-node 1 --timed-steps 30 --timing-steps 3"
  cap gpt-small-b16-ac0 -- --model gpt-small --batch-size 16 $one
  cap gpt-small-b16-ac0-repeat -- --model gpt-small --batch-size 16 $one
  cap gpt-small-b16-ac0.5 -- --model gpt-small --batch-size 16 --ac-coverage 0.5 $one
  cap gpt-small-b16-ac1 -- --model gpt-small --batch-size 16 --ac-coverage 1 $one
  cap gpt-small-b8-ac0 -- --model gpt-small --batch-size 8 $one
  cap gpt-1.3b-b2-ac0 -- --model gpt-1.3b --batch-size 2 $one
  cap gpt-1.3b-b2-ac1 -- --model gpt-1.3b --batch-size 2 --ac-coverage 1 $one
  cap gpt-1.3b-b4-ac0 -- --model gpt-1.3b --batch-size 4 $one
  cd $R
  tar czf $OUT/whatif_small.tgz --exclude='*.detailed.json.gz' gpt-small-*
  tar czf $OUT/whatif_13b.tgz --exclude='*.detailed.json.gz' gpt-1.3b-*
  ls -la */*.detailed.json.gz
  cp gpt-1.3b-b4-ac0/rank0.detailed.json.gz $OUT/detailed_gpt-1.3b-b4.json.gz
  python3 - <<'PY'
import glob, json
for path in sorted(glob.glob("/tmp/captures/whatif/*/run.json")):
    f = json.load(open(path))["figures"]; s = f["step_time_ms"]; h = f.get("host_step_ms") or {}
    print(f"{path.split('/')[-2]:28s} step {s['median']:8.2f} ms (p10 {s['p10']:.2f} p90 {s['p90']:.2f} "
          f"sd {s['stdev']:.2f} n {s['n']}) host {h.get('median', 0):.2f} ms mem {f.get('peak_allocated_gib', 0):.1f} GiB")
PY
else
  python3 -m pip install -q --no-index --find-links wheels msgspec xxhash plotly && echo "analysis wheels installed"
  T=/tmp/captures/tune
  rm -rf $T
  s=$(date +%s)
  timeout 560 python3 -m fsdp_trace tune --nproc-per-node 1 --budget 2 --out $T \
    --model gpt-small --batch-size 16 --timed-steps 30 --timing-steps 3 > /tmp/tune.log 2>&1
  echo "tune rc=$? $(( $(date +%s) - s ))s"
  grep -v "━" /tmp/tune.log | tail -40
  cd /tmp/captures && tar czf $OUT/tune_1gpu.tgz --exclude='*.detailed.json.gz' tune
fi
ls -la $OUT
