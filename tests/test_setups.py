"""Set-ups fsdp-trace did not make itself (sample_traces/foreign-2gpu: 2× H100, and
foreign-cpu: gloo, both written by benchmarks/foreign_setups.py under plain torch.profiler):
each recognized and said, its finding first or folded where it explains another, silent on
the plain FSDP2 counterpart; the evidence checked against the raw trace events here."""

from __future__ import annotations

import gzip
import json
import shutil
from functools import cache

import numpy as np
import pandas as pd
import pytest

from fsdp_trace import analyze
from fsdp_trace.analysis.rank import overlap_tax
from fsdp_trace.vocab import MeshKind, Parallelism
from tests.conftest import SAMPLES

GPU = "foreign-2gpu"
CPU = "foreign-cpu"
BIG = "foreign-2gpu-big"


@cache
def run(path: str):
    return analyze(SAMPLES / path).only


def events(path: str) -> list[dict]:
    """The raw events of the rank-0 trace of a foreign folder (its first file)."""
    name = sorted(p for p in (SAMPLES / path).glob("*.json.gz") if "detailed" not in p.name)[0]
    with gzip.open(name) as fh:
        return json.load(fh)["traceEvents"]


@pytest.mark.parametrize(
    ("path", "parallelism", "offload", "float8"),
    [
        (f"{GPU}/fsdp2", Parallelism.FSDP2, False, False),
        (f"{GPU}/fsdp2-root-only", Parallelism.FSDP2, False, False),
        (f"{GPU}/fsdp2-offload", Parallelism.FSDP2, True, False),
        (f"{GPU}/float8", Parallelism.FSDP2, False, True),
        (f"{GPU}/slow-gpu", Parallelism.FSDP2, False, False),
        (f"{GPU}/fsdp1", Parallelism.FSDP1, False, False),
        (f"{GPU}/ddp", Parallelism.DDP, False, False),
        (f"{CPU}/fsdp1", Parallelism.FSDP1, False, False),
        (f"{CPU}/ddp", Parallelism.DDP, False, False),
        (f"{CPU}/fsdp2-root-only", Parallelism.FSDP2, False, False),
        ("gpt-small-2gpu", Parallelism.FSDP2, False, False),
        ("cpu-hsdp-2x2", Parallelism.FSDP2, False, False),
    ],
)
def test_the_set_up_is_recognized_and_said(path, parallelism, offload, float8):
    r = run(path)
    setup = r.config.setup.value
    assert (setup.parallelism, setup.cpu_offload, setup.float8) == (parallelism, offload, float8)
    payload = r.to_json()["config"]["setup"]
    assert payload["value"]["description"] == setup.describe()
    assert payload["source"] and payload["evidence"]
    from fsdp_trace.present.configuration import config_lines

    lines = {label: (value, source) for label, value, source in config_lines(r.config)}
    assert lines["set-up"][0] == setup.describe()
    if parallelism == Parallelism.DDP:  # never an FSDP mesh, no FSDP units
        assert r.config.mesh.value.kind == MeshKind.DDP
        assert r.config.mesh.value.describe() == "DDP over 2 ranks"
        assert "units" not in lines and "reshard after forward" not in lines
    # FSDP2's defaults are FSDP2's: another set-up's unread items are said to be assumed
    said = " ".join(source for _, source in lines.values())
    assert ("FSDP2 default" in said) <= (parallelism == Parallelism.FSDP2)
    if parallelism == Parallelism.FSDP1:
        placed = (r.collectives["block"] != "unattributed").mean() > 0.5
        assert lines["units"][1].startswith("trace" if placed else "not read")
        assert any(("attributed by the order" in n) == placed for n in r.config.notices)


