"""`fsdp-trace whatif --set`: every value the replay models is accepted from the command line
as the Python API takes it (`ac_coverage=0` undoes activation checkpointing: the README's
validation pairs predict it, and benchmarks/gpu_runs_2gpu.sh predict runs it)."""

from __future__ import annotations

import json

import pytest

import fsdp_trace
from fsdp_trace.whatif import Knobs, parse, predict
from tests.conftest import SAMPLES, run_cli


def test_no_checkpointing_is_a_coverage_of_zero():
    assert parse(["ac_coverage=0"]) == Knobs(ac_coverage=0.0)
    assert parse(["ac_coverage=0.0"]).describe() == "ac_coverage=0"


def test_the_cli_predicts_undoing_full_checkpointing_as_the_api_does(tmp_path):
    out = tmp_path / "w.json"
    done = run_cli(
        "whatif",
        str(SAMPLES / "gpt-small-2gpu-fullac"),
        "--set",
        "ac_coverage=0",
        "--json",
        str(out),
        "--no-cache",
    )
    assert done.returncode == 0, done.stderr
    written = json.loads(out.read_text())
    run = fsdp_trace.analyze(SAMPLES / "gpt-small-2gpu-fullac", detailed=False, cache=False).only
    api = predict(run, Knobs(ac_coverage=0.0))
    assert written["predicted"]["step_us"] == pytest.approx(api.predicted_step_us)
    assert written["predicted"]["step_us"] < written["measured"]["step_us"]  # no recompute
