"""How a capture ends when things go wrong: no torch, Ctrl-C / SIGTERM / a killed rank (named,
not the rank that lost its connection to it), a hung rank, --overwrite over an earlier (killed)
run, a second capture into the --out of a running one (refused, the first untouched), and a
factory model that cannot be imported (refused before any rank starts). Each ends with one
line, no traceback, and no half-written output."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fsdp_trace.capture import outputs
from fsdp_trace.errors import UserError
from tests.conftest import REPO, run_cli

STALLS = "tests.models_for_tests:stalls_after_profiling"
KILLED_RANK_1 = (
    "rank 1 was killed by SIGKILL (exit code -9: the kernel's out-of-memory killer, see "
    "dmesg, or a kill from outside); the other ranks stopped after it"
)


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


@pytest.mark.slow
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


@pytest.mark.slow
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
            f"fsdp-trace capture: error: {KILLED_RANK_1}",
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


@pytest.mark.slow
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


# -- two captures into one --out: the second is refused, the first is left alone -------------

FAST = ("--model", "tests.models_for_tests:two_layer", "--batch-size", "2", "--seq-len", "1")
QUICK_STEPS = ("--warmup-steps", "0", "--timing-steps", "1", "--timed-steps", "1")


def torchrun_command(nproc: int, *args: str) -> list[str]:
    return [
        *(sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"),
        *("--standalone", "-m", "fsdp_trace", "capture", *args),
    ]


def start_stalling_torchrun(out: Path, pid_dir: Path) -> subprocess.Popen:
    """The same stalling 2-rank capture, started by a plain torchrun (no fsdp-trace launcher):
    each node's local rank 0 takes the lock itself."""
    return subprocess.Popen(
        torchrun_command(
            2,
            *("--model", STALLS, "--batch-size", "2", "--seq-len", "1", "--out", str(out)),
            *("--warmup-steps", "0", "--timing-steps", "1"),
        ),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "FSDP_TRACE_QUIET": "1", "FSDP_TRACE_TEST_PID_DIR": str(pid_dir)},
    )


def wait_for_traces(job: subprocess.Popen, out: Path) -> None:
    finals = [out / f"rank{r}.{p}.json.gz" for r in (0, 1) for p in ("detailed", "timing")]
    deadline = time.monotonic() + 90
    while not all(path.exists() for path in finals):
        assert job.poll() is None, job.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "the traces never appeared"
        time.sleep(0.2)


def snapshot(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


def lock_line(out: Path, pid: int) -> re.Pattern:
    return re.compile(
        rf"another capture is writing to {re.escape(str(out))} \(pid {pid} on "
        rf"{re.escape(socket.gethostname())}, started \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d\): wait "
        r"for it to end \(or stop it\), or choose another --out; --overwrite never replaces "
        r"a running capture$"
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("capture", "capture"),
        ("capture", "capture --overwrite"),
        ("capture", "torchrun --overwrite"),
        ("torchrun", "capture --overwrite"),
    ],
)
def test_a_second_capture_into_a_running_captures_out_fails_and_touches_nothing(
    tmp_path, first, second
):
    out = tmp_path / "run"
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    starter = start_stalling_capture if first == "capture" else start_stalling_torchrun
    job = starter(out, pid_dir)
    try:
        wait_for_traces(job, out)
        # The launcher holds the lock; under a plain torchrun, local rank 0 does.
        holder = job.pid if first == "capture" else int((pid_dir / "rank0.pid").read_text())
        before = snapshot(out)
        overwrite = ["--overwrite"] if "--overwrite" in second else []
        args = [*FAST, "--out", str(out), *QUICK_STEPS, *overwrite]
        if second.startswith("torchrun"):
            done = subprocess.run(
                torchrun_command(1, *args),
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=120,
                env={**os.environ, "FSDP_TRACE_QUIET": "1"},
            )
            assert done.returncode != 0, done.stderr[-2000:]
            (line,) = error_lines(done.stderr)
            prefix = "fsdp-trace capture: rank 0: "
        else:
            done = run_cli("capture", "--nproc-per-node", "1", *args, timeout=120)
            assert done.returncode == 2, done.stderr[-2000:]
            (line,) = error_lines(done.stderr)
            prefix = "fsdp-trace capture: error: "
        assert line.startswith(prefix), line
        assert lock_line(out, holder).match(line[len(prefix) :]), line
        assert str(REPO / "fsdp_trace") not in done.stderr  # no traceback through our code
        if not second.startswith("torchrun"):  # (torchrun prints its own on a failed rank)
            assert "Traceback" not in done.stderr
        assert snapshot(out) == before  # the first run's files, byte for byte
        assert job.poll() is None  # and the first run goes on
        os.killpg(job.pid, signal.SIGTERM if first == "capture" else signal.SIGINT)
        job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    # The first run, interrupted, cleans up, its lock file too (under a plain torchrun the
    # directory itself may stay: the lock holder may be done before the other ranks).
    assert not out.exists() or (first == "torchrun" and list(out.iterdir()) == [])