def test_the_evidence_is_the_raw_traces():
    """float8 GEMMs per step and the optimizer's host time, counted here from the raw events
    inside each CPU ProfilerStep."""
    for path, op in ((f"{GPU}/float8", "aten::_scaled_mm"), (f"{GPU}/fsdp2-offload", None)):
        ev = [e for e in events(path) if e.get("ph") == "X"]
        steps = [
            e
            for e in ev
            if str(e["name"]).startswith("ProfilerStep#") and e.get("cat") == "user_annotation"
        ]
        rank = next(r for r in run(path).ranks if r.rank == 0)
        s = rank.signals
        assert s.steps == len(steps)
        inside = [[e for e in ev if st["ts"] <= e["ts"] <= st["ts"] + st["dur"]] for st in steps]
        if op:
            counts = [sum(1 for e in es if e["name"] == op) for es in inside]
            assert s.float8_gemms == pytest.approx(sum(counts) / len(counts))
        opt = [
            e["dur"]
            for es in inside
            for e in es
            if str(e["name"]).startswith("Optimizer.step#") and e.get("cat") == "user_annotation"
        ]
        assert s.optimizer_cpu_us == pytest.approx(float(np.median(opt)), rel=1e-6)


@pytest.mark.parametrize(
    ("path", "first", "healthy"),
    [
        (f"{GPU}/float8", "float8-uncompiled", f"{GPU}/fsdp2"),
        (f"{GPU}/fsdp2-offload", "cpu-offload", f"{GPU}/fsdp2"),
        # GPU-bound sizes (EXTRA in benchmarks/gpu_runs_foreign.sh): the host is not the limit
        (f"{BIG}/fsdp2-root-only", "one-unit", f"{BIG}/fsdp2"),
        (f"{BIG}/slow-gpu", "straggler", f"{BIG}/fsdp2"),
    ],
)
def test_the_set_up_is_the_first_finding(path, first, healthy):
    d = run(path).diagnosis
    assert d.findings[0].rule == first
    assert d.verdict.startswith(d.findings[0].title)
    assert first not in run(healthy).diagnosis.rules()


@pytest.mark.parametrize(
    ("path", "rule", "healthy"),
    [
        (f"{GPU}/fsdp2-root-only", "one-unit", [f"{GPU}/fsdp2", "gpt-small-2gpu"]),
        (f"{GPU}/ddp", "ddp-allreduce", [f"{GPU}/fsdp2", "gpt-small-2gpu"]),
        (f"{GPU}/fsdp1", "fsdp1", [f"{GPU}/fsdp2", f"{GPU}/ddp"]),
        (f"{CPU}/fsdp1", "fsdp1", [f"{CPU}/fsdp2", f"{CPU}/ddp"]),
    ],
)
def test_each_set_up_is_named_by_a_finding(path, rule, healthy):
    assert rule in run(path).diagnosis.rules()
    for other in healthy:
        assert rule not in run(other).diagnosis.rules(), other


def test_cpu_offload_costs_the_host_optimizer_step():
    """The finding's cost is the GPU idle inside the host's optimizer step plus the offload
    copies with no compute beside them, on the worst rank: both from the rank's evidence;
    the idle, checked here as the optimizer's span minus the GPU work inside it."""
    r = run(f"{GPU}/fsdp2-offload")
    f = r.diagnosis.get("cpu-offload")
    rank = next(x for x in r.ranks if x.rank == f.ranks[0])
    s = rank.signals
    assert f.metrics["optimizer_idle_us"] == s.optimizer_idle_us
    assert s.optimizer_gpu_us < 0.01 * s.optimizer_cpu_us  # the host runs it
    assert s.optimizer_idle_us == pytest.approx(s.optimizer_cpu_us, rel=0.02)
    host_bound = f.symptoms and {x.rule for x in f.symptoms}
    assert host_bound and "host-bound" in host_bound  # the idle is the offload's


def test_float8_casts_are_not_recompute():
    """No block is checkpointed in the float8 run: its backward casts run inside autograd
    but re-run a fraction of the forward; the checkpointed capture's traces alone (no
    run.json) still show every block."""
    assert run(f"{GPU}/float8").config.checkpointed.value == []
    assert float(run(f"{GPU}/float8").steps["recompute_us"].max()) == 0.0


