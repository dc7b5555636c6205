"""The `fsdp-trace` command line. Heavy libraries are imported inside each command, so that
`capture` needs only torch + typer + rich and `analyze` never imports torch; capture's options
are built only for capture (DeferredCommand). Annotations are evaluated where they are written
(no `from __future__ import annotations`): typer would otherwise evaluate every parameter's
annotation text again at each start (~5 ms)."""

import contextlib
import functools
import gc
import inspect
import os
import re
import shlex
import signal
import sys
import threading
import typing
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from fsdp_trace import __version__
from fsdp_trace.errors import Terminated, UserError
from fsdp_trace.knobs import KNOB_NAMES
from fsdp_trace.present.fmt import plural
from fsdp_trace.printable import printable

_SLOW = object()
_INTEGER = re.compile(r"-?(0|[1-9][0-9]*)")


class _Coercion:
    """A parameter's value coercion without pydantic where the value is plainly of its type
    (text for `str`, decimal digits for `int`, texts for `list[str]`): typer (0.20+) builds a
    pydantic TypeAdapter per parameter, and importing pydantic is ~60 ms of every command.
    Any other value or type goes through typer's own coercion (its errors word for word)."""

    def __init__(self, param: Any, slow: Any) -> None:
        descriptor = param.type_descriptor
        info = descriptor.parameter_info
        plain = info.parser is None and info.min is None and info.max is None
        annotation = descriptor.annotation
        self.kind = None
        if plain and annotation is str:
            self.kind = "str"
        elif plain and annotation is int:
            self.kind = "int"
        elif plain and typing.get_origin(annotation) is list and annotation == list[str]:
            self.kind = "list[str]"
        self.slow = slow  # typer's own, built on first use

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        multi = param.multiple or param.nargs == -1
        fast = _SLOW
        if value is None:
            fast = () if multi else None
        elif self.kind == "str" and type(value) is str and not multi:
            fast = value
        elif self.kind == "int" and not multi:
            if type(value) is int:
                fast = value
            elif type(value) is str and _INTEGER.fullmatch(value):
                fast = int(value)
        elif (
            self.kind == "list[str]"
            and isinstance(value, list | tuple)
            and all(type(v) is str for v in value)
        ):
            fast = list(value)
        if fast is not _SLOW:
            return fast
        return self.slow().coerce(value, param=param, ctx=ctx)


def _fast_runtime_param(param: Any, typer_runtime_param: Any) -> Any:
    """`_TyperParameter.get_runtime_param` through `_Coercion` (typer 0.20+; older typers
    never call it)."""
    if getattr(param, "_fast_coercion", None) is None:
        param._fast_coercion = _Coercion(param, typer_runtime_param)
    return param._fast_coercion


class _PlainOption(TyperOption):
    """An option whose help shows a plain value name (`INTEGER`, `DIR`, `true|false|N`), or
    none for a switch, instead of typer's `<bool>` / `<list[str]>`."""

    def display_type_rich(self, ctx: Any) -> str | None:
        if self.is_flag or self.count:
            return None
        return self.metavar or _type_name(self.bare_type())

    def get_runtime_param(self) -> Any:
        return _fast_runtime_param(self, super().get_runtime_param)


class _PlainArgument(TyperArgument):
    """An argument named `PATHS...` in the usage line and the help, not `{paths}...`."""

    def display_type_rich(self, ctx: Any) -> str | None:
        return None

    def _name(self) -> str:
        return (self.metavar or self.name or "").upper()

    def _rich_display_name(self) -> str:
        return self._name() + ("..." if self.nargs != 1 else "")

    def _usage_display_name(self) -> str:
        name = self._name() if self.required else f"[{self._name()}]"
        return name + ("..." if self.nargs != 1 else "")

    def get_runtime_param(self) -> Any:
        return _fast_runtime_param(self, super().get_runtime_param)


TYPE_NAMES = {"int": "INTEGER", "float": "FLOAT", "str": "TEXT", "bool": "BOOLEAN"}