@pytest.mark.slow
def test_a_stale_lock_file_neither_blocks_nor_counts_as_a_previous_run(tmp_path):
    """A lock file a killed capture left (no process holds it) is not "a non-empty --out", and
    the capture that reuses it removes it at the end: the run directory holds only the run."""
    out = tmp_path / "run"
    out.mkdir()
    (out / ".fsdp-trace.lock").write_text('{"pid": 999999, "host": "gone"}')
    done = run_cli(
        "capture", "--nproc-per-node", "1", *FAST, "--out", str(out), *QUICK_STEPS, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == [
        "rank0.detailed.json.gz",
        "rank0.timing.json.gz",
        "run.json",
    ]


def test_the_lock_is_released_when_its_holder_is_killed(tmp_path):
    """flock on an open descriptor: a holder killed with SIGKILL leaves no stale lock."""
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from fsdp_trace.capture.outputs import lock_out_dir; "
            f"lock = lock_out_dir(Path({str(out)!r}), 'tok'); print('held', flush=True); "
            "time.sleep(600)",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError) as refused:
            outputs.lock_out_dir(out, "other")
        assert lock_line(out, holder.pid).match(refused.value.message)
        assert outputs.out_dir_problem(out, overwrite=True) == refused.value.message
        assert outputs.out_dir_problem(out, overwrite=False, own_token="tok") is None
        with outputs.lock_out_dir(out, "tok") as joined:  # the same run's other node
            assert not joined.held
    finally:
        holder.kill()
        holder.wait()
    with outputs.lock_out_dir(out, "mine") as lock:
        assert lock.held
        assert json.loads((out / ".fsdp-trace.lock").read_text())["pid"] == os.getpid()
    assert list(out.iterdir()) == []  # released: the lock file is gone
    assert outputs.out_dir_problem(out, overwrite=False) is None


# -- a killed rank is named, not the rank that lost its connection to it ----------------------


@pytest.mark.slow
def test_a_rank_killed_mid_collective_is_blamed_not_rank_0s_connection_error(tmp_path):
    """Rank 0 waits in the first all-gather for rank 1; rank 1 is killed (the OOM killer, a
    user): rank 0's collective fails at once with a connection error, but the line names
    rank 1 and its signal."""
    out = tmp_path / "run"
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    job = subprocess.Popen(
        [
            *(sys.executable, "-m", "fsdp_trace", "capture"),
            *("--model", "tests.models_for_tests:hangs_on_rank_1"),
            *("--batch-size", "2", "--seq-len", "1", "--nproc-per-node", "2", "--out", str(out)),
            *("--timeout-s", "120"),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "FSDP_TRACE_QUIET": "1", "FSDP_TRACE_TEST_PID_DIR": str(pid_dir)},
    )
    try:
        deadline = time.monotonic() + 90
        while not all((pid_dir / f"rank{r}.pid").exists() for r in (0, 1)):
            assert job.poll() is None, job.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "the ranks never built their model"
            time.sleep(0.1)
        time.sleep(3)  # rank 0 is now blocked in the first all-gather
        os.kill(int((pid_dir / "rank1.pid").read_text()), signal.SIGKILL)
        _, stderr = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    assert job.returncode == 1, stderr[-2000:]
    assert error_lines(stderr) == [f"fsdp-trace capture: error: {KILLED_RANK_1}"]
    assert "Traceback" not in stderr
    assert not out.exists()


