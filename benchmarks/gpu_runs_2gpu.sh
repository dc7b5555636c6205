#!/usr/bin/env bash
# Real 2x H200 runs (device tool kind `nvidia-h200-x2`, NVLink between the GPUs):
# the AC-coverage sweep repeated 3 times, a capture per diagnosis rule with its problem and a
# healthy counterpart, `fsdp-trace tune` from eager defaults, what-if validation pairs (one
# knob at a time), eager scaling efficiency. Only the project's own commands
# (`python3 -m fsdp_trace capture|sweep|plot|tune|analyze|whatif`); python snippets only print
# what run.json / the --json outputs say.
#
# Carry the package as committed (the GPU image has torch 2.11, typer, rich, pandas, numpy, not
# msgspec/xxhash/plotly: the wheels in .gpu/wheels, cp312, are installed by every stage):
#   rm -rf .gpu/fsdp_trace && mkdir -p .gpu && git archive HEAD fsdp_trace | tar -x -C .gpu
#   cp benchmarks/gpu_runs_2gpu.sh .gpu/        # .gpu/wheels: msgspec xxhash plotly narwhals packaging
#   device tool `run`, kind nvidia-h200-x2, carry [".gpu"], one command per stage:
#     cd .gpu && bash gpu_runs_2gpu.sh STAGE [ARGS]
# Each stage stays under 9 minutes (estimates below, from the shipped H200 runs' step times
# and ~25-40 s of start-up per capture; each capture also has its own `timeout`), writes its
# runs under /tmp/captures/issue15/ and tars them into $OUT (<= 15 MiB a file, split as
# NAME.tgz.partNN above that: `cat NAME.tgz.part* | tar xz`).
#
# Stages, in the order to run them (device time: all of them need about two 30-minute sessions):
#   sweep 1 a | sweep 1 b | sweep 2 a | sweep 2 b | sweep 3 a | sweep 3 b
#        `fsdp-trace sweep` of gpt-1.3b at batch ${SWEEP_BATCH:-24} (AC 0 peaks at about
#        18.3 + 3.67*b GiB on one GPU and 8.4 + 4.17*b on two, fitted to the shipped b1/b4 runs:
#        ~106-109 GiB of 140 at b24, so memory is tight without AC), 2 GPUs with the 1-GPU
#        baseline per point; part a = AC 0,0.25,0.5 (6 captures, ~5 min), b = 0.75,1 (4, ~4 min);
#        repeat N into sweep/rN{a,b}. Keeps run.json + analysis.json + efficiency.csv.
#        If AC 0 runs out of memory, run every part with SWEEP_BATCH=20.
#   sweep-plot [DIR]  `fsdp-trace plot` of the six folders: efficiency.html/.csv with every
#                point's median and the spread of its 3 repeats (~10 s)
#   rules-small  gpt-small b16 (and tiny, gpt-small b1 seq 256) captures, ~4 min
#   rules-big    gpt-1.3b captures (b4, b4 straggler, b16, b1 seq 512 and 3 variants), ~5 min
#   rules-check [DIR]  analyze every rules capture: does each rule fire on its problem and
#                stay silent on its healthy counterpart (EXPECT below; ~2 min)
#   tune         fsdp-trace tune, gpt-1.3b b1 from eager defaults, budget 3, ~6 min
#   pairs        what-if pairs on 2 GPUs, gpt-1.3b b2, 30 timed steps each, ~6 min
#   predict [DIR]  fsdp-trace whatif on every pair: predicted vs measured (10th
#                percentiles), the README table's rows (~1 min)
#   (the stages with [DIR] also run on the CPU machine over the extracted or committed folders,
#   e.g. `CPU=1 bash benchmarks/gpu_runs_2gpu.sh predict sample_traces/whatif-2gpu`)
#   scaling 4 | scaling 1   eager gpt-1.3b at batch 4 (then 1): 1-GPU baseline + 2 GPUs
#                with --baseline, 3 times, 20 timed steps, ~4 min each
#
# The commands (GPU; R=/tmp/captures/issue15, S="--timing-steps 3 --timed-steps 5"):
#   fsdp-trace sweep --ac-coverage 0,0.25,0.5 --nproc-per-node 2 --out $R/sweep/r1a --overwrite
#       --model gpt-1.3b --batch-size 24 --warmup-steps 2 --timing-steps 3 --timed-steps 10
#       (b: --ac-coverage 0.75,1 --out $R/sweep/r1b; repeats 2, 3: r2a r2b r3a r3b)
#   fsdp-trace plot $R/sweep/r1a ... $R/sweep/r3b --no-traces --out $R/sweep/efficiency.html
#   fsdp-trace capture --out $R/rules/NAME --overwrite --nproc-per-node 2 $S ... with
#     small-b16                  --model gpt-small --batch-size 16
#     small-b16-p2p-disabled     the same, NCCL_P2P_DISABLE=1 in the environment
#     small-b16-max-connections-1  the same, CUDA_DEVICE_MAX_CONNECTIONS=1
#     small-b16-root-reshard     + --root-reshard-after-forward true
#     small-b16-fullac           + --ac-coverage 1
#     small-b8-grad-accum2       --model gpt-small --batch-size 8 --grad-accum 2
#     small-b1-s256              --model gpt-small --batch-size 1 --seq-len 256
#     tiny                       --model tiny
#     big-b4 / big-b16           --model gpt-1.3b --batch-size 4 / 16
#     big-b4-straggler           --model gpt-1.3b --batch-size 4 --straggler-rank 1
#                                --straggler-delay-ms 30
#     big-b1-s512                --model gpt-1.3b --batch-size 1 --seq-len 512
#     big-b1-s512-emb            + --shard-embeddings
#     big-b1-s512-keep-last      + --keep-last-unsharded
#     big-b1-s512-emb-bf16       + --shard-embeddings --reduce-dtype bf16
#   fsdp-trace analyze $R/rules/NAME --no-report --json $R/rules-check/NAME.json
#   fsdp-trace tune --nproc-per-node 2 --budget 3 --out $R/tune --overwrite --model gpt-1.3b
#       --batch-size 1 --timing-steps 3 --timed-steps 20
#   fsdp-trace capture --out $R/pairs/NAME --overwrite --nproc-per-node 2 --model gpt-1.3b
#       --timing-steps 3 --timed-steps 30 with NAME: b2 and b2-repeat (--batch-size 2),
#       b2-ac0.5 / b2-ac1 (--ac-coverage), b2-noreshard (--reshard-after-forward false),
#       b2-pf2 (--prefetch-forward 2), b2-pb2 (--prefetch-backward 2), b2-emb
#       (--shard-embeddings), b4 (--batch-size 4), b2-nch8 (NCCL_MAX_NCHANNELS=8 in the
#       environment: no what-if knob models it, so the pair is measured only)
#   fsdp-trace whatif $R/pairs/BASE --set KNOB=VALUE --json $R/predict/N.json (pairs: PAIRS)
#   fsdp-trace capture --out $R/scaling-b4/b4-rN-1gpu --overwrite --model gpt-1.3b
#       --batch-size 4 --nproc-per-node 1 --timed-steps 20, then b4-rN-2gpu with
#       --nproc-per-node 2 --baseline $R/scaling-b4/b4-rN-1gpu (N = 1, 2, 3; the same at b1)
#
# What a GPU session does after (extract each tarball into a scratch folder first):
#   - sample_traces/sweep-gpt-1.3b-bB/ (B: the sweep's batch): one folder per repeat, r1..r3
#     (a repeat's parts a and b merged), run.json + analysis.json per point, with `fsdp-trace
#     plot sample_traces/sweep-gpt-1.3b-bB/r1 .../r2 .../r3 --no-traces --out
#     sample_traces/sweep-gpt-1.3b-bB/efficiency.html`. Done for B=14 on 2x H100
#     (sample_traces/sweep-gpt-1.3b-b14, which replaced the batch-1 sweep in the tests, the
#     notebook and the README); `python scripts/gpu_tables.py` writes its README table and the
#     commands in sample_traces/README.md from the run.json files.
#   - sample_traces/diagnosis/: the rules-* captures (timing traces; detailed kept for
#     small-b16, tiny and big-b4, the profiler-distortion pair), commands from each run.json
#     in sample_traces/README.md; tests/test_diagnosis.py CASES: each rule's shows/silent from
#     the rules-check table, replacing today's gpt-small b4 samples where the new pair is
#     cleaner; `python scripts/rules_table.py` for the README tables. redundant-collectives
#     and shard-group-crosses-nodes stay synthetic (no one-node capture can show them).
#   - sample_traces/tune-2gpu/: tune.json, tune.md and each run's run.json + analysis.json;
#     README "Tune" table from tune.md.
#   - sample_traces/whatif-2gpu/: the pairs (timing traces + run.json); tests/test_whatif.py
#     REAL_PAIRS gains the predict rows (AC, reshard, prefetch, batch, shard-embeddings), and
#     the README "What if" table their errors (the note that prefetch is checked by no real
#     pair goes once it is).
#   - benchmarks/results/capture/h100x2/: the scaling run.json files (b4 x3, b1 x3, with their
#     1-GPU baselines) as MODEL-bB-rN-Ngpu.run.json (done, 2x H100); `python
#     scripts/gpu_tables.py` writes their table (median, min-max) into
#     benchmarks/results/capture_scaling.md and the batch-4 figure into README.md.
#
# DEADLINE (epoch seconds): a capture that could not end before it (CAP_EST s, default 60) is
# skipped, so a stage returns what it has inside the device tool's 10-minute limit.
#
# CPU=1: the same stages on this CPU machine (tiny model, --device cpu, gloo, 2 processes, few
# steps) to check every command line end to end; runs under /tmp/issue15-cpu. whatif refuses
# CPU traces (no GPU kernels), so `CPU=1 ... predict` predicts on the shipped 2-GPU pair
# gpt-small-2gpu / gpt-small-2gpu-fullac instead. From the repository root:
#   for s in "sweep 1 a" "sweep 1 b" "sweep 2 a" "sweep 2 b" "sweep 3 a" "sweep 3 b" sweep-plot \
#     rules-small rules-big rules-check tune pairs predict "scaling 4" "scaling 1"; do
#     CPU=1 bash benchmarks/gpu_runs_2gpu.sh $s; done
set -u
STAGE=${1:-help}
[ $# -gt 0 ] && shift
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PYTHONPATH=$PWD:$HERE${PYTHONPATH:+:$PYTHONPATH} FSDP_TRACE_QUIET=1 PYTHONUNBUFFERED=1
CPU=${CPU:-0}
FT="python3 -m fsdp_trace"
NP=2

if [ "$CPU" = 1 ]; then
  R=${R:-/tmp/issue15-cpu}
  OUT=${OUT:-$R/out/$STAGE$(printf -- '-%s' "$@")}  # a folder per stage, as a GPU command has
  DEV="--device cpu"
  STEPS="--warmup-steps 1 --timing-steps 2 --timed-steps 3"
  STEPS_SWEEP=$STEPS STEPS_RULES=$STEPS STEPS_PAIRS=$STEPS STEPS_SCALING=$STEPS STEPS_TUNE=$STEPS
  SWEEP_MODEL="--model tiny --batch-size 4"
  SMALL="--model tiny --batch-size 4"
  SMALL_B8="--model tiny --batch-size 2"
  SMALL_COMM="--model tiny --batch-size 1 --seq-len 16"
  HOST="--model tiny"
  BIG="--model tiny"
  BIG_B1S="--model tiny --batch-size 1 --seq-len 32"
  BIG16_BATCH=8
  DELAY_MS=15
  TUNE_MODEL="--model tiny --batch-size 1"
  TUNE_BUDGET=1
  CAP_TIMEOUT=240 STAGE_TIMEOUT=1200
else
  R=${R:-/tmp/captures/issue15}
  OUT=${OUT:-/tmp/out}
  DEV=""
  STEPS_SWEEP="--warmup-steps 2 --timing-steps 3 --timed-steps 10"
  STEPS_RULES="--timing-steps 3 --timed-steps 5"
  STEPS_PAIRS="--timing-steps 3 --timed-steps 30"
  STEPS_SCALING="--timed-steps 20"
  STEPS_TUNE="--timing-steps 3 --timed-steps 20"
  # AC 0 tight in memory on the card that came: 24 on an H200 (141 GB), 14 on an H100 (80 GB)
  GPU_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  [ "${GPU_MIB:-0}" -gt 100000 ] && DEFAULT_BATCH=24 || DEFAULT_BATCH=14
  SWEEP_MODEL="--model gpt-1.3b --batch-size ${SWEEP_BATCH:-$DEFAULT_BATCH}"
  SMALL="--model gpt-small --batch-size 16"
  SMALL_B8="--model gpt-small --batch-size 8"
  SMALL_COMM="--model gpt-small --batch-size 1 --seq-len 256"
  HOST="--model tiny"
  BIG="--model gpt-1.3b"
  BIG_B1S="--model gpt-1.3b --batch-size 1 --seq-len 512"
  BIG16_BATCH=16
  DELAY_MS=30
  TUNE_MODEL="--model gpt-1.3b --batch-size 1"
  TUNE_BUDGET=3
  CAP_TIMEOUT=${CAP_TIMEOUT:-200} STAGE_TIMEOUT=${STAGE_TIMEOUT:-530}
fi
mkdir -p "$R" "$OUT"

setup() {
  if ! python3 -c "import msgspec, xxhash" 2>/dev/null; then
    python3 -m pip install -q --no-index --find-links "${WHEELS:-$HERE/wheels}" msgspec xxhash \
      && echo "analysis wheels installed"
    python3 -m pip install -q --no-index --find-links "${WHEELS:-$HERE/wheels}" plotly 2>/dev/null \
      || echo "plotly not carried: efficiency.csv only (plot the HTML on the CPU machine)"
  fi
  python3 -c "import torch, fsdp_trace; print('torch', torch.__version__, fsdp_trace.__file__)"
  [ "$CPU" = 1 ] || nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
}

cap() {  # cap DIR [VAR=VALUE ...] -- capture args
  local dir=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  mkdir -p "$(dirname "$dir")"
  local s=$(date +%s)
  if [ "${DEADLINE:-0}" -gt 0 ] && [ $(( s + ${CAP_EST:-60} )) -gt "$DEADLINE" ]; then
    printf '== %-40s skipped: the stage is out of time (DEADLINE)\n' "${dir#$R/}"; return
  fi
  env ${envs[@]+"${envs[@]}"} timeout "$CAP_TIMEOUT" $FT capture --out "$dir" --overwrite "$@" \
    $DEV > "$dir.log" 2>&1
  local rc=$?
  printf '== %-40s rc=%s %ss\n' "${dir#$R/}" "$rc" "$(( $(date +%s) - s ))"
  [ $rc -eq 0 ] || tail -5 "$dir.log"
}

pack() {  # pack NAME DIR [tar options]: DIR into $OUT/NAME.tgz, split above 15 MiB
  local name=$1 dir=$2; shift 2
  rm -f "$OUT/$name.tgz" "$OUT/$name.tgz.part"*
  (cd "$(dirname "$dir")" && tar czf "$OUT/$name.tgz" "$@" "$(basename "$dir")")
  if [ "$(stat -c %s "$OUT/$name.tgz")" -gt $((15 * 1024 * 1024)) ]; then
    split -b 15m -d "$OUT/$name.tgz" "$OUT/$name.tgz.part" && rm "$OUT/$name.tgz"
  fi
  local n=$(ls "$OUT" | wc -l)
  [ "$n" -le 8 ] || echo "WARNING: $n files in $OUT (at most 8 come back)"
  ls -la "$OUT"
}

runs_table() {  # what each run.json under the folders says
  python3 - "$@" <<'PY'
import glob, json, sys
for root in sys.argv[1:]:
    for path in sorted(glob.glob(f"{root}/**/run.json", recursive=True)):
        d = json.load(open(path)); f = d["figures"]; s = f["step_time_ms"]
        eff, mfu = f.get("scaling_efficiency"), f.get("mfu")
        print(f"{path[len(root) + 1:-9]:44s} step {s['median']:8.2f} ms (p10 {s['p10']:8.2f} "
              f"n {s['n']:2d}) tok/s/GPU {f['tokens_per_s_per_gpu']:9.0f} "
              f"eff {'-' if eff is None else f'{eff:.3f}'} mfu {'-' if mfu is None else f'{mfu:.3f}'} "
              f"mem {f.get('peak_allocated_gib') or f.get('peak_rss_gib') or 0:.2f} GiB")
PY
}

# rule | the capture that shows it | the healthy counterparts it must stay silent on
EXPECT=(
  "host-bound|tiny|big-b4"
  "straggler|big-b4-straggler|big-b4"
  "profiler-distortion|small-b16|big-b4"
  "first-allgather-exposed|big-b1-s512|big-b1-s512-emb"
  "last-unit-regathered|big-b1-s512|big-b1-s512-keep-last"
  "reduction-tail|big-b1-s512|big-b1-s512-emb-bf16"
  "communication-bound|small-b1-s256|small-b16"
  "low-bus-bandwidth|small-b16-p2p-disabled|small-b16"
  "max-connections-1|small-b16-max-connections-1|small-b16"
  "root-resharded|small-b16-root-reshard|small-b16"
  "ac-over-applied|small-b16-fullac|small-b16"
  "gradient-accumulation|small-b8-grad-accum2|small-b16"
  "overlap-tax|big-b4|big-b16"
)

# base | --set | the run that has the change (what the prediction is checked against)
PAIRS=(
  "b2|ac_coverage=1|b2-ac1"
  "b2-ac1|ac_coverage=0|b2"
  "b2|ac_coverage=0.5|b2-ac0.5"
  "b2|reshard_after_forward=false|b2-noreshard"
  "b2-noreshard|reshard_after_forward=true|b2"
  "b2|prefetch_forward=2|b2-pf2"
  "b2|prefetch_backward=2|b2-pb2"
  "b2|shard_embeddings=true|b2-emb"
  "b2-emb|shard_embeddings=false|b2"
  "b2|batch_size=4|b4"
  "b4|batch_size=2|b2"
)

start=$(date +%s)
case "$STAGE" in
sweep)
  setup
  rep=${1:-1} part=${2:-}
  case "$part" in
    a) points=0,0.25,0.5 ;;
    b) points=0.75,1 ;;
    "") points=0,0.25,0.5,0.75,1 ;;
    *) echo "sweep REPEAT [a|b]"; exit 2 ;;
  esac
  out=$R/sweep/r$rep$part
  mkdir -p "$R/sweep"
  timeout "$STAGE_TIMEOUT" $FT sweep --ac-coverage $points --nproc-per-node $NP --out "$out" \
    --overwrite $SWEEP_MODEL $STEPS_SWEEP $DEV > "$out.log" 2>&1
  echo "== sweep r$rep$part rc=$? $(( $(date +%s) - start ))s"; tail -3 "$out.log"
  runs_table "$out"
  cat "$out/efficiency.csv" 2>/dev/null
  pack "sweep-r$rep$part" "$out" --exclude='*.json.gz' --exclude='*.html'
  ;;
