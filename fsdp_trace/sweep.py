"""Scaling efficiency against activation-checkpoint coverage: run the captures of a sweep and
turn run directories into the table behind efficiency.html and `fsdp-trace compare`."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fsdp_trace import atomic
from fsdp_trace.errors import UserError
from fsdp_trace.fmt import plural, short_name
from fsdp_trace.printable import printable
from fsdp_trace.runrecord import RUN_FILE, RunRecord, read_run
from fsdp_trace.vocab import Source

TABLE_COLUMNS = [
    "run",
    "label",
    "model",
    "batch_size",
    "seq_len",
    "world_size",
    "ac_coverage",
    "compile",
    "step_ms",
    "tokens_per_s_per_gpu",
    "scaling_efficiency",
    "baseline",
    "mfu",
    "exposed_pct",
    "exposed_transfer_pct",
    "exposed_wait_pct",
    "overlap_pct",
    "recompute_pct",
    "peak_allocated_gib",
    "figures_from",
    "device",  # "cuda" or "cpu": a CPU run's timing says nothing about scaling
    "ac_blocks",  # blocks under activation checkpointing, of
    "n_blocks",
    "alloc_retries",  # caching-allocator retries in the timed steps (run.json num_alloc_retries)
    "baseline_alloc_retries",  # those of the 1-GPU run the efficiency is measured against
]


def parse_points(text: str) -> list[float]:
    """'0,0.25,0.5' → [0.0, 0.25, 0.5], each a fraction in [0, 1]."""
    try:
        points = [float(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise UserError(f"--ac-coverage takes comma-separated fractions, not {text!r}") from None
    if not points or any(not 0.0 <= p <= 1.0 for p in points):
        raise UserError(f"--ac-coverage needs fractions in [0, 1], got {text!r}")
    return sorted(set(points))


def point_dir(out: Path, coverage: float, nproc: int) -> Path:
    return out / f"ac{coverage:.2f}-{nproc}gpu"


def run_sweep(
    base,
    points: list[float],
    nproc: int,
    out: Path,
    rendezvous,
    baseline: bool,
    on_point: Callable[[Path], None] | None = None,
) -> list[Path]:
    """Capture each coverage point on `nproc` GPUs, after its 1-GPU baseline; analyze each
    point's timing traces into its analysis.json (so the plot can be redrawn, and the table
    rebuilt, after the traces are deleted or left out to save space). `on_point` hears of
    each run directory once it is complete."""
    from fsdp_trace.capture.launcher import launch

    out.mkdir(parents=True, exist_ok=True)
    dirs = []
    for coverage in points:
        base_dir = point_dir(out, coverage, 1)
        if baseline and nproc > 1:
            launch(
                replace(base, ac_coverage=coverage, out=str(base_dir), baseline=None), 1, rendezvous
            )
            summarize_point(base_dir)
            dirs.append(base_dir)
            if on_point is not None:
                on_point(base_dir)
        run_dir = point_dir(out, coverage, nproc)
        cfg = replace(
            base,
            ac_coverage=coverage,
            out=str(run_dir),
            baseline=str(base_dir) if baseline and nproc > 1 else base.baseline,
        )
        launch(cfg, nproc, rendezvous)
        summarize_point(run_dir)
        dirs.append(run_dir)
        if on_point is not None:
            on_point(run_dir)
    return dirs


def find_runs(paths: list[str | Path]) -> list[Path]:
    """Run directories given directly, or found one level below (a sweep's folder)."""
    runs: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if (path / RUN_FILE).exists():
            runs.append(path)
        elif path.is_dir():
            found = sorted(p.parent for p in path.glob(f"*/{RUN_FILE}"))
            if not found:
                raise UserError(f"{path}: no run.json here or one level below: not a capture run")
            runs.extend(found)
        else:
            raise UserError(f"{path}: no such run directory")
    return runs


# Per run: the figures its timing traces gave the table, so that the table (and the plot) can be
# rebuilt where the traces were deleted or left out for size.
SUMMARY_FILE = "analysis.json"
# 2: per-rank breakdown figures; the run's figures are the worst rank's (1 pooled the steps
# of every rank into one median: read, with its per-rank figures taken instead).
SUMMARY_FORMAT = 2
READABLE_FORMATS = (1, 2)


def timing_traces(run_dir: Path, run: RunRecord) -> list[Path] | None:
    """The run's timing traces when every one run.json lists is there, else None."""
    paths = [run_dir / name for name in run.files.timing]
    if not paths or not all(p.is_file() for p in paths):
        return None
    return paths


def summarize(run) -> dict[str, Any]:
    """The figures of one analyzed run (`RunAnalysis`) that the efficiency table needs: per
    rank, what every view shows for it (its median step's breakdown, in % of that step;
    overlap: the median over its steps), and for the run the rank that exposes the most
    communication with its own split (never one median pooled over ranks, never figures of
    different ranks mixed), and recompute time as a share of all steps' time: None where the
    traces could not measure it (CPU traces have no GPU kernels: recompute_us is NaN)."""
    from fsdp_trace.present.view import per_rank

    table = per_rank(run)
    ranks = [
        {
            "rank": None if row.rank is None or row.rank != row.rank else int(row.rank),
            "steps": len(r.steps),
            "step_ms": _number(row.step_us / 1e3),
            "exposed_pct": _number(row.exposed_pct),
            "exposed_transfer_pct": _number(row.exposed_transfer_pct),
            "exposed_wait_pct": _number(row.exposed_wait_pct),
            "overlap_pct": _number(row.overlap_pct),
            "idle_pct": _number(row.idle_pct),
            "recompute_pct": _number(row.recompute_pct),
        }
        for row, r in zip(table.itertuples(index=False), run.ranks, strict=True)
        if len(r.steps)
    ]
    steps = run.steps
    steps = steps[steps["source"] != Source.DETAILED]
    total = float(steps["step_us"].sum()) if len(steps) else 0.0
    measured = steps["recompute_us"].to_numpy(dtype=np.float64)
    recompute = float(np.nansum(measured)) if np.isfinite(measured).any() else None
    return {
        **worst_rank(ranks),
        "recompute_pct": 100.0 * recompute / total if total and recompute is not None else None,
        "ranks": ranks,
    }


def _number(value: Any) -> float | None:
    return float(value) if value is not None and np.isfinite(value) else None


def worst_rank(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's figures from one rank: the one exposing the most communication, with its
    own transfer / waiting split; the slowest rank's step; the lowest overlap."""
    exposed = [r for r in ranks if r.get("exposed_pct") is not None]
    worst = max(exposed, key=lambda r: r["exposed_pct"]) if exposed else {}
    steps = [r["step_ms"] for r in ranks if r.get("step_ms") is not None]
    overlaps = [r["overlap_pct"] for r in ranks if r.get("overlap_pct") is not None]
    return {
        "step_ms": max(steps) if steps else None,
        "exposed_pct": worst.get("exposed_pct"),
        "exposed_transfer_pct": worst.get("exposed_transfer_pct"),
        "exposed_wait_pct": worst.get("exposed_wait_pct"),
        "exposed_rank": worst.get("rank"),
        "overlap_pct": min(overlaps) if overlaps else None,
    }


def _trace_sizes(paths: list[Path]) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in paths}


def analyze_point(run_dir: Path, traces: list[Path]) -> dict[str, Any]:
    """Analyze a run's timing traces into the analysis.json summary."""
    import fsdp_trace

    return {
        "format": SUMMARY_FORMAT,
        "source": "traces",
        "made_by": f"fsdp-trace {fsdp_trace.__version__}: medians over the timing steps of "
        + ", ".join(p.name for p in traces),
        "fsdp_trace": fsdp_trace.__version__,
        "traces": _trace_sizes(traces),
        **summarize(fsdp_trace.analyze(run_dir, detailed=False).only),
    }


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    atomic.write_text(run_dir / SUMMARY_FILE, json.dumps(summary, indent=1) + "\n")


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """A run's analysis.json, or None when there is none; unreadable is a user error."""
    path = run_dir / SUMMARY_FILE
    if not path.exists():
        return None
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(
            f"{path}: unreadable ({exc}): delete it and re-run `fsdp-trace plot` "
            "where the traces are"
        ) from None
    if not isinstance(summary, dict) or summary.get("format") not in READABLE_FORMATS:
        raise UserError(f"{path}: not an fsdp-trace analysis.json (format {SUMMARY_FORMAT})")
    if summary["format"] == 1:  # its run figures pooled every rank's steps: take the ranks'
        ranks = summary.get("ranks") or []
        summary = {**summary, **worst_rank(ranks)} if ranks else {**summary, "pooled": True}
    return summary


def summarize_point(run_dir: Path) -> dict[str, Any] | None:
    """Analyze a captured point's traces and write its analysis.json (what `sweep` does after
    each capture); None when the run has no complete timing traces."""
    run = read_run(run_dir)
    traces = timing_traces(run_dir, run)
    if traces is None:
        return None
    summary = analyze_point(run_dir, traces)
    write_summary(run_dir, summary)
    return summary


def point_figures(
    run_dir: Path, run: RunRecord, with_traces: bool
) -> tuple[dict[str, Any], str, str | None]:
    """(figures, where they came from, why they are missing) for one run: its timing traces
    when present (reusing analysis.json when it was made from these very traces by this
    version), else its analysis.json, else nothing (blank figures)."""
    from fsdp_trace import __version__

    summary = read_summary(run_dir)
    traces = timing_traces(run_dir, run)
    if traces is not None and with_traces:
        current = (
            summary is not None
            and summary.get("format") == SUMMARY_FORMAT
            and summary.get("source") == "traces"
            and summary.get("fsdp_trace") == __version__
            and summary.get("traces") == _trace_sizes(traces)
        )
        return (summary if current else analyze_point(run_dir, traces)), "traces", None
    if summary is not None:
        return summary, SUMMARY_FILE, None
    why = (
        "--no-traces and no analysis.json"
        if traces is not None
        else "no timing traces and no analysis.json"
    )
    return {}, "", why


def _stderr(message: str) -> None:
    print(f"fsdp-trace: {printable(message)}", file=sys.stderr)


def _label(run: RunRecord) -> str:
    """ "2 GPU, AC 0.5, compile": the run's setup in a few words (on CPU: "2 CPU ranks")."""
    cfg = run.config
    world = run.world.world_size
    parts = [f"{world} GPU" if run.world.device != "cpu" else plural(world, "CPU rank")]
    if cfg.ac_coverage:
        parts.append(f"AC {cfg.ac_coverage:g}")
    if cfg.compile:
        parts.append("compile")
    if cfg.reshard_after_forward is not True:
        parts.append(f"reshard={cfg.reshard_after_forward}")
    if cfg.hsdp > 1:
        parts.append(f"HSDP {cfg.hsdp}")
    for value, text in (
        (cfg.shard_embeddings, "emb units"),
        (cfg.keep_last_unsharded, "keep last"),
        (cfg.prefetch_forward, "fwd prefetch"),
        (cfg.prefetch_backward, "bwd prefetch"),
    ):
        if value:
            parts.append(text if value is True else f"{text} {value}")
    return ", ".join(parts)


def _paths(paths: list[str], limit: int) -> str:
    return ", ".join(paths[:limit]) + (", ..." if len(paths) > limit else "")


# On CPU (gloo) a run's step time measures the host's cores, shared by every rank, not GPUs
# and their links: its tokens/s neither scale nor compare with a GPU run's.
CPU_NOTICE = (
    "{runs} ran on CPU (gloo): step time and tokens/s measure the host's cores, shared by "
    "every rank, not GPUs and their interconnect, so scaling efficiency is not computed for "
    "them and their speed is no guide to a GPU run's; exposed communication and recompute "
    "need GPU kernels, which CPU traces do not have. What a CPU run does show: the sharding "
    "and activation-checkpoint plan (AC blocks), the collectives per block, and host memory."
)


def run_table(
    runs: list[Path],
    with_traces: bool = True,
    notify: Callable[[str], None] | None = _stderr,
) -> pd.DataFrame:
    """One row per run: knobs and figures; efficiency against the matching 1-GPU run.

    Exposed % and recompute % come from the timing traces, or the run's analysis.json where
    the traces were left out (`figures_from` says which); a run with neither gets blanks and a
    notice (to `notify`, and in `table.attrs["notices"]`). Exposed % is blank on 1 GPU: there
    is no communication to expose. A CPU run (`device` "cpu") gets no scaling efficiency and
    no recompute % (its traces cannot measure them), and a notice saying so."""
    rows, blank, pooled, cpu = [], {}, [], []
    for path in runs:
        run = read_run(path)
        figures = run.figures
        found, source, why = point_figures(path, run, with_traces)
        if why:
            blank.setdefault(why, []).append(str(path))
        if found.get("pooled") and run.world.world_size > 1:
            pooled.append(str(path))
        world = run.world.world_size
        on_cpu = run.world.device == "cpu"
        if on_cpu:
            cpu.append(str(path))
        many = world > 1  # exposure and overlap need communication
        rows.append(
            {
                "run": str(path),
                "label": _label(run),
                "device": run.world.device or "",
                "model": run.model.name,
                "batch_size": run.model.batch_size,
                "seq_len": run.model.seq_len,
                "world_size": world,
                "ac_coverage": run.parallel.ac_coverage_effective,
                "ac_blocks": len(run.parallel.ac_blocks),
                "n_blocks": run.model.n_blocks,
                "compile": bool(run.config.compile),
                "step_ms": figures.step_time_ms.median if figures.step_time_ms else None,
                "tokens_per_s_per_gpu": figures.tokens_per_s_per_gpu,
                "scaling_efficiency": None if on_cpu else figures.scaling_efficiency,
                "baseline": "",
                "mfu": figures.mfu,
                "exposed_pct": found.get("exposed_pct") if many else None,
                "exposed_transfer_pct": found.get("exposed_transfer_pct") if many else None,
                "exposed_wait_pct": found.get("exposed_wait_pct") if many else None,
                "overlap_pct": found.get("overlap_pct") if many else None,
                # never 0.0 where it was not measured (an analysis.json of an older version
                # summed the NaNs of a CPU trace into 0.0)
                "recompute_pct": None if on_cpu else found.get("recompute_pct"),
                "peak_allocated_gib": figures.peak_memory_gib,
                "figures_from": source,
                "alloc_retries": None if on_cpu else figures.num_alloc_retries,
                "baseline_alloc_retries": None,
                "saved_baseline": figures.baseline_dir,
            }
        )
    table = pd.DataFrame(rows, columns=[*TABLE_COLUMNS, "saved_baseline"])
    table["alloc_retries"] = pd.to_numeric(table["alloc_retries"], errors="coerce").astype("Int64")
    for column in (
        "exposed_pct",
        "exposed_transfer_pct",
        "exposed_wait_pct",
        "overlap_pct",
        "recompute_pct",
        "scaling_efficiency",
    ):
        table[column] = pd.to_numeric(table[column], errors="coerce")
    table = _fill_efficiency(table).drop(columns="saved_baseline")
    retries = allocator_notices(table)
    notices = [
        f"exposed % and recompute % left blank for {plural(len(paths), 'run')} "
        f"({why}): {_paths(paths, 4)}"
        for why, paths in blank.items()
    ]
    if pooled:
        notices.append(
            f"exposed % of {plural(len(pooled), 'run')} comes from an analysis.json "
            "of format 1, which kept one median over every rank's steps, not per-rank figures: "
            f"re-run `fsdp-trace plot` where the traces are ({_paths(pooled, 2)})"
        )
    if cpu:
        which = "every run" if len(cpu) == len(table) else plural(len(cpu), "run")
        notices.append(CPU_NOTICE.format(runs=f"{which} ({_paths(cpu, 3)})"))
    notices += retries
    table.attrs["notices"] = notices
    if notify is not None:
        for notice in notices:
            notify(notice)
    return table


def table_csv(table: pd.DataFrame, folder: Path) -> str:
    """The table as efficiency.csv text, run paths relative to the folder the CSV is written
    to (so the CSV stays valid when the sweep folder is moved or committed)."""
    runs = [os.path.relpath(Path(run).resolve(), Path(folder).resolve()) for run in table["run"]]
    return table.assign(run=runs).to_csv(index=False)


EXACT_KEY = ["device", "model", "batch_size", "seq_len", "ac_coverage", "compile"]
LOOSE_KEY = ["device", "model", "batch_size", "seq_len"]


def _fill_efficiency(table: pd.DataFrame) -> pd.DataFrame:
    """Efficiency = tok/s/GPU at N ÷ tok/s of a 1-GPU run in the list: the one with the same
    model, batch, sequence, AC coverage and compile setting, else the first with the same
    model, batch and sequence (the knobs differ: `baseline` says so), one in the run's own
    folder first (repeats of a sweep each have their 1-GPU run); run.json's own figure
    (against the capture's --baseline) where the list has no such run. `baseline` names the
    run used, `baseline_alloc_retries` its allocator retries. CPU runs get none (their timing
    says nothing about scaling)."""
    single = table[(table["world_size"] == 1) & (table["device"] != "cpu")]
    efficiency, names, retries = [], [], []
    for row in table.itertuples(index=False):
        if row.device == "cpu" or row.world_size == 1:
            efficiency.append(float("nan") if row.device == "cpu" else 1.0)
            names.append("")
            retries.append(pd.NA)
            continue
        base, differs = None, []
        for key in (EXACT_KEY, LOOSE_KEY):
            match = single
            for k in key:
                match = match[match[k] == getattr(row, k)]
            if len(match):
                # a repeated sweep: each run against the 1-GPU run of its own folder
                own = match[
                    [Path(str(r)).parent == Path(str(row.run)).parent for r in match["run"]]
                ]
                base = (own if len(own) else match).iloc[0]
                differs = [
                    name
                    for k, name in (("ac_coverage", "AC coverage"), ("compile", "compile"))
                    if base[k] != getattr(row, k)
                ]
                break
        if base is not None and base["tokens_per_s_per_gpu"]:
            efficiency.append(row.tokens_per_s_per_gpu / base["tokens_per_s_per_gpu"])
            name = Path(str(base["run"])).name
            names.append(f"{name} (differs: {', '.join(differs)})" if differs else name)
            retries.append(base["alloc_retries"])
        elif pd.notna(row.scaling_efficiency):
            efficiency.append(row.scaling_efficiency)
            saved = row.saved_baseline
            names.append(f"run.json: {Path(saved).name}" if saved else "run.json")
            retries.append(pd.NA)
        else:
            efficiency.append(float("nan"))
            names.append("")
            retries.append(pd.NA)
    table["scaling_efficiency"] = pd.to_numeric(pd.Series(efficiency), errors="coerce")
    table["baseline"] = names
    table["baseline_alloc_retries"] = pd.array(retries, dtype="Int64")
    return table


def _coverages(rows: pd.DataFrame) -> str:
    points = sorted({float(c) for c in rows["ac_coverage"].dropna()})
    return "AC " + ", ".join(f"{c:g}" for c in points) if points else "AC coverage unknown"


def _retried(rows: pd.DataFrame) -> str:
    """'AC 0: r1/ac0.00-1gpu, r2/ac0.00-1gpu; 30 retries each' (or '12 to 30 retries')."""
    counts = sorted(int(n) for n in rows["alloc_retries"])
    if len(counts) == 1:
        many = plural(counts[0], "retry", "retries")
    elif counts[0] == counts[-1]:
        many = f"{counts[0]} retries each"
    else:
        many = f"{counts[0]} to {counts[-1]} retries"
    names = [short_name(r) for r in rows["run"]]
    return f"{_coverages(rows)}: {', '.join(names[:6])}{', ...' if len(names) > 6 else ''}; {many}"


def _range(values: pd.Series) -> str:
    low, high = float(values.min()), float(values.max())
    return f"{low:.2f}" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}"


