"""`analyze` (traces → terminal, JSON, CSV, report, Perfetto; the --fail-on gate) and
`compare` (runs side by side)."""

import sys
from pathlib import Path
from typing import Annotated, Protocol

import typer

from fsdp_trace.cli.app import outputs_written, user_errors
from fsdp_trace.cli.common import (
    OUT_DIR_HELP,
    SCHEDULER_HELP,
    analyze_modules,
    announce,
    beside_inputs,
    cluster_client,
    default_place_problem,
    importing_libraries,
    in_out_dir,
    input_files,
    no_cache_if,
    place,
    refuse_urls,
    run_inputs,
    verb,
)
from fsdp_trace.collector import full_passes_deferred
from fsdp_trace.errors import UserError
from fsdp_trace.fmt import plural
from fsdp_trace.printable import printable


def analyze(
    paths: Annotated[
        list[str],
        typer.Argument(
            help="Trace files (.json/.json.gz), capture run directories, or directories of "
            "per-rank traces.",
            show_default=False,
            metavar="PATHS",
        ),
    ],
    json_out: Annotated[
        str | None,
        typer.Option("--json", help="Write every number as JSON to this file.", metavar="FILE"),
    ] = None,
    csv_out: Annotated[
        str | None,
        typer.Option(
            "--csv",
            help="Write steps.csv, breakdown.csv, blocks.csv, collectives.csv to this folder.",
            metavar="DIR",
        ),
    ] = None,
    report: Annotated[
        str | None,
        typer.Option(
            help="The self-contained HTML report (opens offline). Default: RUN/report.html for "
            "a run directory, NAME.report.html beside a trace file.",
            metavar="FILE",
            show_default=False,
        ),
    ] = None,
    no_report: Annotated[bool, typer.Option("--no-report", help="Do not write the report.")] = (
        False
    ),
    perfetto: Annotated[
        str | None,
        typer.Option(
            help="Write an annotated Perfetto trace (.pftrace) to this file.", metavar="FILE"
        ),
    ] = None,
    out_dir: Annotated[str | None, typer.Option(help=OUT_DIR_HELP, metavar="DIR")] = None,
    hta: Annotated[
        bool,
        typer.Option(
            help="Cross-check with HTA's get_comm_comp_overlap (traceinsight or "
            "holistictraceanalysis)."
        ),
    ] = False,
    detailed: Annotated[
        bool,
        typer.Option(help="Also analyze a run's detailed traces (profiler distortion)."),
    ] = True,
    jobs: Annotated[
        int | None,
        typer.Option(
            help="Traces analyzed at once, one per process (each holds one trace's events); "
            "results identical to --jobs 1. Default: a process per core, as many as half the "
            "available memory holds.",
            metavar="N",
            show_default=False,
        ),
    ] = None,
    scheduler: Annotated[
        str | None, typer.Option(help=SCHEDULER_HELP, metavar="ADDRESS", show_default=False)
    ] = None,
    no_cache: Annotated[
        bool,
        typer.Option(
            "--no-cache",
            help="Neither read nor write the cache (parsed traces, analyses, packed plotly.js).",
        ),
    ] = False,
    top: Annotated[
        int, typer.Option(help="Rows of the per-block table in the terminal.", metavar="N")
    ] = 15,
    fail_on: Annotated[
        list[str] | None,
        typer.Option(
            help="CI gate, repeatable: exit 1 when a condition holds, e.g. 'exposed_pct>5' "
            "or 'findings>0'.",
            metavar="CONDITION",
        ),
    ] = None,
) -> None:
    """Find exposed FSDP2 communication in traces, and its cause.

    Every AllGather / ReduceScatter is attributed to its FSDP2 block and phase, each rank's
    step is cut into where its time goes, and the cause to act on first is named.
    """
    # A run of many ranks' results held until the last output: fsdp_trace.collector.
    with user_errors("analyze"), no_cache_if(no_cache), full_passes_deferred():
        used = analyze_modules()
        keeping_cpu_slices, run_analysis = used.keeping_cpu_slices, used.run_analysis
        gate, export, terminal = used.gate, used.export, used.terminal

        if top < 0:
            raise UserError(f"--top {top}: give a number of rows, 0 or more")
        conditions = [gate.parse(text) for text in fail_on or []]
        if jobs is not None and jobs < 1:
            raise UserError(f"--jobs {jobs}: give a number of processes, 1 or more")
        refuse_urls(paths, {"--perfetto": perfetto is not None, "--hta": hta})
        inputs = input_files(paths)  # a bad input fails first, in one line
        folder = Path(out_dir) if out_dir else None
        placement = None
        if no_report:
            report_path = None
        elif report is not None:
            report_path = in_out_dir(report, folder)
        elif folder is not None:
            report_path = folder / "report.html"
        else:
            placement = beside_inputs(paths, "report.html", per_file="report.html")
            report_path = placement.path
        outputs = {
            "--json": in_out_dir(json_out, folder),
            "--report": report_path,
            "--perfetto": in_out_dir(perfetto, folder),
        }
        csv_dir = in_out_dir(csv_out, folder)
        # Every output path is checked before the analysis runs and anything is written: it
        # must be writable, and never one of the inputs.
        try:
            export.check_outputs(outputs, {"--csv": csv_dir}, inputs=inputs)
        except UserError as exc:
            raise default_place_problem(exc, "--report", placement) from None
        # --perfetto: each analysis keeps its CPU slices and kernels (the writer reads every
        # rank's), so the writer never parses again.
        perfetto_out = outputs["--perfetto"] is not None
        with cluster_client(scheduler, jobs) as client, keeping_cpu_slices(perfetto_out):
            if client is not None and not perfetto_out and not hta:
                # The run assembled and its outputs made on the cluster, where the ranks'
                # results are: the client receives the outputs (fsdp_trace.render.produced).
                from fsdp_trace.pipeline import analyze_on_cluster
                from fsdp_trace.render.produced import ConsoleSpec, Produce

                produce = Produce(
                    top=top,
                    conditions=tuple(conditions),
                    console=ConsoleSpec.of(terminal.make_console()),
                    json=outputs["--json"] is not None,
                    csv=csv_dir is not None,
                    report=outputs["--report"] is not None,
                )
                produced = analyze_on_cluster(
                    paths, client, produce, detailed=detailed, cache=not no_cache
                )
                made: _Made = _FromProduced(produced)
            else:
                result = run_analysis(
                    paths,
                    jobs=jobs,
                    detailed=detailed,
                    cache=not no_cache,
                    hta=hta,
                    client=client,
                    keep_kernels=perfetto_out,
                )
                made = _FromResult(result, cache=not no_cache)
        violated, n_runs = made.show(conditions, top)
        notes = {}
        runs = plural(n_runs, "run")
        if placement is not None and placement.note:  # several inputs
            notes[placement.path] = (
                f"one report for {plural(len(paths), 'input')} ({runs}), {placement.note}; "
                "choose with --report or --out-dir"
            )
        elif placement is not None and n_runs > 1:  # a folder of several runs
            notes[placement.path] = (
                f"one report for {runs}, in {placement.path.parent}; "
                "choose with --report or --out-dir"
            )
        written = _write_outputs(made, outputs, csv_dir, notes=notes)
    announce(written)
    for line in violated:
        print(f"fsdp-trace analyze: fail-on: {printable(line)}", file=sys.stderr)
    outputs_written()
    if violated:
        raise typer.Exit(1)