def _type_name(bare: str) -> str:
    """`int` → INTEGER, `list[str]` → TEXT (repeatable options say so in their help)."""
    if bare.startswith("list[") and bare.endswith("]"):
        bare = bare[5:-1]
    return TYPE_NAMES.get(bare, bare.upper())


def _plain(params: list) -> list:
    for param in params:
        if type(param) is TyperOption:
            param.__class__ = _PlainOption
        elif type(param) is TyperArgument:
            param.__class__ = _PlainArgument
    return params


def unwrap(text: str | None) -> str | None:
    """A docstring's paragraphs, each on one line: the terminal wraps them at its width (rich
    help keeps single newlines, which break sentences at 80 columns)."""
    if not text:
        return text
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


HELP_ROOM = 28  # the help column's narrowest before an option's help goes under its name


def _options_panel(*, name: str, params: list, ctx: Any, markup_mode: Any, console: Any, **_):
    """typer's panel of options, laid out so that no option name is ever cut: each option's
    names (its negative switch under it) and value name on one line at their full width, the
    help beside them, or under them where the terminal leaves the help too little room (rich
    would shrink the names column: `--reshard-after-f…` at 80 columns)."""
    if not params:
        return
    from rich.console import Group
    from rich.padding import Padding
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text
    from typer import rich_utils as ru

    rows = []
    for param in params:
        argument = isinstance(param, TyperArgument)
        shown = [o if "--" in o or not argument else param.display_name_raw for o in param.opts]
        names = ru.highlighter(", ".join(shown))
        if param.secondary_opts:
            names.append("\n")
            names.append_text(ru.negative_highlighter(", ".join(param.secondary_opts)))
        kind = Text(param.display_type_rich(ctx=ctx) or "", style=ru.STYLE_TYPES)
        help_text = ru._get_parameter_help(param=param, ctx=ctx, markup_mode=markup_mode)
        required = Text(ru.REQUIRED_SHORT_STRING if param.required else "", ru.STYLE_REQUIRED_SHORT)
        rows.append((required, names, kind, help_text))
    starred = any(r[0].plain for r in rows)
    names_width = max(line.cell_len for r in rows for line in r[1].split("\n"))
    kind_width = max(r[2].cell_len for r in rows)
    inner = console.width - 4  # the panel's borders and padding
    used = (2 if starred else 0) + names_width + 2 + (kind_width + 2 if kind_width else 0)
    table = Table.grid(padding=(0, 2 if inner - used >= HELP_ROOM else 1), expand=True)
    if starred:
        table.add_column(no_wrap=True, width=1)
    if inner - used >= HELP_ROOM:  # the help beside the names
        table.add_column(no_wrap=True, width=names_width)
        if kind_width:
            table.add_column(no_wrap=True, width=kind_width)
        table.add_column(ratio=1)
        for required, names, kind, help_text in rows:
            cells = [required] if starred else []
            table.add_row(*cells, names, *([kind] if kind_width else []), help_text)
    else:  # under them, indented
        table.add_column(ratio=1)
        for required, names, kind, help_text in rows:
            head = names.copy()
            if kind.plain:
                head.append("  ")
                head.append_text(kind)
            cells = [required] if starred else []
            table.add_row(*cells, Group(head, Padding(help_text, (0, 0, 0, 4))))
    console.print(
        Panel(
            table,
            border_style=ru.STYLE_OPTIONS_PANEL_BORDER,
            title=name,
            title_align=ru.ALIGN_OPTIONS_PANEL,
        )
    )


@contextmanager
def _fitting_help() -> Iterator[None]:
    """typer's rich help with `_options_panel` for its panels of options."""
    from typer import rich_utils

    original = rich_utils._print_options_panel
    rich_utils._print_options_panel = _options_panel
    try:
        yield
    finally:
        rich_utils._print_options_panel = original