def test_checkpointing_is_read_from_the_trace_alone(tmp_path):
    for name in ("gpt-small-2gpu-fullac", "cpu-fullac"):
        folder = tmp_path / name
        folder.mkdir()
        for trace in (SAMPLES / name).glob("rank*.timing.json.gz"):
            shutil.copy(trace, folder)
        blocks = analyze(folder, cache=False).only.config
        assert blocks.checkpointed.value == blocks.blocks and blocks.blocks


def test_detailed_traces_of_a_few_ranks_join_the_lean_run():
    """Lean traces of ranks 0-3 and detailed ones of ranks 0-1, taken after them, in one
    folder: one run; the detailed traces attach to their ranks and no timing figure reads
    them."""
    result = analyze(SAMPLES / CPU / "mixed-detail")
    assert len(result.runs) == 1
    r = result.only
    assert sorted(x.rank for x in r.ranks) == [0, 1, 2, 3]
    assert sorted(x.rank for x in r.detailed) == [0, 1]
    assert all("detailed" in x.path for x in r.detailed)
    assert not any("detailed" in x.path for x in r.ranks)


def test_the_overlap_tax_counts_only_compute_beside_moving_nccl():
    """One NCCL kernel of 100 µs that waits 60 µs for a peer and moves data for the last 40
    (its twin of the same size took 40 µs): a GEMM beside the waiting part is neither beside
    NCCL moving data nor alone; only those beside the moving part count as beside."""
    coll = pd.DataFrame(
        {
            "collective": ["AllGather", "AllGather"],
            "bytes": [1e6, 1e6],
            "group_size": [2.0, 2.0],
            "start_us": [1000.0, 5000.0],
            "end_us": [1100.0, 5040.0],
            "dur_us": [100.0, 40.0],
        }
    )
    moving = overlap_tax.moving(coll)
    assert moving[0].tolist() == [1060.0, 5000.0] and moving[1].tolist() == [1100.0, 5040.0]
    rows = []
    # the same op (name, shape, phase, position) three times beside waiting, three beside
    # moving data, three alone; slower only beside the moving part
    for step, (start, dur) in enumerate(
        [
            (1005, 10),
            (1015, 10),
            (1025, 10),
            (1062, 13),
            (1078, 13),
            (5010, 13),
            (3000, 10),
            (3100, 10),
            (3200, 10),
        ]
    ):
        rows.append((start, start + dur, dur, "compute", step))
    rows += [(1000.0, 1100.0, 100.0, "comm", 0), (5000.0, 5040.0, 40.0, "comm", 5)]
    k = pd.DataFrame(rows, columns=["ts", "end", "dur", "kind", "step"])
    k = k.assign(
        name="gemm", grid="[1,1,1]", block_dim="[128,1,1]", phase="forward", block="layers.0"
    )
    ops = overlap_tax.measure(k, {"layers.0"}, moving)
    assert len(ops) == 1
    op = ops.iloc[0]
    assert (op["n_with"], op["n_alone"]) == (3, 3)
    assert op["median_with"] == 13 and op["median_alone"] == 10
    every = overlap_tax.measure(k, {"layers.0"})  # the NCCL kernels' whole span: diluted
    assert every.iloc[0]["n_with"] == 6 and every.iloc[0]["median_with"] < 13


def test_the_overlap_tax_never_leads_a_verdict():
    for path in ("diagnosis/gpt-1.3b-b4-2gpu", f"{GPU}/slow-gpu", "gpt-small-2gpu"):
        d = run(path).diagnosis
        tax = d.get("overlap-tax")
        if tax is not None:
            assert tax.kind == "note" and tax not in [f for f in d.findings if f.kind == "cause"]
        assert not d.verdict.startswith("Overlap tax")
    assert run("diagnosis/gpt-1.3b-b4-2gpu").diagnosis.get("overlap-tax") is not None