def allocator_notices(table: pd.DataFrame) -> list[str]:
    """What allocator retries (run.json `num_alloc_retries` > 0: the caching allocator found no
    free block, released its cached memory — a cudaFree and a device synchronize — and tried
    again) mean for the table: a 1-GPU run that retried is slowed by memory, so a scaling
    efficiency measured against it holds that slowness (above 1 it is not super-linear
    scaling); a multi-GPU run that retried is slowed the same way, its efficiency understated.
    Any run with retries, whatever its setup; none for a run without (or not counting them:
    CPU runs, older run.json)."""
    gpu = table["device"] != "cpu"
    retried = table[gpu & (table["alloc_retries"].fillna(0) > 0)]
    notices = []
    ones = retried[retried["world_size"] == 1]
    if len(ones):
        against = table[(table["baseline_alloc_retries"].fillna(0) > 0) & gpu]
        against = against[against["scaling_efficiency"].notna()]
        text = (
            f"allocator retries in {plural(len(ones), 'run')} on 1 GPU ({_retried(ones)} "
            "in the timed steps): the caching allocator found no free block, released its "
            "cached memory and tried again (a cudaFree and a device synchronize each time), so "
            "those steps are slowed by memory, not compute"
        )
        if len(against):
            efficiency = against["scaling_efficiency"]
            text += (
                f"; the scaling efficiency of {plural(len(against), 'run')} measured against "
                f"them ({_coverages(against)}: {_range(efficiency)}) measures that baseline's "
                "slowness too: "
                + (
                    "above 1 it is not super-linear scaling"
                    if (efficiency > 1).any()
                    else "it is overstated"
                )
            )
        notices.append(text)
    many = retried[retried["world_size"] > 1]
    if len(many):
        notices.append(
            f"allocator retries in {plural(len(many), 'multi-GPU run')} ({_retried(many)} in the "
            "timed steps): their steps are slowed by memory, not communication, so their "
            "tokens/s and scaling efficiency understate the GPUs; more AC coverage or a smaller "
            "batch removes the retries"
        )
    return notices


