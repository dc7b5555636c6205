"""Our overlap figure beside HTA's get_comm_comp_overlap on the same traces, with whichever
HTA is installed: holistictraceanalysis 0.5.0 (the dev extra) or its successor traceinsight
0.6.1. The two install the same module, `hta`, over each other, so they never share an
environment: CI installs traceinsight apart (`pip install --no-deps --target DIR`, .ci/run)
and names DIR in FSDP_TRACE_TRACEINSIGHT; `test_with_traceinsight` then runs this file again
in a process that imports `hta` from DIR."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fsdp_trace import analyze
from fsdp_trace.analysis.job import hta_check
from fsdp_trace.analysis.job.hta_check import (
    HTA_PACKAGES,
    cross_check,
    hta_overlap,
    hta_tool,
    overlap_with_hta_rules,
)
from fsdp_trace.analysis.read.loader import load_trace
from tests.conftest import REPO, SAMPLES, run_cli

pytest.importorskip("hta")
TRACEINSIGHT = "traceinsight 0.6.1"
# A folder holding traceinsight (pip install --no-deps --target FOLDER traceinsight==0.6.1).
TRACEINSIGHT_DIR = os.environ.get("FSDP_TRACE_TRACEINSIGHT")
# Set by test_with_traceinsight for the process it starts: the HTA that must be running there.
EXPECTED = os.environ.get("FSDP_TRACE_EXPECT_HTA")
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


def test_the_hta_that_runs_is_named():
    tool = hta_tool()
    assert tool is not None and tool.split(" ")[0] in HTA_PACKAGES, tool
    import hta

    assert tool.split(" ")[1] == hta.__version__
    if EXPECTED:
        assert tool == EXPECTED


def test_cross_check_table_and_cli():
    result = analyze(SAMPLES / "gpt-small-2gpu", detailed=False)
    table, notices = cross_check(result.ranks)
    tool = hta_tool()
    assert notices == [f"HTA cross-check: {tool}"] and list(table["rank"]) == [0, 1]
    assert table["tool"].tolist() == [tool, tool]  # which HTA ran, per row
    # HTA's default rounds ns timestamps to whole µs: off by under a point on these traces.
    assert (table["ours_hta_rules_pct"] - table["hta_pct"]).abs().max() < 1.0
    done = run_cli(
        "analyze", str(SAMPLES / "gpt-small-2gpu"), "--hta", "--no-detailed", "--no-report"
    )
    assert done.returncode == 0, done.stderr
    assert "Cross-check with HTA" in done.stdout
    assert f"HTA cross-check: {tool}" in " ".join(done.stdout.split())


def test_no_hta_is_a_notice(monkeypatch):
    monkeypatch.setattr(hta_check, "hta_tool", lambda: None)
    table, notices = cross_check(analyze(SAMPLES / "gpt-small-2gpu", detailed=False).ranks)
    assert table.empty and notices == [hta_check.NOT_INSTALLED]
    assert "pip install traceinsight" in notices[0]


def test_cpu_run_names_the_hta_and_checks_nothing():
    table, notices = cross_check(analyze(SAMPLES / "cpu-gloo-2proc", detailed=False).ranks)
    assert table.empty
    assert notices == [f"HTA cross-check: {hta_tool()} — no GPU rank with collectives to check"]


def test_an_hta_failure_is_one_short_line(monkeypatch):
    """HTA's errors can quote whole arrays over many lines (pandas 3's `TypeError: Invalid
    value '[40564 40584 ...]' for dtype 'int16'`, 3.7 KB): the notice stays one line."""
    values = " ".join(str(40564 + 4 * i) for i in range(600))
    wrapped = "\n ".join(values[i : i + 70] for i in range(0, len(values), 70))

    def fails(path, rank, rounding=True):
        raise TypeError(f"Invalid value '[{wrapped}]' for dtype 'int16'")

    monkeypatch.setattr(hta_check, "hta_overlap", fails)
    table, notices = cross_check(analyze(SAMPLES / "gpt-small-2gpu", detailed=False).ranks)
    assert table.empty and len(notices) == 3
    for notice in notices[1:]:
        assert "\n" not in notice and len(notice) < 200, notice
        assert "Invalid value '…' for dtype 'int16'" in notice
    assert notices[1].startswith("--hta: HTA failed on rank 0 (rank0.timing.json.gz): TypeError")


def test_a_real_hta_failure_prints_one_line_per_rank():
    """The 2-rank detailed sample: HTA 0.5.0 / traceinsight 0.6.1 fail on it under pandas 3;
    where they do, each rank's notice is one line (it was 3.7 KB of array, 195 lines)."""
    folder = SAMPLES / "gpt-small-2gpu"
    traces = [str(folder / f"rank{r}.detailed.json.gz") for r in (0, 1)]
    done = run_cli("analyze", *traces, "--hta", "--no-report", env={"COLUMNS": "400"})
    assert done.returncode == 0, done.stderr
    failed = [line for line in done.stdout.splitlines() if "HTA failed" in line]
    if not failed:
        assert "Cross-check with HTA" in done.stdout  # HTA ran on both (pandas 2)
        return
    assert len(failed) == 2 and all(len(line) < 250 for line in failed), failed
    assert "[4" not in done.stdout + done.stderr  # no array of HTA's in the output


@pytest.mark.slow
def test_with_traceinsight():
    """This file's tests again, with traceinsight 0.6.1 as `hta` (a process of its own)."""
    if hta_tool() == TRACEINSIGHT:
        return  # this process runs traceinsight: the tests above were its run
    if not TRACEINSIGHT_DIR:
        pytest.skip(
            "traceinsight is not installed apart: pip install --no-deps --target DIR "
            "traceinsight==0.6.1 and set FSDP_TRACE_TRACEINSIGHT=DIR (.ci/run does)"
        )
    path = os.pathsep.join(filter(None, [TRACEINSIGHT_DIR, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "FSDP_TRACE_EXPECT_HTA": TRACEINSIGHT}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0"]
    done = subprocess.run(
        [*command, "-m", "", "-k", "not test_with_traceinsight", __file__],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " skipped" not in done.stdout, done.stdout[-2000:]


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
