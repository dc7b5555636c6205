"""Diagnosis on real traces captured on purpose (sample_traces/diagnosis, see its README):
each rule fires on the trace that shows its problem and stays silent where it must."""

from __future__ import annotations

import gzip
import json
from functools import cache

import pytest

from fsdp_trace.analyze import analyze
from fsdp_trace.diagnose import diagnose, match
from fsdp_trace.diagnose.gate import parse
from fsdp_trace.errors import UserError
from tests.conftest import SAMPLES, run_cli

DIAG = SAMPLES / "diagnosis"


@cache
def findings(path: str) -> dict[int, object]:
    result = analyze(SAMPLES / path)
    found, _ = diagnose(result)
    return {f.number: f for f in found}


CASES = [
    # rule, trace that shows the problem, trace where the rule must stay silent
    (1, "diagnosis/p2p-disabled", "diagnosis/tuned-b16"),
    (2, "gpt-small-2gpu", "diagnosis/tuned-b16"),
    (3, "gpt-small-2gpu", "diagnosis/gpt-1.3b-b4-2gpu"),
    (4, "diagnosis/comm-bound", "gpt-small-2gpu"),
    (5, "diagnosis/host-bound", "diagnosis/gpt-1.3b-b4-2gpu"),
    (6, "diagnosis/grad-accum", "gpt-small-2gpu"),
    (7, "diagnosis/gpt-1.3b-b4-2gpu", "diagnosis/max-connections-1"),
    (8, "diagnosis/p2p-disabled", "gpt-small-2gpu"),
    (9, "diagnosis/max-connections-1", "gpt-small-2gpu"),
    (10, "diagnosis/straggler", "diagnosis/gpt-1.3b-b4-2gpu"),
    (11, "gpt-small-2gpu", "gpt-small-2gpu-fullac"),
]


@pytest.mark.parametrize(("rule", "shows", "silent"), CASES, ids=[str(c[0]) for c in CASES])
def test_rule_fires_where_the_problem_is_and_only_there(rule, shows, silent):
    assert rule in findings(shows), f"rule {rule} silent on {shows}"
    assert rule not in findings(silent), f"rule {rule} fired on {silent}"
    finding = findings(shows)[rule]
    assert any(ch.isdigit() for ch in finding.saw)  # it states what it saw, with numbers
    assert finding.why and finding.change


def test_keeping_the_last_block_silences_rule_2_on_cpu_traces_too():
    assert 2 in findings("cpu-gloo-2proc")
    assert 2 not in findings("diagnosis/cpu-keep-last")


def test_findings_name_the_right_details():
    assert findings("diagnosis/straggler")[10].metrics["rank"] == 1  # the delayed rank
    assert findings("gpt-small-2gpu")[2].metrics["unit"] == "layers.7"
    six = findings("diagnosis/grad-accum")[6]
    assert six.metrics["count"] == 4 and six.metrics["expected"] == 2
    assert "micro-batch" in six.saw
    assert "--accum-no-sync" in findings("diagnosis/grad-accum").get(3, six).change or 3 not in (
        findings("diagnosis/grad-accum")
    )
    assert "NCCL_P2P_DISABLE=1" in findings("diagnosis/p2p-disabled")[8].saw
    assert findings("diagnosis/p2p-disabled")[8].metrics["topology"] == "nvlink"
    assert "unset CUDA_DEVICE_MAX_CONNECTIONS" in findings("diagnosis/max-connections-1")[9].change


def _raw(path):
    return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


def test_cross_rank_matching_against_an_independent_computation():
    """Per profiled step, the k-th NCCL kernel (launch order) of each rank is one collective:
    transfer = the shortest duration, the others waited; the last to start arrived last."""
    run = DIAG / "straggler"
    per_rank = {}
    for rank in (0, 1):
        events = _raw(run / f"rank{rank}.timing.json.gz")
        steps = [
            (e["ts"], e["ts"] + e["dur"], e["name"])
            for e in events
            if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
        ]
        launch = {
            e["args"]["correlation"]: e["ts"]
            for e in events
            if e.get("cat") in ("cuda_runtime", "cuda_driver")
        }
        by_step: dict[str, list] = {}
        for e in sorted(
            (e for e in events if e.get("cat") == "kernel" and e["name"].startswith("nccl")),
            key=lambda e: e["args"]["correlation"],
        ):
            t = launch.get(e["args"]["correlation"])
            step = next((n for s, end, n in steps if t is not None and s <= t <= end), None)
            if step is not None:
                by_step.setdefault(step, []).append(e)
        per_rank[rank] = by_step
    pairs = [
        pair
        for step in per_rank[0]
        for pair in zip(per_rank[0][step], per_rank[1][step], strict=True)
    ]
    cross = match(analyze(run, detailed=False).ranks)
    assert len(cross.matched) == len(pairs) > 50
    waits = {0: 0.0, 1: 0.0}
    last = {0: 0, 1: 0}
    for a, b in pairs:
        transfer = min(a["dur"], b["dur"])
        waits[0] += a["dur"] - transfer
        waits[1] += b["dur"] - transfer
        last[0 if a["ts"] > b["ts"] else 1] += 1
    table = cross.per_rank.set_index("rank")
    for rank in (0, 1):
        n_steps = len(per_rank[0])  # this capture profiled 3 timing steps
        assert table.loc[rank, "wait_us_per_step"] == pytest.approx(waits[rank] / n_steps, rel=1e-6)
        assert table.loc[rank, "arrived_last"] == last[rank]
    assert cross.clock_offsets_us[0] == 0.0 and abs(cross.clock_offsets_us[1]) < 50  # one host


def test_clock_offsets_are_found_and_corrected():
    result = analyze(DIAG / "gpt-1.3b-b4-2gpu", detailed=False)
    shifted = result.ranks[1].collectives.copy()
    shifted[["start_us", "end_us"]] += 5000.0  # pretend rank 1's clock runs 5 ms ahead
    result.ranks[1].collectives = shifted
    plain = match(analyze(DIAG / "gpt-1.3b-b4-2gpu", detailed=False).ranks)
    cross = match(result.ranks)
    assert cross.clock_offsets_us[1] == pytest.approx(plain.clock_offsets_us[1] + 5000.0, abs=1e-6)
    assert any("clocks disagree" in n for n in cross.notices)
    # After the correction, who arrived last is (all but near-ties) as with the true clocks.
    assert (cross.matched["last_rank"] == plain.matched["last_rank"]).mean() > 0.95


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
        "--json",
        str(tmp_path / "a.json"),
        "--report",
        str(tmp_path / "r.html"),
    )
    assert done.returncode == 1
    assert "fail-on: exposed_pct>1 violated (rank 0:" in done.stderr
    assert "mfu<0.05" not in done.stderr  # that one holds
    assert (tmp_path / "a.json").exists()  # the analysis itself is still written
    assert (tmp_path / "r.html").exists()
    ok = run_cli("analyze", run, "--no-detailed", "--fail-on", "exposed_pct>99", "--no-report")
    assert ok.returncode == 0
    bad = run_cli("analyze", run, "--fail-on", "exposure>5")
    assert bad.returncode == 2 and "unknown metric" in bad.stderr


def test_gate_parsing():
    assert str(parse("idle_pct >= 12.5")) == "idle_pct>=12.5"
    with pytest.raises(UserError):
        parse("exposed_pct")