# -- a factory that cannot be imported fails before any rank starts ----------------------------


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (
            "tests.no_such_module:build",
            "cannot import tests.no_such_module (No module named 'tests.no_such_module')",
        ),
        (
            "tests.broken_factory:build",
            "importing tests.broken_factory failed (RuntimeError: broken on purpose at import)",
        ),
        (
            "tests.models_for_tests:no_such_factory",
            "tests.models_for_tests has no callable no_such_factory",
        ),
    ],
)
def test_a_factory_that_cannot_be_imported_fails_before_the_ranks_start(tmp_path, target, message):
    out = tmp_path / "run"
    imports = tmp_path / "imports.log"
    done = run_cli(
        "capture",
        *("--model", target, "--batch-size", "2", "--seq-len", "1"),
        *("--nproc-per-node", "2", "--out", str(out)),
        env={"FSDP_TRACE_TEST_IMPORT_LOG": str(imports)},
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    # No "rank N:" prefix: the launcher said it, before torchrun started anything.
    assert done.stderr.splitlines() == [f"fsdp-trace capture: error: --model {target}: {message}"]
    assert not out.exists()
    if target.startswith("tests.broken_factory"):
        assert imports.read_text().split() == ["parent"]  # no rank ever imported it


@pytest.mark.slow
def test_a_factory_that_cannot_be_imported_is_one_line_under_torchrun_too(tmp_path):
    out = tmp_path / "run"
    target = "tests.broken_factory:build"
    done = subprocess.run(
        torchrun_command(
            1, *("--model", target, "--batch-size", "2", "--seq-len", "1", "--out", str(out))
        ),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "FSDP_TRACE_QUIET": "1"},
    )
    assert done.returncode != 0
    assert error_lines(done.stderr) == [
        f"fsdp-trace capture: rank 0: --model {target}: importing tests.broken_factory failed "
        "(RuntimeError: broken on purpose at import)"
    ]
    assert str(REPO / "fsdp_trace") not in done.stderr  # torchrun's own report only
    assert not out.exists()


ERROR_0 = {"rank": 0, "time": 2.0, "message": "RuntimeError: Connection closed by peer", "code": 1}
ERROR_1 = {"rank": 1, "time": 1.0, "message": "RuntimeError: data loader crashed", "code": 1}


@pytest.mark.parametrize(
    ("codes", "errors", "early", "line"),
    [
        # SIGKILLed rank 1; rank 0 lost its connection and said so first: rank 1 is the cause.
        ({0: 1, 1: -9}, {0: ERROR_0}, {0, 1}, KILLED_RANK_1),
        ({1: -9}, {0: ERROR_0}, {1}, KILLED_RANK_1),
        # Rank 1 failed and said why; rank 0, stuck in a GPU collective, ignored torchrun's
        # SIGTERM and was SIGKILLed 30 s later: the teardown is not the cause.
        ({0: -9, 1: 1}, {1: ERROR_1}, {1}, "rank 1: RuntimeError: data loader crashed"),
        ({0: 143, 1: 1}, {1: ERROR_1}, {1}, "rank 1: RuntimeError: data loader crashed"),
        # A kill comes before the abort that NCCL's watchdog makes of the peer that lost it.
        (
            {0: -6, 1: -9},
            {},
            {0, 1},
            KILLED_RANK_1,
        ),
        # SIGTERM from outside to one rank (it exits 143 through its handler).
        (
            {1: 143, 0: 1},
            {0: ERROR_0},
            {1},
            "rank 1 was stopped by SIGTERM (exit code 143); the other ranks stopped after it",
        ),
        # Which ranks failed before the teardown is unknown: the written errors decide.
        ({0: 1, 1: -9}, {0: ERROR_0}, None, "rank 0: RuntimeError: Connection closed by peer"),
        ({1: -9}, {}, None, "rank 1 exited with code -9 and left no message"),
    ],
)
def test_the_failure_report_names_the_rank_that_failed_first(codes, errors, early, line):
    from fsdp_trace.capture.launcher import failure_report

    report = failure_report(codes, errors, alone=False, early=early)
    assert report.message == line
    assert report.exit_code == 1
    alone = failure_report({0: -9}, {}, alone=True, early={0}).message
    assert alone == KILLED_RANK_1.replace("rank 1", "rank 0").split("; the other")[0]
