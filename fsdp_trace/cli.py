"""The `fsdp-trace` command line. Heavy libraries are imported inside each command, so that
`capture` needs only torch + typer + rich and `analyze` never imports torch."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from fsdp_trace import __version__
from fsdp_trace.errors import UserError

app = typer.Typer(
    name="fsdp-trace",
    help="Where FSDP2 communication is not hidden behind compute, block by block, "
    "and what to change.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def fail(command: str, message: str, code: int = 2) -> typer.Exit:
    """Print the one-line error every bad input gets, and the exit to raise."""
    print(f"fsdp-trace {command}: error: {message}", file=sys.stderr, flush=True)
    return typer.Exit(code)


@contextmanager
def user_errors(command: str) -> Iterator[None]:
    """Turn a UserError into one line on stderr and exit code 2, and Ctrl-C into one line and
    exit code 130: never a traceback."""
    try:
        yield
    except UserError as exc:
        raise fail(command, exc.message, exc.exit_code) from None
    except KeyboardInterrupt:
        raise fail(command, "interrupted (Ctrl-C): nothing written", 130) from None


def input_files(paths: list[str]) -> list[Path]:
    """Every file an analysis of `paths` reads (traces and run.json), for the output checks."""
    from fsdp_trace.analysis.inputs import resolve
    from fsdp_trace.runrecord import RUN_FILE

    found = resolve(paths)
    files = list(found.loose)
    for run in found.runs:
        files += [t.path for t in run.traces]
        files.append(run.run_dir / RUN_FILE)
    return files


def _version(value: bool) -> None:
    if value:
        print(f"fsdp-trace {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """fsdp-trace: capture FSDP2 training steps and analyze their communication overlap."""


def config_from_params(params: dict):
    """A validated CaptureConfig from the capture command's parameters (by field name)."""
    import dataclasses

    from fsdp_trace.capture.config import CaptureConfig

    names = {f.name for f in dataclasses.fields(CaptureConfig)}
    return CaptureConfig(**{k: v for k, v in params.items() if k in names}).validate()


def rendezvous_from_params(params: dict):
    import dataclasses

    from fsdp_trace.capture.launcher import Rendezvous

    names = {f.name for f in dataclasses.fields(Rendezvous)}
    return Rendezvous(**{k: v for k, v in params.items() if k in names})


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or (
        "RANK" in os.environ and "WORLD_SIZE" in os.environ and "LOCAL_RANK" in os.environ
    )


