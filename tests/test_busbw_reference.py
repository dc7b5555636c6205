"""The bus-bandwidth reference table (fsdp_trace/diagnose/data/busbw.csv) and the
`low-bus-bandwidth` rule that compares each large message with it at the message's size:
the interpolation against a computation made here from the CSV read on its own, the rule
firing below a quarter of the curve and silent above it, the shipped table being exactly what
its named sources measure, and a GPU session's measurement replacing the provisional rows."""

from __future__ import annotations

import csv
import itertools
import json
import math
import re

import numpy as np
import pandas as pd
import pytest

from benchmarks import busbw_table
from fsdp_trace import analyze
from fsdp_trace.diagnose import busbw
from fsdp_trace.diagnose.rules import communication
from tests.conftest import REPO, SAMPLES
from tests.fsdp_sim import Sim


def csv_curve(
    collective: str, gpus: int, interconnect: str = "nvlink"
) -> list[tuple[float, float]]:
    """(bytes, busbw) of one curve, read from the shipped CSV with the csv module."""
    with open(busbw.TABLE, newline="") as handle:
        rows = [
            (float(r["bytes"]), float(r["busbw_gbps"]))
            for r in csv.DictReader(handle)
            if r["interconnect"] == interconnect
            and r["collective"] == collective
            and int(r["gpus"]) == gpus
        ]
    return sorted(rows)


def by_hand(points: list[tuple[float, float]], nbytes: float) -> float:
    """Linear in log(size) between the two rows around `nbytes`."""
    for (b0, y0), (b1, y1) in itertools.pairwise(points):
        if b0 <= nbytes <= b1:
            t = (math.log(nbytes) - math.log(b0)) / (math.log(b1) - math.log(b0))
            return y0 + t * (y1 - y0)
    raise AssertionError(f"{nbytes} is outside the curve")


def test_the_curve_interpolates_in_log_size_between_its_rows():
    points = csv_curve("AllGather", 2)
    assert len(points) >= 4
    found = busbw.curve(busbw.reference(), "nvlink", "AllGather", 2)
    assert not found.provisional and found.gpus == 2
    for (b0, _), (b1, _) in itertools.pairwise(points):
        for t in (0.1, 0.5, 0.83):
            size = math.exp(math.log(b0) + t * (math.log(b1) - math.log(b0)))
            assert found.at(size)[0] == pytest.approx(by_hand(points, size), rel=1e-9)
    sizes = np.array([b for b, _ in points])
    assert found.at(sizes) == pytest.approx([y for _, y in points])  # the rows themselves
    assert found.at(points[-1][0] * 10)[0] == pytest.approx(points[-1][1])  # saturates
    assert np.isnan(found.at(points[0][0] / 2)[0])  # no reference below the curve


def test_a_group_size_nobody_measured_takes_the_nearest_and_says_provisional():
    table = busbw.reference()
    largest = int(table["gpus"].max())
    far = busbw.curve(table, "nvlink", "ReduceScatter", 8 * largest)
    assert far.gpus == largest and far.asked_gpus == 8 * largest and far.provisional
    assert f"used for {8 * largest}" in far.describe()
    assert busbw.curve(table, "pcie", "AllGather", 2) is None  # nothing measured
    # every provisional row is a copy of a measured one, and says whose
    with open(busbw.TABLE, newline="") as handle:
        rows = list(csv.DictReader(handle))
    measured = {
        (r["interconnect"], r["gpus"], r["collective"], r["bytes"]): r["busbw_gbps"]
        for r in rows
        if r["provisional"] == "0"
    }
    for r in (r for r in rows if r["provisional"] == "1"):
        origin = re.match(r"provisional: as measured over (\d+) GPUs by ", r["source"])
        assert origin, r["source"]
        key = (r["interconnect"], origin.group(1), r["collective"], r["bytes"])
        assert measured[key] == r["busbw_gbps"]


def _sim_run(tmp_path, share: float, name: str, ranks: int = 2, measured_at: int | None = None):
    """A healthy step whose all-gathers and reduce-scatters (40 MB each: between two rows of
    each curve) reach `share` of the reference busbw computed here (from the curves of
    `measured_at` ranks, default `ranks`); returns the run and the median of the reference
    over its matched collectives, computed here."""
    nbytes = 40e6
    factor = (ranks - 1) / ranks  # all-gather and reduce-scatter: nccl-tests' bus factor
    want = {
        kind: by_hand(csv_curve(kind, measured_at or ranks), nbytes)
        for kind in ("AllGather", "ReduceScatter")
    }
    us = {kind: nbytes / (share * bw / factor * 1e9) * 1e6 for kind, bw in want.items()}
    sim = Sim(
        ranks=ranks,
        blocks=6,
        bwd_us=30000.0,
        ag_us=us["AllGather"],
        root_ag_us=us["AllGather"],
        rs_us=us["ReduceScatter"],
        root_rs_us=us["ReduceScatter"],
        nelems=int(nbytes / 2),  # bf16
    )
    sim.write(tmp_path / name)
    run = analyze(sorted((tmp_path / name).glob("*.json")), cache=False).only
    kinds = run.crossrank.matched["collective"].astype(str)
    assert set(kinds) == set(want) and (run.crossrank.matched["bytes"] == nbytes).all()
    return run, float(np.median([want[k] for k in kinds]))