IGNORED_KNOBS = {
    "out",
    "overwrite",
    "baseline",
    "extra",
    "timed_steps",
    "timing_steps",
    "warmup_steps",
    "timeout_s",
}
# The environment a capture records that changes how FSDP2's collectives run: compared
# between runs like the knobs (NCCL_P2P_DISABLE=1 is a change, not "the same knobs").
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_")
ENV_NAMES = ("CUDA_DEVICE_MAX_CONNECTIONS", "TORCH_SYMM_MEM_DISABLE_MULTICAST")
UNSET = "unset"


def run_knobs(run: RunRecord) -> dict[str, Any]:
    """What a run was asked to do, resolved: run.json's config (a knob left at None, "the
    preset's", by the value the model section records), then the NCCL / CUDA environment
    variables that matter, then the GPU topology."""
    knobs = dict(run.config.raw)
    for name in ("batch_size", "seq_len"):
        resolved = getattr(run.model, name)
        if knobs.get(name) is None and resolved is not None:
            knobs[name] = resolved
    env = run.environment.env_vars
    for name in sorted(env):
        if name.startswith(ENV_PREFIXES) or name in ENV_NAMES:
            knobs[name] = env[name]
    knobs["topology"] = run.environment.topology
    return knobs


def _text(value: Any) -> str:
    return UNSET if value is None else str(value)


