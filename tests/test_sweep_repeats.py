"""A sweep captured several times (benchmarks/gpu_issue15.sh runs `fsdp-trace sweep` once per
repeat, each into its own folder): each multi-GPU run's efficiency is against the 1-GPU run
of its own folder, and the plot shows every point's median with the spread of its repeats."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from fsdp_trace import sweep
from fsdp_trace.render import efficiency
from tests.conftest import SAMPLES, run_cli

SWEEP = SAMPLES / "sweep-gpt-1.3b-b1"
# repeat → (factor on the 1-GPU runs' tokens/s, factor on the 2-GPU runs'): real run.json
# files with their throughput scaled, so each repeat's efficiency differs
REPEATS = {"r1": (1.0, 1.0), "r2": (1.10, 0.95), "r3": (0.96, 1.02)}


def repeated_sweep(tmp_path: Path) -> Path:
    root = tmp_path / "sweep"
    for name, (one, two) in REPEATS.items():
        shutil.copytree(SWEEP, root / name, ignore=shutil.ignore_patterns("*.html", "*.csv"))
        for run_json in (root / name).glob("*/run.json"):
            record = json.loads(run_json.read_text())
            factor = one if record["world"]["world_size"] == 1 else two
            record["figures"]["tokens_per_s_per_gpu"] *= factor
            run_json.write_text(json.dumps(record))
    return root


def tokens(root: Path, repeat: str, point: str) -> float:
    record = json.loads((root / repeat / point / "run.json").read_text())
    return record["figures"]["tokens_per_s_per_gpu"]


def test_each_repeat_is_against_its_own_1gpu_run(tmp_path):
    root = repeated_sweep(tmp_path)
    table = sweep.run_table(sweep.find_runs(sorted(root.iterdir())), False, notify=None)
    assert len(table) == 30
    for row in table[table["world_size"] == 2].itertuples():
        run = Path(row.run)
        tag = run.name.replace("-2gpu", "")
        want = tokens(root, run.parent.name, run.name) / tokens(
            root, run.parent.name, f"{tag}-1gpu"
        )
        assert row.scaling_efficiency == pytest.approx(want, rel=1e-12)
        assert row.baseline == f"{tag}-1gpu"


def test_the_plot_shows_the_median_and_the_spread_of_the_repeats(tmp_path):
    root = repeated_sweep(tmp_path)
    table = sweep.run_table(sweep.find_runs(sorted(root.iterdir())), False, notify=None)
    fig = efficiency.figure(table, efficiency.sweep_title(table))
    (line,) = [t for t in fig.data if t.name == "2 GPU" and t.yaxis == "y"]  # efficiency
    (dots,) = [t for t in fig.data if t.name == "2 GPU, each run" and t.yaxis == "y"]
    assert len(dots.y) == 15 and len(line.y) == 5
    for i, coverage in enumerate(line.x):
        tag = f"ac{coverage:.2f}"
        each = [tokens(root, r, f"{tag}-2gpu") / tokens(root, r, f"{tag}-1gpu") for r in REPEATS]
        assert line.y[i] == pytest.approx(np.median(each))
        assert line.y[i] + line.error_y.array[i] == pytest.approx(max(each))
        assert line.y[i] - line.error_y.arrayminus[i] == pytest.approx(min(each))
        mine = [y for x, y in zip(dots.x, dots.y, strict=True) if x == coverage]
        assert sorted(mine) == pytest.approx(sorted(each))
    notes = " ".join(a.text for a in fig.layout.annotations)
    assert "Repeated points (3 runs each)" in notes


def test_a_single_sweep_draws_as_before():
    table = sweep.run_table(sweep.find_runs([SWEEP]), False, notify=None)
    fig = efficiency.figure(table, "t")
    assert not any("each run" in str(t.name) for t in fig.data)
    assert all(t.error_y.array is None for t in fig.data if t.type == "scatter")
    assert efficiency.repeats_note(table) is None


def test_plot_of_the_repeat_folders(tmp_path):
    root = repeated_sweep(tmp_path)
    out = tmp_path / "efficiency.html"
    done = run_cli("plot", *map(str, sorted(root.iterdir())), "--no-traces", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "Repeated points (3 runs each)" in out.read_text()
    written = (tmp_path / "efficiency.csv").read_text().splitlines()
    assert len(written) == 31 and written[1].startswith("sweep/r1/")
