"""Allocator retries in a sweep: a run whose caching allocator retried (run.json
`num_alloc_retries` > 0) is slowed by memory, so an efficiency measured against such a 1-GPU
baseline is not scaling (above 1 it is not super-linear), and a multi-GPU run that retried
understates its GPUs. `plot` says so on stderr and under the page; a sweep without retries
hears nothing of it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from fsdp_trace import sweep
from fsdp_trace.render import efficiency
from tests.conftest import SAMPLES, run_cli

SWEEP = SAMPLES / "sweep-gpt-1.3b-b14"
REPEATS = sorted(p for p in SWEEP.iterdir() if p.is_dir())


def figures(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())["figures"]


def allocator(notices: list[str]) -> list[str]:
    return [n for n in notices if n.startswith("allocator retries")]


def test_the_committed_sweep_says_its_retrying_baselines_are_no_scaling():
    notices: list[str] = []
    table = sweep.run_table(sweep.find_runs(REPEATS), with_traces=False, notify=notices.append)
    # From the run.json files: the 1-GPU runs that retried, and the 2-GPU runs beside them.
    retried = [
        run
        for repeat in REPEATS
        for run in sorted(repeat.glob("*-1gpu"))
        if figures(run)["num_alloc_retries"] > 0
    ]
    assert retried  # the sweep's finding: its AC 0 baselines retried
    assert not any(figures(run)["num_alloc_retries"] for run in SWEEP.glob("*/*-2gpu"))
    each = [
        figures(run.with_name(run.name.replace("-1gpu", "-2gpu")))["tokens_per_s_per_gpu"]
        / figures(run)["tokens_per_s_per_gpu"]
        for run in retried
    ]
    (notice,) = allocator(notices)
    assert allocator(table.attrs["notices"]) == [notice]
    assert f"allocator retries in {len(retried)} runs on 1 GPU" in notice
    for run in retried:
        assert f"{run.parent.name}/{run.name}" in notice
    assert f"the scaling efficiency of {len(each)} runs measured against them" in notice
    assert f"{min(each):.2f}-{max(each):.2f}" in notice
    assert ("above 1 it is not super-linear scaling" in notice) == (max(each) > 1)
    assert "multi-GPU" not in notice
    # The table carries each run's count and its baseline's (efficiency.csv's columns).
    for row in table.itertuples():
        run = Path(row.run)
        assert row.alloc_retries == figures(run)["num_alloc_retries"]
        if row.world_size == 1:
            assert row.baseline_alloc_retries is pd.NA
        else:
            baseline = run.with_name(run.name.replace("-2gpu", "-1gpu"))
            assert row.baseline_alloc_retries == figures(baseline)["num_alloc_retries"]


def test_plot_says_it_on_stderr_and_under_the_page(tmp_path):
    out = tmp_path / "efficiency.html"
    done = run_cli("plot", *map(str, REPEATS), "--no-traces", "--out", str(out))
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "allocator retries" in line]
    assert len(said) == 1 and "not super-linear scaling" in said[0]
    table = sweep.run_table(sweep.find_runs(REPEATS), with_traces=False, notify=None)
    fig = efficiency.figure(table, "t")
    # each footnote is drawn as the rows it wraps into, one annotation a row, in order
    drawn = " ".join(a.text for a in fig.layout.annotations)
    (notice,) = allocator(table.attrs["notices"])
    assert notice in drawn and efficiency.READING in drawn
    # wrapped: no drawn row is wider than the page takes
    rows = efficiency.footnote_rows([notice, efficiency.READING])
    assert set(rows) <= {a.text for a in fig.layout.annotations}
    assert max(map(len, rows)) <= efficiency.FOOTNOTE_CHARACTERS
    csv = pd.read_csv(tmp_path / "efficiency.csv")
    assert csv["alloc_retries"].tolist() == table["alloc_retries"].tolist()
    # the page's subtitle: the best point's efficiency is against a baseline that retried
    best = efficiency.best_point(table)
    title = fig.layout.title.text
    retried = best["baseline_alloc_retries"] > 0
    assert retried == ("against a 1-GPU run slowed by allocator retries" in title)


def copied_repeat(tmp_path: Path, retries: dict[str, int]) -> Path:
    """The first repeat copied, every run.json's num_alloc_retries set from `retries` (0 for
    the runs it does not name)."""
    folder = tmp_path / REPEATS[0].name
    shutil.copytree(REPEATS[0], folder)
    for run_json in folder.glob("*/run.json"):
        record = json.loads(run_json.read_text())
        record["figures"]["num_alloc_retries"] = retries.get(run_json.parent.name, 0)
        run_json.write_text(json.dumps(record))
    return folder


def test_no_retries_no_notice(tmp_path):
    folder = copied_repeat(tmp_path, {})
    notices: list[str] = []
    table = sweep.run_table(sweep.find_runs([folder]), with_traces=False, notify=notices.append)
    assert allocator(notices) == []
    fig = efficiency.figure(table, "t")
    assert "allocator" not in fig.layout.title.text
    assert not any("allocator retries in" in a.text for a in fig.layout.annotations)
    done = run_cli("plot", str(folder), "--no-traces")
    assert done.returncode == 0 and "allocator" not in done.stderr
    # real runs without retries, through compare
    runs = [SAMPLES / "gpt-small-1gpu", SAMPLES / "gpt-small-2gpu"]
    assert all(figures(r)["num_alloc_retries"] == 0 for r in runs)
    table = sweep.compare_table(runs, with_traces=False, notify=None)
    assert allocator(table.attrs["notices"]) == []


def test_a_multi_gpu_run_that_retried_and_a_baseline_below_1(tmp_path):
    folder = copied_repeat(tmp_path, {"ac0.50-1gpu": 4, "ac0.75-2gpu": 7})
    notices: list[str] = []
    table = sweep.run_table(sweep.find_runs([folder]), with_traces=False, notify=notices.append)
    one, many = allocator(notices)
    eff = table.set_index(table["run"].map(lambda r: Path(r).name))["scaling_efficiency"]
    assert eff["ac0.50-2gpu"] < 1  # the premise of "overstated"
    assert "1 run on 1 GPU (AC 0.5: r1/ac0.50-1gpu; 4 retries" in one
    assert f"(AC 0.5: {eff['ac0.50-2gpu']:.2f}) measures that baseline's slowness" in one
    assert "it is overstated" in one and "super-linear" not in one
    assert "1 multi-GPU run (AC 0.75: r1/ac0.75-2gpu; 7 retries" in many
    assert "understate" in many


@pytest.mark.parametrize("world", [1, 2])
def test_cpu_runs_count_no_retries(tmp_path, world):
    run = tmp_path / "cpu"
    shutil.copytree(SAMPLES / "cpu-gloo-2proc", run, ignore=shutil.ignore_patterns("*.gz"))
    record = json.loads((run / "run.json").read_text())
    record["figures"]["num_alloc_retries"] = 3  # not a GPU allocator's: never read
    record["world"]["world_size"] = world
    (run / "run.json").write_text(json.dumps(record))
    table = sweep.run_table([run], with_traces=False, notify=None)
    assert allocator(table.attrs["notices"]) == [] and table["alloc_retries"].isna().all()
