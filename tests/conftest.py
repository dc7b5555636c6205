"""Shared fixtures: one real CPU/gloo capture per test session, and the shipped samples."""

from __future__ import annotations

import os
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
