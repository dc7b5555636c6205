"""Efficiency vs AC coverage (sweep, plot) and run comparison, on real runs."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from fsdp_trace.errors import UserError
from fsdp_trace.sweep import compare_table, find_runs, knob_changes, parse_points, run_table
from tests.conftest import SAMPLES, run_cli

SWEEP = SAMPLES / "sweep-gpt-1.3b-b1"


def test_efficiency_is_each_point_against_its_1gpu_baseline():
    table = run_table(find_runs([SWEEP]), with_traces=False)
    assert len(table) == 10
    for coverage in (0.0, 0.25, 0.5, 0.75, 1.0):
        tag = f"ac{coverage:.2f}"
        one = json.loads((SWEEP / f"{tag}-1gpu" / "run.json").read_text())["figures"]
        two = json.loads((SWEEP / f"{tag}-2gpu" / "run.json").read_text())["figures"]
        row = table[(table["ac_coverage"] == coverage) & (table["world_size"] == 2)].iloc[0]
        expected = two["tokens_per_s_per_gpu"] / one["tokens_per_s_per_gpu"]
        assert row["scaling_efficiency"] == pytest.approx(expected)
        assert row["scaling_efficiency"] == pytest.approx(two["scaling_efficiency"])  # as captured
    # the sweep recorded the same throughput it plotted
    recorded = pd.read_csv(SWEEP / "efficiency.csv")
    assert recorded["tokens_per_s_per_gpu"].tolist() == pytest.approx(
        table["tokens_per_s_per_gpu"].tolist()
    )


def test_plot_from_run_directories(tmp_path):
    out = tmp_path / "efficiency.html"
    done = run_cli("plot", str(SWEEP), "--no-traces", "--out", str(out))
    assert done.returncode == 0, done.stderr
    html = out.read_text()
    assert html.count("plotly.js v") >= 1 and "<script src=" not in html
    assert "Scaling efficiency" in html and "best tokens\\u002fs\\u002fGPU" in html
    assert (tmp_path / "efficiency.csv").exists()


def test_compare_names_what_changed(tmp_path):
    runs = [
        SAMPLES / "gpt-small-1gpu",
        SAMPLES / "gpt-small-2gpu",
        SAMPLES / "diagnosis" / "tuned-b16",
    ]
    table = compare_table(runs, with_traces=False)
    assert table["change"].tolist()[1] == "GPUs: 1 → 2"
    assert "shard_embeddings: False → True" in table["change"].iloc[2]
    assert "keep_last_unsharded: False → True" in table["change"].iloc[2]
    tps = table["tokens_per_s_per_gpu"].tolist()
    assert table["tokens_per_s_per_gpu_change_pct"].iloc[2] == pytest.approx(
        100 * (tps[2] / tps[1] - 1)
    )
    assert table["scaling_efficiency"].iloc[2] == pytest.approx(tps[2] / tps[0])  # same batch/seq
    html = tmp_path / "compare.html"
    done = run_cli("compare", *map(str, runs), "--no-traces", "--html", str(html))
    assert done.returncode == 0, done.stderr
    assert "GPUs: 1 → 2" in done.stdout and html.exists()


def test_sweep_end_to_end_on_cpu(tmp_path):
    out = tmp_path / "sweep"
    done = run_cli(
        "sweep",
        "--ac-coverage",
        "0,1",
        "--nproc-per-node",
        "2",
        "--out",
        str(out),
        "--model",
        "tiny",
        "--warmup-steps",
        "0",
        "--timing-steps",
        "1",
        "--timed-steps",
        "2",
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    runs = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert runs == ["ac0.00-1gpu", "ac0.00-2gpu", "ac1.00-1gpu", "ac1.00-2gpu"]
    full = json.loads((out / "ac1.00-2gpu" / "run.json").read_text())
    assert full["parallel"]["ac_blocks"] == [f"layers.{i}" for i in range(4)]
    assert full["config"]["baseline"].endswith("ac1.00-1gpu")
    assert (out / "efficiency.html").exists() and (out / "efficiency.csv").exists()


def test_sweep_refuses_bad_options_and_points(tmp_path):
    bad = run_cli("sweep", "--out", str(tmp_path / "s"), "--model", "tiny", "--no-such-knob", "3")
    assert bad.returncode == 2 and "capture option: No such option" in bad.stderr
    assert "Traceback" not in bad.stderr and not (tmp_path / "s").exists()
    with pytest.raises(UserError):
        parse_points("0,1.5")
    assert parse_points("1,0,0.5,0.5") == [0.0, 0.5, 1.0]
    assert knob_changes({"compile": False, "out": "a"}, {"compile": True, "out": "b"}) == (
        "compile: False → True"
    )