class PlainCommand(TyperCommand):
    """Every command: help without typer's type markers, paragraphs wrapped to the terminal,
    option names never cut (`_options_panel`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["help"] = unwrap(kwargs.get("help"))
        super().__init__(*args, **kwargs)

    def get_params(self, ctx: Any) -> list:
        return _plain(super().get_params(ctx))

    def format_help(self, ctx: Any, formatter: Any) -> None:
        with _fitting_help():
            super().format_help(ctx, formatter)


class DeferredCommand(PlainCommand):
    """The stand-in of a command whose parameters are costly to build (`capture`'s, generated
    from its config classes by parsing their source: ~15 ms): same name and help, no
    parameters. Its group builds the real one (`DEFERRED`) only when that command is asked
    for, so that every other command and the command list start without that cost."""


class PlainGroup(TyperGroup):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["help"] = unwrap(kwargs.get("help"))
        super().__init__(*args, **kwargs)
        self._listing = False

    def get_params(self, ctx: Any) -> list:
        return _plain(super().get_params(ctx))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        """A command, a deferred one built now (the help's command list keeps the stand-in:
        it shows only the name and help, which the stand-in has)."""
        command = super().get_command(ctx, cmd_name)
        if isinstance(command, DeferredCommand) and not self._listing:
            command = self.commands[cmd_name] = DEFERRED[cmd_name]()
        return command

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """The help, its command list from the stand-ins as they are."""
        self._listing = True
        try:
            with _fitting_help():
                super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    name="fsdp-trace",
    help="Find the FSDP2 communication not hidden behind compute, and what to change.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=PlainGroup,
)


def fail(command: str, message: str, code: int = 2) -> typer.Exit:
    """Print the one-line error every bad input gets, and the exit to raise."""
    print(f"fsdp-trace {command}: error: {printable(message)}", file=sys.stderr, flush=True)
    return typer.Exit(code)


@contextmanager
def user_errors(command: str) -> Iterator[None]:
    """Turn a UserError into one line on stderr and exit code 2, Ctrl-C into one line and
    exit code 130, SIGTERM into one line and 143 (each after what was being written is
    removed): never a traceback. (capture handles its signals itself: its ranks.)"""
    previous = None
    if command != "capture" and threading.current_thread() is threading.main_thread():
        _TERMINATED_IN.add(os.getpid())
        previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    except UserError as exc:
        raise fail(command, exc.message, exc.exit_code) from None
    except Terminated:
        raise fail(command, "terminated (SIGTERM): nothing written", 143) from None
    except KeyboardInterrupt:
        raise fail(command, "interrupted (Ctrl-C): nothing written", 130) from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


_TERMINATED_IN: set[int] = set()  # the processes whose SIGTERM raises Terminated


def _terminated(signum, frame) -> None:
    if os.getpid() not in _TERMINATED_IN:  # a forked helper (decode, --jobs): ends as usual
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    raise Terminated()


@contextmanager
def no_cache_if(no_cache: bool) -> Iterator[None]:
    """`--no-cache`: caching off for the whole command, so that nothing is read from or written
    to the cache folder (parsed traces, analyses, the packed plotly.js of the pages)."""
    if not no_cache:
        yield
        return
    from fsdp_trace.analysis.read import cache

    with cache.off("--no-cache"):
        yield


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a command imports its libraries, and what
    they made frozen after: importing numpy and pandas creates ~10^5 objects, and each
    collection pass during the imports (and, unfrozen, every full pass later) scans them all,
    ~30 ms of a 0.3 s start. Imports leave no cyclic garbage to collect."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def analyze_modules() -> SimpleNamespace:
    """What `analyze` uses, imported (pandas, numpy, msgspec and the analysis behind them):
    the command's own imports, in one place so that benchmarks/speed_targets.py times these."""
    with collector_paused():
        from fsdp_trace.analysis.rank.analyze import keeping_cpu_slices
        from fsdp_trace.diagnose import gate
        from fsdp_trace.pipeline import analyze as run_analysis
        from fsdp_trace.render import export, terminal
    return SimpleNamespace(
        keeping_cpu_slices=keeping_cpu_slices,
        gate=gate,
        run_analysis=run_analysis,
        export=export,
        terminal=terminal,
    )


