"""Efficiency vs AC coverage (sweep, plot) and run comparison, on real runs."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fsdp_trace import analyze, sweep
from fsdp_trace.errors import UserError
from fsdp_trace.render.compare import figure as compare_figure
from fsdp_trace.render.compare import render_html
from fsdp_trace.sweep import compare_table, find_runs, knob_changes, parse_points, run_table
from tests.conftest import SAMPLES, run_cli

SWEEP = SAMPLES / "sweep-gpt-1.3b-b14"
REPEATS = sorted(p for p in SWEEP.iterdir() if p.is_dir())  # r1, r2, r3: a sweep each
POINTS = (0.0, 0.25, 0.5, 0.75, 1.0)


def record(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


def test_efficiency_is_each_point_against_its_1gpu_baseline():
    table = run_table(find_runs(REPEATS), with_traces=False, notify=None)
    assert len(table) == len(list(SWEEP.glob("*/*/run.json"))) == 2 * len(POINTS) * len(REPEATS)
    for repeat in REPEATS:
        for coverage in POINTS:
            tag = f"ac{coverage:.2f}"
            one = record(repeat / f"{tag}-1gpu")["figures"]
            two = record(repeat / f"{tag}-2gpu")["figures"]
            (row,) = table[table["run"] == str(repeat / f"{tag}-2gpu")].itertuples()
            expected = two["tokens_per_s_per_gpu"] / one["tokens_per_s_per_gpu"]
            assert row.scaling_efficiency == pytest.approx(expected)
            assert row.scaling_efficiency == pytest.approx(two["scaling_efficiency"])  # captured
            assert row.ac_coverage == coverage and row.baseline == f"{tag}-1gpu"
    # the sweep recorded the same throughput it plotted, with portable run paths
    recorded = pd.read_csv(SWEEP / "efficiency.csv")
    assert recorded["tokens_per_s_per_gpu"].tolist() == pytest.approx(
        table["tokens_per_s_per_gpu"].tolist()
    )
    assert all((SWEEP / run / "run.json").exists() for run in recorded["run"])


def test_committed_sweep_figures_come_from_its_analysis_json():
    """The traces were left out: exposed % and recompute % come from each point's
    analysis.json (1 GPU: no exposed figure), with or without --no-traces."""
    for with_traces in (True, False):
        notices: list[str] = []
        table = run_table(find_runs(REPEATS), with_traces=with_traces, notify=notices.append)
        assert (table["figures_from"] == "analysis.json").all()
        # per-rank analysis.json (format 2): nothing to say of them; only the AC 0
        # baselines' allocator retries (tests/test_sweep_allocator.py) are said
        assert [n for n in notices if not n.startswith("allocator retries")] == []
        for row in table.itertuples():
            saved = json.loads((Path(row.run) / "analysis.json").read_text())
            assert saved["format"] == sweep.SUMMARY_FORMAT and saved["source"] == "traces"
            assert row.recompute_pct == pytest.approx(saved["recompute_pct"])
            if row.world_size == 1:
                assert np.isnan(row.exposed_pct)
            else:  # the worst rank's, with its own split
                worst = max(saved["ranks"], key=lambda r: r["exposed_pct"])
                assert row.exposed_pct == pytest.approx(worst["exposed_pct"])
                assert row.exposed_wait_pct == pytest.approx(worst["exposed_wait_pct"])
        # What AC coverage does, in every repeat on 1 and 2 GPUs: no recompute without it,
        # more recompute and less memory with each step of coverage.
        for _, runs in table.groupby([table["run"].map(lambda r: Path(r).parent), "world_size"]):
            runs = runs.sort_values("ac_coverage")
            assert runs["ac_coverage"].tolist() == list(POINTS)
            assert runs["recompute_pct"].iloc[0] == 0.0
            assert runs["recompute_pct"].is_monotonic_increasing
            assert runs["recompute_pct"].is_unique
            assert runs["peak_allocated_gib"].is_monotonic_decreasing
            assert runs["peak_allocated_gib"].is_unique
    # The committed CSV is exactly what the tool writes from these runs (paths relative to
    # it), every column.
    committed = (SWEEP / "efficiency.csv").read_text()
    assert committed.splitlines()[0].split(",") == sweep.TABLE_COLUMNS
    assert sweep.table_csv(table, SWEEP) == committed


@pytest.mark.parametrize("flag", [[], ["--no-traces"]])
def test_plot_from_run_directories(tmp_path, flag):
    out = tmp_path / "efficiency.html"
    done = run_cli("plot", *map(str, REPEATS), *flag, "--out", str(out))
    assert done.returncode == 0, done.stderr
    html = out.read_text()
    assert html.count("plotly.js v") >= 1 and "<script src=" not in html
    assert "Scaling efficiency" in html and "best tokens\\u002fs\\u002fGPU" in html
    runs = [p.parent for p in SWEEP.glob("*/*/run.json")]
    assert f"from analysis.json for {len(runs)} of {len(runs)} runs" in html
    assert '"responsive": true' in html and "width:100%" in html.replace(" ", "")
    table = pd.read_csv(tmp_path / "efficiency.csv")
    multi = [r for r in runs if record(r)["world"]["world_size"] > 1]
    assert table["exposed_pct"].notna().sum() == len(multi) and table["recompute_pct"].notna().all()


def sample_point(folder: Path) -> Path:
    """gpt-small-2gpu as a run directory of its own (traces linked, not copied)."""
    folder.mkdir(parents=True)
    source = SAMPLES / "gpt-small-2gpu"
    shutil.copy(source / "run.json", folder / "run.json")
    for trace in source.glob("rank*.json.gz"):
        (folder / trace.name).symlink_to(trace)
    return folder


def test_point_summary_traces_then_analysis_json_then_blanks(tmp_path, monkeypatch):
    point = sample_point(tmp_path / "point")
    summary = sweep.summarize_point(point)
    written = json.loads((point / "analysis.json").read_text())
    assert written == json.loads(json.dumps(summary))
    # Against the analysis, computed here: each rank's median step (the lower middle one by
    # length), its parts in % of that step; overlap the median over its steps; the run's
    # figures are the rank exposing the most, with its own split.
    steps = analyze(point, detailed=False).steps
    expected = {}
    for rank, own in steps.groupby("rank"):
        ordered = own.sort_values(["step_us", "step"])
        median = ordered.iloc[(len(ordered) - 1) // 2]
        exposed = median[["exposed_transfer_us", "exposed_wait_us", "exposed_unsplit_us"]].sum()
        expected[rank] = {
            "steps": len(own),
            "step_ms": median["step_us"] / 1e3,
            "exposed_pct": 100 * exposed / median["step_us"],
            "exposed_wait_pct": 100 * median["exposed_wait_us"] / median["step_us"],
            "overlap_pct": own["overlap_pct"].median(),
            "recompute_pct": 0.0,  # no activation checkpointing
        }
    for rank in written["ranks"]:
        for key, value in expected[rank["rank"]].items():
            assert rank[key] == pytest.approx(value), key
    worst = max(expected, key=lambda r: expected[r]["exposed_pct"])
    assert written["exposed_rank"] == worst
    assert written["exposed_pct"] == pytest.approx(expected[worst]["exposed_pct"])
    assert written["exposed_wait_pct"] == pytest.approx(expected[worst]["exposed_wait_pct"])
    assert written["step_ms"] == pytest.approx(max(e["step_ms"] for e in expected.values()))
    assert written["traces"] == {
        p.name: p.stat().st_size for p in sorted(point.glob("rank*.timing.json.gz"))
    }
    # Traces present and analysis.json made from them: reused, not re-analyzed.
    monkeypatch.setattr(sweep, "analyze_point", lambda *a: pytest.fail("re-analyzed"))
    table = run_table([point])
    assert table["figures_from"].tolist() == ["traces"]
    assert table["exposed_pct"].iloc[0] == pytest.approx(written["exposed_pct"])
    # Traces gone: the same figures from analysis.json.
    for trace in point.glob("rank*.json.gz"):
        trace.unlink()
    table = run_table([point])
    assert table["figures_from"].tolist() == ["analysis.json"]
    assert table["exposed_pct"].iloc[0] == pytest.approx(written["exposed_pct"])
    # Neither: blanks and one notice, never an error; plot still writes its page.
    (point / "analysis.json").unlink()
    notices: list[str] = []
    table = run_table([point], notify=notices.append)
    assert np.isnan(table["exposed_pct"].iloc[0]) and np.isnan(table["recompute_pct"].iloc[0])
    assert len(notices) == 1 and "no timing traces and no analysis.json" in notices[0]
    done = run_cli("plot", str(point), "--out", str(tmp_path / "e.html"))
    assert done.returncode == 0, done.stderr
    assert "left blank for 1 run" in done.stderr and (tmp_path / "e.html").exists()


def test_unreadable_analysis_json_is_a_user_error(tmp_path):
    point = sample_point(tmp_path / "point")
    (point / "analysis.json").write_text("{not json")
    done = run_cli("plot", str(point), "--no-traces", "--out", str(tmp_path / "e.html"))
    assert done.returncode == 2 and "analysis.json: unreadable" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "e.html").exists()


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


def test_compare_falls_back_to_a_1gpu_run_with_other_knobs_and_shows_deltas(tmp_path):
    runs = [
        SAMPLES / "gpt-small-1gpu",
        SAMPLES / "gpt-small-2gpu",
        SAMPLES / "gpt-small-2gpu-fullac",  # AC 1: no 1-GPU run with AC 1 in the list
    ]
    table = compare_table(runs, with_traces=True)
    tps = table["tokens_per_s_per_gpu"].tolist()
    assert table["baseline"].tolist() == [
        "",
        "gpt-small-1gpu",
        "gpt-small-1gpu (differs: AC coverage)",
    ]
    assert table["scaling_efficiency"].iloc[2] == pytest.approx(tps[2] / tps[0])
    # Exposed % (from the traces, computed here): the worst rank's median, never one median
    # pooled over ranks; none on 1 GPU; its change in points.
    exposed = [
        max(
            sum(b[p] for p in ("exposed_transfer_us", "exposed_wait_us", "exposed_unsplit_us"))
            / b["step_us"]
            * 100
            for run in [analyze(r, detailed=False).only]
            for b in (run.rank_breakdown(x) for x in run.ranks)
        )
        for r in runs[1:]
    ]
    assert np.isnan(table["exposed_pct"].iloc[0])
    assert table["exposed_pct"].iloc[1:].tolist() == pytest.approx(exposed)
    assert np.isnan(table["exposed_pct_change"].iloc[1])
    assert table["exposed_pct_change"].iloc[2] == pytest.approx(exposed[1] - exposed[0])
    memory = [
        json.loads((r / "run.json").read_text())["figures"]["peak_allocated_gib"] for r in runs
    ]
    assert table["peak_allocated_gib_change"].iloc[1:].tolist() == pytest.approx(
        np.diff(memory).tolist()
    )
    page = render_html(table)
    header = re.findall(r"<th[^>]*>(.*?)</th>", page)
    assert {"baseline (1 GPU)", "Δ exposed", "Δ mem", "what changed"} <= set(header)
    text = re.sub(r"<span[^>]*>|</span>", "", page)  # (names and numbers come in pieces)
    assert "gpt-small-1gpu (differs: AC coverage)" in text and "ac_coverage: 0.0 → 1.0" in text
    # The chart: bars and lines only (the table is HTML, cells wrap); the % panel has its own
    # axis with round ticks and room above the highest label, no secondary axis.
    chart = compare_figure(table).to_plotly_json()
    assert {t["type"] for t in chart["data"]} == {"bar", "scatter"}
    assert chart["layout"]["yaxis2"]["tickvals"] == [0, 20, 40, 60, 80, 100]
    assert chart["layout"]["yaxis2"]["range"][1] > 100
    assert "yaxis3" not in chart["layout"]
    assert {t.get("yaxis", "y") for t in chart["data"] if t["type"] == "scatter"} == {"y2"}


def test_compare_without_a_1gpu_run_uses_run_json_and_names_it(tmp_path):
    table = compare_table([SAMPLES / "gpt-small-2gpu"], with_traces=False, notify=None)
    saved = json.loads((SAMPLES / "gpt-small-2gpu" / "run.json").read_text())["figures"]
    assert table["scaling_efficiency"].iloc[0] == pytest.approx(saved["scaling_efficiency"])
    assert table["baseline"].iloc[0].startswith("run.json")


@pytest.mark.slow
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
    # Every file written is named; PyTorch's profiler chatter is not there.
    assert "USDT" not in done.stderr and "profiler_start" not in done.stderr
    named = re.findall(r"^fsdp-trace: wrote (\S+)", done.stderr, re.MULTILINE)
    assert named == [
        *(str(out / name) for name in runs),
        f"{out}/efficiency.html",
        f"{out}/efficiency.csv",
    ]
    assert f"wrote {out}/ac0.00-2gpu (run.json and 4 traces, analysis.json)" in done.stderr
    # A CPU sweep: no scaling efficiency (a 2-core host made it 7.1), no recompute (CPU traces
    # cannot measure it, never 0.0), the device said, and a notice why.
    first = pd.read_csv(out / "efficiency.csv")
    assert (first["device"] == "cpu").all()
    assert first["scaling_efficiency"].isna().all() and first["recompute_pct"].isna().all()
    assert "ran on CPU (gloo)" in done.stderr
    # Each point's analysis.json, from its traces: the plot survives deleting them.
    for name in runs:
        saved = json.loads((out / name / "analysis.json").read_text())
        assert saved["source"] == "traces" and set(saved["traces"]) == {
            p.name for p in (out / name).glob("rank*.timing.json.gz")
        }
        assert saved["recompute_pct"] is None
    for trace in out.glob("*/rank*.json.gz"):
        trace.unlink()
    done = run_cli("plot", str(out), "--out", str(tmp_path / "again.html"))
    assert done.returncode == 0, done.stderr
    again = pd.read_csv(tmp_path / "again.csv")
    assert again["step_ms"].tolist() == pytest.approx(first["step_ms"].tolist())
    assert again["recompute_pct"].isna().all()
    assert (again["figures_from"] == "analysis.json").all()


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
