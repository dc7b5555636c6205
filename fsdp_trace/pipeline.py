"""The pipeline behind `fsdp_trace.analyze`: inputs → per-rank analysis → inferred
configuration → cross-rank view → step breakdown → diagnosis → (optional) HTA check.

    import fsdp_trace
    result = fsdp_trace.analyze("sample_traces/gpt-small-2gpu")
    result.findings[0].cause, result.breakdown, result.config.mesh.value.describe()

Pure: traces in, a typed `Result` out; nothing printed, nothing written. Every front end
(terminal, HTML report, JSON/CSV, sweep/plot/compare, notebooks) renders what this returns.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from fsdp_trace.analysis.job import perrank
from fsdp_trace.analysis.job.config import InferredConfig, infer
from fsdp_trace.analysis.job.crossrank import match
from fsdp_trace.analysis.job.perrank import Failure, TraceInput
from fsdp_trace.analysis.rank.breakdown import (
    Matched,
    collective_transfer,
    exposed_intervals,
    exposed_split,
)
from fsdp_trace.analysis.read import grouping
from fsdp_trace.analysis.read.inputs import Inputs, RunInput, resolve
from fsdp_trace.analysis.read.remote import is_url
from fsdp_trace.analysis.results import RankAnalysis
from fsdp_trace.analysis.table import array_of
from fsdp_trace.collector import full_passes_deferred
from fsdp_trace.diagnose import diagnose
from fsdp_trace.diagnose.finding import Diagnosis
from fsdp_trace.errors import UserError
from fsdp_trace.fmt import agree, plural
from fsdp_trace.result import Result, RunAnalysis
from fsdp_trace.vocab import Source

T = TypeVar("T")


@full_passes_deferred()  # the results of many ranks, held: fsdp_trace.collector
def analyze(
    paths: str | Path | Sequence[str | Path],
    *,
    jobs: int | None = 1,
    detailed: bool = True,
    cache: bool = True,
    hta: bool = False,
    client: Any = None,
    keep_kernels: bool = False,
) -> Result:
    """Analyze and diagnose every run behind `paths`: trace files, capture run directories,
    directories of per-rank traces, or fsspec URLs of any of these (`s3://…`, `file://…`).

    `jobs`: traces analyzed at once, each in its own process (results identical to 1;
    None: `perrank.auto_jobs`, a process per core as the memory allows, for the traces
    not in the cache);
    `client`: a `distributed.Client`: each trace analyzed as a task on its Dask cluster,
    where the workers read it; a trace that fails there is left out of its run, which says
    so (results otherwise identical to jobs=1);
    `detailed`: also read capture runs' detailed traces (attribution, profiler distortion);
    `cache`: reuse parsed traces and per-rank analyses of unchanged files (False: neither
    read nor write the cache); `hta`: cross-check overlap with holistictraceanalysis;
    `keep_kernels`: every timing trace's result keeps its kernels (for views that read all
    of them: `fsdp-trace whatif`, `--perfetto`), also from a Dask cluster; else a run keeps
    them only where `perrank.keeps_kernels` says (a small local run without the cache) and
    the views read them again (`RankAnalysis.load_kernels`)."""
    if jobs is not None and jobs < 1:
        raise UserError(f"--jobs {jobs}: give a number of processes, 1 or more")
    if client is not None and jobs not in (None, 1):
        raise UserError(f"--jobs {jobs} and a Dask cluster: give one of them")
    if hta:
        from fsdp_trace.analysis.job.hta_check import NOT_INSTALLED, hta_tool

        if hta_tool() is None:  # asked for: refused before any work, not a notice after it
            raise UserError(NOT_INSTALLED)
    if client is not None:
        from fsdp_trace.analysis.job import cluster

        plan = Plan.of(paths, detailed, elsewhere=cluster.workers_elsewhere(client))
        keep = [keep_kernels and t.source != Source.DETAILED for t in plan.work]
        outcomes = cluster.analyze_all(client, plan.work, cache, keep)
    else:
        plan = Plan.of(paths, detailed)
        # Decided per run (the loose traces as one): a small run keeps its kernels.
        keep = [
            k
            for group in plan.groups
            for k in perrank.keeps_kernels(group, cache, every=keep_kernels)
        ]
        outcomes = list(perrank.analyze_all(plan.work, jobs, cache, keep))
    return assemble(plan, outcomes, hta=hta, cache=cache)


def analyze_on_cluster(
    paths: str | Path | Sequence[str | Path],
    client: Any,
    produce: Callable[[Result], T],
    *,
    detailed: bool = True,
    cache: bool = True,
) -> T:
    """`analyze` on a Dask cluster with its run level there too (no HTA check: it reads the
    traces where the Result is): what `produce` (a picklable callable, run on a worker)
    makes of the Result, not the Result. The command's
    outputs travel to the caller, never every rank's results, so its memory stays flat in
    the number of ranks (`cluster.analyze_and_produce`; `fsdp-trace analyze --scheduler`)."""
    from fsdp_trace.analysis.job import cluster

    plan = Plan.of(paths, detailed, elsewhere=cluster.workers_elsewhere(client))
    return cluster.analyze_and_produce(client, plan, cache, assemble, produce)


@dataclasses.dataclass
class Plan:
    """What an analysis of `paths` reads: the runs and loose traces found, and every trace
    to analyze (`work`), run by run (`groups`, the loose traces last, as one)."""

    given: list[str]
    inputs: Inputs
    detailed: bool
    groups: list[list[TraceInput]]

    @classmethod
    def of(
        cls,
        paths: str | Path | Sequence[str | Path],
        detailed: bool = True,
        *,
        elsewhere: bool = False,
    ) -> Plan:
        """`elsewhere`: the traces are read by Dask workers whose working folder is not this
        process's (`cluster.workers_elsewhere`): relative local paths are given to them
        joined to this one's, and so named in the results."""
        given = [str(p) for p in ([paths] if isinstance(paths, str | Path) else paths)]
        inputs = resolve([_from_here(p) for p in given] if elsewhere else given)
        groups = [
            [t for t in r.traces if detailed or t.source != Source.DETAILED] for r in inputs.runs
        ]
        groups.append([TraceInput(p) for p in inputs.loose])
        return cls(given, inputs, detailed, groups)

    @property
    def work(self) -> list[TraceInput]:
        return [t for group in self.groups for t in group]