def test_the_rule_compares_each_message_with_the_curve_at_its_size(tmp_path):
    low, expected = _sim_run(tmp_path, 0.2, "low")
    finding = low.diagnosis.get("low-bus-bandwidth")
    assert finding is not None
    assert finding.metrics["topology"] == "nvlink" and finding.metrics["assumed"]
    assert finding.metrics["expected_gbps"] == pytest.approx(expected, rel=1e-6)
    assert finding.metrics["ratio"] == pytest.approx(0.2, rel=1e-3)
    assert finding.metrics["compared"] == len(low.crossrank.matched)
    assert f"a median {expected:.0f} GB/s" in finding.evidence
    assert "AllGather over 2 GPUs (measured)" in finding.evidence
    # above the floor share (a quarter of the curve) it stays silent
    assert communication.BUSBW_FLOOR_SHARE == 0.25
    fine, _ = _sim_run(tmp_path, 0.3, "fine")
    assert "low-bus-bandwidth" not in fine.diagnosis.rules()


def test_a_group_size_with_a_provisional_curve_says_so(tmp_path, monkeypatch):
    """Four ranks against a table whose 4-GPU curves are copies of the 2-GPU ones (as the
    shipped table was made before four GPUs were measured)."""
    table = busbw.reference()
    two = table[table["gpus"] == 2]
    copied = busbw.read_rows(pd.concat([two, busbw.provisional_rows(two, 4)]))
    monkeypatch.setattr(busbw, "reference", lambda: copied)
    run, expected = _sim_run(tmp_path, 0.1, "four", ranks=4, measured_at=2)
    finding = run.diagnosis.get("low-bus-bandwidth")
    assert finding is not None and finding.metrics["provisional"]
    assert finding.metrics["expected_gbps"] == pytest.approx(expected, rel=1e-6)
    assert "AllGather over 4 GPUs (provisional)" in finding.evidence
    assert "not measured at this group size yet" in finding.evidence


def test_the_rule_on_real_traces_uses_the_curve():
    """NCCL through host memory fires, far below the curve (the ratio computed here from the
    matched collectives and the CSV); the healthy sample reaches about all of it."""
    broken = analyze(SAMPLES / "diagnosis" / "p2p-disabled", cache=False).only
    finding = broken.diagnosis.get("low-bus-bandwidth")
    assert finding is not None and finding.metrics["compared"] > 0
    m = broken.crossrank.matched
    m = m[m["bytes"] >= communication.LARGE_MESSAGE_BYTES]
    ratios = [
        bw / by_hand(csv_curve(kind, 2), size)
        for kind, size, bw in zip(
            m["collective"], m["bytes"], m["transfer_busbw_gbps"], strict=True
        )
    ]
    assert finding.metrics["ratio"] == pytest.approx(np.median(ratios), rel=1e-9)
    assert finding.metrics["ratio"] < 0.2
    healthy = analyze(SAMPLES / "gpt-small-2gpu", cache=False).only
    assert "low-bus-bandwidth" not in healthy.diagnosis.rules()
    rows = busbw.measure(healthy)
    rows = rows[rows["bytes"] >= communication.LARGE_MESSAGE_BYTES]
    want, _ = busbw.expected(
        busbw.reference(), "nvlink", rows["collective"], rows["gpus"], rows["bytes"]
    )
    assert np.median(rows["busbw_gbps"].to_numpy() / want) > 0.5


def _sources(text: str) -> list[str]:
    return [re.sub(r" \(\d+\)$", "", part) for part in text.split("; ")]


def test_the_shipped_table_is_what_its_sources_measure(tmp_path, monkeypatch):
    """Every measured row, remade from the runs its `source` names by the script that wrote
    it, with the 4-GPU rows copied as provisional: the same file, byte for byte."""
    with open(busbw.TABLE, newline="") as handle:
        rows = list(csv.DictReader(handle))
    runs = sorted({s for r in rows if r["provisional"] == "0" for s in _sources(r["source"])})
    assert runs and all((REPO / run / "run.json").is_file() for run in runs)
    for run in runs:  # real 2x H200 captures, every one
        record = json.loads((REPO / run / "run.json").read_text())
        assert record["environment"]["gpu_name"] == "NVIDIA H200"
        assert record["environment"]["interconnect"]["summary"] == "nvlink"
    monkeypatch.chdir(REPO)
    out = tmp_path / "busbw.csv"
    assert busbw_table.main([*runs, "--provisional-for", "4", "--out", str(out)]) == 0
    assert out.read_text() == busbw.TABLE.read_text()


def test_a_measurement_replaces_the_provisional_rows(tmp_path, monkeypatch):
    """What a GPU session does: its 4-GPU runs replace the 4-GPU curves they measure; the
    2-GPU curves and the curves it did not measure stay."""
    sim = Sim(ranks=4, blocks=4, ag_us=400.0, rs_us=500.0)
    run_json = {
        "world": {"world_size": 4, "local_world_size": 4, "nnodes": 1, "device": "cuda"},
        "environment": {"gpu_name": "NVIDIA H200", "interconnect": {"summary": "nvlink"}},
    }
    sim.write(tmp_path / "four", run_json)
    merged = busbw_table.build([str(tmp_path / "four")], busbw.TABLE, [], notify=lambda _: None)
    old = busbw.reference()
    four = merged[(merged["gpus"] == 4) & (merged["collective"] == "AllGather")]
    assert len(four) and not four["provisional"].any()
    assert set(four["source"].str.replace(r" \(\d+\)$", "", regex=True)) == {str(tmp_path / "four")}
    kept = merged[merged["gpus"] == 2].reset_index(drop=True)
    assert kept.equals(old[old["gpus"] == 2].reset_index(drop=True))


def test_a_table_with_two_figures_for_one_size_is_refused(tmp_path):
    text = busbw.TABLE.read_text().splitlines()
    (tmp_path / "t.csv").write_text("\n".join([*text, text[1]]) + "\n")
    with pytest.raises(ValueError, match="two rows"):
        busbw.read_table(tmp_path / "t.csv")
