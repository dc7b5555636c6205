"""Our overlap figure beside HTA's get_comm_comp_overlap on the same traces."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from fsdp_trace import analyze
from fsdp_trace.analysis.hta_check import cross_check, hta_overlap, overlap_with_hta_rules
from fsdp_trace.analysis.loader import load_trace
from tests.conftest import SAMPLES, run_cli

pytest.importorskip("hta")
DATA = Path(__file__).parent / "data" / "hta"
TRACES = [
    DATA / "sampled_rank-0_pt20.json.gz",
    DATA / "nccl_data_a100_pt24.json.gz",
    SAMPLES / "gpt-small-2gpu" / "rank0.timing.json.gz",
    SAMPLES / "gpt-small-2gpu" / "rank1.timing.json.gz",
]


@pytest.mark.parametrize("path", TRACES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_same_definitions_give_the_same_figure(path):
    """HTA's window and kernel classes, exact timestamps on both sides: equal to 0.01."""
    trace = load_trace(path)
    ours = overlap_with_hta_rules(trace)
    theirs = hta_overlap(path, trace.rank or 0, rounding=False)
    assert ours == pytest.approx(theirs, abs=0.01)


def test_reference_figures_and_the_rounding_difference():
    sampled = load_trace(DATA / "sampled_rank-0_pt20.json.gz")
    assert round(overlap_with_hta_rules(sampled), 2) == 11.81  # integer µs: no rounding
    nccl = DATA / "nccl_data_a100_pt24.json.gz"
    assert round(overlap_with_hta_rules(load_trace(nccl)), 2) == 14.76
    # HTA by default rounds ns timestamps inward to whole µs: 14.31 on this trace.
    assert hta_overlap(nccl, 0) == pytest.approx(14.31, abs=0.005)


def test_cross_check_table_and_cli():
    result = analyze(SAMPLES / "gpt-small-2gpu", detailed=False)
    table, notices = cross_check(result.ranks)
    assert not notices and list(table["rank"]) == [0, 1]
    # HTA's default rounds ns timestamps to whole µs: off by under a point on these traces.
    assert (table["ours_hta_rules_pct"] - table["hta_pct"]).abs().max() < 1.0
    done = run_cli(
        "analyze", str(SAMPLES / "gpt-small-2gpu"), "--hta", "--no-detailed", "--no-report"
    )
    assert done.returncode == 0, done.stderr
    assert "Cross-check with HTA" in done.stdout


def _without_profiler_steps(source: Path, target: Path) -> Path:
    """The trace with its ProfilerStep annotations (CPU and GPU side) and the GPU events whose
    launch is not in it removed: HTA then reads every kernel, and so does our one window."""
    doc = json.loads(gzip.decompress(source.read_bytes()))
    events = doc["traceEvents"]
    launched = {
        e["args"]["correlation"]
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    doc["traceEvents"] = [
        e
        for e in events
        if "ProfilerStep" not in e.get("name", "")
        and not (
            e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
            and e["args"].get("correlation") not in launched
        )
    ]
    target.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return target


@pytest.mark.parametrize("rank", [0, 1])
def test_main_analysis_over_one_window_equals_hta(tmp_path, rank):
    """The per-step analysis itself (not a separate function): on a trace without ProfilerStep
    it measures one window over every kernel, which is exactly HTA's window there."""
    path = _without_profiler_steps(
        SAMPLES / "gpt-small-2gpu" / f"rank{rank}.timing.json.gz", tmp_path / f"rank{rank}.json.gz"
    )
    r = analyze(path).ranks[0]
    assert len(r.steps) == 1 and any("no ProfilerStep" in n for n in r.notices)
    assert not any("left out" in n for n in r.notices)  # every GPU event is in the window
    ours = r.steps.iloc[0]["overlap_pct"]
    assert ours == pytest.approx(hta_overlap(path, rank, rounding=False), abs=0.01)
    assert ours == pytest.approx(overlap_with_hta_rules(load_trace(path)), abs=1e-9)