@app.command()
def capture(
    model: Annotated[
        str,
        typer.Option(
            help="A preset (tiny, gpt-small, gpt-1.3b) or your own package.module:factory."
        ),
    ] = "tiny",
    out: Annotated[str, typer.Option(help="Run directory to write traces and run.json into.")] = (
        "fsdp-trace-run"
    ),
    overwrite: Annotated[
        bool, typer.Option(help="Reuse a non-empty --out (its old traces are deleted).")
    ] = False,
    nproc_per_node: Annotated[
        int | None,
        typer.Option(
            help="Processes on this node when not run under torchrun (default: GPUs, or 1)."
        ),
    ] = None,
    nnodes: Annotated[
        str, typer.Option(help="torchrun --nnodes (multi-node: also give the rendezvous options).")
    ] = "1",
    node_rank: Annotated[int | None, typer.Option(help="torchrun --node-rank.")] = None,
    rdzv_backend: Annotated[str | None, typer.Option(help="torchrun --rdzv-backend.")] = None,
    rdzv_endpoint: Annotated[str | None, typer.Option(help="torchrun --rdzv-endpoint.")] = None,
    rdzv_id: Annotated[str | None, typer.Option(help="torchrun --rdzv-id.")] = None,
    master_addr: Annotated[str | None, typer.Option(help="torchrun --master-addr.")] = None,
    master_port: Annotated[int | None, typer.Option(help="torchrun --master-port.")] = None,
    device: Annotated[
        str, typer.Option(help="auto (CUDA+NCCL if GPUs, else CPU+gloo), cuda or cpu.")
    ] = "auto",
    batch_size: Annotated[
        int | None,
        typer.Option(
            help="Local batch per GPU (default: the preset's; required for a "
            "package.module:factory model)."
        ),
    ] = None,
    seq_len: Annotated[
        int | None,
        typer.Option(
            help="Sequence length (default: the preset's; required for a "
            "package.module:factory model)."
        ),
    ] = None,
    dtype: Annotated[
        str,
        typer.Option(
            help="Parameter/compute dtype of the mixed-precision policy: bf16, fp16, fp32."
        ),
    ] = "bf16",
    reduce_dtype: Annotated[
        str, typer.Option(help="Gradient reduce-scatter dtype: fp32, bf16, fp16.")
    ] = "fp32",
    hsdp: Annotated[
        int,
        typer.Option(
            help="Hybrid sharding: R replicas of world/R shards each (1: plain FSDP over all "
            "ranks)."
        ),
    ] = 1,
    reshard_after_forward: Annotated[
        str,
        typer.Option(help="fully_shard's reshard_after_forward: true, false, or a group size."),
    ] = "true",
    root_reshard_after_forward: Annotated[
        str,
        typer.Option(
            help="reshard_after_forward for the root unit: default (FSDP2's), true or false."
        ),
    ] = "default",
    keep_last_unsharded: Annotated[
        bool,
        typer.Option(
            "--keep-last-unsharded/--reshard-last",
            help="Do not reshard the last block (and the head unit) after forward: backward "
            "needs them at once.",
        ),
    ] = False,
    shard_embeddings: Annotated[
        bool,
        typer.Option(help="Shard the embeddings and the norm+output head as their own units."),
    ] = False,
    prefetch_forward: Annotated[
        int, typer.Option(help="Explicit forward prefetch depth (0: FSDP2's default).")
    ] = 0,
    prefetch_backward: Annotated[
        int, typer.Option(help="Explicit backward prefetch depth (0: FSDP2's default of 1).")
    ] = 0,
    ac_coverage: Annotated[
        float,
        typer.Option(help="Fraction of blocks under activation checkpointing, spread evenly."),
    ] = 0.0,
    ac_mode: Annotated[
        str, typer.Option(help="Checkpoint implementation: non-reentrant or reentrant.")
    ] = "non-reentrant",
    compile: Annotated[bool, typer.Option(help="torch.compile each block.")] = False,
    grad_accum: Annotated[
        int, typer.Option(help="Micro-batches per optimizer step (gradient accumulation).")
    ] = 1,
    accum_no_sync: Annotated[
        bool,
        typer.Option(
            "--accum-no-sync/--accum-sync",
            help="Skip the reduce-scatter on non-final micro-batches.",
        ),
    ] = False,
    warmup_steps: Annotated[int, typer.Option(help="Untimed steps before profiling.")] = 3,
    timing_steps: Annotated[int, typer.Option(help="Steps in the lean timing trace.")] = 5,
    timed_steps: Annotated[
        int, typer.Option(help="Un-profiled steps timed for tokens/s, MFU and memory.")
    ] = 10,
    seed: Annotated[int, typer.Option(help="Seed for weights and synthetic tokens.")] = 0,
    lr: Annotated[float, typer.Option(help="AdamW learning rate.")] = 1e-4,
    timeout_s: Annotated[
        int,
        typer.Option(
            help="Process-group timeout in seconds (at least 1): a stuck collective fails, "
            "never hangs."
        ),
    ] = 300,
    baseline: Annotated[
        str | None,
        typer.Option(help="A 1-GPU run directory: record scaling efficiency against it."),
    ] = None,
    straggler_rank: Annotated[
        int | None, typer.Option(help="Diagnostics: delay this rank's steps (a slow data loader).")
    ] = None,
    straggler_delay_ms: Annotated[
        float, typer.Option(help="Diagnostics: host delay per step on --straggler-rank.")
    ] = 0.0,
) -> None:
    """Profile an FSDP2 training step: one detailed step and several lean timing steps per
    rank, then time un-profiled steps for tokens/s/GPU, MFU and memory.

    Under torchrun: `torchrun --nproc_per_node=N -m fsdp_trace capture ...`.
    Standalone: `fsdp-trace capture --nproc-per-node N ...` starts torchrun's machinery itself.
    """
    with user_errors("capture"):
        cfg = config_from_params(locals())
    if under_torchrun():
        from fsdp_trace.capture.runner import leave_worker, worker_main

        command = os.environ.get("FSDP_TRACE_COMMAND") or shlex.join(
            [
                "torchrun",
                f"--nproc-per-node={os.environ.get('LOCAL_WORLD_SIZE', '?')}",
                "-m",
                "fsdp_trace",
                *sys.argv[1:],
            ]
        )
        leave_worker(worker_main(cfg, command))

    from fsdp_trace.capture.launcher import CaptureFailed, launch

    rendezvous = rendezvous_from_params(locals())
    with user_errors("capture"):
        try:
            launch(cfg, nproc_per_node, rendezvous)
        except CaptureFailed as exc:
            raise fail("capture", exc.message, exc.exit_code) from None
    print(f"fsdp-trace capture: wrote {cfg.out}", file=sys.stderr)


