#!/usr/bin/env bash
# The GPU captures behind sample_traces/ and benchmarks/results/, run on the device tool's
# `nvidia-h200-x2` (2x H200, NVLink) from the repository root:
#     bash benchmarks/gpu_samples.sh
# `python3 -m fsdp_trace` is `fsdp-trace` without installing the package (the GPU image has
# torch, typer and rich; nothing else is needed to capture). Every run is a plain
# `fsdp-trace capture`; its run.json records the equivalent command (`command`, rebuilt from the
# resolved options) and the command line as typed (`argv`).
set -u
export PYTHONPATH=$PWD FSDP_TRACE_QUIET=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
R=/tmp/captures
rm -rf $R && mkdir -p $R/samples $R/diagnosis $R/bench
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nvidia-smi topo -m
python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())"

cap() {  # cap DIR [env VAR=VALUE ...] -- capture args
  local dir=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  local s=$(date +%s)
  env "${envs[@]}" timeout 240 python3 -m fsdp_trace capture --out "$dir" "$@" > "$dir.log" 2>&1
  local rc=$?
  printf '== %-40s rc=%s %ss\n' "${dir#$R/}" "$rc" "$(( $(date +%s) - s ))"
  [ $rc -eq 0 ] || tail -5 "$dir.log"
}

# --- sample traces: a small GPT (8 blocks), 2 GPUs without and with full AC, 1-GPU baseline
# (batch 4; the shipped sample_traces/gpt-small-* are the batch-16 runs of gpu_samples_gpu_bound.sh)
S=$R/samples
cap $S/gpt-small-1gpu -- --model gpt-small --nproc-per-node 1
cap $S/gpt-small-2gpu -- --model gpt-small --nproc-per-node 2 --baseline $S/gpt-small-1gpu
cap $S/gpt-small-2gpu-fullac -- --model gpt-small --nproc-per-node 2 --ac-coverage 1
(cd $R && tar czf $OUT/samples.tgz samples)

# --- benchmark: gpt-1.3b, bf16, seq 2048; batch 4 and batch 1; 1 GPU baseline then 2 GPUs
B=$R/bench
for b in 4 1; do
  cap $B/gpt-1.3b-b$b-1gpu -- --model gpt-1.3b --batch-size $b --nproc-per-node 1 --timed-steps 20
  cap $B/gpt-1.3b-b$b-2gpu -- --model gpt-1.3b --batch-size $b --nproc-per-node 2 --timed-steps 20 \
    --baseline $B/gpt-1.3b-b$b-1gpu
done
cap $B/gpt-1.3b-b4-compile-1gpu -- --model gpt-1.3b --batch-size 4 --nproc-per-node 1 --timed-steps 20 --compile
cap $B/gpt-1.3b-b4-compile-2gpu -- --model gpt-1.3b --batch-size 4 --nproc-per-node 2 --timed-steps 20 \
  --compile --baseline $B/gpt-1.3b-b4-compile-1gpu
(cd $R && tar czf $OUT/bench.tgz --exclude='*1gpu/*.json.gz' --exclude='*compile*/*.json.gz' \
  --exclude='*.detailed.json.gz' bench)

# --- diagnosis traces: each shows one problem on purpose (see tests/test_diagnosis.py)
D=$R/diagnosis
small2="--model gpt-small --nproc-per-node 2 --timing-steps 3 --timed-steps 5"
cap $D/tuned -- $small2 --shard-embeddings --keep-last-unsharded
cap $D/comm-bound -- $small2 --batch-size 1 --seq-len 256
cap $D/host-bound -- --model tiny --nproc-per-node 2 --timing-steps 3 --timed-steps 5
cap $D/grad-accum -- $small2 --grad-accum 2
cap $D/p2p-disabled NCCL_P2P_DISABLE=1 -- $small2
cap $D/max-connections-1 CUDA_DEVICE_MAX_CONNECTIONS=1 -- $small2
cap $D/straggler -- $small2 --straggler-rank 1 --straggler-delay-ms 15

python3 - <<'PY'
import glob, json
for path in sorted(glob.glob("/tmp/captures/*/*/run.json")):
    d = json.load(open(path)); f = d["figures"]
    mfu = f.get("mfu"); eff = f.get("scaling_efficiency")
    print(f"{path.split('/')[-2]:32s} step {f['step_time_ms']['median']:8.2f} ms  "
          f"tok/s/gpu {f['tokens_per_s_per_gpu']:9.0f}  mfu {mfu if mfu is None else round(mfu, 3)}  "
          f"eff {eff if eff is None else round(eff, 3)}  mem {f.get('peak_allocated_gib', 0):.1f} GiB")
PY
du -sh $R/*/*
cd $R
tar czf $OUT/diagnosis.tgz --exclude='tuned/*.detailed.json.gz' --exclude='comm-bound/*.detailed.json.gz' \
  --exclude='grad-accum/*.detailed.json.gz' --exclude='p2p-disabled/*.detailed.json.gz' \
  --exclude='max-connections-1/*.detailed.json.gz' --exclude='straggler/*.detailed.json.gz' diagnosis
ls -la $OUT