def _from_here(path: str) -> str:
    """A local path as a process with another working folder reads it: joined to this one's
    (not resolved: the names given, links and `..`, stay as the user gave them)."""
    return path if is_url(path) or os.path.isabs(path) else os.path.join(os.getcwd(), path)


@full_passes_deferred()
def assemble(
    plan: Plan, outcomes: Sequence[RankAnalysis | Failure], *, hta: bool = False, cache: bool = True
) -> Result:
    """The runs of `plan` from its traces' analyses (`outcomes`, in the order of
    `plan.work`): grouped, each analyzed as a run (configuration, cross-rank view,
    breakdown, diagnosis). Where this runs, the ranks' results are: on the caller's
    machine, or on a Dask worker (`cluster.analyze_and_produce`)."""
    inputs, detailed, work = plan.inputs, plan.detailed, plan.work
    failed = [o for o in outcomes if isinstance(o, Failure)]
    if len(failed) == len(work):
        more = f" (and {len(failed) - 1} more traces failed)" if len(failed) > 1 else ""
        raise UserError(failed[0].reason + more)
    runs_in: list[tuple[RunInput, list[RankAnalysis]]] = []
    missing: list[list[Failure]] = []
    notices: list[str] = []
    done = 0
    for run_in in inputs.runs:
        n = sum(1 for t in run_in.traces if detailed or t.source != Source.DETAILED)
        mine = outcomes[done : done + n]
        done += n
        analyses = [a for a in mine if not isinstance(a, Failure)]
        if not any(a.source != Source.DETAILED for a in analyses):  # no timing trace left
            notices += [f"{run_in.name}: {f.line()}" for f in mine if isinstance(f, Failure)]
            continue
        runs_in.append((run_in, analyses))
        missing.append([a for a in mine if isinstance(a, Failure)])
    loose = [(f, a) for f, a in zip(inputs.loose, outcomes[done:], strict=True)]
    ok = [(f, a) for f, a in loose if not isinstance(a, Failure)]
    found = dataclasses.replace(inputs, loose=[f for f, _ in ok])
    grouped = _group_loose(found, [a for _, a in ok], detailed)
    lost = [a for _, a in loose if isinstance(a, Failure)]
    runs_in += grouped
    missing += [[f for f in lost if _near(f, run_in)] for run_in, _ in grouped]
    runs = [
        analyze_run(r, a, hta=hta, cache=cache, missing=m)
        for (r, a), m in zip(runs_in, missing, strict=True)
    ]
    placed = {id(f) for m in missing for f in m}
    grouping = grouping_line(runs_in, len(work))
    if failed:
        grouping += f"; {len(failed)} failed (left out)"
    if inputs.skipped:
        grouping += f"; {plural(len(inputs.skipped), 'run')} not analyzed (see the notices)"
    return Result(
        inputs=plan.given,
        runs=runs,
        grouping=grouping,
        input_notices=[f"not analyzed: {line}" for line in inputs.skipped]
        + notices
        + [f.line() for f in lost if id(f) not in placed],
    )