@app.command()
def analyze(
    paths: Annotated[
        list[str],
        typer.Argument(
            help="Trace files (.json/.json.gz), capture run directories, or directories of "
            "per-rank traces.",
            show_default=False,
        ),
    ],
    json_out: Annotated[
        str | None, typer.Option("--json", help="Write every number as JSON to this file.")
    ] = None,
    csv_out: Annotated[
        str | None,
        typer.Option("--csv", help="Write steps.csv, blocks.csv, collectives.csv to this folder."),
    ] = None,
    report: Annotated[
        str, typer.Option(help="The self-contained HTML report (opens offline from disk).")
    ] = "report.html",
    no_report: Annotated[bool, typer.Option("--no-report", help="Do not write the report.")] = (
        False
    ),
    perfetto: Annotated[
        str | None,
        typer.Option(help="Write an annotated Perfetto trace (.pftrace) to this file."),
    ] = None,
    hta: Annotated[
        bool,
        typer.Option(help="Cross-check with holistictraceanalysis' get_comm_comp_overlap."),
    ] = False,
    detailed: Annotated[
        bool,
        typer.Option(help="Also analyze a run's detailed traces (profiler distortion)."),
    ] = True,
    jobs: Annotated[
        int,
        typer.Option(
            help="Traces analyzed at once, one per process (each holds one trace's events); "
            "results identical to --jobs 1."
        ),
    ] = 1,
    no_cache: Annotated[
        bool,
        typer.Option(
            "--no-cache", help="Neither read nor write the cache (parsed traces and analyses)."
        ),
    ] = False,
    top: Annotated[int, typer.Option(help="Rows of the per-block table in the terminal.")] = 15,
    fail_on: Annotated[
        list[str] | None,
        typer.Option(
            help="CI gate, repeatable: exit 1 when a condition holds, e.g. 'exposed_pct>5', "
            "'mfu<0.4', 'findings>0'.",
        ),
    ] = None,
) -> None:
    """Attribute every AllGather / ReduceScatter to its FSDP2 block and phase, measure where
    each rank's step goes, and say which cause to act on first."""
    with user_errors("analyze"):
        from fsdp_trace.diagnose import gate
        from fsdp_trace.pipeline import analyze as run_analysis
        from fsdp_trace.render import export, terminal

        if top < 0:
            raise UserError(f"--top {top}: give a number of rows, 0 or more")
        conditions = [gate.parse(text) for text in fail_on or []]
        outputs = {
            "--json": Path(json_out) if json_out else None,
            "--report": None if no_report else Path(report),
            "--perfetto": Path(perfetto) if perfetto else None,
        }
        if jobs < 1:
            raise UserError(f"--jobs {jobs}: give a number of processes, 1 or more")
        # Every output path is checked before the analysis runs and anything is written: it
        # must be writable, and never one of the inputs.
        export.check_outputs(
            outputs, {"--csv": Path(csv_out) if csv_out else None}, inputs=input_files(paths)
        )
        result = run_analysis(paths, jobs=jobs, detailed=detailed, cache=not no_cache, hta=hta)
        # The gate can refuse a condition (a run metric without run.json): before any output.
        violated = gate.violations(conditions, result.runs)
        terminal.render(result, top=top)
        written = _write_outputs(
            result, outputs, Path(csv_out) if csv_out else None, cache=not no_cache
        )
    for line in written:
        print(f"fsdp-trace: wrote {line}", file=sys.stderr)
    for line in violated:
        print(f"fsdp-trace analyze: fail-on: {line}", file=sys.stderr)
    if violated:
        raise typer.Exit(1)


