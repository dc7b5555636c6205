"""The commands that run training: `capture` (its options generated from the capture config
classes, built only when asked for: DeferredCommand), `sweep`, `tune` and `plot` (a sweep's
efficiency from its run folders)."""

import functools
import inspect
import os
import shlex
import sys
import typing
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from fsdp_trace.cli.app import PlainCommand, fail, user_errors
from fsdp_trace.cli.common import (
    OUT_DIR_HELP,
    announce,
    default_place_problem,
    place,
    run_contents,
    run_inputs,
    verb,
)
from fsdp_trace.errors import UserError
from fsdp_trace.printable import printable


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


LAUNCHER_PANEL = "Launcher (without torchrun)"
LAUNCHER_METAVARS = {
    "nproc_per_node": "N",
    "nnodes": "N|MIN:MAX",
    "node_rank": "N",
    "rdzv_endpoint": "HOST:PORT",
    "master_port": "PORT",
}


def _option_type(hint: Any) -> Any:
    """The type an option parses its value as: the field's own type, `T | None` kept; a
    field of several types (`bool | int`: true, false or N) is text its validation parses."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if not args:
        return hint
    if len(args) == 1:
        return args[0] | None
    return str


def dataclass_options(cls: type, panels: dict[str, str], metavars: dict[str, str]) -> list:
    """typer parameters for every field of `cls`: `--field-name`, its type and default, its
    docstring as help, a switch pair for a boolean (`SWITCHES`), under its help panel."""
    import dataclasses

    from fsdp_trace.capture.config import field_docs, option_text, switch_options

    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    parameters = []
    for spec in dataclasses.fields(cls):
        name = spec.name
        hint = hints[name]
        kind = _option_type(hint)
        default = spec.default
        if kind is str and hint is not str:  # several types, parsed from text: say it so
            default = option_text(default)
        # Named explicitly: some typer/click pairs (typer 0.27 with click 8.5) otherwise name
        # an option whose metavar is its name in capitals after the metavar (--DEVICE).
        decls: tuple[str, ...] = (f"--{name.replace('_', '-')}",)
        if hint is bool:
            decls = ("/".join(switch_options(name)),)
        option = typer.Option(
            *decls,
            help=docs.get(name),
            metavar=metavars.get(name),
            rich_help_panel=panels.get(name),
            show_default=default is not None and hint is not bool,  # a switch: off unless given
        )
        parameters.append(
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=default,
                annotation=Annotated[kind, option],
            )
        )
    return parameters


def capture_options() -> list:
    """The capture command's options, generated from CaptureConfig's fields and the
    launcher's (Rendezvous): one source of names, types, defaults and help."""
    from fsdp_trace.capture.config import HELP_PANELS, METAVARS, CaptureConfig
    from fsdp_trace.capture.launcher import Rendezvous

    panels = {name: panel for panel, names in HELP_PANELS.items() for name in names}
    launcher = {spec: LAUNCHER_PANEL for spec in Rendezvous.__dataclass_fields__}
    return [
        *dataclass_options(CaptureConfig, panels, METAVARS),
        *dataclass_options(Rendezvous, launcher, LAUNCHER_METAVARS),
    ]


def with_options(parameters: list):
    """Give `func(**options)` these keyword parameters, as typer reads them (its signature)."""

    def decorate(func):
        signature = inspect.signature(func)
        own = [p for p in signature.parameters.values() if p.kind != p.VAR_KEYWORD]
        func.__signature__ = signature.replace(parameters=[*own, *parameters])
        func.__annotations__ = {p.name: p.annotation for p in parameters}
        return func

    return decorate


def capture(**options: Any) -> None:
    """Profile FSDP2 training steps on every rank.

    One detailed step and several lean timing steps per rank are profiled, then un-profiled
    steps are timed for tokens/s/GPU, MFU and memory.

    Under torchrun: `torchrun --nproc_per_node=N -m fsdp_trace capture ...`.
    Standalone: `fsdp-trace capture --nproc-per-node N ...` starts torchrun's machinery itself.
    """
    with user_errors("capture"):
        cfg = config_from_params(options)
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

    rendezvous = rendezvous_from_params(options)
    with user_errors("capture"):
        try:
            launch(cfg, rendezvous.nproc_per_node, rendezvous)
        except CaptureFailed as exc:
            raise fail("capture", exc.message, exc.exit_code) from None
    print(f"fsdp-trace capture: wrote {printable(run_contents(Path(cfg.out)))}", file=sys.stderr)


def _stand_in() -> None:
    """Never run: a DeferredCommand's group runs the command it builds."""


@functools.cache
def _capture_callback() -> Any:
    """`capture` with its generated options as its signature (once: this changes it)."""
    return with_options(capture_options())(capture)


def capture_command() -> TyperCommand:
    """`capture` as typer builds it, its options generated from the config classes."""
    one = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    one.command(cls=PlainCommand)(_capture_callback())
    return typer.main.get_command(one)


