"""Shared fixtures: one real CPU/gloo capture per test session, the shipped samples, and a
one-process gloo group; `free_port` for rendezvous and servers.

No test touches the user's own cache or home: before collection, the test run points
FSDP_TRACE_CACHE_DIR, XDG_CACHE_HOME, HOME and TMPDIR into a scratch folder of its own,
inherited by every process a test starts and removed at the end. pytest-xdist workers share
the run's folder: the cache is safe under concurrent writers (atomic renames, checksums,
entries bound to their key), so a sample one worker parsed is read back by the others; tests
of the cache itself use folders of their own."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_traces"


def run_cli(
    *args: str, timeout: float = 300, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`fsdp-trace ARGS` in a subprocess, from the repository root; its output piped, at the
    width piped output gets (pytest-xdist's workers set COLUMNS=80, which the terminal views
    honour: a test of a width passes COLUMNS in `env`)."""
    inherited = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    full_env = {**inherited, "FSDP_TRACE_QUIET": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "fsdp_trace", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )


def free_port() -> int:
    """A local TCP port nobody listens on now (for a rendezvous or a server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker per core this process may run on (its CPU affinity, and a cgroup
    v2 CPU quota where one is set), not psutil's count of the host's physical cores (1 on a
    2-vCPU machine with SMT, 64 in a container limited to 2). PYTEST_XDIST_AUTO_NUM_WORKERS
    still wins."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "").isdigit():
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores or 1, -(-int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return max(1, cores or 1)


ISOLATED = ("FSDP_TRACE_CACHE_DIR", "XDG_CACHE_HOME", "HOME", "TMPDIR")
SCRATCH_VARIABLE = "FSDP_TRACE_TEST_SCRATCH"  # the run's scratch folder, for xdist workers
_saved_environment: dict[str, str | None] = {}
_own_scratch: list[Path] = []


def pytest_configure(config: pytest.Config) -> None:
    """Every test (and every process it starts) caches into the run's scratch folder, and a
    cache path that falls back to ~ lands in a scratch home, never the user's; the processes
    tests start have a temporary folder in it too. Done before
    collection, so that nothing collected at import time escapes it either. The process that
    starts the run makes the folder; its xdist workers (which inherit the variables) use it."""
    _saved_environment.update({key: os.environ.get(key) for key in (*ISOLATED, SCRATCH_VARIABLE)})
    inherited = os.environ.get(SCRATCH_VARIABLE)
    if os.environ.get("PYTEST_XDIST_WORKER") and inherited and Path(inherited).is_dir():
        scratch = Path(inherited)
    else:
        scratch = Path(tempfile.mkdtemp(prefix="pytest-fsdp-trace-"))
        _own_scratch.append(scratch)
        for name in ("cache", "home", "tmp"):
            (scratch / name).mkdir(mode=0o700)
    os.environ[SCRATCH_VARIABLE] = str(scratch)
    os.environ["FSDP_TRACE_CACHE_DIR"] = str(scratch / "cache")
    os.environ["XDG_CACHE_HOME"] = str(scratch / "home" / ".cache")
    os.environ["HOME"] = str(scratch / "home")
    # What the processes a test starts leave in their temporary folder (a plain torchrun's
    # /tmp/torchelastic_* log folders, torch's compile cache) goes with the scratch folder.
    os.environ["TMPDIR"] = str(scratch / "tmp")


def pytest_unconfigure(config: pytest.Config) -> None:
    """The user's environment back, and the scratch folder gone (by the process that made
    it, once its workers are done)."""
    for key, value in _saved_environment.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    for folder in _own_scratch:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def gloo_world_of_one():
    """A one-process gloo group for this test module (FSDP2 and barriers need one)."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="session")
def cpu_run(tmp_path_factory) -> Path:
    """A 2-process CPU/gloo capture of the tiny preset with AC and explicit prefetch. Its
    temporary folder is `scratch_of(run)`, to see that the capture leaves nothing there."""
    out = tmp_path_factory.mktemp("capture") / "run"
    scratch_of(out).mkdir()
    done = run_cli(
        "capture",
        "--model",
        "tiny",
        "--nproc-per-node",
        "2",
        "--out",
        str(out),
        "--ac-coverage",
        "0.5",
        "--prefetch-forward",
        "1",
        "--prefetch-backward",
        "2",
        "--warmup-steps",
        "1",
        "--timed-steps",
        "3",
        env={"TMPDIR": str(scratch_of(out))},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def scratch_of(out: Path) -> Path:
    """The temporary folder (TMPDIR) of the capture that wrote `out`."""
    return out.parent / "tmp"


def left_in(scratch: Path) -> list[str]:
    """What a capture left in its temporary folder, but torch's compile cache
    (`torchinductor_USER`: one folder every torch program on the machine shares)."""
    return sorted(p.name for p in scratch.iterdir() if not p.name.startswith("torchinductor_"))


def counting_parses(monkeypatch) -> list[str]:
    """The traces parsed from now on (`perrank.load_trace` calls in this process), in order."""
    from fsdp_trace.analysis.job import perrank

    parsed: list[str] = []
    load = perrank.load_trace

    def counting(path, *args, **kwargs):
        parsed.append(str(path))
        return load(path, *args, **kwargs)

    monkeypatch.setattr(perrank, "load_trace", counting)
    return parsed
