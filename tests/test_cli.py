"""The command line as a user meets it: where outputs go and how each is announced, compare's
row names and environment knobs, honest CPU figures, help without type markers, capture's
options generated from its config dataclasses, and no profiler chatter."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from fsdp_trace import cli, sweep
from fsdp_trace.capture.config import (
    HELP_PANELS,
    SWITCHES,
    CaptureConfig,
    field_docs,
    switch_options,
)
from fsdp_trace.capture.launcher import Rendezvous
from fsdp_trace.errors import UserError
from fsdp_trace.present.compare import CPU_EFFICIENCY
from fsdp_trace.present.compare import compare_table as compare_view_table
from tests.conftest import SAMPLES, run_cli

CPU_SAMPLE = SAMPLES / "cpu-gloo-2proc"
COMMANDS = [
    "capture",
    "analyze",
    "whatif",
    "sweep",
    "tune",
    "plot",
    "compare",
    "view",
    "cache",
    "cache info",
]


def linked_run(source: Path, folder: Path, edit=None) -> Path:
    """A copy of a sample run directory (traces linked, not copied); `edit(run_json)` may
    change its run.json."""
    folder.mkdir(parents=True)
    record = json.loads((source / "run.json").read_text())
    if edit is not None:
        edit(record)
    (folder / "run.json").write_text(json.dumps(record))
    for trace in source.glob("rank*.json.gz"):
        (folder / trace.name).symlink_to(trace)
    return folder


def wrote(stderr: str) -> list[str]:
    """The "fsdp-trace: wrote/replaced PATH" lines, as (verb, path)."""
    return re.findall(r"^fsdp-trace: (wrote|replaced) (\S+)", stderr, re.MULTILINE)


# --- 1. outputs where users expect them ---------------------------------------------------


def test_report_lands_in_the_run_directory_and_says_replaced_the_second_time(tmp_path):
    run = linked_run(CPU_SAMPLE, tmp_path / "run")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    first = run_cli("analyze", str(run), "--no-detailed")
    assert first.returncode == 0, first.stderr
    assert wrote(first.stderr) == [("wrote", f"{run}/report.html")]
    assert (run / "report.html").is_file()
    again = run_cli("analyze", str(run), "--no-detailed")
    assert wrote(again.stderr) == [("replaced", f"{run}/report.html")]


def test_report_beside_a_trace_file_and_beside_the_first_of_several(tmp_path):
    run = linked_run(CPU_SAMPLE, tmp_path / "runs" / "a")
    trace = tmp_path / "loose" / "rank0.timing.json.gz"
    trace.parent.mkdir()
    shutil.copy(CPU_SAMPLE / "rank0.timing.json.gz", trace)
    done = run_cli("analyze", str(trace))
    assert done.returncode == 0, done.stderr
    assert wrote(done.stderr) == [("wrote", str(trace.parent / "rank0.timing.report.html"))]
    both = run_cli("analyze", str(run), str(trace), "--no-detailed")
    assert both.returncode == 0, both.stderr
    assert wrote(both.stderr) == [("wrote", str(tmp_path / "runs" / "report.html"))]
    line = both.stderr.splitlines()[-1]
    assert f"one report for 2 inputs (2 runs), beside the first input, {run};" in line
    assert "--report or --out-dir" in line


def test_a_folder_of_traces_gets_its_report_inside(tmp_path):
    folder = tmp_path / "traces"
    folder.mkdir()
    for trace in CPU_SAMPLE.glob("rank*.timing.json.gz"):
        (folder / trace.name).symlink_to(trace)
    done = run_cli("analyze", str(folder))
    assert done.returncode == 0, done.stderr
    assert wrote(done.stderr) == [("wrote", f"{folder}/report.html")]
    runs = tmp_path / "runs"  # a folder of runs (a sweep's): inside it too, and said
    linked_run(CPU_SAMPLE, runs / "a")
    linked_run(SAMPLES / "cpu-fullac", runs / "b")
    done = run_cli("analyze", str(runs), "--no-detailed")
    assert done.returncode == 0, done.stderr
    assert wrote(done.stderr) == [("wrote", f"{runs}/report.html")]
    assert f"(one report for 2 runs, in {runs}; choose with --report or --out-dir)" in (done.stderr)


def test_out_dir_takes_every_output_and_bare_names(tmp_path):
    run = linked_run(CPU_SAMPLE, tmp_path / "run")
    out = tmp_path / "out"
    done = run_cli(
        "analyze",
        str(run),
        "--no-detailed",
        "--out-dir",
        str(out),
        "--json",
        "a.json",
        "--csv",
        "tables",
        "--perfetto",
        "v.pftrace",
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["a.json", "report.html", "tables", "v.pftrace"]
    assert not (run / "report.html").exists()
    named = {path for _, path in wrote(done.stderr)}
    assert named == {f"{out}/a.json", f"{out}/tables/", f"{out}/report.html", f"{out}/v.pftrace"}
    # --report still overrides (a bare name in --out-dir, a path where it says)
    mine = tmp_path / "mine.html"
    done = run_cli(
        "analyze", str(run), "--no-detailed", "--out-dir", str(out), "--report", str(mine)
    )
    assert wrote(done.stderr) == [("wrote", str(mine))]


def test_outputs_are_checked_before_the_analysis_and_never_an_input(tmp_path):
    run = linked_run(CPU_SAMPLE, tmp_path / "run")
    done = run_cli("analyze", str(run), "--report", str(run / "run.json"))
    assert done.returncode == 2 and "is one of the inputs" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and done.stdout == ""
    bad = run_cli("analyze", str(run), "--out-dir", str(run / "run.json"))
    assert bad.returncode == 2 and "not a folder" in bad.stderr and bad.stdout == ""
    # plot and compare too: never a run's own files
    done = run_cli("plot", str(run), "--out", str(run / "run.json"))
    assert done.returncode == 2 and "is one of the inputs" in done.stderr


def test_plot_names_the_csv_and_lands_in_the_folder_given(tmp_path):
    sweep_dir = tmp_path / "sweep"
    for name in ("ac0.00-1gpu", "ac0.00-2gpu"):
        source = SAMPLES / "sweep-gpt-1.3b-b14" / "r1" / name
        shutil.copytree(source, sweep_dir / name)
    done = run_cli("plot", str(sweep_dir), "--no-traces")
    assert done.returncode == 0, done.stderr
    assert wrote(done.stderr) == [
        ("wrote", f"{sweep_dir}/efficiency.html"),
        ("wrote", f"{sweep_dir}/efficiency.csv"),
    ]
    again = run_cli("plot", str(sweep_dir), "--no-traces", "--out-dir", str(tmp_path / "o"))
    assert wrote(again.stderr) == [
        ("wrote", f"{tmp_path}/o/efficiency.html"),
        ("wrote", f"{tmp_path}/o/efficiency.csv"),
    ]
    third = run_cli("plot", str(sweep_dir), "--no-traces")
    assert [v for v, _ in wrote(third.stderr)] == ["replaced", "replaced"]


def test_plot_without_plotly_writes_the_csv_and_says_so(tmp_path, monkeypatch, capsys):
    point = tmp_path / "ac0.00-2gpu"
    shutil.copytree(SAMPLES / "sweep-gpt-1.3b-b14" / "r1" / "ac0.00-2gpu", point)
    monkeypatch.setitem(sys.modules, "plotly", None)  # import plotly fails
    cli.capture.write_efficiency([point], tmp_path / "efficiency.html", with_traces=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ac0.00-2gpu", "efficiency.csv"]
    err = capsys.readouterr().err
    assert f"fsdp-trace: wrote {tmp_path}/efficiency.csv" in err
    assert "plotly is not installed" in err and "efficiency.html" not in err


def test_compare_writes_beside_the_first_run_or_in_out_dir(tmp_path):
    a = linked_run(CPU_SAMPLE, tmp_path / "runs" / "a")
    b = linked_run(SAMPLES / "cpu-fullac", tmp_path / "runs" / "b")
    done = run_cli("compare", str(a), str(b), "--no-traces")
    assert done.returncode == 0, done.stderr
    assert wrote(done.stderr) == [("wrote", f"{tmp_path}/runs/compare.html")]
    done = run_cli("compare", str(a), str(b), "--no-traces", "--out-dir", str(tmp_path / "o"))
    assert wrote(done.stderr) == [("wrote", f"{tmp_path}/o/compare.html")]
    done = run_cli("compare", str(a), str(b), "--no-traces", "--html", "")
    assert wrote(done.stderr) == []


# --- 2. compare names its runs -------------------------------------------------------------


def test_compare_rows_are_named_by_directory_or_label():
    runs = [SAMPLES / "gpt-small-2gpu", SAMPLES / "diagnosis" / "p2p-disabled"]
    table = sweep.compare_table(runs, with_traces=False, notify=None)
    assert table["label"].tolist() == ["gpt-small-2gpu", "p2p-disabled"]
    assert table["setup"].tolist() == ["2 GPU", "2 GPU"]
    labelled = sweep.compare_table(runs, with_traces=False, notify=None, labels=["base", "nop2p"])
    assert labelled["label"].tolist() == ["base", "nop2p"]
    assert compare_view_table(labelled).rows[1][1] == "nop2p"
    done = run_cli("compare", *map(str, runs), "--no-traces", "--html", "", "--label", "x")
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "fsdp-trace compare: error: --label given 1 time for 2 runs: give one per run, in the "
        "order of the runs"
    )
    named = run_cli(
        "compare", *map(str, runs), "--no-traces", "--html", "", "--label", "x", "--label", "y"
    )
    assert named.returncode == 0, named.stderr
    assert re.search(r"│ 2 │ y ", named.stdout)


def test_compare_names_environment_changes_and_resolved_defaults_never_none():
    runs = [
        SAMPLES / "gpt-small-2gpu",
        SAMPLES / "diagnosis" / "p2p-disabled",
        SAMPLES / "diagnosis" / "max-connections-1",
    ]
    table = sweep.compare_table(runs, with_traces=False, notify=None)
    # batch_size was left at the preset's (None in config) in the diagnosis runs: compared
    # by the value run.json's model section records
    assert table["change"].iloc[1] == "batch_size: 16 → 4, NCCL_P2P_DISABLE: unset → 1"
    assert table["change"].iloc[2] == (
        "CUDA_DEVICE_MAX_CONNECTIONS: unset → 1, NCCL_P2P_DISABLE: 1 → unset"
    )
    assert not any("None" in c for c in table["change"])
    assert sweep.knob_changes({"straggler_rank": None}, {"straggler_rank": 1}) == (
        "straggler_rank: unset → 1"
    )
    knobs = sweep.run_knobs(sweep.read_run(runs[1]))
    assert knobs["topology"] == "nvlink" and knobs["batch_size"] == 4
    assert "OMP_NUM_THREADS" not in knobs  # set by the launcher per run, not a knob


# --- 3. honest CPU runs --------------------------------------------------------------------


def test_summarize_leaves_recompute_blank_where_cpu_traces_cannot_measure_it():
    import fsdp_trace

    run = fsdp_trace.analyze(SAMPLES / "cpu-fullac", detailed=False).only
    assert np.isnan(run.steps["recompute_us"]).all()  # no GPU kernels on CPU
    figures = sweep.summarize(run)
    assert figures["recompute_pct"] is None
    gpu = sweep.summarize(fsdp_trace.analyze(SAMPLES / "gpt-small-2gpu", detailed=False).only)
    assert gpu["recompute_pct"] == 0.0  # measured: no AC, no recompute kernels


def cpu_sweep(tmp_path: Path) -> list[Path]:
    """A CPU sweep's four points made from a CPU sample (1 and 2 ranks, AC 0 and 1), with
    the kind of figures a 2-core machine gives: 2 ranks "faster" per rank than 1."""

    def point(world: int, coverage: float, tps: float):
        def edit(record):
            record["world"]["world_size"] = world
            record["config"]["ac_coverage"] = coverage
            record["parallel"]["ac_coverage_effective"] = coverage
            record["parallel"]["ac_blocks"] = [f"layers.{i}" for i in range(int(4 * coverage))]
            record["figures"]["tokens_per_s_per_gpu"] = tps
            if world > 1:
                record["figures"]["scaling_efficiency"] = 7.1
            record["files"]["timing"] = record["files"]["timing"][:world]

        return linked_run(CPU_SAMPLE, tmp_path / f"ac{coverage:.2f}-{world}gpu", edit)

    return [
        point(1, 0.0, 400.0),
        point(2, 0.0, 1500.0),
        point(1, 1.0, 300.0),
        point(2, 1.0, 2130.0),
    ]


def test_cpu_runs_get_no_efficiency_no_recompute_and_a_notice(tmp_path):
    runs = cpu_sweep(tmp_path)
    notices: list[str] = []
    table = sweep.run_table(runs, with_traces=False, notify=notices.append)
    assert table["device"].tolist() == ["cpu"] * 4
    assert table["scaling_efficiency"].isna().all()  # never 7.1 (710 %)
    assert table["recompute_pct"].isna().all()
    assert table["ac_blocks"].tolist() == [0, 0, 4, 4] and (table["n_blocks"] == 4).all()
    assert table["label"].tolist()[:2] == ["1 CPU rank", "2 CPU ranks"]
    cpu_notice = [n for n in notices if "ran on CPU (gloo)" in n]
    assert len(cpu_notice) == 1 and cpu_notice[0].startswith("every run (")
    assert "not computed" in cpu_notice[0]
    compared = sweep.compare_table(runs, with_traces=False, notify=None)
    view = compare_view_table(compared)
    column = view.headers.index("efficiency")
    assert [row[column] for row in view.rows] == [CPU_EFFICIENCY] * 4 == ["— (CPU)"] * 4
    assert compared["change"].iloc[1] == "ranks: 1 → 2"
    done = run_cli("compare", *map(str, runs), "--no-traces", "--html", "")
    assert "— (CPU)" in done.stdout and "notice: every run" in done.stdout


def test_cpu_sweep_plot_draws_no_timing_as_fact(tmp_path):
    from fsdp_trace.render import efficiency

    table = sweep.run_table(cpu_sweep(tmp_path), with_traces=False, notify=None)
    fig = efficiency.figure(table, efficiency.sweep_title(table)).to_plotly_json()
    title = fig["layout"]["title"]["text"]
    assert "on CPU (gloo)" in title and "not plotted" in title
    panels = [a["text"] for a in fig["layout"]["annotations"]]
    assert "Peak host memory (RSS), GiB" in panels
    assert "Blocks under activation checkpointing" in panels
    assert not any("efficiency" in p.lower() or "tokens" in p.lower() for p in panels[:2])
    lines = [t for t in fig["data"] if t["type"] == "scatter"]
    assert {t["name"] for t in lines} == {"1 CPU rank", "2 CPU ranks"}
    cells = next(t for t in fig["data"] if t["type"] == "table")["cells"]["values"]
    assert cells[3] == ["— (CPU)"] * 4
    # Among GPU runs, a CPU run is left out of the timing panels and never the best point.
    gpu = sweep.run_table(
        sweep.find_runs([SAMPLES / "sweep-gpt-1.3b-b14" / "r1"]), with_traces=False, notify=None
    )
    mixed = pd.concat([gpu, table], ignore_index=True)
    assert efficiency.best_point(mixed)["device"] == "cuda"
    drawn = efficiency.figure(mixed, "t").to_plotly_json()["data"]
    assert not any("CPU" in str(t.get("name")) for t in drawn)


def test_capture_summary_of_a_cpu_run_shows_no_scaling_figure():
    from fsdp_trace.capture.summary import CPU_NOTICE, CPU_SCALING, summary_rows

    record = json.loads((CPU_SAMPLE / "run.json").read_text())
    record["figures"].update(
        scaling_efficiency=7.1, baseline_dir="runs/b", baseline_tokens_per_s=200.0
    )
    rows = summary_rows(record)
    assert dict(rows)["scaling efficiency"] == CPU_SCALING
    assert ("notice", CPU_NOTICE) in rows and not any("7.1" in text for _, text in rows)


# --- 4. a quiet, readable CLI --------------------------------------------------------------


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_has_no_type_markers(command):
    done = subprocess.run(
        [sys.executable, "-m", "fsdp_trace", *command.split(), "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert done.returncode == 0, done.stderr
    for marker in ("<bool>", "<int>", "<str>", "<float>", "<list[str]>", "{"):
        assert marker not in done.stdout, (command, marker)
    assert not re.search(r"<\w", done.stdout), command


def test_command_summaries_fit_one_line_at_80_columns():
    done = subprocess.run(
        [sys.executable, "-m", "fsdp_trace", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
    )
    panel = done.stdout.split("Commands")[1]
    rows = [line for line in panel.splitlines() if line.startswith("│")]
    names = [row.split()[1] for row in rows]
    assert names == [c for c in COMMANDS if " " not in c]  # the top-level ones, in order
    for row in rows:  # one line each, a whole sentence
        assert row.rstrip(" │").endswith("."), row


def test_capture_options_come_from_the_config_dataclasses():
    group = typer.main.get_command(cli.app)
    command = group.get_command(typer.Context(group), "capture")  # built when asked for
    options = {p.name: p for p in command.params}
    for cls in (CaptureConfig, Rendezvous):
        docs = field_docs(cls)
        hints = typing.get_type_hints(cls)
        for spec in dataclasses.fields(cls):
            assert docs.get(spec.name), f"{cls.__name__}.{spec.name} has no docstring"
            option = options[spec.name]
            assert option.help == docs[spec.name]
            flag = "--" + spec.name.replace("_", "-")
            if hints[spec.name] is bool:
                assert (option.opts[0], option.secondary_opts[0]) == switch_options(spec.name)
            else:
                assert option.opts == [flag]
    assert set(options) - {"help"} == {
        *(f.name for f in dataclasses.fields(CaptureConfig)),
        *(f.name for f in dataclasses.fields(Rendezvous)),
    }
    for name, pair in SWITCHES.items():
        assert (options[name].opts[0], options[name].secondary_opts[0]) == pair
    panels = [name for names in HELP_PANELS.values() for name in names]
    assert sorted(panels) == sorted(f.name for f in dataclasses.fields(CaptureConfig))
    assert options["reshard_after_forward"].default == "true"  # as typed, parsed by validate


def test_sweep_passes_capture_options_through(monkeypatch, tmp_path):
    seen = {}

    def run_sweep(base, points, nproc, out, rendezvous, baseline, on_point=None):
        seen.update(base=base, points=points, nproc=nproc)
        raise UserError("stop here")

    monkeypatch.setattr(sweep, "run_sweep", run_sweep)
    args = ["sweep", "--ac-coverage", "0,1", "--out", str(tmp_path / "s"), "--model", "gpt-small"]
    args += ["--batch-size", "3", "--keep-last-unsharded", "--accum-no-sync", "--grad-accum", "2"]
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 2 and "stop here" in result.output
    base = seen["base"]
    assert (base.model, base.batch_size, base.grad_accum) == ("gpt-small", 3, 2)
    assert base.keep_last_unsharded and base.accum_no_sync and seen["points"] == [0.0, 1.0]


USDT_FILTER_INPUT = (
    b"\x1b[2Kwarmup 1/3"  # a progress bar's partial line
    b"USDT:2026-11-23 22:08:00 23289:23289 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
    b"[W kineto] ERROR: CUPTI_ERROR_INSUFFICIENT_PRIVILEGES\n"
    b"USDT:2026-11-23 22:08:01 23289:23289 SyncActivityProfilerHandler.cpp:59] profiler_stop\n"
    b"Traceback (most recent call last):\n  RuntimeError: real\n"
    b"USDT: something else\n"
)


def test_the_profiler_filter_drops_only_kineto_usdt_lines():
    from fsdp_trace.capture.runner import USDT_FILTER

    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", USDT_FILTER],
        input=USDT_FILTER_INPUT,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == (
        b"\x1b[2Kwarmup 1/3[W kineto] ERROR: CUPTI_ERROR_INSUFFICIENT_PRIVILEGES\n"
        b"Traceback (most recent call last):\n  RuntimeError: real\nUSDT: something else\n"
    )


def test_the_profiler_filter_passes_partial_output_at_once():
    from fsdp_trace.capture.runner import USDT_FILTER

    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", USDT_FILTER],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        proc.stdin.write(b"\rtiming 2/5 US")  # a bar, then what could start a USDT line
        proc.stdin.flush()
        assert os.read(proc.stderr.fileno(), 100) == b"\rtiming 2/5 "
        proc.stdin.write(b"ER\n")
        proc.stdin.flush()
        assert os.read(proc.stderr.fileno(), 100) == b"USER\n"
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def test_progress_counts_each_phase_and_says_the_profiler_warmup(capsys):
    from fsdp_trace.capture.runner import Progress, progress_phases

    cfg = CaptureConfig(warmup_steps=3, timing_steps=5, timed_steps=10)
    phases = progress_phases(cfg)
    assert [(name, total) for name, total, _ in phases] == [
        ("warmup", 3),
        ("detailed", 1),
        ("timing", 5),
        ("timed", 10),
    ]
    progress = Progress(True, phases)
    with progress.running():
        progress.phase("warmup")
        for _ in range(3):
            progress.advance()
        progress.phase("detailed")
        on_step = progress.counter(skip=1)
        on_step()  # the profiler's warmup step: not counted
        on_step()
        progress.phase("timing")
        on_step = progress.counter(skip=1)
        for _ in range(6):
            on_step()
        progress.phase("timed")
        for _ in range(10):
            progress.advance()
        progress.done()
    tasks = {t.description: (t.completed, t.total) for t in progress._progress.tasks}
    assert tasks == {"warmup": (3, 3), "detailed": (1, 1), "timing": (5, 5), "timed": (10, 10)}
    err = capsys.readouterr().err
    assert "after 1 profiler warmup step" in err and "timed" in err and "10/10" in err


def test_plural_words(tmp_path):
    done = run_cli("cache", "clear", env={"FSDP_TRACE_CACHE_DIR": str(tmp_path / "empty")})
    assert done.returncode == 0 and "deleted 0 files" in done.stdout
    point = linked_run(CPU_SAMPLE, tmp_path / "point")
    for trace in point.glob("rank*.json.gz"):
        trace.unlink()
    notices: list[str] = []
    sweep.run_table([point], notify=notices.append)
    assert any("left blank for 1 run (" in n for n in notices)