def input_files(paths: list[str]) -> list[Path]:
    """Every local file an analysis of `paths` reads (traces and run.json), for the output
    checks (a URL's objects are not files an output could replace)."""
    from fsdp_trace.analysis.read.inputs import resolve
    from fsdp_trace.runrecord import RUN_FILE

    found = resolve(paths)
    files = list(found.loose)
    for run in found.runs:
        files += [t.path for t in run.traces]
        if isinstance(run.run_dir, Path):
            files.append(run.run_dir / RUN_FILE)
    return [f for f in files if isinstance(f, Path)]


SCHEDULER_HELP = (
    "Analyze the traces as tasks on a Dask cluster, where its workers read them: "
    "tcp://HOST:PORT, a scheduler file (.json), or local:N (N worker processes here). Needs "
    "fsdp-trace[dask]; results identical to --jobs 1."
)


def cluster_client(scheduler: str | None, jobs: int) -> AbstractContextManager[Any]:
    """The Dask client `--scheduler` asks for (None without it), closed at the end."""
    if scheduler is None:
        return nullcontext(None)
    if jobs != 1:
        raise UserError(f"--jobs {jobs} and --scheduler: give one of them")
    from fsdp_trace.analysis.job.cluster import connect

    return connect(scheduler)


def refuse_urls(paths: list[str], options: dict[str, bool]) -> None:
    """Options that read every event of the traces here cannot take URL inputs."""
    from fsdp_trace.analysis.read.remote import is_url

    url = next((p for p in paths if is_url(p)), None)
    given = [name for name, on in options.items() if on]
    if url is not None and given:
        raise UserError(
            f"{given[0]} reads every event of the traces here, not through a URL ({url}): "
            "copy the traces to a local folder, or leave it out"
        )


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


# Registered here, first of the commands, as a stand-in: built when asked for (DeferredCommand).
app.command("capture", cls=DeferredCommand, help=capture.__doc__)(_stand_in)


@functools.cache
def _capture_callback() -> Any:
    """`capture` with its generated options as its signature (once: this changes it)."""
    return with_options(capture_options())(capture)


def capture_command() -> TyperCommand:
    """`capture` as typer builds it, its options generated from the config classes."""
    one = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    one.command(cls=PlainCommand)(_capture_callback())
    return typer.main.get_command(one)


DEFERRED = {"capture": capture_command}


def run_contents(out: Path) -> str:
    """ "runs/x (run.json and 4 traces)": a run directory and what the capture wrote there."""
    traces = sorted(out.glob("rank*.json.gz")) if out.is_dir() else []
    parts = (["run.json"] if (out / "run.json").is_file() else []) + (
        [plural(len(traces), "trace")] if traces else []
    )
    return f"{out} ({' and '.join(parts)})" if parts else str(out)


# --- where outputs go ----------------------------------------------------------------------


TRACE_SUFFIXES = (".json.gz", ".json")


def trace_stem(name: str) -> str:
    """`rank0.timing.json.gz` → `rank0.timing`."""
    for suffix in TRACE_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


class Placement(typing.NamedTuple):
    """Where a command's output goes by default, and the words that say why when it is not
    obvious (one report for several inputs). A NamedTuple: a frozen dataclass costs ~0.4 ms
    to define, at every command's start."""

    path: Path
    note: str = ""


def beside_inputs(paths: list[str], name: str, per_file: str | None = None) -> Placement:
    """The default place of an output named `name`: inside a folder given alone (a run
    directory, a folder of traces or of runs), beside a trace file given alone (as
    `STEM.<per_file>`), else beside the first of several inputs."""
    from fsdp_trace.analysis.read.remote import is_url

    if is_url(paths[0]):  # nothing to write beside a URL: the current folder
        return Placement(Path(name), "the inputs are URLs: in the current folder")
    first = Path(paths[0])
    if len(paths) == 1:
        if first.is_dir():
            return Placement(first / name)
        if per_file:
            return Placement(first.parent / f"{trace_stem(first.name)}.{per_file}")
        return Placement(first.parent / name)
    return Placement(first.parent / name, f"beside the first input, {first}")