def test_fsdp1_collectives_are_attributed_to_its_units_by_hook_order():
    """FSDP1's labels name no module: its units are numbered by forward order (the root
    first, enclosing the others). Every gather and reduce-scatter lands on a unit; each block
    unit is gathered in forward and again in backward and reduced once per step; the root
    (embeddings and head) moves the most bytes; a unit's gradient reduce-scatter (fp32)
    moves twice its bf16 gather."""
    r = run(f"{GPU}/fsdp1")
    assert r.config.blocks == [f"unit {i}" for i in range(1, 7)]
    for rank in r.ranks:
        c = rank.collectives
        assert not (c["block"] == "unattributed").any()
        n = rank.steps["step"].nunique()
        per = c.groupby(["block", "collective", "phase"]).size() / n
        for unit in r.config.blocks:
            assert per[(unit, "AllGather", "forward")] == 1
            assert per[(unit, "AllGather", "backward")] == 1
            assert per[(unit, "ReduceScatter", "backward")] == 1
        gathers = c[c["collective"] == "AllGather"].groupby("block")["bytes"].median()
        reduced = c[c["collective"] == "ReduceScatter"].groupby("block")["bytes"].median()
        assert gathers.idxmax() == "root"
        assert (reduced[r.config.blocks] == 2 * gathers[r.config.blocks]).all()


def test_float8_names_its_amax_all_reduces_and_its_gathers():
    """float8's amax all-reduces (4-byte scalars) and one-byte all-gathers, counted here from
    the rank's collectives, are in the finding's evidence and cost."""
    r = run(f"{GPU}/float8")
    f = r.diagnosis.get("float8-uncompiled")
    rank = next(x for x in r.ranks if x.rank == f.ranks[0])
    c, n = rank.collectives, len(rank.steps)
    scalars = c[(c["collective"] == "AllReduce") & (c["bytes"] == 4)]
    assert f.metrics["amax_allreduces_per_step"] == len(scalars) / n > 0
    exposed = scalars["exposed_transfer_us"].fillna(0).sum() / n
    assert f.metrics["amax_exposed_us"] == pytest.approx(exposed)
    gathers = c[(c["collective"] == "AllGather") & (c["dtype"] == "Byte")]
    assert f"{gathers['bytes'].median() / 1e6:.1f} MB each: one byte a parameter" in f.evidence


@pytest.mark.parametrize("seed", range(30))
def test_union_per_step_reads_each_step_and_the_cover_it_meets(seed):
    """The median over steps of each step's union less `cover` (offload copies no compute
    hides): against each step's rows picked by a mask and the whole cover, and a fine grid."""
    from fsdp_trace.analysis import intervals as iv
    from fsdp_trace.analysis.rank import setup as setup_mod

    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 60))
    ts = np.round(rng.uniform(0, 200, n), 2)
    end = ts + np.round(rng.uniform(0, 15, n), 2)
    step_of = rng.integers(0, 5, n)
    steps = np.arange(6)  # step 5 has no rows
    c0 = np.round(rng.uniform(0, 200, 20), 2)
    cover = iv.union(c0, c0 + np.round(rng.uniform(0, 10, 20), 2))
    got = setup_mod._union_per_step(ts, end, step_of, steps, cover=cover)
    whole = [
        iv.length(iv.subtract(iv.union(ts[step_of == s], end[step_of == s]), cover)) for s in steps
    ]
    assert got == float(np.median(whole)) if n else got == 0.0
    grid = np.arange(0, 230, 0.01) + 0.005
    covered = np.zeros(grid.size, bool)
    for a, b in zip(*cover, strict=True):
        covered |= (grid >= a) & (grid < b)
    per_step = []
    for s in steps:
        mine = np.zeros(grid.size, bool)
        for a, b in zip(ts[step_of == s], end[step_of == s], strict=True):
            mine |= (grid >= a) & (grid < b)
        per_step.append((mine & ~covered).sum() * 0.01)
    if n:
        assert got == pytest.approx(float(np.median(per_step)), abs=0.02)
