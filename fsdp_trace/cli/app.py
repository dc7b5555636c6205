"""The command line's frame: typer's commands and groups as every command prints its help
(type markers dropped, paragraphs wrapped, option names never cut), the `app` group with its
--version, and the one-line error (`fail`, `user_errors`). Annotations are evaluated where
they are written (no `from __future__ import annotations`: see `fsdp_trace.cli`)."""

import inspect
import os
import re
import signal
import sys
import threading
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from fsdp_trace import __version__
from fsdp_trace.errors import Terminated, UserError
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


# What a DeferredCommand stands in for: its name → what builds the real command (the table in
# `fsdp_trace.cli` fills it).
DEFERRED: dict[str, Callable[[], TyperCommand]] = {}


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
    """Print the one-line error every bad input gets, and the exit to raise (`command`: ""
    for what fails before a command runs, `--version`, `--help`)."""
    who = f"fsdp-trace {command}" if command else "fsdp-trace"
    print(f"{who}: error: {printable(message)}", file=sys.stderr, flush=True)
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

# Set by a command that only reads its inputs and writes its outputs (analyze, compare,
# whatif) once they are written: `fsdp_trace.cli.run` may then end the process at once.
_OUTPUTS_WRITTEN: list[bool] = []


def command_starts() -> None:
    """A command starts in this process: what the one before it said is forgotten."""
    _OUTPUTS_WRITTEN.clear()


def outputs_written() -> None:
    """The command's outputs are written and it leaves nothing of its own to finish (no file
    open, no process or thread it waits for): the process need not be torn down."""
    _OUTPUTS_WRITTEN.append(True)


def may_end_now() -> bool:
    """Whether the process may end without tearing the interpreter down: the command said
    its outputs are written, no other thread runs (a daemon thread too: a Dask client's, which
    the teardown would not wait for but which may still be closing its connections), and no
    tool runs the command inside itself (a profiler or tracer, `cProfile`, `pdb`, coverage,
    writes its results or takes over after the command; `python -i` opens its prompt)."""
    if not _OUTPUTS_WRITTEN or threading.active_count() != 1:
        return False
    inspect = sys.flags.inspect or os.environ.get("PYTHONINSPECT")
    return not (inspect or sys.getprofile() or sys.gettrace())


def _terminated(signum, frame) -> None:
    if os.getpid() not in _TERMINATED_IN:  # a forked helper (decode, --jobs): ends as usual
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    raise Terminated()


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