class _Made(Protocol):
    """The run's outputs: from the Result here, or from what a Dask worker made of it. `show`
    checks the gate and prints the terminal's view (the --fail-on conditions that hold, how
    many runs); the others write each file output to a (staged) path."""

    def show(self, conditions: list, top: int) -> tuple[list[str], int]: ...
    def json(self, path: Path) -> None: ...
    def csv(self, folder: Path) -> None: ...
    def report(self, path: Path) -> None: ...
    def perfetto(self, path: Path) -> dict: ...


class _FromResult:
    def __init__(self, result, cache: bool) -> None:
        self.result, self.cache = result, cache

    def show(self, conditions: list, top: int) -> tuple[list[str], int]:
        from fsdp_trace.diagnose import gate
        from fsdp_trace.render import terminal

        # The gate can refuse a condition (a run metric without run.json): before any output.
        violated = gate.violations(conditions, self.result.runs)
        terminal.render(self.result, top=top)
        return violated, len(self.result.runs)

    def json(self, path: Path) -> None:
        from fsdp_trace.render import export

        export.write_json(self.result, path)

    def csv(self, folder: Path) -> None:
        from fsdp_trace.render import export

        export.write_csv_files(self.result, folder)

    def report(self, path: Path) -> None:
        from fsdp_trace.render.report import write_report

        write_report(self.result, path)

    def perfetto(self, path: Path) -> dict:
        from fsdp_trace.render.perfetto import write_perfetto

        return write_perfetto(self.result, path, cache=self.cache)


class _FromProduced:
    def __init__(self, produced) -> None:
        self.produced = produced

    def show(self, conditions: list, top: int) -> tuple[list[str], int]:
        sys.stdout.write(self.produced.terminal)  # the gate was checked where it was made
        sys.stdout.flush()
        return self.produced.violated, self.produced.runs

    def json(self, path: Path) -> None:
        from fsdp_trace.render.produced import write

        write(self.produced.json, path)

    def csv(self, folder: Path) -> None:
        from fsdp_trace.render.produced import write

        for name, data in self.produced.csv.items():
            write(data, folder / name)

    def report(self, path: Path) -> None:
        from fsdp_trace.render.produced import write

        write(self.produced.report, path)

    def perfetto(self, path: Path) -> dict:
        raise AssertionError("--perfetto is written from the Result, on the client")


