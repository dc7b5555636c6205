"""Bad input: one line that says what is wrong and what to do, exit 2, no traceback, and
nothing half-written."""

from __future__ import annotations

import gzip
import json

import pytest

from tests.conftest import run_cli
from tests.synth import TraceBuilder


def _valid(tmp_path):
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.kernel("gemm", 100, 100, launch_ts=5)
    return b.document()


CASES = {
    "missing": (None, "no such file"),
    "not_json": (b"this is not json at all", "not valid JSON"),
    "empty_file": (b"", "empty file"),
    "truncated_gzip": ("truncate", "truncated or corrupt gzip"),
    "empty_events": (json.dumps({"traceEvents": []}).encode(), "'traceEvents' is empty"),
    "unknown_layout": (json.dumps({"events": [1, 2]}).encode(), "no 'traceEvents' key"),
    "wrong_types": (json.dumps({"traceEvents": 5}).encode(), "not a Kineto trace layout"),
    "half_written_json": ("cut", "not valid JSON"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_trace_gets_one_line_and_exit_2(tmp_path, case):
    content, message = CASES[case]
    path = tmp_path / ("trace.json.gz" if content == "truncate" else "trace.json")
    if content == "truncate":
        data = gzip.compress(json.dumps(_valid(tmp_path)).encode())
        path.write_bytes(data[: len(data) // 2])
    elif content == "cut":
        text = json.dumps(_valid(tmp_path))
        path.write_text(text[: len(text) - 40])
    elif content is not None:
        path.write_bytes(content)
    out_json = tmp_path / "out.json"
    out_csv = tmp_path / "csv"
    report = tmp_path / "report.html"
    done = run_cli(
        "analyze",
        str(path),
        "--json",
        str(out_json),
        "--csv",
        str(out_csv),
        "--report",
        str(report),
    )
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("fsdp-trace analyze: error: ")
    assert message in lines[0]
    assert "Traceback" not in done.stderr + done.stdout
    assert not out_json.exists() and not out_csv.exists()  # nothing half-written
    assert not report.exists()


def test_directory_without_traces(tmp_path):
    done = run_cli("analyze", str(tmp_path))
    assert done.returncode == 2
    assert "no .json/.json.gz traces and no run.json" in done.stderr


def test_run_directory_missing_its_timing_traces(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"files": {"timing": ["rank0.timing.json.gz"]}}))
    done = run_cli("analyze", str(tmp_path))
    assert done.returncode == 2
    assert "missing" in done.stderr and "Traceback" not in done.stderr


def test_cpu_trace_is_a_notice_not_an_error(tmp_path):
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.label("FSDP::all_gather (layers.0)", 10, 100)
    b.cpu("c10d::_allgather_base_", 20, 50)
    b.label("gloo:all_gather", 30, 200, tid=999)
    path = b.write(tmp_path / "rank0.json")
    out_json = tmp_path / "out.json"
    done = run_cli("analyze", str(path), "--json", str(out_json), "--no-report")
    assert done.returncode == 0, done.stderr
    assert "no GPU kernels: a CPU (gloo) trace" in done.stdout
    payload = json.loads(out_json.read_text())
    (coll,) = payload["collectives"]
    assert (coll["block"], coll["collective"], coll["dur_us"]) == ("layers.0", "AllGather", 200)


def test_single_gpu_trace_is_a_notice(tmp_path):
    path = TraceBuilder(world_size=1)
    path.step(1, 0, 1000)
    path.kernel("gemm", 100, 100, launch_ts=5)
    done = run_cli("analyze", str(path.write(tmp_path / "t.json")), "--no-report")
    assert done.returncode == 0
    assert "no NCCL kernels" in done.stdout