def _write_outputs(
    result, outputs: dict[str, Path | None], csv_dir: Path | None, cache: bool = True
) -> list[str]:
    """Write every requested output, all or nothing: each is staged beside its target and
    moved into place only once all are written. Returns what to announce."""
    from fsdp_trace.render import export

    written: list[str] = []
    current = ""
    try:
        with export.StagedOutputs() as staged:
            if outputs["--json"] is not None:
                current = f"--json {outputs['--json']}"
                export.write_json(result, staged.file(outputs["--json"]))
                written.append(str(outputs["--json"]))
            if csv_dir is not None:
                current = f"--csv {csv_dir}"
                export.write_csv_files(result, staged.folder(csv_dir))
                written.append(f"{csv_dir}/ ({', '.join(f'{n}.csv' for n in export.CSV_NAMES)})")
            if outputs["--report"] is not None:
                from fsdp_trace.render.report import write_report

                current = f"--report {outputs['--report']}"
                write_report(result, staged.file(outputs["--report"]))
                written.append(str(outputs["--report"]))
            if outputs["--perfetto"] is not None:
                from fsdp_trace.render.perfetto import write_perfetto

                path = outputs["--perfetto"]
                current = f"--perfetto {path}"
                counts = write_perfetto(result, staged.file(path), cache=cache)
                written.append(
                    f"{path} ({sum(counts['slices'].values()):,} slices, {counts['flows']} "
                    f"flows); open it with `fsdp-trace view {path}`"
                )
            staged.commit()
    except OSError as exc:  # e.g. the disk filled up: nothing was moved into place
        raise UserError(
            f"{current}: cannot write ({exc.strerror or exc}); nothing written"
        ) from None
    return written


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def sweep(
    ctx: typer.Context,
    ac_coverage: Annotated[
        str, typer.Option(help="Comma-separated AC coverage points, fractions of blocks.")
    ] = "0,0.25,0.5,0.75,1",
    nproc_per_node: Annotated[int, typer.Option(help="GPUs per point (the baseline uses 1).")] = 2,
    out: Annotated[str, typer.Option(help="Folder for the runs and efficiency.html.")] = (
        "fsdp-trace-sweep"
    ),
    baseline: Annotated[
        bool, typer.Option(help="Also capture the 1-GPU baseline at each point.")
    ] = True,
    overwrite: Annotated[bool, typer.Option(help="Reuse a non-empty --out.")] = False,
) -> None:
    """Capture at each AC coverage point (and its 1-GPU baseline), then plot scaling
    efficiency, tokens/s/GPU, exposed communication, recompute and memory against coverage.

    Any other option is passed to every capture, e.g.
    `fsdp-trace sweep --ac-coverage 0,0.5,1 --model gpt-1.3b --batch-size 1`.
    """
    from fsdp_trace import sweep as sweeping
    from fsdp_trace.capture.launcher import CaptureFailed
    from fsdp_trace.capture.outputs import out_dir_problem

    with user_errors("sweep"):
        points = sweeping.parse_points(ac_coverage)
        command = typer.main.get_command(app).commands["capture"]
        try:  # the sweep's own options (--out, --ac-coverage, ...) never reach ctx.args
            parsed = command.make_context("capture", list(ctx.args)).params
        except Exception as exc:  # click's UsageError, vendored by typer
            message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
            raise UserError(f"capture option: {message}") from None
        parsed["overwrite"] = overwrite
        base = config_from_params(parsed)
        folder = Path(out)
        problem = out_dir_problem(folder, overwrite)
        if problem:
            raise UserError(problem.replace("--out", "sweep --out"))
        try:
            runs = sweeping.run_sweep(
                base, points, nproc_per_node, folder, rendezvous_from_params(parsed), baseline
            )
        except CaptureFailed as exc:
            raise fail("sweep", exc.message, exc.exit_code) from None
        write_efficiency(runs, folder / "efficiency.html", with_traces=True)