def timing_by_content(analyses: list[RankAnalysis]) -> tuple[list[RankAnalysis], list[str]]:
    """A capture run's traces as timing or detailed by what they hold, not by their names or
    run.json's lists: a trace with shapes or Python frames (record_shapes, with_stack, which
    slow the host) never times the run while a lean trace of its rank is there; where none
    is, it does, and a notice says so."""
    detailed = grouping.is_detailed
    lean = {a.rank for a in analyses if not detailed(a)}
    lean_timing = {a.rank for a in analyses if not detailed(a) and a.source != Source.DETAILED}
    out, moved, kept = [], [], []
    for a in analyses:
        if a.source != Source.DETAILED and detailed(a):
            if a.rank in lean:
                moved.append(a)
                a = relabel(a, Source.DETAILED)
            else:
                kept.append(a)
        elif a.source == Source.DETAILED and not detailed(a) and a.rank not in lean_timing:
            a = relabel(a, Source.TIMING)  # its rank's lean trace, under the detailed name
        out.append(a)
    said = []
    if moved:
        said.append(
            f"{_names(moved)}: given as timing traces but detailed (shapes or Python frames: "
            "record_shapes/with_stack, which slow the host): used as the run's detailed "
            "traces, not for its timing, which the lean traces give"
        )
    if kept:
        said.append(
            f"{_names(kept)}: detailed traces (record_shapes/with_stack) and no lean trace of "
            "their ranks: they time the run, but the profiler slows their host side, so host "
            "time and GPU idle are overstated; capture lean timing traces to measure them"
        )
    return out, said


def _names(analyses: list[RankAnalysis]) -> str:
    names = [Path(a.path).name for a in analyses]
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _near(failure: Failure, run_in: RunInput) -> bool:
    """Whether a failed loose trace lay beside a run's traces (then that run lacks it)."""
    folder = failure.path.rstrip("/").rpartition("/")[0]
    return any(str(t.path).rpartition("/")[0] == folder for t in run_in.traces)


def _group_loose(
    inputs: Inputs, analyses: list[RankAnalysis], detailed: bool
) -> list[tuple[RunInput, list[RankAnalysis]]]:
    """Runs among the trace files given without run.json, told apart by their content."""
    out = []
    taken = {r.name for r in inputs.runs}
    for timing, extra in grouping.group(analyses):
        files = [inputs.loose[i] for i in timing + extra]
        name = grouping.run_name(files, taken)
        taken.add(name)
        mine = [relabel(analyses[i], Source.TRACE) for i in timing]
        if detailed:
            mine += [relabel(analyses[i], Source.DETAILED) for i in extra]
        run_in = RunInput(
            name,
            [TraceInput(f) for f in files],
            sources=list(dict.fromkeys(inputs.sources[f] for f in files)),
        )
        out.append((run_in, mine))
    return out


