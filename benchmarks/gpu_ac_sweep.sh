#!/usr/bin/env bash
# Third GPU session (device tool, `nvidia-h200-x2`, carry .whl with plotly+narwhals+msgspec):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   PYTHONPATH=/tmp/site bash benchmarks/gpu_ac_sweep.sh
# The AC-coverage sweep (kept small: run.json files and the plot), and a tuned GPU-bound capture.
set -u
export PYTHONPATH=$PWD:${PYTHONPATH:-} FSDP_TRACE_QUIET=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
R=/tmp/captures
rm -rf $R && mkdir -p $R/diagnosis

s=$(date +%s)
timeout 300 python3 -m fsdp_trace capture --out $R/diagnosis/tuned-b16 --model gpt-small --batch-size 16 \
  --nproc-per-node 2 --shard-embeddings --keep-last-unsharded --timing-steps 3 --timed-steps 5 \
  > $R/diagnosis/tuned-b16.log 2>&1
echo "== tuned-b16 rc=$? $(( $(date +%s) - s ))s"
(cd $R && tar czf $OUT/diagnosis_d.tgz --exclude='*.detailed.json.gz' diagnosis)

s=$(date +%s)
timeout 420 python3 -m fsdp_trace sweep --ac-coverage 0,0.25,0.5,0.75,1 --nproc-per-node 2 \
  --out $R/sweep --model gpt-1.3b --batch-size 1 --warmup-steps 2 --timing-steps 3 --timed-steps 10 \
  > $R/sweep.log 2>&1
echo "== sweep rc=$? $(( $(date +%s) - s ))s"; tail -3 $R/sweep.log
(cd $R && tar czf $OUT/sweep.tgz sweep.log sweep/efficiency.html sweep/efficiency.csv sweep/*/run.json)
cat $R/sweep/efficiency.csv
ls -la $OUT
