"""A sweep captured several times (benchmarks/gpu_runs_2gpu.sh runs `fsdp-trace sweep` once per
repeat, each into its own folder; the committed gpt-1.3b batch-14 sweep has three): each
multi-GPU run's efficiency is against the 1-GPU run of its own folder, and the plot shows every
point's median with the spread of its repeats."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from fsdp_trace import sweep
from fsdp_trace.render import efficiency
from tests.conftest import SAMPLES, run_cli

SWEEP = SAMPLES / "sweep-gpt-1.3b-b14"
REPEATS = sorted(p for p in SWEEP.iterdir() if p.is_dir())


def tokens(repeat: Path, point: str) -> float:
    record = json.loads((repeat / point / "run.json").read_text())
    return record["figures"]["tokens_per_s_per_gpu"]


def each_efficiency(tag: str) -> list[float]:
    """The point's efficiency in every repeat, from the run.json files."""
    return [tokens(r, f"{tag}-2gpu") / tokens(r, f"{tag}-1gpu") for r in REPEATS]


def test_the_committed_sweep_is_repeated():
    assert len(REPEATS) == 3
    points = [sorted(p.name for p in r.iterdir()) for r in REPEATS]
    assert points[0] == points[1] == points[2] and len(points[0]) == 10


def test_each_repeat_is_against_its_own_1gpu_run():
    table = sweep.run_table(sweep.find_runs(REPEATS), False, notify=None)
    assert len(table) == 30
    first = REPEATS[0]
    others = 0
    for row in table[table["world_size"] == 2].itertuples():
        run = Path(row.run)
        tag = run.name.replace("-2gpu", "")
        want = tokens(run.parent, run.name) / tokens(run.parent, f"{tag}-1gpu")
        assert row.scaling_efficiency == pytest.approx(want, rel=1e-12)
        assert row.baseline == f"{tag}-1gpu"
        # against the first repeat's baseline it would be another number
        if run.parent != first:
            against_first = tokens(run.parent, run.name) / tokens(first, f"{tag}-1gpu")
            others += against_first != pytest.approx(want, rel=1e-6)
    assert others == 10


def test_the_plot_shows_the_median_and_the_spread_of_the_repeats():
    table = sweep.run_table(sweep.find_runs(REPEATS), False, notify=None)
    fig = efficiency.figure(table, efficiency.sweep_title(table))
    (line,) = [t for t in fig.data if t.name == "2 GPU" and t.yaxis == "y"]  # efficiency
    (dots,) = [t for t in fig.data if t.name == "2 GPU, each run" and t.yaxis == "y"]
    assert len(dots.y) == 15 and len(line.y) == 5
    for i, coverage in enumerate(line.x):
        each = each_efficiency(f"ac{coverage:.2f}")
        assert line.y[i] == pytest.approx(np.median(each))
        assert line.y[i] + line.error_y.array[i] == pytest.approx(max(each))
        assert line.y[i] - line.error_y.arrayminus[i] == pytest.approx(min(each))
        mine = [y for x, y in zip(dots.x, dots.y, strict=True) if x == coverage]
        assert sorted(mine) == pytest.approx(sorted(each))
    # the 1-GPU tokens/s panel too: median and spread of its three runs
    (ones,) = [t for t in fig.data if t.name == "1 GPU" and t.yaxis == "y2"]
    for i, coverage in enumerate(ones.x):
        each = [tokens(r, f"ac{coverage:.2f}-1gpu") for r in REPEATS]
        assert ones.y[i] == pytest.approx(np.median(each))
        assert ones.y[i] + ones.error_y.array[i] == pytest.approx(max(each))
    notes = " ".join(a.text for a in fig.layout.annotations)
    assert "Repeated points (3 runs each)" in notes


def test_a_single_sweep_draws_as_before():
    table = sweep.run_table(sweep.find_runs(REPEATS[:1]), False, notify=None)
    fig = efficiency.figure(table, "t")
    assert not any("each run" in str(t.name) for t in fig.data)
    assert all(t.error_y.array is None for t in fig.data if t.type == "scatter")
    assert efficiency.repeats_note(table) is None


def test_plot_of_the_repeat_folders(tmp_path):
    root = tmp_path / "sweep"
    shutil.copytree(SWEEP, root, ignore=shutil.ignore_patterns("*.html", "*.csv"))
    out = tmp_path / "efficiency.html"
    folders = sorted(p for p in root.iterdir() if p.is_dir())
    done = run_cli("plot", *map(str, folders), "--no-traces", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "Repeated points (3 runs each)" in out.read_text()
    written = (tmp_path / "efficiency.csv").read_text().splitlines()
    assert len(written) == 31 and written[1].startswith("sweep/r1/")