def _with(rank: RankAnalysis, column: str, value) -> RankAnalysis:
    """The same analysis with `column` (a field, and a column of its tables) set."""
    changes = {column: value}
    for name in ("steps", "collectives", "blocks", "compute_phases"):
        frame = getattr(rank, name)
        if column in frame:
            changes[name] = frame.assign(**{column: value})
    out = dataclasses.replace(rank, **changes)
    out.cpu_slices = rank.cpu_slices  # not a field: carried by hand (--perfetto's)
    return out


def relabel(rank: RankAnalysis, source: str) -> RankAnalysis:
    """The same analysis as a trace of another kind (its tables' `source` column too)."""
    return rank if rank.source == source else _with(rank, "source", str(source))


def number_unnamed(analyses: list[RankAnalysis]) -> tuple[list[RankAnalysis], list[str]]:
    """Traces that name no rank (no distributedInfo.rank, none in the file name) take the
    lowest free rank numbers, in file order, said in a notice."""
    used = {a.rank for a in analyses if a.rank is not None}
    unnamed = [i for i, a in enumerate(analyses) if a.rank is None]
    if not unnamed:
        return analyses, []
    free = (n for n in range(len(used) + len(unnamed) + 1) if n not in used)
    out = list(analyses)
    given = []
    for i in unnamed:
        number = next(free)
        out[i] = _with(out[i], "rank", number)
        given.append(f"{Path(out[i].path).name if out[i].path else i} as rank {number}")
    return out, [
        f"{plural(len(unnamed), 'trace')} {agree(len(unnamed), 'names', 'name')} no rank (no "
        f"distributedInfo.rank, no rank in the file name): read {', '.join(given)}"
    ]


def grouping_line(runs: list[tuple[RunInput, list[RankAnalysis]]], files: int) -> str:
    """How the files were grouped, in one line."""
    parts = []
    for run_in, analyses in runs:
        timing = sum(a.source != Source.DETAILED for a in analyses)
        detailed = len(analyses) - timing
        kind = "capture run" if run_in.run is not None else "traces"
        ranks = sorted({a.rank for a in analyses if a.rank is not None})
        who = (
            f"ranks {ranks[0]}–{ranks[-1]}"
            if len(ranks) > 1
            else f"rank {ranks[0]}"
            if ranks
            else "no rank"
        )
        text = f"{run_in.name} ({kind}, {who}: {plural(timing, 'trace')}"
        parts.append(text + (f" + {detailed} detailed)" if detailed else ")"))
    return f"{plural(files, 'file')} → {plural(len(runs), 'run')}: " + "; ".join(parts)


def analyze_run(
    run_in: RunInput,
    analyses: list[RankAnalysis],
    *,
    hta: bool = False,
    cache: bool = True,
    missing: Sequence[Failure] = (),
) -> RunAnalysis:
    """One run from its traces' analyses: configuration, cross-rank view, breakdown,
    diagnosis. `missing`: its traces that failed (each said in a notice)."""
    said: list[str] = []
    if run_in.run is not None:  # a capture run: its lists name the traces, their content wins
        analyses, said = timing_by_content(analyses)
    timing, notices = number_unnamed([r for r in analyses if r.source != Source.DETAILED])
    notices = [f.line() for f in missing] + said + notices
    detailed, _ = number_unnamed([r for r in analyses if r.source == Source.DETAILED])
    record = run_in.run
    config = infer(timing, record)
    contradiction = run_record_contradicts(record, timing, config)
    if contradiction:  # another run's run.json: nothing of it describes these traces
        notices.append(
            f"{contradiction}: run.json describes another run; its configuration and figures "
            "are not used, the traces' own are"
        )
        record = None
        config = infer(timing, None)
    notices += config.notices
    expected: dict[tuple[str, str], float] = {}  # a run's ranks repeat their units
    for r in timing + detailed:
        _apply_expectations(r, config, expected)
    copies = copied_ranks(timing)
    notices += [
        f"rank {copy.rank}'s trace is rank {original.rank}'s (every step and collective at "
        "the same µs: one trace copied under two ranks?): left out of the cross-rank match, "
        "which would see no waiting at all; give each rank's own trace"
        for copy, original in copies
    ]
    left_out = {id(copy) for copy, _ in copies}
    crossrank = match([r for r in timing if id(r) not in left_out])
    notices += crossrank.notices
    matched = crossrank.matched_by_rank()
    for r in timing:
        _apply_crossrank(r, matched.get(r.rank) if r.rank is not None else None)
    for r in detailed:
        _apply_crossrank(r, None)
    analysis = RunAnalysis(
        name=run_in.name,
        inputs=run_in.sources,
        ranks=timing,
        detailed=detailed,
        run=record,
        config=config,
        crossrank=crossrank,
        diagnosis=Diagnosis([], [], "", True),
        own_notices=notices,
        run_dir=str(run_in.run_dir) if run_in.run_dir is not None else None,
    )
    analysis.diagnosis = diagnose(analysis)
    analysis.own_notices += analysis.diagnosis.notices
    if hta:
        from fsdp_trace.analysis.job.hta_check import cross_check

        analysis.hta, hta_notices = cross_check(timing, cache=cache)
        analysis.own_notices += hta_notices
    return analysis