sweep-plot)
  setup
  S=${1:-$R/sweep}
  parts=$(ls -d "$S"/r*/ 2>/dev/null | sed 's:/$::')
  [ -n "$parts" ] || { echo "no sweep folders under $S"; exit 1; }
  $FT plot $parts --no-traces --out "$S/efficiency.html"
  echo "== sweep-plot rc=$? $(( $(date +%s) - start ))s"
  python3 - "$S/efficiency.csv" <<'PY'
import sys
import pandas as pd
t = pd.read_csv(sys.argv[1])
t = t[t["world_size"] > 1]
g = t.groupby("ac_coverage")
print(pd.DataFrame({
    "runs": g.size(),
    "efficiency median": g["scaling_efficiency"].median(),
    "min": g["scaling_efficiency"].min(), "max": g["scaling_efficiency"].max(),
    "tok/s/GPU median": g["tokens_per_s_per_gpu"].median(),
    "exposed % median": g["exposed_pct"].median(),
    "mem GiB": g["peak_allocated_gib"].median(),
}).round(3).to_string())
PY
  (cd "$S" && tar czf "$OUT/sweep-plot.tgz" efficiency.html efficiency.csv)
  ls -la "$OUT"
  ;;
rules-small)
  setup
  D=$R/rules
  S="--nproc-per-node $NP $STEPS_RULES"
  cap $D/small-b16 -- $SMALL $S
  cap $D/small-b16-p2p-disabled NCCL_P2P_DISABLE=1 -- $SMALL $S
  cap $D/small-b16-max-connections-1 CUDA_DEVICE_MAX_CONNECTIONS=1 -- $SMALL $S
  cap $D/small-b16-root-reshard -- $SMALL $S --root-reshard-after-forward true
  cap $D/small-b16-fullac -- $SMALL $S --ac-coverage 1
  cap $D/small-b8-grad-accum2 -- $SMALL_B8 $S --grad-accum 2
  cap $D/small-b1-s256 -- $SMALL_COMM $S
  cap $D/tiny -- $HOST $S
  echo "== rules-small $(( $(date +%s) - start ))s"
  runs_table "$D"
  pack rules-small "$D" --exclude='big-*' \
    --exclude='small-b16-*/*.detailed.json.gz' --exclude='small-b[18]-*/*.detailed.json.gz'
  ;;
