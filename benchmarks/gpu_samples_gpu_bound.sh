#!/usr/bin/env bash
# Second GPU session (device tool, `nvidia-h200-x2`, carry .whl with plotly+narwhals+msgspec):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   PYTHONPATH=/tmp/site bash benchmarks/gpu_samples_gpu_bound.sh
# GPU-bound sample traces (batch 16), tuned benchmark variants, and the AC-coverage sweep.
set -u
export PYTHONPATH=$PWD:${PYTHONPATH:-} FSDP_TRACE_QUIET=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
R=/tmp/captures
rm -rf $R && mkdir -p $R/samples $R/bench
python3 -c "import torch, plotly, msgspec; print('torch', torch.__version__, 'plotly', plotly.__version__)"

cap() {  # cap DIR -- capture args
  local dir=$1; shift 2
  local s=$(date +%s)
  timeout 240 python3 -m fsdp_trace capture --out "$dir" "$@" > "$dir.log" 2>&1
  local rc=$?
  printf '== %-40s rc=%s %ss\n' "${dir#$R/}" "$rc" "$(( $(date +%s) - s ))"
  [ $rc -eq 0 ] || tail -5 "$dir.log"
}

# --- sample traces, GPU-bound: gpt-small at batch 16 (batch 4 is host-bound on this VM's CPU)
S=$R/samples
cap $S/gpt-small-b16-1gpu -- --model gpt-small --batch-size 16 --nproc-per-node 1
cap $S/gpt-small-b16-2gpu -- --model gpt-small --batch-size 16 --nproc-per-node 2 --baseline $S/gpt-small-b16-1gpu
cap $S/gpt-small-b16-2gpu-fullac -- --model gpt-small --batch-size 16 --nproc-per-node 2 --ac-coverage 1
(cd $R && tar czf $OUT/samples_c.tgz samples)

# --- benchmark, tuned as torchtitan does: per-block compile, embeddings/head as own units
B=$R/bench
t="--model gpt-1.3b --batch-size 4 --timed-steps 20 --compile --shard-embeddings"
cap $B/gpt-1.3b-b4-tuned-1gpu -- $t --keep-last-unsharded --nproc-per-node 1
cap $B/gpt-1.3b-b4-tuned-2gpu -- $t --keep-last-unsharded --nproc-per-node 2 --baseline $B/gpt-1.3b-b4-tuned-1gpu
cap $B/gpt-1.3b-b4-noreshard-1gpu -- $t --reshard-after-forward false --nproc-per-node 1
cap $B/gpt-1.3b-b4-noreshard-2gpu -- $t --reshard-after-forward false --nproc-per-node 2 --baseline $B/gpt-1.3b-b4-noreshard-1gpu
(cd $R && tar czf $OUT/bench_c.tgz --exclude='*.json.gz' bench)

# --- efficiency vs activation-checkpoint coverage, gpt-1.3b at batch 1 (communication harder to hide)
s=$(date +%s)
timeout 420 python3 -m fsdp_trace sweep --ac-coverage 0,0.25,0.5,0.75,1 --nproc-per-node 2 \
  --out $R/sweep --model gpt-1.3b --batch-size 1 --warmup-steps 2 --timing-steps 3 --timed-steps 10 \
  > $R/sweep.log 2>&1
echo "== sweep rc=$? $(( $(date +%s) - s ))s"; tail -3 $R/sweep.log
(cd $R && tar czf $OUT/sweep.tgz --exclude='*.detailed.json.gz' sweep sweep.log)

python3 - <<'PY'
import glob, json
for path in sorted(glob.glob("/tmp/captures/**/run.json", recursive=True)):
    d = json.load(open(path)); f = d["figures"]
    mfu = f.get("mfu"); eff = f.get("scaling_efficiency")
    print(f"{path.split('/')[-2]:32s} step {f['step_time_ms']['median']:8.2f} ms  "
          f"tok/s/gpu {f['tokens_per_s_per_gpu']:9.0f}  mfu {mfu if mfu is None else round(mfu, 3)}  "
          f"eff {eff if eff is None else round(eff, 3)}  mem {f.get('peak_allocated_gib', 0):.1f} GiB")
PY
cat $R/sweep/efficiency.csv
ls -la $OUT
