"""Bad input: one line that says what is wrong and what to do, exit 2, no traceback, and
nothing half-written."""

from __future__ import annotations

import gzip
import json

import pytest

from tests.conftest import SAMPLES, run_cli
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


def _trace(tmp_path):
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.kernel("gemm", 100, 100, launch_ts=5)
    b.nccl("AllGather", 150, 100, launch_ts=6)
    return b.write(tmp_path / "rank0.json")


def _one_line_error(done, *fragments: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fsdp-trace analyze: error: "), done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.mark.parametrize("bad", ["csv", "report", "perfetto", "json", "same"])
def test_bad_output_path_writes_nothing(tmp_path, bad):
    """Every output path is checked before anything is written: --json is not left behind
    when --csv (or another output) cannot be written."""
    trace = _trace(tmp_path)
    a_file = tmp_path / "plain_file"
    a_file.write_text("keep me")
    out = tmp_path / "out"
    paths = {
        "--json": out / "a.json",
        "--csv": out / "csv",
        "--report": out / "r.html",
        "--perfetto": out / "v.pftrace",
    }
    option = {"same": "--perfetto"}.get(bad, f"--{bad}")
    paths[option] = {
        "csv": a_file,  # an existing plain file as the CSV folder
        "report": a_file / "r.html",  # a folder that is a file
        "perfetto": a_file / "deeper" / "v.pftrace",
        "json": tmp_path,  # a folder as the JSON file
        "same": out / "a.json",  # two outputs to one file
    }[bad]
    args = [a for option_, path in paths.items() for a in (option_, str(path))]
    done = run_cli("analyze", str(trace), *args)
    _one_line_error(done, option)
    assert not out.exists()  # nothing written, no folder made
    assert a_file.read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain_file", "rank0.json"]


def test_all_outputs_written_into_new_folders(tmp_path):
    trace = _trace(tmp_path)
    out = tmp_path / "new" / "deeper"
    done = run_cli(
        "analyze",
        str(trace),
        "--json",
        str(out / "a.json"),
        "--csv",
        str(out / "csv"),
        "--report",
        str(out / "r.html"),
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["a.json", "csv", "r.html"]  # no leftovers
    assert sorted(p.name for p in (out / "csv").iterdir()) == [
        "blocks.csv",
        "breakdown.csv",
        "collectives.csv",
        "steps.csv",
    ]
    assert json.loads((out / "a.json").read_text())["steps"][0]["comm_us"] == 100


@pytest.mark.parametrize(
    "condition",
    [
        "exposed_pct>1.2.3",
        "exposed_pct>.",
        "exposed_pct>>5",
        "nonsense<1",
        "mfu<0.4",  # a trace file has no run.json to read MFU from: refused after analysis
    ],
)
def test_bad_fail_on_is_one_line_and_writes_nothing(tmp_path, condition):
    out_json = tmp_path / "out.json"
    done = run_cli(
        "analyze",
        str(_trace(tmp_path)),
        "--json",
        str(out_json),
        "--report",
        str(tmp_path / "r.html"),
        "--fail-on",
        condition,
    )
    _one_line_error(done, "--fail-on", condition.split("<")[0].split(">")[0])
    assert not out_json.exists() and not (tmp_path / "r.html").exists()


def test_trace_without_launch_events_is_analyzed(tmp_path):
    """No cuda_runtime/cuda_driver events: a notice and one window, never a traceback."""
    for with_steps in (True, False):
        b = TraceBuilder()
        if with_steps:
            b.step(1, 0, 1000)
        b.kernel("gemm", 100, 100, launch_ts=None)
        b.nccl("AllGather", 150, 100, launch_ts=None)
        done = run_cli("analyze", str(b.write(tmp_path / "rank0.json")), "--no-report")
        assert done.returncode == 0, done.stderr
        assert "rank 0: none of the 2 GPU events has its launch in the trace" in " ".join(
            done.stdout.split()
        )


def test_notices_name_their_rank_and_run_json_notices_are_shown():
    done = run_cli("analyze", str(SAMPLES / "cpu-gloo-2proc"), "--no-report")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "notice: run.json: MFU omitted: not a GPU run" in text
    assert "notice: ranks 0, 1 (timing and detailed traces): no GPU kernels" in text
    done = run_cli("analyze", str(SAMPLES / "gpt-small-2gpu"), "--no-report")
    notices = [ln for ln in done.stdout.splitlines() if ln.startswith("notice:")]
    assert notices and all(ln.startswith("notice: rank") for ln in notices), notices
    assert len(notices) == len(set(notices))


def test_a_failing_output_leaves_none_behind(tmp_path, monkeypatch):
    """The report fails after the JSON and CSV were written (a full disk): neither is moved
    into place, no staging file or folder it made is left, and the error is one line."""
    from fsdp_trace import analyze, cli
    from fsdp_trace.errors import UserError
    from fsdp_trace.render import report

    result = analyze(_trace(tmp_path))

    def full_disk(analysis, path):
        path.write_text("<html>half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report, "write_report", full_disk)
    out = tmp_path / "new"
    outputs = {"--json": out / "a.json", "--report": out / "r.html", "--perfetto": None}
    with pytest.raises(UserError, match=r"--report .*r.html: cannot write \(No space left"):
        cli.analyze._write_outputs(cli.analyze._FromResult(result, True), outputs, out / "csv")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.json"]


_started = None  # a semaphore the workers below release, inherited by their fork


def _tell_then_sleep() -> None:
    import time

    _started.release()
    time.sleep(30)


def test_a_stopped_pool_leaves_no_manager_thread_for_the_exit_hook():
    """After an error the pool is stopped; its manager thread must have closed its wake-up
    pipe before the interpreter's exit hook writes to it (else, now and then, a traceback
    after the error's one line: the next test's failure once in CI). The workers, forked
    while the command's own SIGTERM handler is in place, end at once all the same."""
    import multiprocessing
    import signal
    from concurrent.futures import ProcessPoolExecutor

    from fsdp_trace.analysis.job import perrank

    global _started
    fork = multiprocessing.get_context("fork")
    _started = fork.Semaphore(0)
    before = signal.signal(signal.SIGTERM, lambda *_: None)  # a handler that does not end
    try:
        pool = ProcessPoolExecutor(2, mp_context=fork, initializer=perrank._start_worker)
        for _ in range(2):
            pool.submit(_tell_then_sleep)
        assert all(_started.acquire(timeout=60) for _ in range(2))  # both inside their call
        manager = pool._executor_manager_thread
        perrank.stop_pool(pool)
        assert manager is not None and not manager.is_alive()
    finally:
        signal.signal(signal.SIGTERM, before)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_corrupt_trace_among_several_is_one_line_with_any_jobs(tmp_path, jobs):
    """With worker processes too (--jobs 2 ends the pool): one line naming the trace, exit 2,
    no traceback."""
    for name in ("rank0.timing.json.gz", "rank1.timing.json.gz"):
        (tmp_path / name).write_bytes((SAMPLES / "gpt-small-2gpu" / name).read_bytes())
    corrupt = tmp_path / "rank1.timing.json.gz"
    corrupt.write_bytes(corrupt.read_bytes()[:100_000])
    done = run_cli("analyze", str(tmp_path), "--no-report", "--no-cache", "--jobs", jobs)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"fsdp-trace analyze: error: {corrupt}: truncated or corrupt gzip: re-copy or "
        "re-export the trace"
    ]


def test_hta_asked_for_but_not_installed_is_one_line(tmp_path):
    """issue 21 (8): `--hta` without HTA exited 0 with a notice; it was asked for, so the
    command refuses in one line (exit 2) before any analysis, and writes nothing."""
    import subprocess
    import sys

    from tests.conftest import REPO

    report = tmp_path / "r.html"
    code = (
        "import sys; sys.modules['hta'] = None  # no HTA to import\n"
        "from fsdp_trace.cli import main; main()"
    )
    args = ["analyze", str(SAMPLES / "gpt-small-2gpu"), "--hta", "--report", str(report)]
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        "fsdp-trace analyze: error: --hta: HTA is not installed: pip install traceinsight "
        "(HTA's successor; or holistictraceanalysis, not both: they install the same module)"
    ]
    assert done.stdout == "" and not report.exists()