def passed_capture_options(args: list[str], overwrite: bool) -> dict[str, Any]:
    """The capture options a sweep or tune passes on to every capture (its own options, such
    as --out, never reach `args`), parsed as `capture` parses them."""
    command = capture_command()
    try:
        parsed = command.make_context("capture", list(args)).params
    except Exception as exc:  # click's UsageError, vendored by typer
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        raise UserError(f"capture option: {message}") from None
    parsed["overwrite"] = overwrite
    return parsed


def sweep(
    ctx: typer.Context,
    ac_coverage: Annotated[
        str,
        typer.Option(
            help="Comma-separated AC coverage points, fractions of blocks.", metavar="POINTS"
        ),
    ] = "0,0.25,0.5,0.75,1",
    nproc_per_node: Annotated[
        int, typer.Option(help="GPUs per point (the baseline uses 1).", metavar="N")
    ] = 2,
    out: Annotated[
        str,
        typer.Option(help="Folder for the runs, efficiency.html and .csv.", metavar="DIR"),
    ] = "fsdp-trace-sweep",
    baseline: Annotated[
        bool, typer.Option(help="Also capture the 1-GPU baseline at each point.")
    ] = True,
    overwrite: Annotated[bool, typer.Option(help="Reuse a non-empty --out.")] = False,
) -> None:
    """Capture and plot efficiency against AC coverage.

    At each AC coverage point (and its 1-GPU baseline) a capture runs; then scaling
    efficiency, tokens/s/GPU, exposed communication, recompute and memory are plotted
    against coverage. Any other option is passed to every capture, e.g.
    `fsdp-trace sweep --ac-coverage 0,0.5,1 --model gpt-1.3b --batch-size 1`.
    """
    from fsdp_trace import sweep as sweeping
    from fsdp_trace.capture.launcher import CaptureFailed
    from fsdp_trace.capture.outputs import out_dir_problem

    with user_errors("sweep"):
        points = sweeping.parse_points(ac_coverage)
        parsed = passed_capture_options(ctx.args, overwrite)
        base = config_from_params(parsed)
        folder = Path(out)
        problem = out_dir_problem(folder, overwrite)
        if problem:
            raise UserError(problem.replace("--out", "sweep --out"))
        try:
            runs = sweeping.run_sweep(
                base,
                points,
                nproc_per_node,
                folder,
                rendezvous_from_params(parsed),
                baseline,
                on_point=lambda run: announce([f"wrote {point_contents(run)}"]),
            )
        except CaptureFailed as exc:
            raise fail("sweep", exc.message, exc.exit_code) from None
        write_efficiency(runs, folder / "efficiency.html", with_traces=True)


def tune(
    ctx: typer.Context,
    nproc_per_node: Annotated[
        int, typer.Option(help="GPUs of the runs tuned (the baseline uses 1).", metavar="N")
    ] = 2,
    budget: Annotated[
        int, typer.Option(help="Knob captures to spend at most.", metavar="STEPS")
    ] = 4,
    target: Annotated[
        str | None,
        typer.Option(
            help="Stop once scaling efficiency reaches this (0.9 or 90%).",
            metavar="EFF",
            show_default=False,
        ),
    ] = None,
    out: Annotated[
        str, typer.Option(help="Folder for the runs, tune.md and tune.html.", metavar="DIR")
    ] = "fsdp-trace-tune",
    overwrite: Annotated[bool, typer.Option(help="Reuse a non-empty --out.")] = False,
    render_only: Annotated[
        bool,
        typer.Option(
            "--render-only",
            help="Capture nothing: re-measure the runs of --out (its tune.json and run "
            "folders) and write tune.json, tune.md and tune.html again.",
        ),
    ] = False,
) -> None:
    """Capture, predict and keep the knobs that buy throughput.

    Captures the 1-GPU baseline and the N-GPU eager run (twice: the run-to-run noise), then
    repeatedly captures the knob the what-if replay predicts to gain most, keeping it when
    its measured gain is beyond the noise, until --budget or --target. Writes the table of
    which knob bought each point as tune.md and tune.html. Any other option is passed to
    every capture, e.g. `fsdp-trace tune --model gpt-1.3b --nproc-per-node 8 --budget 3`.
    `fsdp-trace tune --out DIR --render-only` writes the table of DIR again.
    """
    from fsdp_trace import tune as tuning
    from fsdp_trace.capture.launcher import CaptureFailed
    from fsdp_trace.capture.outputs import out_dir_problem
    from fsdp_trace.render import tune as tune_render
    from fsdp_trace.tune import folder_view

    with user_errors("tune"):
        if render_only:
            render_tune(Path(out), ctx.args)
            return
        goal = tuning.parse_target(target)
        try:  # each capture is analyzed: say what is missing before anything is captured
            import fsdp_trace.pipeline
            import fsdp_trace.whatif  # noqa: F401
        except ImportError as exc:
            raise UserError(
                f"tune analyzes every capture, and {exc.name} is missing: install fsdp-trace "
                "with its dependencies (pip install fsdp-trace)"
            ) from None
        if nproc_per_node < 1:
            raise UserError(f"--nproc-per-node {nproc_per_node}: give 1 or more")
        parsed = passed_capture_options(ctx.args, overwrite)
        base = config_from_params(parsed)
        folder = Path(out)
        problem = out_dir_problem(folder, overwrite)
        if problem:
            raise UserError(problem.replace("--out", "tune --out"))
        capture_run = tuning.launcher_capture(rendezvous_from_params(parsed))

        def say(line: str) -> None:
            print(f"fsdp-trace tune: {printable(line)}", file=sys.stderr, flush=True)

        try:
            result = tuning.tune(
                base, nproc_per_node, folder, capture_run, budget=budget, target=goal, say=say
            )
        except CaptureFailed as exc:
            raise fail("tune", exc.message, exc.exit_code) from None
        view = folder_view(result, folder)
        written = tune_render.write(view, folder)
        tune_render.terminal(view)
        announce([f"wrote {path}" for path in [folder / tuning.TUNE_FILE, *written]])


