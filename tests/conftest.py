"""Shared fixtures: one real CPU/gloo capture per test session, the shipped samples, and a
one-process gloo group; `free_port` for rendezvous and servers. No test touches the user's
own cache or home: the cache, XDG_CACHE_HOME and HOME point into the session's tmp folder."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_traces"


def run_cli(
    *args: str, timeout: float = 300, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`fsdp-trace ARGS` in a subprocess, from the repository root."""
    full_env = {**os.environ, "FSDP_TRACE_QUIET": "1", **(env or {})}
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


@pytest.fixture(autouse=True, scope="session")
def isolated_cache(tmp_path_factory):
    """Every test (and every process it starts) caches into a folder of this session, and a
    cache path that falls back to ~ lands in a scratch home, never the user's."""
    saved = {k: os.environ.get(k) for k in ("FSDP_TRACE_CACHE_DIR", "XDG_CACHE_HOME", "HOME")}
    home = tmp_path_factory.mktemp("home")
    os.environ["FSDP_TRACE_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    os.environ["XDG_CACHE_HOME"] = str(home / ".cache")
    os.environ["HOME"] = str(home)
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


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
    """A 2-process CPU/gloo capture of the tiny preset with AC and explicit prefetch."""
    out = tmp_path_factory.mktemp("capture") / "run"
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
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return out