def in_out_dir(value: str | None, out_dir: Path | None) -> Path | None:
    """An output path given as a bare name lands in --out-dir; a path with a folder stays."""
    if value is None:
        return None
    path = Path(value)
    if out_dir is not None and not path.is_absolute() and path.parent == Path("."):
        return out_dir / path
    return path


def announce(lines: list[str]) -> None:
    """Name each file written on stderr, after whatever the command printed."""
    sys.stdout.flush()
    for line in lines:
        print(f"fsdp-trace: {printable(line)}", file=sys.stderr)


def verb(path: Path) -> str:
    """What writing `path` does: "replaced" an existing file (the tool's own output), else
    "wrote"."""
    return "replaced" if Path(path).exists() else "wrote"


def default_place_problem(exc: UserError, option: str, placement: Placement | None) -> UserError:
    """A default place that cannot be written (a read-only input folder) says how to choose
    another."""
    if placement is not None and exc.message.startswith(f"{option} {placement.path}:"):
        return UserError(
            f"{exc.message} (the default place, beside the input): pass {option} PATH, "
            "--out-dir DIR" + (" or --no-report" if option == "--report" else "")
        )
    return exc


OUT_DIR_HELP = "Put every output of this command in this folder (bare output names land there)."


@app.command(cls=PlainCommand)
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
        int,
        typer.Option(
            help="Traces analyzed at once, one per process (each holds one trace's events); "
            "results identical to --jobs 1.",
            metavar="N",
        ),
    ] = 1,
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
    with user_errors("analyze"), no_cache_if(no_cache):
        used = analyze_modules()
        keeping_cpu_slices, run_analysis = used.keeping_cpu_slices, used.run_analysis
        gate, export, terminal = used.gate, used.export, used.terminal

        if top < 0:
            raise UserError(f"--top {top}: give a number of rows, 0 or more")
        conditions = [gate.parse(text) for text in fail_on or []]
        if jobs < 1:
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
            result = run_analysis(
                paths,
                jobs=jobs,
                detailed=detailed,
                cache=not no_cache,
                hta=hta,
                client=client,
                keep_kernels=perfetto_out,
            )
        # The gate can refuse a condition (a run metric without run.json): before any output.
        violated = gate.violations(conditions, result.runs)
        terminal.render(result, top=top)
        notes = {}
        runs = plural(len(result.runs), "run")
        if placement is not None and placement.note:  # several inputs
            notes[placement.path] = (
                f"one report for {plural(len(paths), 'input')} ({runs}), {placement.note}; "
                "choose with --report or --out-dir"
            )
        elif placement is not None and len(result.runs) > 1:  # a folder of several runs
            notes[placement.path] = (
                f"one report for {runs}, in {placement.path.parent}; "
                "choose with --report or --out-dir"
            )
        written = _write_outputs(result, outputs, csv_dir, cache=not no_cache, notes=notes)
    announce(written)
    for line in violated:
        print(f"fsdp-trace analyze: fail-on: {printable(line)}", file=sys.stderr)
    if violated:
        raise typer.Exit(1)