def write_efficiency(runs: list[Path], html: Path, with_traces: bool) -> None:
    """The efficiency table as CSV and, where plotly is installed, efficiency.html."""
    from fsdp_trace import atomic
    from fsdp_trace import sweep as sweeping

    table = sweeping.run_table(runs, with_traces=with_traces)
    atomic.write_text(html.with_suffix(".csv"), sweeping.table_csv(table, html.parent))
    try:
        from fsdp_trace.render.efficiency import sweep_title, write_efficiency_html

        write_efficiency_html(table, html, sweep_title(table))
    except ImportError:
        print(
            f"fsdp-trace: plotly is not installed: run `fsdp-trace plot` on {html.parent} "
            "where it is",
            file=sys.stderr,
        )
        return
    print(f"fsdp-trace: wrote {html}", file=sys.stderr)


@app.command()
def plot(
    runs: Annotated[
        list[str],
        typer.Argument(
            help="Run directories, or folders holding them (a sweep's --out).", show_default=False
        ),
    ],
    out: Annotated[str, typer.Option(help="The HTML file to write.")] = "efficiency.html",
    traces: Annotated[
        bool,
        typer.Option(
            help="Read the timing traces (else each run's analysis.json) for exposed % and "
            "recompute %."
        ),
    ] = True,
) -> None:
    """The efficiency-vs-AC-coverage plot from existing run directories."""
    from fsdp_trace import sweep as sweeping

    with user_errors("plot"):
        write_efficiency(sweeping.find_runs(runs), Path(out), with_traces=traces)


@app.command()
def compare(
    runs: Annotated[
        list[str],
        typer.Argument(
            help="Capture run directories, in the order to compare.", show_default=False
        ),
    ],
    html: Annotated[
        str | None, typer.Option(help="Also write the comparison as self-contained HTML.")
    ] = "compare.html",
    traces: Annotated[
        bool,
        typer.Option(
            help="Read the timing traces (else each run's analysis.json) for exposed "
            "communication %."
        ),
    ] = True,
) -> None:
    """The table users write by hand: 1 GPU, N GPUs, then each tuning step, with
    tokens/s/GPU, scaling efficiency, exposed %, memory and what each change bought."""
    from fsdp_trace import sweep as sweeping
    from fsdp_trace.render import terminal

    with user_errors("compare"):
        table = sweeping.compare_table(sweeping.find_runs(runs), with_traces=traces)
        terminal.compare_view(table)
        if html:
            try:
                from fsdp_trace.render.compare import write_compare_html
            except ImportError:
                raise UserError(
                    "--html needs plotly: pip install plotly, or pass --html ''"
                ) from None
            write_compare_html(table, Path(html))
            print(f"fsdp-trace: wrote {html}", file=sys.stderr)


@app.command()
def view(
    file: Annotated[
        str, typer.Argument(help="A .pftrace (or any trace) file to open.", show_default=False)
    ],
    port: Annotated[int, typer.Option(help="Local port; ui.perfetto.dev loads only from 9001.")] = (
        9001
    ),
    browser: Annotated[bool, typer.Option(help="Open the link in a browser if one exists.")] = True,
    keep_serving: Annotated[
        bool, typer.Option(help="Keep serving after the first download (Ctrl-C stops).")
    ] = False,
) -> None:
    """Serve FILE on 127.0.0.1 with the headers the Perfetto UI needs, and print (and open)
    the ui.perfetto.dev link that loads it. Remote machine: ssh -L 9001:127.0.0.1:9001 HOST."""
    from fsdp_trace.view import serve

    with user_errors("view"):
        serve(Path(file), port=port, open_browser=browser, once=not keep_serving)


cache_app = typer.Typer(
    help="The cache of parsed traces and analyses (see README 'Cache').", no_args_is_help=True
)
app.add_typer(cache_app, name="cache")


@cache_app.command("info")
def cache_info() -> None:
    """Where the cache is, how large, and what it holds."""
    from fsdp_trace.analysis import cache

    with user_errors("cache info"):
        for line in cache.info().lines():
            print(line)


@cache_app.command("clear")
def cache_clear() -> None:
    """Delete every cache entry (and leftover temporary files)."""
    from fsdp_trace.analysis import cache

    with user_errors("cache clear"):
        files, freed = cache.clear()
        print(
            f"fsdp-trace: deleted {files} files ({freed / 1024**2:,.1f} MiB) "
            f"from {cache.directory()}"
        )


def main() -> None:
    app()
