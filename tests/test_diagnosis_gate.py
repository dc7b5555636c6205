"""The CI gate (`--fail-on`): conditions, every metric's source, and bad input as one-line
errors with exit code 2 (never a traceback, never a silent pass)."""

from __future__ import annotations

import copy
import json
import shutil
from functools import cache

import numpy as np
import pytest

from fsdp_trace import analyze
from fsdp_trace.diagnose import gate
from fsdp_trace.errors import UserError
from tests.conftest import SAMPLES, run_cli


@cache
def analysis(path: str, detailed: bool = True):
    return analyze(SAMPLES / path, detailed=detailed, cache=False).only


def check(text: str, path: str = "gpt-small-2gpu", detailed: bool = True) -> dict[str, float]:
    return dict(gate.values(gate.parse(text), analysis(path, detailed)))


def test_fail_on_gate(tmp_path):
    run = str(SAMPLES / "gpt-small-2gpu")
    done = run_cli(
        "analyze",
        run,
        "--no-detailed",
        "--fail-on",
        "exposed_pct>1",
        "--fail-on",
        "mfu<0.05",
        "--fail-on",
        "mfu<0.45",
        "--json",
        str(tmp_path / "a.json"),
        "--report",
        str(tmp_path / "r.html"),
    )
    assert done.returncode == 1
    assert "fail-on: exposed_pct>1 violated (rank 0:" in done.stderr
    assert "mfu<0.05" not in done.stderr  # that one holds
    # MFU is a fraction; the message also shows it as a percentage.
    assert "fail-on: mfu<0.45 violated (run: 0.3304 (33.0 %))" in done.stderr
    assert (tmp_path / "a.json").exists()  # the analysis itself is still written
    assert (tmp_path / "r.html").exists()
    ok = run_cli("analyze", run, "--no-detailed", "--fail-on", "exposed_pct>99", "--no-report")
    assert ok.returncode == 0


@pytest.mark.parametrize(
    "text", ["exposed_pct>1.2.3", "exposed_pct", "exposed_pct>", "exposed_pct>5%", "mfu<.4.5"]
)
def test_malformed_conditions_are_user_errors(text):
    with pytest.raises(UserError, match="write metric OP number"):
        gate.parse(text)


def test_malformed_and_unknown_conditions_exit_2_in_one_line():
    run = str(SAMPLES / "gpt-small-2gpu")
    for text, message in (
        ("exposed_pct>1.2.3", "write metric OP number"),
        ("exposure>5", "unknown metric"),
    ):
        done = run_cli("analyze", run, "--no-detailed", "--no-report", "--fail-on", text)
        assert done.returncode == 2 and message in done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_numbers_parse_in_every_plain_form():
    assert str(gate.parse("idle_pct >= 12.5")) == "idle_pct>=12.5"
    assert gate.parse("mfu<.45").value == 0.45
    assert gate.parse("step_ms<1e3").value == 1000.0
    assert gate.parse("exposed_pct>-1").value == -1.0


def test_a_metric_the_input_cannot_give_is_an_error_not_a_pass():
    """CPU/gloo traces have no overlap figures: `exposed_pct>0` used to exit 0."""
    run = str(SAMPLES / "cpu-gloo-2proc")
    for text, why in (
        ("exposed_pct>0", "CPU (gloo) traces have no GPU kernels, so no per-step exposed_pct"),
        ("wait_pct>0", "it needs GPU traces of two or more ranks"),
    ):
        done = run_cli("analyze", run, "--no-detailed", "--no-report", "--fail-on", text)
        assert done.returncode == 2, done.stderr
        assert f"metric {text.split('>')[0]} is not available for this input: {why}" in done.stderr
        assert "Traceback" not in done.stderr


def test_cross_rank_metrics():
    waits = check("wait_pct>0", "diagnosis/straggler", detailed=False)
    assert waits["rank 0"] == pytest.approx(93.5, abs=0.1) and waits["rank 1"] == 0.0
    late = check("straggler_pct>0", "diagnosis/straggler", detailed=False)
    assert late == {"rank 0": 0.0, "rank 1": 100.0}
    ms = check("wait_ms>0", "diagnosis/straggler", detailed=False)
    assert ms["rank 0"] == pytest.approx(63.2, abs=0.1)


def test_distortion_needs_the_detailed_traces():
    slow = check("distortion_pct>0")
    assert slow["rank 0"] == pytest.approx(62.1, abs=0.1)
    assert slow["rank 1"] == pytest.approx(57.8, abs=0.1)
    with pytest.raises(UserError, match="detailed traces"):
        check("distortion_pct>0", detailed=False)