def _write_outputs(
    result,
    outputs: dict[str, Path | None],
    csv_dir: Path | None,
    cache: bool = True,
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
                export.write_json(result, staged.file(outputs["--json"]))
                written.append(said(outputs["--json"]))
            if csv_dir is not None:
                current = f"--csv {csv_dir}"
                export.write_csv_files(result, staged.folder(csv_dir))
                names = [f"{n}.csv" for n in export.CSV_NAMES]
                again = any((csv_dir / n).exists() for n in names)
                written.append(
                    f"{'replaced' if again else 'wrote'} {csv_dir}/ ({', '.join(names)})"
                )
            if outputs["--report"] is not None:
                from fsdp_trace.render.report import write_report

                current = f"--report {outputs['--report']}"
                write_report(result, staged.file(outputs["--report"]))
                written.append(said(outputs["--report"]))
            if outputs["--perfetto"] is not None:
                from fsdp_trace.render.perfetto import write_perfetto

                path = outputs["--perfetto"]
                current = f"--perfetto {path}"
                counts = write_perfetto(result, staged.file(path), cache=cache)
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


@app.command(cls=PlainCommand)
def whatif(
    paths: Annotated[
        list[str],
        typer.Argument(
            help="A capture run directory, or a run's per-rank traces (GPU traces: the replay "
            "needs GPU timing).",
            show_default=False,
            metavar="RUN_OR_TRACES",
        ),
    ],
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="A change, repeatable: KNOB=VALUE with KNOB one of "
            + ", ".join(KNOB_NAMES)
            + ". Without --set: every change the diagnosis names, ranked.",
            metavar="KNOB=VALUE",
        ),
    ] = None,
    json_out: Annotated[
        str | None,
        typer.Option(
            "--json",
            help="Write the prediction (measured.step_us, predicted.step_us, "
            "predicted.breakdown, per rank) as JSON to this file.",
            metavar="FILE",
        ),
    ] = None,
    jobs: Annotated[
        int, typer.Option(help="Traces analyzed at once, one per process.", metavar="N")
    ] = 1,
    scheduler: Annotated[
        str | None, typer.Option(help=SCHEDULER_HELP, metavar="ADDRESS", show_default=False)
    ] = None,
    no_cache: Annotated[
        bool, typer.Option("--no-cache", help="Neither read nor write the cache.")
    ] = False,
) -> None:
    """Predict what a knob change buys, by replaying the measured step.

    Every rank's measured step is replayed with FSDP2's schedule (per-block compute, the
    transfer times from the cross-rank match, the measured overlap tax, the host's launches
    at its speed without the profiler) under the changed knobs, beside the measured step and
    its split, with an uncertainty. README "What if" gives the model's error on real pairs.
    """
    with user_errors("whatif"), no_cache_if(no_cache):
        import json

        from fsdp_trace import atomic
        from fsdp_trace import whatif as model
        from fsdp_trace.pipeline import analyze as run_analysis
        from fsdp_trace.present import whatif as views
        from fsdp_trace.render import export
        from fsdp_trace.render.terminal import make_console
        from fsdp_trace.render.whatif import render_prediction, render_ranking

        if jobs < 1:
            raise UserError(f"--jobs {jobs}: give a number of processes, 1 or more")
        knobs = model.parse(set_) if set_ else None
        inputs = input_files(paths)
        target = Path(json_out) if json_out else None
        export.check_outputs({"--json": target}, {}, inputs=inputs)
        with cluster_client(scheduler, jobs) as client:
            # The replay reads every GPU rank's kernels: kept, not read again.
            result = run_analysis(
                paths,
                jobs=jobs,
                detailed=False,
                cache=not no_cache,
                client=client,
                keep_kernels=True,
            )
        console = make_console()
        payloads = []
        for run in result.runs:
            if knobs is not None:
                prediction = model.predict(run, knobs)
                render_prediction(views.prediction_view(prediction, run.name), console)
                payloads.append(views.payload(prediction, run.name))
            else:
                ranked = model.rank_candidates(run)
                points = views.measured_points(run, result.runs)
                render_ranking(views.ranking_view(ranked, run.name, points), console)
                payloads.append(views.ranking_payload(ranked, run.name))
        if target is not None:
            document = payloads[0] if len(payloads) == 1 else {"runs": payloads}
            try:
                with export.StagedOutputs() as staged:
                    atomic.write_text(
                        staged.file(target), json.dumps(document, indent=1, allow_nan=False) + "\n"
                    )
                    line = f"{verb(target)} {target}"
                    staged.commit()
            except OSError as exc:
                raise UserError(
                    f"--json {target}: cannot write ({exc.strerror or exc}); nothing written"
                ) from None
            announce([line])


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


