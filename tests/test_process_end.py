"""How `fsdp-trace` ends its process (`fsdp_trace.cli.run`): after an analysis that wrote its
outputs, at once (`os._exit`) with the atexit functions run and stdout flushed; with anything
else to wait for (a thread, a failed command), through the interpreter's teardown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, SAMPLES

# `python -m fsdp_trace ARGS`, with os._exit recorded and an atexit function of its own; a
# second thread (sleeping) when asked.
PROBE = """
import atexit, os, runpy, sys, threading, time
log, thread, sys.argv = sys.argv[1], sys.argv[2], ["fsdp-trace", *sys.argv[3:]]
real_exit = os._exit
def recorded(code):
    with open(log, "a") as f:
        f.write(f"os._exit {code}\\n")
    real_exit(code)
os._exit = recorded
atexit.register(lambda: open(log, "a").write("atexit\\n"))
if thread == "yes":
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
runpy.run_module("fsdp_trace", run_name="__main__", alter_sys=True)
"""
SAMPLE = SAMPLES / "gpt-small-1gpu"


def ended(tmp_path: Path, *args: str, thread: bool = False) -> tuple[int, str, list[str]]:
    """`fsdp-trace ARGS`: its exit code, its stdout, and the probe's log (in order)."""
    log = tmp_path / "log"
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(log), "yes" if thread else "no", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "FSDP_TRACE_QUIET": "1", "COLUMNS": "100"},
    )
    lines = log.read_text().splitlines() if log.exists() else []
    return done.returncode, done.stdout, lines


def test_an_analysis_ends_at_once_with_its_outputs_whole(tmp_path):
    out = tmp_path / "out.json"
    code, stdout, log = ended(tmp_path, "analyze", str(SAMPLE), "--no-report", "--json", str(out))
    assert code == 0
    assert log == ["atexit", "os._exit 0"]  # atexit's functions first, then the end
    assert "Exposed communication" in stdout and stdout.endswith("\n")  # flushed, through a pipe
    assert json.loads(out.read_text())["ranks"]  # written whole


def test_a_gate_that_fails_ends_at_once_with_its_code(tmp_path):
    code, _, log = ended(
        tmp_path, "analyze", str(SAMPLE), "--no-report", "--fail-on", "exposed_pct>=0"
    )
    assert code == 1
    assert log == ["atexit", "os._exit 1"]


@pytest.mark.parametrize(
    "args, thread, code",
    [
        (["analyze", str(SAMPLE), "--no-report"], True, 0),  # a thread to wait for
        (["analyze", "no-such-trace.json", "--no-report"], False, 2),  # a failed command
        (["--version"], False, 0),  # not an analysis
    ],
)
def test_anything_else_ends_through_the_teardown(tmp_path, args, thread, code):
    got, _, log = ended(tmp_path, *args, thread=thread)
    assert got == code
    assert log == ["atexit"]