def render_tune(folder: Path, extra: list[str]) -> None:
    """`tune --render-only`: the tune folder's figures recomputed from its runs (run.json and
    analysis.json or traces), written and printed as after the loop; nothing is captured."""
    from fsdp_trace import tune as tuning
    from fsdp_trace.render import tune as tune_render
    from fsdp_trace.tune import folder_view

    if extra:
        raise UserError(
            f"--render-only captures nothing: leave out the capture options ({' '.join(extra)})"
        )
    if not folder.is_dir():
        raise UserError(f"--out {folder}: no such folder (give a tune folder to render)")
    result = tuning.remeasure(tuning.read_tune(folder), folder)
    view = folder_view(result, folder)
    tuning.record_final(result, folder)
    written = tune_render.write(view, folder)
    tune_render.terminal(view)
    announce([f"wrote {path}" for path in [folder / tuning.TUNE_FILE, *written]])


def point_contents(run: Path) -> str:
    """ "sweeps/b1/ac0.00-2gpu (run.json and 4 traces, analysis.json)"."""
    text = run_contents(run)
    if (run / "analysis.json").is_file():
        text = text[:-1] + ", analysis.json)" if text.endswith(")") else f"{text} (analysis.json)"
    return text


def write_efficiency(runs: list[Path], html: Path, with_traces: bool) -> None:
    """The efficiency table as efficiency.csv and, where plotly is installed, efficiency.html
    beside it: checked first, written all or nothing, each named on stderr."""
    from fsdp_trace import sweep as sweeping
    from fsdp_trace.render import export

    csv = html.with_suffix(".csv")
    export.check_outputs({"--out": html, "--out (its CSV)": csv}, {}, inputs=run_inputs(runs))
    table = sweeping.run_table(runs, with_traces=with_traces)
    try:
        import plotly  # noqa: F401  (the page needs it; the CSV does not)

        from fsdp_trace.render.efficiency import sweep_title, write_efficiency_html
    except ImportError:
        write_efficiency_html = None
    lines = [f"{verb(csv)} {csv}"]
    if write_efficiency_html is not None:
        lines.insert(0, f"{verb(html)} {html}")
    try:
        with export.StagedOutputs() as staged:
            from fsdp_trace import atomic

            atomic.write_text(staged.file(csv), sweeping.table_csv(table, html.parent))
            if write_efficiency_html is not None:
                write_efficiency_html(table, staged.file(html), sweep_title(table))
            staged.commit()
    except OSError as exc:  # e.g. the disk filled up: nothing was moved into place
        raise UserError(f"{html}: cannot write ({exc.strerror or exc}); nothing written") from None
    announce(lines)
    if write_efficiency_html is None:
        announce([f"plotly is not installed: run `fsdp-trace plot` on {html.parent} where it is"])


def plot(
    runs: Annotated[
        list[str],
        typer.Argument(
            help="Run directories, or folders holding them (a sweep's --out).",
            show_default=False,
            metavar="RUNS",
        ),
    ],
    out: Annotated[
        str | None,
        typer.Option(
            help="The HTML file to write, the table as .csv beside it. Default: "
            "efficiency.html in the folder given (beside the first of several).",
            metavar="FILE",
            show_default=False,
        ),
    ] = None,
    out_dir: Annotated[str | None, typer.Option(help=OUT_DIR_HELP, metavar="DIR")] = None,
    traces: Annotated[
        bool,
        typer.Option(
            help="Read the timing traces (else each run's analysis.json) for exposed % and "
            "recompute %."
        ),
    ] = True,
) -> None:
    """Plot efficiency against AC coverage from run directories."""
    from fsdp_trace import sweep as sweeping

    with user_errors("plot"):
        found = sweeping.find_runs(runs)
        html, placement = place(runs, out, "efficiency.html", out_dir)
        try:
            write_efficiency(found, html, with_traces=traces)
        except UserError as exc:
            raise default_place_problem(exc, "--out", placement) from None