@app.command(
    cls=PlainCommand,
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
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


@app.command(
    cls=PlainCommand,
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
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
    from fsdp_trace.present.tune import folder_view
    from fsdp_trace.render import tune as tune_render

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
    from fsdp_trace.present.tune import folder_view
    from fsdp_trace.render import tune as tune_render

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


def run_inputs(runs: list[Path]) -> list[Path]:
    """The files `plot` and `compare` read in each run directory (run.json, analysis.json,
    traces): never an output."""
    return [p for run in runs for p in run.iterdir() if p.name.endswith(TRACE_SUFFIXES)]


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


def place(
    runs: list[str], value: str | None, name: str, out_dir: str | None
) -> tuple[Path, Placement | None]:
    """An output of `plot` / `compare`: as given (a bare name in --out-dir), else in
    --out-dir, else beside the inputs."""
    folder = Path(out_dir) if out_dir else None
    if value:
        return in_out_dir(value, folder), None
    if folder is not None:
        return folder / name, None
    placement = beside_inputs(runs, name)
    return placement.path, placement


@app.command(cls=PlainCommand)
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


@app.command(cls=PlainCommand)
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


@app.command(cls=PlainCommand)
def view(
    file: Annotated[
        str,
        typer.Argument(
            help="A .pftrace (or any trace) file to open.", show_default=False, metavar="FILE"
        ),
    ],
    port: Annotated[
        int, typer.Option(help="Local port; ui.perfetto.dev loads only from 9001.", metavar="PORT")
    ] = 9001,
    browser: Annotated[bool, typer.Option(help="Open the link in a browser if one exists.")] = True,
    keep_serving: Annotated[
        bool, typer.Option(help="Keep serving after the first download (Ctrl-C stops).")
    ] = False,
) -> None:
    """Serve a trace to the Perfetto UI and print its link.

    FILE is served on 127.0.0.1 with the headers the Perfetto UI needs, and the
    ui.perfetto.dev link that loads it is printed (and opened). On a remote machine:
    ssh -L 9001:127.0.0.1:9001 HOST.
    """
    from fsdp_trace.view import serve

    with user_errors("view"):
        serve(Path(file), port=port, open_browser=browser, once=not keep_serving)


cache_app = typer.Typer(
    help="The cache of parsed traces and analyses (see README 'Cache').",
    no_args_is_help=True,
    cls=PlainGroup,
)
app.add_typer(cache_app, name="cache")


@cache_app.command("info", cls=PlainCommand)
def cache_info() -> None:
    """Where the cache is, how large, and what it holds."""
    from fsdp_trace.analysis.read import cache

    with user_errors("cache info"):
        for line in cache.info().lines():
            print(printable(line))


@cache_app.command("clear", cls=PlainCommand)
def cache_clear() -> None:
    """Delete every cache entry (and leftover temporary files)."""
    from fsdp_trace.analysis.read import cache

    with user_errors("cache clear"):
        files, freed = cache.clear()
        print(
            f"fsdp-trace: deleted {plural(files, 'file')} ({freed / 1024**2:,.1f} MiB) "
            f"from {printable(cache.directory())}"
        )


class _Stdout:
    """Standard output as the commands write it: a reader that went away (`| head -1`) stops
    the printing, not the command (its files are still written, and it exits as it would);
    a stdout that cannot be written (`> /dev/full`) is a one-line error; text the terminal's
    encoding cannot show is replaced, never a UnicodeEncodeError. Everything else is the
    stream's own."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self._gone = False

    def __getattr__(self, name: str):
        return getattr(self._stream, name)

    def _closed_under_us(self) -> None:
        """Later writes, and the interpreter's last flush, go nowhere."""
        self._gone = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass

    def _do(self, action, *args):
        if self._gone:
            return None
        try:
            return action(*args)
        except BrokenPipeError:
            self._closed_under_us()
        except OSError as exc:
            self._closed_under_us()
            raise UserError(
                f"cannot write to standard output ({exc.strerror or exc}): the output stops "
                "here, nothing else written"
            ) from None
        return None

    def write(self, text: str) -> int:
        self._do(self._stream.write, text)
        self._do(self._stream.flush)
        return len(text)

    def flush(self) -> None:
        self._do(self._stream.flush)


def main() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError):  # not a TextIOWrapper
            stream.reconfigure(errors="backslashreplace" if stream is sys.stderr else "replace")
    if sys.stdout is not None:
        sys.stdout = _Stdout(sys.stdout)
    app()