def test_recompute_metrics_when_the_steps_carry_them():
    """recompute_pct/_ms come from the step rows' recompute_pct/recompute_us; an analysis
    without those columns says so instead of passing."""
    result = copy.copy(analysis("gpt-small-2gpu-fullac", False))
    result.ranks = [copy.copy(r) for r in result.ranks]
    for r in result.ranks:
        r.steps = r.steps.drop(columns=["recompute_pct", "recompute_us"], errors="ignore")
    with pytest.raises(
        UserError, match="not available for this input: the analysis has no per-step recompute_pct"
    ):
        gate.values(gate.parse("recompute_pct>5"), result)
    for i, r in enumerate(result.ranks):
        r.steps = r.steps.assign(recompute_pct=[10.0 + i, 20.0 + i, 30.0 + i, 40.0 + i, 50.0 + i])
    assert gate.values(gate.parse("recompute_pct>5"), result) == [
        ("rank 0", 30.0),
        ("rank 1", 31.0),
    ]


def test_run_metrics_need_run_json_and_the_figure():
    files = sorted((SAMPLES / "gpt-small-2gpu").glob("rank*.timing.json.gz"))
    bare = analyze(files, cache=False).only
    with pytest.raises(UserError, match=r"comes from run\.json"):
        gate.values(gate.parse("mfu<0.4"), bare)
    with pytest.raises(UserError, match=r"no scaling_efficiency \(capture with --baseline\)"):
        check("scaling_efficiency<0.9", "diagnosis/tuned-b16", detailed=False)
    assert check("scaling_efficiency<0.9") == {"run": pytest.approx(0.869, abs=1e-3)}
    causes = [f for f in analysis("gpt-small-2gpu-fullac").findings if f.kind == "cause"]
    assert check("findings>0", "gpt-small-2gpu-fullac") == {"diagnosis": len(causes)}
    assert len(causes) == 1  # activation checkpointing; its host idles under the profiler only


def test_scaling_efficiency_of_a_cpu_run_is_not_gated(tmp_path):
    """A CPU run.json that carries an efficiency (written by an older capture) is not read:
    on CPU every rank shares the host's cores, as the headline says; a GPU run's is."""
    run = tmp_path / "cpu-run"
    shutil.copytree(SAMPLES / "cpu-fullac", run)
    record = json.loads((run / "run.json").read_text())
    assert record["world"]["device"] == "cpu"
    record["figures"]["scaling_efficiency"] = 0.5
    (run / "run.json").write_text(json.dumps(record))
    cpu = analyze(run, cache=False).only
    with pytest.raises(UserError, match=r"a CPU \(gloo\) run: scaling efficiency is not"):
        gate.values(gate.parse("scaling_efficiency<0.9"), cpu)
    done = run_cli("analyze", str(run), "--no-report", "--fail-on", "scaling_efficiency<0.9")
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert check("scaling_efficiency<0.9") == {"run": pytest.approx(0.869, abs=1e-3)}


def test_breakdown_metrics_per_rank():
    """exposed_wait_pct and friends: per rank, the median over its steps of the part's share
    of each step, computed here from the steps table."""
    run = analysis("gpt-small-2gpu", False)
    for metric, column in (
        ("exposed_wait_pct", "exposed_wait_us"),
        ("exposed_transfer_pct", "exposed_transfer_us"),
        ("fsdp_copy_pct", "fsdp_copy_us"),
        ("model_compute_pct", "model_compute_us"),
    ):
        found = check(f"{metric}>10", "gpt-small-2gpu", detailed=False)
        for r in run.ranks:
            share = 100 * r.steps[column] / r.steps["step_us"]
            assert found[f"rank {r.rank}"] == pytest.approx(float(np.median(share)))
    waits = check("exposed_wait_pct>10", detailed=False)
    assert waits["rank 1"] > 10 > waits["rank 0"]  # rank 1 waits for host-bound rank 0
    ms = check("exposed_wait_ms>1", detailed=False)
    assert ms["rank 1"] == pytest.approx(run.ranks[1].steps["exposed_wait_us"].median() / 1e3)
    done = run_cli(
        "analyze",
        str(SAMPLES / "gpt-small-2gpu"),
        "--no-detailed",
        "--no-report",
        "--fail-on",
        "exposed_wait_pct>10",
    )
    assert done.returncode == 1 and "exposed_wait_pct>10 violated (rank 1:" in done.stderr
    assert "rank 0" not in done.stderr.split("violated")[1]


def test_waiting_metrics_need_a_cross_rank_match():
    with pytest.raises(UserError, match="matched across two or more ranks"):
        check("exposed_wait_pct>1", "gpt-small-1gpu", detailed=False)