def knob_changes(before: dict[str, Any], after: dict[str, Any]) -> str:
    """'compile: False → True, NCCL_P2P_DISABLE: unset → 1' between two runs' knobs (what
    `run_knobs` gives); a knob one run lacks reads "unset", never None."""
    changes = []
    for key in [*after, *(k for k in before if k not in after)]:
        if key in IGNORED_KNOBS or before.get(key) == after.get(key):
            continue
        changes.append(f"{key}: {_text(before.get(key))} → {_text(after.get(key))}")
    return ", ".join(changes)


def run_names(runs: list[Path]) -> list[str]:
    """Each run's row label: its directory's name, its path where two names are alike."""
    names = [Path(run).name or str(run) for run in runs]
    return [
        name if names.count(name) == 1 else str(run) for name, run in zip(names, runs, strict=True)
    ]


def compare_table(
    runs: list[Path],
    with_traces: bool = True,
    notify: Callable[[str], None] | None = _stderr,
    labels: list[str] | None = None,
) -> pd.DataFrame:
    """`fsdp-trace compare`: the runs in the order given, each labelled by its directory's
    name (or `labels`, one per run), with what changed from the previous one (GPUs, knobs
    and the environment) and what that bought: tokens/s/GPU (%), exposed communication
    (points of the step) and peak memory (GiB). `setup` keeps the few-word description."""
    if labels is not None and len(labels) != len(runs):
        raise UserError(
            f"--label given {plural(len(labels), 'time')} for {plural(len(runs), 'run')}: "
            "give one per run, in the order of the runs"
        )
    table = run_table(runs, with_traces=with_traces, notify=notify)
    table["setup"] = table["label"]
    table["label"] = list(labels) if labels is not None else run_names(runs)
    configs = [read_run(path) for path in runs]
    changes = [""]
    for i in range(1, len(configs)):
        prev, cur = configs[i - 1], configs[i]
        change = knob_changes(run_knobs(prev), run_knobs(cur))
        heads = []
        if prev.world.device != cur.world.device:
            heads.append(f"device: {_text(prev.world.device)} → {_text(cur.world.device)}")
        if prev.world.world_size != cur.world.world_size:
            word = "GPUs" if cur.world.device != "cpu" else "ranks"
            heads.append(f"{word}: {prev.world.world_size} → {cur.world.world_size}")
        changes.append(", ".join([*heads, change] if change else heads) or "(same knobs)")
    table["change"] = changes
    # A change is only a change between runs on the same kind of device (a CPU run's tokens/s
    # and host memory do not compare with a GPU run's).
    alike = table["device"] == table["device"].shift(1)
    tps = table["tokens_per_s_per_gpu"].astype(float)
    before = tps.shift(1)
    table["tokens_per_s_per_gpu_change_pct"] = (100.0 * (tps / before - 1.0)).where(
        (before != 0) & alike
    )
    table["exposed_pct_change"] = table["exposed_pct"].diff()
    table["peak_allocated_gib_change"] = (
        table["peak_allocated_gib"].astype(float).diff().where(alike)
    )
    return table
