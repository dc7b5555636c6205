"""How `fsdp-trace` ends its process (`fsdp_trace.cli.run`): after an analysis that wrote its
outputs, at once (`os._exit`) with the atexit functions run and the standard streams flushed;
with anything else to wait for (a thread, a failed command, a profiler or prompt around the
command), through the interpreter's teardown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, SAMPLES

# `python -m fsdp_trace ARGS`, with os._exit recorded and an atexit function of its own that
# writes to the real stdout without flushing it (block-buffered into a pipe); a second
# thread (sleeping) when asked.
PROBE = """
import atexit, os, runpy, sys, threading, time
log, thread, sys.argv = sys.argv[1], sys.argv[2], ["fsdp-trace", *sys.argv[3:]]
real_exit = os._exit
def recorded(code):
    with open(log, "a") as f:
        f.write(f"os._exit {code}\\n")
    real_exit(code)
os._exit = recorded
def last_words():
    open(log, "a").write("atexit\\n")
    sys.__stdout__.write("[the last words]")
atexit.register(last_words)
if thread == "yes":
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
runpy.run_module("fsdp_trace", run_name="__main__", alter_sys=True)
"""
SAMPLE = SAMPLES / "gpt-small-1gpu"
RUN = SAMPLES / "gpt-small-2gpu"


def ended(
    tmp_path: Path, *args: str, thread: bool = False, env: dict | None = None
) -> tuple[int, str, list[str]]:
    """`fsdp-trace ARGS`: its exit code, its stdout, and the probe's log (in order)."""
    log = tmp_path / "log"
    base = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # a pipe buffers
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(log), "yes" if thread else "no", *args],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        env={**base, "FSDP_TRACE_QUIET": "1", "COLUMNS": "100", **(env or {})},
    )
    lines = log.read_text().splitlines() if log.exists() else []
    return done.returncode, done.stdout, lines


def test_an_analysis_ends_at_once_with_its_outputs_whole(tmp_path):
    out = tmp_path / "out.json"
    code, stdout, log = ended(tmp_path, "analyze", str(SAMPLE), "--no-report", "--json", str(out))
    assert code == 0
    assert log == ["atexit", "os._exit 0"]  # atexit's functions first, then the end
    assert "Exposed communication" in stdout
    assert stdout.endswith("[the last words]")  # written after the command, flushed at the end
    assert json.loads(out.read_text())["ranks"]  # written whole


@pytest.mark.parametrize(
    "args",
    [
        ["whatif", str(RUN), "--set", "reshard_after_forward=false", "--json", "{out}"],
        ["compare", str(SAMPLE), str(RUN), "--html", ""],
    ],
)
def test_whatif_and_compare_end_at_once(tmp_path, args):
    out = tmp_path / "out.json"
    code, stdout, log = ended(tmp_path, *[a.replace("{out}", str(out)) for a in args])
    assert code == 0
    assert log == ["atexit", "os._exit 0"]
    assert stdout.endswith("[the last words]")
    if args[0] == "whatif":
        assert json.loads(out.read_text())


def test_a_gate_that_fails_ends_at_once_with_its_code(tmp_path):
    args = ["analyze", str(SAMPLE), "--no-report", "--fail-on", "exposed_pct>=0"]
    code, _, log = ended(tmp_path, *args)
    assert code == 1
    assert log == ["atexit", "os._exit 1"]


@pytest.mark.parametrize(
    "args, thread, env, code",
    [
        (["analyze", str(SAMPLE), "--no-report"], True, None, 0),  # a thread to wait for
        # a prompt after the command (at EOF here; its exit code is Python's: not checked)
        (["analyze", str(SAMPLE), "--no-report"], False, {"PYTHONINSPECT": "1"}, None),
        (["analyze", "no-such-trace.json", "--no-report"], False, None, 2),  # a failed command
        (["--version"], False, None, 0),  # not an analysis
    ],
)
def test_anything_else_ends_through_the_teardown(tmp_path, args, thread, env, code):
    got, stdout, log = ended(tmp_path, *args, thread=thread, env=env)
    assert code is None or got == code
    assert log == ["atexit"]
    assert stdout.endswith("[the last words]")


def test_a_profiler_around_the_command_writes_its_profile(tmp_path):
    """`python -m cProfile -o FILE -m fsdp_trace analyze …` writes FILE after the command
    returns: the command must return to it."""
    out = tmp_path / "prof.out"
    profiled = [sys.executable, "-m", "cProfile", "-o", str(out), "-m", "fsdp_trace"]
    done = subprocess.run(
        [*profiled, "analyze", str(SAMPLE), "--no-report"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "FSDP_TRACE_QUIET": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert out.stat().st_size > 0