def copied_ranks(timing: list[RankAnalysis]) -> list[tuple[RankAnalysis, RankAnalysis]]:
    """(copy, original) for each rank's trace that is another rank's over again: the same
    process ids and the same steps and collectives to the µs, which two real ranks (two
    processes) never have."""
    seen: dict[bytes, RankAnalysis] = {}
    out = []
    for r in timing:
        c = r.collectives
        if c.empty or r.steps.empty:
            continue
        key = repr(r.meta.get("first_pids")).encode() + b"".join(
            np.column_stack(
                [array_of(frame, name, np.float64) for name in ("start_us", "end_us")]
            ).tobytes()
            for frame in (r.steps, c)
        )
        original = seen.setdefault(key, r)
        if original is not r and original.rank != r.rank:
            out.append((r, original))
    return out


def run_record_contradicts(
    record, timing: list[RankAnalysis], config: InferredConfig
) -> str | None:
    """How a run's run.json contradicts its traces (their world size or rank count, their
    number of transformer blocks), in words; None where it agrees or cannot tell."""
    if record is None:
        return None
    recorded = record.world.world_size
    worlds = sorted({int(w) for r in timing if isinstance(w := r.meta.get("world_size"), int)})
    ranks = {r.rank for r in timing if r.rank is not None}
    if worlds and recorded not in worlds:
        shown = " and ".join(map(str, worlds))
        return f"run.json records a world of {recorded}, the traces one of {shown}"
    if len(ranks) > recorded:
        return f"run.json records a world of {recorded}, the traces are of {len(ranks)} ranks"
    blocks = record.model.n_blocks
    if blocks and config.labels and config.blocks and len(config.blocks) != blocks:
        return (
            f"run.json records {plural(blocks, 'transformer block')}, the traces' FSDP2 "
            f"labels show {len(config.blocks)}"
        )
    return None


def _apply_expectations(
    rank: RankAnalysis, config: InferredConfig, known: dict[tuple[str, str], float]
) -> None:
    """Fill the blocks table's `expected_per_step` and `excess` from the configuration
    (`known`: its answers so far, by unit and collective, shared by a run's ranks)."""
    b = rank.blocks
    if b.empty:
        return
    pairs = zip(map(str, array_of(b, "block")), map(str, array_of(b, "collective")), strict=True)
    expected = np.array(
        [known[p] if p in known else known.setdefault(p, config.expected(*p)) for p in pairs],
        dtype=np.float64,
    )
    rank.blocks = b.assign(
        expected_per_step=expected,
        excess=array_of(b, "unit_count_per_step", np.float64) - expected,
    )


def _apply_crossrank(rank: RankAnalysis, matched: Matched | None) -> None:
    """Fill the collectives' transfer/wait columns and the steps' exposed breakdown columns
    (the compute ones come with the rank's analysis): from its collectives and exposed
    intervals, never its kernels (fsdp_trace.analysis.rank.breakdown)."""
    exposed = exposed_intervals(rank) if rank.n_kernels else None
    c = rank.collectives
    transfer = None
    if len(c):
        extra = collective_transfer(c, matched, exposed)
        rank.collectives = c.assign(**extra)
        transfer = extra["transfer_us"]
    if rank.steps.empty:
        return
    rank.steps = rank.steps.assign(**exposed_split(rank, matched, exposed, transfer))