def _write_outputs(
    made: _Made,
    outputs: dict[str, Path | None],
    csv_dir: Path | None,
    notes: dict[Path, str] | None = None,
) -> list[str]:
    """Write every requested output, all or nothing: each is staged beside its target and
    moved into place only once all are written. Returns what to announce, one line per
    output: "wrote PATH", or "replaced PATH" where one was there before."""
    from fsdp_trace.render import export

    notes = notes or {}
    written: list[str] = []

    def said(path: Path, what: str = "") -> str:
        extra = "; ".join(x for x in (what, notes.get(path, "")) if x)
        return f"{verb(path)} {path}" + (f" ({extra})" if extra else "")

    current = ""
    try:
        with export.StagedOutputs() as staged:
            if outputs["--json"] is not None:
                current = f"--json {outputs['--json']}"
                made.json(staged.file(outputs["--json"]))
                written.append(said(outputs["--json"]))
            if csv_dir is not None:
                current = f"--csv {csv_dir}"
                made.csv(staged.folder(csv_dir))
                names = [f"{n}.csv" for n in export.CSV_NAMES]
                again = any((csv_dir / n).exists() for n in names)
                written.append(
                    f"{'replaced' if again else 'wrote'} {csv_dir}/ ({', '.join(names)})"
                )
            if outputs["--report"] is not None:
                current = f"--report {outputs['--report']}"
                made.report(staged.file(outputs["--report"]))
                written.append(said(outputs["--report"]))
            if outputs["--perfetto"] is not None:
                path = outputs["--perfetto"]
                current = f"--perfetto {path}"
                counts = made.perfetto(staged.file(path))
                written.append(
                    said(
                        path,
                        f"{sum(counts['slices'].values()):,} slices, "
                        f"{plural(counts['flows'], 'flow')}",
                    )
                    + f"; open it with `fsdp-trace view {path}`"
                )
            staged.commit()
    except OSError as exc:  # e.g. the disk filled up: nothing was moved into place
        raise UserError(
            f"{current}: cannot write ({exc.strerror or exc}); nothing written"
        ) from None
    return written


def compare(
    runs: Annotated[
        list[str],
        typer.Argument(
            help="Capture run directories (or folders holding them), in the order to compare.",
            show_default=False,
            metavar="RUNS",
        ),
    ],
    label: Annotated[
        list[str] | None,
        typer.Option(
            help="A name for each run's row, repeatable: one per run, in order (default: the "
            "run directory's name).",
            metavar="NAME",
        ),
    ] = None,
    html: Annotated[
        str | None,
        typer.Option(
            help="The comparison as self-contained HTML ('' for none). Default: compare.html "
            "beside the first run.",
            metavar="FILE",
            show_default=False,
        ),
    ] = None,
    out_dir: Annotated[str | None, typer.Option(help=OUT_DIR_HELP, metavar="DIR")] = None,
    traces: Annotated[
        bool,
        typer.Option(
            help="Read the timing traces (else each run's analysis.json) for exposed "
            "communication %."
        ),
    ] = True,
) -> None:
    """Compare runs side by side: what each change bought.

    The table users write by hand: 1 GPU, N GPUs, then each tuning step, with tokens/s/GPU,
    scaling efficiency, exposed %, memory and what changed from the previous run (FSDP2
    knobs and the NCCL / CUDA environment).
    """
    with importing_libraries():
        from fsdp_trace import sweep as sweeping
        from fsdp_trace.render import export, terminal

    with user_errors("compare"):
        found = sweeping.find_runs(runs)
        if label and len(label) != len(found):
            raise UserError(
                f"--label given {plural(len(label), 'time')} for {plural(len(found), 'run')}: "
                "give one per run, in the order of the runs"
            )
        target, placement = (None, None)
        if html != "":
            target, placement = place(runs, html, "compare.html", out_dir)
            try:
                export.check_outputs({"--html": target}, {}, inputs=run_inputs(found))
            except UserError as exc:
                raise default_place_problem(exc, "--html", placement) from None
            try:
                from fsdp_trace.render.compare import write_compare_html
            except ImportError:
                raise UserError(
                    "--html needs plotly: pip install plotly, or pass --html ''"
                ) from None
        # the notices go under the table (compare_view), not to stderr
        table = sweeping.compare_table(found, with_traces=traces, notify=None, labels=label)
        terminal.compare_view(table)
        if target is not None:
            line = f"{verb(target)} {target}"
            try:
                with export.StagedOutputs() as staged:
                    write_compare_html(table, staged.file(target))
                    staged.commit()
            except OSError as exc:
                raise UserError(
                    f"--html {target}: cannot write ({exc.strerror or exc}); nothing written"
                ) from None
            announce([line])
        outputs_written()
