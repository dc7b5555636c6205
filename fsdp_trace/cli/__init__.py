"""The `fsdp-trace` command line: the table of its commands, one module per group (`analyze`:
analyze, compare; `capture`: capture, sweep, tune, plot; `whatif`; `view`: view, cache) on the
frame `app` lays out. Heavy libraries are imported inside each command, so that `capture`
needs only torch + typer + rich and `analyze` never imports torch; capture's options are built
only for capture (DeferredCommand). Annotations are evaluated where they are written (no
`from __future__ import annotations`): typer would otherwise evaluate every parameter's
annotation text again at each start (~5 ms)."""

import atexit
import contextlib
import errno
import io
import os
import sys

from fsdp_trace.cli import analyze, capture, view, whatif
from fsdp_trace.cli.app import (
    DEFERRED,
    DeferredCommand,
    PlainCommand,
    app,
    command_starts,
    fail,
    may_end_now,
)
from fsdp_trace.errors import UserError

# The commands, in the order the help lists them. `capture` is a stand-in, built when asked
# for (DeferredCommand).
EXTRA_ARGS = {"allow_extra_args": True, "ignore_unknown_options": True}
app.command("capture", cls=DeferredCommand, help=capture.capture.__doc__)(capture._stand_in)
DEFERRED["capture"] = capture.capture_command
app.command(cls=PlainCommand)(analyze.analyze)
app.command(cls=PlainCommand)(whatif.whatif)
app.command(cls=PlainCommand, context_settings=EXTRA_ARGS)(capture.sweep)
app.command(cls=PlainCommand, context_settings=EXTRA_ARGS)(capture.tune)
app.command(cls=PlainCommand)(capture.plot)
app.command(cls=PlainCommand)(analyze.compare)
app.command(cls=PlainCommand)(view.view)
app.add_typer(view.cache_app, name="cache")


class _Output:
    """Standard output or error as the commands write them: a reader that went away (`|
    head -1`, `2>&1 | head -1`) stops the printing, not the command (its files are still
    written, and it exits as it would); a stdout that cannot be written (`> /dev/full`) is a
    one-line error, a stderr that cannot be written is quiet (it is where that line would
    go); text the terminal's encoding cannot show is replaced, never a UnicodeEncodeError.
    Everything else is the stream's own."""

    def __init__(self, stream, errors_said: bool = True) -> None:
        self._stream = stream
        self._errors_said = errors_said  # False: stderr, where an error line cannot go
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
            if not self._errors_said:
                return None
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


class _Closed(io.TextIOBase):
    """A standard stream closed before the command started (`>&-`: Python gives None): every
    write fails as a closed file's does, which `_Output` turns into its one line (on stdout)
    or silence (on stderr). Not a terminal, and no descriptor, as io's base class says."""

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "it is closed")


def _hold_closed_descriptors() -> None:
    """Standard descriptors closed before the command (`>&-`, `2>&-`) held open on
    /dev/null: else the next file opened takes the number (the staged JSON, the report), and
    whatever writes to it by number (a library's C code, a child process) writes into that
    file. Python's own stream stays None (`_Closed`)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            held = os.open(os.devnull, os.O_RDWR)  # the lowest free number: this one
            if held != fd:
                os.dup2(held, fd)
                os.close(held)


def main() -> None:
    command_starts()
    _hold_closed_descriptors()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError):  # not a TextIOWrapper
            stream.reconfigure(errors="backslashreplace" if stream is sys.stderr else "replace")
    sys.stdout = _Output(sys.stdout or _Closed())
    sys.stderr = _Output(sys.stderr or _Closed(), errors_said=False)
    try:
        app()
    except UserError as exc:  # outside a command's own handling: printing --version, --help
        raise SystemExit(fail("", exc.message, exc.exit_code).exit_code) from None


def run() -> None:
    """The `fsdp-trace` command: `main`, and then, after an analysis that wrote its outputs
    (`app.may_end_now`), the process ended without the interpreter's teardown: freeing every
    object of the analysis and every module one by one (~40 ms after a 300 MB trace, ~25 ms
    after a small one: a twentieth of a short run). What the exit would still do is done:
    the functions registered with atexit, the last flush of stdout and stderr."""
    try:
        main()
    except SystemExit as done:
        code = done.code
    else:
        code = 0
    if (code is None or isinstance(code, int)) and may_end_now():
        atexit._run_exitfuncs()  # multiprocessing's among them: its children ended and joined
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            with contextlib.suppress(Exception):  # as the teardown's flush: never a traceback
                stream.flush()
        os._exit(code or 0)
    sys.exit(code)