rules-big)
  setup
  D=$R/rules
  S="--nproc-per-node $NP $STEPS_RULES"
  cap $D/big-b4 -- $BIG --batch-size 4 $S
  cap $D/big-b4-straggler -- $BIG --batch-size 4 $S --straggler-rank 1 \
    --straggler-delay-ms $DELAY_MS
  cap $D/big-b16 -- $BIG --batch-size $BIG16_BATCH $S
  cap $D/big-b1-s512 -- $BIG_B1S $S
  cap $D/big-b1-s512-emb -- $BIG_B1S $S --shard-embeddings
  cap $D/big-b1-s512-keep-last -- $BIG_B1S $S --keep-last-unsharded
  cap $D/big-b1-s512-emb-bf16 -- $BIG_B1S $S --shard-embeddings --reduce-dtype bf16
  echo "== rules-big $(( $(date +%s) - start ))s"
  runs_table "$D"
  pack rules-big "$D" --exclude='small-*' --exclude='tiny*' \
    --exclude='big-b[14]?*/*.detailed.json.gz' --exclude='big-b16/*.detailed.json.gz'
  ;;
rules-check)
  setup
  D=${1:-$R/rules}
  C=$R/rules-check
  mkdir -p "$C"
  for run in "$D"/*/; do
    name=$(basename "$run")
    $FT analyze "$run" --no-report --json "$C/$name.json" > "$C/$name.log" 2>&1 \
      || { echo "analyze $name failed:"; tail -3 "$C/$name.log"; }
  done
  python3 - "$C" "${EXPECT[@]}" <<'PY'
import json, sys
from pathlib import Path
folder = Path(sys.argv[1])
def rules(name):
    path = folder / f"{name}.json"
    if not path.exists():
        return None
    d = json.loads(path.read_text())
    found = set()
    for f in d["findings"] + d["minor"]:
        found.add(f["rule"])
        found.update(s["rule"] for s in f.get("symptoms") or [])
    return found
bad = 0
print(f"{'rule':26s} {'shows (fires?)':40s} healthy (silent?)")
for line in sys.argv[2:]:
    rule, shows, healthy = line.split("|")
    got = rules(shows)
    fired = "no capture" if got is None else ("fires" if rule in got else "SILENT")
    quiet = []
    for h in healthy.split(","):
        other = rules(h)
        quiet.append(f"{h}: " + ("no capture" if other is None else "FIRES" if rule in other else "silent"))
    bad += fired != "fires" or any(not q.endswith("silent") for q in quiet)
    print(f"{rule:26s} {shows + ': ' + fired:40s} {', '.join(quiet)}")
for path in sorted(folder.glob("*.json")):
    d = json.loads(path.read_text())
    print(f"  {path.stem:32s} {d['verdict'][:100]}")
print(f"{bad} rule(s) not shown cleanly" if bad else "every rule fires on its capture and only there")
PY
  echo "== rules-check $(( $(date +%s) - start ))s"
  (cd "$R" && tar czf "$OUT/rules-check.tgz" rules-check)
  ;;
tune)
  setup
  timeout "$STAGE_TIMEOUT" $FT tune --nproc-per-node $NP --budget $TUNE_BUDGET --out "$R/tune" \
    --overwrite $TUNE_MODEL $STEPS_TUNE $DEV > "$R/tune.log" 2>&1
  echo "== tune rc=$? $(( $(date +%s) - start ))s"
  grep -v "━" "$R/tune.log" | tail -40
  cp "$R/tune.log" "$R/tune/"
  pack tune "$R/tune" --exclude='*.json.gz'
  ;;
pairs)
  setup
  P=$R/pairs
  S="--nproc-per-node $NP $STEPS_PAIRS"
  cap $P/b2 -- $BIG --batch-size 2 $S
  cap $P/b2-repeat -- $BIG --batch-size 2 $S
  cap $P/b2-ac0.5 -- $BIG --batch-size 2 $S --ac-coverage 0.5
  cap $P/b2-ac1 -- $BIG --batch-size 2 $S --ac-coverage 1
  cap $P/b2-noreshard -- $BIG --batch-size 2 $S --reshard-after-forward false
  cap $P/b2-pf2 -- $BIG --batch-size 2 $S --prefetch-forward 2
  cap $P/b2-pb2 -- $BIG --batch-size 2 $S --prefetch-backward 2
  cap $P/b2-emb -- $BIG --batch-size 2 $S --shard-embeddings
  cap $P/b4 -- $BIG --batch-size 4 $S
  cap $P/b2-nch8 NCCL_MAX_NCHANNELS=8 -- $BIG --batch-size 2 $S  # no what-if knob: measured only
  echo "== pairs $(( $(date +%s) - start ))s"
  runs_table "$P"
  pack pairs "$P" --exclude='*.detailed.json.gz'
  ;;
predict)
  setup
  P=${1:-$R/pairs}
  pairs=("${PAIRS[@]}")
  if [ "$CPU" = 1 ] && [ $# -eq 0 ]; then
    # whatif needs GPU kernels: on CPU predict on the shipped 2-GPU pair under pair names
    P=$R/predict-gpu-pairs
    rm -rf "$P" && mkdir -p "$P"
    ln -s "$PWD/sample_traces/gpt-small-2gpu" "$P/b2"
    ln -s "$PWD/sample_traces/gpt-small-2gpu-fullac" "$P/b2-ac1"
    pairs=("b2|ac_coverage=1|b2-ac1" "b2-ac1|ac_coverage=0|b2")
  fi
  W=$R/predict
  rm -rf "$W" && mkdir -p "$W"
  i=0
  for pair in "${pairs[@]}"; do
    IFS='|' read -r base knob other <<< "$pair"
    i=$((i + 1))
    if [ ! -f "$P/$base/run.json" ]; then echo "pair $i: no $P/$base"; continue; fi
    $FT whatif "$P/$base" --set "$knob" --json "$W/$i.json" > "$W/$i.log" 2>&1 \
      || { echo "whatif $base --set $knob failed:"; tail -3 "$W/$i.log"; }
    echo "$i|$base|$knob|$other" >> "$W/pairs.txt"
  done
  python3 - "$P" "$W" <<'PY'
import json, math, sys
from pathlib import Path
runs, folder = Path(sys.argv[1]), Path(sys.argv[2])
def p10(name):
    path = runs / name / "run.json"
    if not path.exists():
        return None, None
    s = json.loads(path.read_text())["figures"]["step_time_ms"]
    return s["p10"], 2 * 1.25 * s["stdev"] / math.sqrt(s["n"])
errors = []
print("| run | change | measured ms | predicted ms | the other run, measured | error | direction |")
print("|---|---|---:|---:|---:|---:|---|")
for line in (folder / "pairs.txt").read_text().split():
    i, base, knob, other = line.split("|")
    path = folder / f"{i}.json"
    if not path.exists():
        print(f"| {base} | {knob} | — | (whatif failed) | | | |"); continue
    d = json.loads(path.read_text())
    before = d["measured"]["step_us"] / 1e3
    pred = d["predicted"]["step_us"] / 1e3
    unc = (d["predicted"].get("uncertainty_us") or 0) / 1e3
    after, noise_after = p10(other)
    _, noise_before = p10(base)
    if after is None:
        print(f"| {base} | {knob} | {before:.1f} | {pred:.1f} ± {unc:.1f} | (not captured) | | |"); continue
    err = pred / after - 1
    errors.append(abs(err))
    beyond = abs(after - before) > (noise_before or 0) + (noise_after or 0)
    direction = ("right" if (pred - before) * (after - before) > 0 else "WRONG") if beyond else "within noise"
    print(f"| {base} | {knob} | {before:.1f} | {pred:.1f} ± {unc:.1f} | {after:.1f} | {100 * err:+.1f} % | {direction} |")
if errors:
    import statistics
    print(f"median error {100 * statistics.median(errors):.1f} %, largest {100 * max(errors):.1f} %")
base, rep = p10("b2"), p10("b2-repeat")
if base[0] and rep[0]:
    print(f"run-to-run: b2 p10 {base[0]:.1f} ms, b2-repeat {rep[0]:.1f} ms ({100 * (rep[0] / base[0] - 1):+.1f} %)")
PY
  echo "== predict $(( $(date +%s) - start ))s"
  (cd "$R" && tar czf "$OUT/predict.tgz" predict)
  ;;
scaling)
  setup
  b=${1:-4}
  C=$R/scaling-b$b
  for n in 1 2 3; do
    cap $C/b$b-r$n-1gpu -- $BIG --batch-size $b --nproc-per-node 1 $STEPS_SCALING
    cap $C/b$b-r$n-2gpu -- $BIG --batch-size $b --nproc-per-node $NP $STEPS_SCALING \
      --baseline $C/b$b-r$n-1gpu
  done
  echo "== scaling b$b $(( $(date +%s) - start ))s"
  runs_table "$C"
  python3 - "$C" "$b" <<'PY'
import glob, json, statistics, sys
folder, b = sys.argv[1], sys.argv[2]
eff, mfu = [], []
for path in sorted(glob.glob(f"{folder}/b{b}-r*-2gpu/run.json")):
    f = json.load(open(path))["figures"]
    if f.get("scaling_efficiency") is not None:
        eff.append(f["scaling_efficiency"])
    if f.get("mfu") is not None:
        mfu.append(f["mfu"])
if eff:
    print(f"batch {b}: scaling efficiency median {statistics.median(eff):.3f} "
          f"(min {min(eff):.3f}, max {max(eff):.3f}, {len(eff)} runs)")
if mfu:
    print(f"batch {b}: MFU median {statistics.median(mfu):.3f} (min {min(mfu):.3f}, max {max(mfu):.3f})")
if not eff:
    print(f"batch {b}: no scaling efficiency (CPU runs have none)")
PY
  pack "scaling-b$b" "$C" --exclude='*.detailed.json.gz' --exclude='*-1gpu/*.json.gz'
  ;;
*)
  sed -n '2,/^set -u/p' "$0" | sed '$d'
  exit 2
  ;;
esac
