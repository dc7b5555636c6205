"""How a capture ends when things go wrong: no torch, Ctrl-C / SIGTERM / a killed rank, a hung
rank, and --overwrite over an earlier (killed) run. Each ends with one line, no traceback, and
no half-written output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli

STALLS = "tests.models_for_tests:stalls_after_profiling"


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("fsdp-trace")]


def blocker_dir(tmp_path: Path, modules: list[str]) -> Path:
    """A sitecustomize that makes `import <module>` fail with ModuleNotFoundError, in this
    process and every process it starts (torchrun's ranks inherit PYTHONPATH). `find_spec`
    still answers (torch's dynamo probes for installed libraries that way); importing fails."""
    folder = tmp_path / "blocker"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(
        textwrap.dedent(
            f"""
            import importlib.abc
            import importlib.machinery
            import sys

            BLOCKED = {modules!r}


            class NotInstalled(importlib.abc.Loader):
                def create_module(self, spec):
                    return None

                def exec_module(self, module):
                    name = module.__name__
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)


            class Blocker(importlib.abc.MetaPathFinder):
                def find_spec(self, name, path=None, target=None):
                    if name.split(".")[0] in BLOCKED:
                        return importlib.machinery.ModuleSpec(name, NotInstalled())
                    return None


            sys.meta_path.insert(0, Blocker())
            """
        )
    )
    return folder


def test_capture_without_torch_says_how_to_install_it(tmp_path):
    blocker = blocker_dir(tmp_path, ["torch"])
    out = tmp_path / "run"
    done = run_cli(
        "capture",
        *("--nproc-per-node", "1", "--out", str(out)),
        env={"PYTHONPATH": f"{blocker}{os.pathsep}{REPO}"},
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert error_lines(done.stderr) == [
        "fsdp-trace capture: error: capture needs PyTorch, which is not installed: "
        'pip install "fsdp-trace[capture]" (or the torch build for your CUDA)'
    ]
    assert "Traceback" not in done.stderr
    assert not out.exists()


def test_overwrite_replaces_an_earlier_killed_run_with_torch_typer_rich_only(tmp_path):
    """--overwrite removes the previous run's files (a stale rank 3 from a bigger world, the
    temp files a killed run left) and keeps the user's; the whole capture path runs with
    pandas, plotly, msgspec and perfetto unimportable."""
    out = tmp_path / "run"
    out.mkdir()
    stale = [
        "run.json",
        "rank0.detailed.json.gz",
        "rank3.timing.json.gz",
        ".rank0.timing.tmp-4242.json.gz",
        ".run.json.abcd1234.tmp",
    ]
    for name in stale:
        (out / name).write_text("from an earlier run")
    (out / "notes.txt").write_text("mine")
    refused = run_cli("capture", "--nproc-per-node", "1", "--out", str(out), timeout=60)
    assert refused.returncode == 2 and "--overwrite" in refused.stderr

    blocker = blocker_dir(tmp_path, ["pandas", "plotly", "msgspec", "perfetto"])
    done = run_cli(
        "capture",
        *("--nproc-per-node", "1", "--out", str(out), "--overwrite"),
        *("--warmup-steps", "0", "--timing-steps", "1", "--timed-steps", "2"),
        env={"PYTHONPATH": f"{blocker}{os.pathsep}{REPO}"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == [
        "notes.txt",
        "rank0.detailed.json.gz",
        "rank0.timing.json.gz",
        "run.json",
    ]
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["overwrite"] is True and run["world"]["world_size"] == 1
    assert run["command"].endswith("--overwrite --warmup-steps 0 --timing-steps 1 --timed-steps 2")
    # Rank 0's end-of-capture summary (stdout), with the reason MFU is missing.
    assert "tokens/s/GPU" in done.stdout and "omitted: not a GPU run" in done.stdout
    median = run["figures"]["step_time_ms"]["median"]
    assert f"{median:.2f} ms median" in done.stdout


def start_stalling_capture(out: Path, pid_dir: Path) -> subprocess.Popen:
    """A 2-rank capture that writes both traces per rank, then stalls in the timed steps."""
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "fsdp_trace", "capture", "--model", STALLS),
            *("--batch-size", "2", "--seq-len", "1", "--nproc-per-node", "2", "--out", str(out)),
            *("--warmup-steps", "0", "--timing-steps", "1"),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, like a shell job
        env={**os.environ, "FSDP_TRACE_QUIET": "1", "FSDP_TRACE_TEST_PID_DIR": str(pid_dir)},
    )


@pytest.mark.parametrize(
    ("how", "code", "line"),
    [
        (
            "ctrl-c",
            130,
            "fsdp-trace capture: error: interrupted by SIGINT: every rank stopped, no run "
            "written (incomplete traces and temp files removed from {out})",
        ),
        (
            "sigterm-launcher",
            143,
            "fsdp-trace capture: error: interrupted by SIGTERM: every rank stopped, no run "
            "written (incomplete traces and temp files removed from {out})",
        ),
        (
            "sigkill-rank-1",
            1,
            "fsdp-trace capture: error: rank 1 exited with code -9 and left no message",
        ),
    ],
)
def test_a_killed_run_leaves_no_traces_and_no_run_json(tmp_path, how, code, line):
    out = tmp_path / "run"
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    job = start_stalling_capture(out, pid_dir)
    try:
        finals = [out / f"rank{r}.{p}.json.gz" for r in (0, 1) for p in ("detailed", "timing")]
        deadline = time.monotonic() + 90
        while not all(path.exists() for path in finals):
            assert job.poll() is None, job.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "the traces never appeared"
            time.sleep(0.2)
        if how == "ctrl-c":  # the terminal signals the whole foreground job
            os.killpg(job.pid, signal.SIGINT)
        elif how == "sigterm-launcher":
            job.send_signal(signal.SIGTERM)
        else:
            os.kill(int((pid_dir / "rank1.pid").read_text()), signal.SIGKILL)
        _, stderr = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    assert job.returncode == code, stderr[-2000:]
    assert error_lines(stderr) == [line.format(out=out)]
    assert "Traceback" not in stderr
    assert not out.exists()  # no final-named trace, no temp file, no run.json, no empty dir


def test_a_hung_rank_ends_the_job_at_the_process_group_timeout(tmp_path):
    """Rank 1 never produces a batch; rank 0 waits in the first all-gather until --timeout-s,
    then the job ends with one line instead of hanging."""
    out = tmp_path / "run"
    start = time.monotonic()
    done = run_cli(
        "capture",
        *("--model", "tests.models_for_tests:hangs_on_rank_1", "--batch-size", "2"),
        *("--seq-len", "1", "--nproc-per-node", "2", "--out", str(out), "--timeout-s", "10"),
        timeout=120,
    )
    elapsed = time.monotonic() - start
    assert 10 < elapsed < 60
    assert done.returncode == 1
    lines = error_lines(done.stderr)
    assert len(lines) == 1
    assert lines[0].startswith(
        "fsdp-trace capture: error: rank 0: a collective waited longer than --timeout-s 10 "
        "for another rank, which is stuck or far behind (RuntimeError: Timed out waiting 10000ms"
    )
    assert "Traceback" not in done.stderr
    assert not out.exists()
