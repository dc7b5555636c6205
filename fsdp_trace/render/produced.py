"""`fsdp-trace analyze`'s outputs, made where its run is assembled: on a Dask worker
(`fsdp_trace.analysis.job.cluster.analyze_and_produce`), so that the client receives the
command's outputs, not every rank's results (its memory stays flat in the number of ranks).

`Produce` is what the command asks for, sent to the worker with the tasks; `Produced` is
what comes back: the gate's violations, the terminal's text (rendered for the client's
console: its width, colours and whether it is a terminal) and the bytes of each file output,
made by the writers a local run uses, compressed (--json and --csv grow with ranks ×
collectives; compressed, the client holds a tenth of them, and writes them out a piece at a
time). The client prints the text and writes the files as a local run does (staged, all or
nothing).
"""

from __future__ import annotations

import io
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from fsdp_trace.diagnose.gate import Condition
    from fsdp_trace.result import Result


@dataclass(frozen=True)
class ConsoleSpec:
    """The client's console, as the worker renders for it: its size (both: rich takes a
    width alone as 80 columns under TERM=dumb), colours, whether it is a terminal, and its
    stream's encoding (rich draws ASCII boxes where it is not UTF-8)."""

    width: int
    height: int
    color_system: str | None  # rich's name ("truecolor", "256", ...); None: no colours
    terminal: bool
    no_color: bool
    encoding: str

    @classmethod
    def of(cls, console: Console) -> ConsoleSpec:
        return cls(
            console.width,
            console.height,
            console.color_system,
            console.is_terminal,
            console.no_color,
            console.encoding,
        )

    def console(self, file: io.StringIO) -> Console:
        from rich.console import Console

        return Console(
            file=_Text(file, self.encoding),
            width=self.width,
            height=self.height,
            color_system=self.color_system,  # type: ignore[arg-type]
            force_terminal=self.terminal,
            no_color=self.no_color,
        )


class _Text(io.TextIOBase):
    """A text buffer that says it is of the client's stream's encoding (rich reads
    `file.encoding`)."""

    def __init__(self, buffer: io.StringIO, encoding: str) -> None:
        self.buffer_, self._encoding = buffer, encoding

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self._encoding

    def write(self, text: str) -> int:
        return self.buffer_.write(text)

    def writable(self) -> bool:
        return True


@dataclass(frozen=True)
class Produced:
    """A run's outputs, made on a worker; each file's bytes compressed (`write` them)."""

    violated: list[str]  # the --fail-on conditions that hold
    terminal: str  # the terminal output, as the client's console prints it
    runs: int  # how many runs the inputs held
    json: bytes | None = None
    csv: dict[str, bytes] = field(default_factory=dict)  # file name -> bytes
    report: bytes | None = None


PIECE = 1 << 20  # bytes inflated at a time


def write(packed: bytes, path: Path) -> None:
    """A file of `Produced` to `path` (atomically), inflated a piece at a time."""
    from fsdp_trace import atomic

    inflate = zlib.decompressobj()
    with atomic.atomic_open(path, "wb") as handle:
        rest = packed
        while rest:
            handle.write(inflate.decompress(rest, PIECE))
            rest = inflate.unconsumed_tail
        handle.write(inflate.flush())


def _packed(data: bytes) -> bytes:
    return zlib.compress(data, 1)  # JSON, CSV and HTML shrink ~5-10x even so


@dataclass(frozen=True)
class Produce:
    """What the command makes of the assembled Result: the gate, the terminal's text, and
    the file outputs asked for (--json, --csv, --report)."""

    top: int
    conditions: tuple[Condition, ...]
    console: ConsoleSpec
    json: bool = False
    csv: bool = False
    report: bool = False

    def __call__(self, result: Result) -> Produced:
        from fsdp_trace.diagnose import gate
        from fsdp_trace.render import export, terminal

        # The gate can refuse a condition (a run metric without run.json): before any output.
        violated = gate.violations(list(self.conditions), result.runs)
        text = io.StringIO()
        terminal.render(result, console=self.console.console(text), top=self.top)
        files: dict[str, Any] = {}
        with tempfile.TemporaryDirectory(prefix="fsdp-trace-produce-") as tmp:
            if self.json:
                export.write_json(result, Path(tmp) / "out.json")
                files["json"] = _packed((Path(tmp) / "out.json").read_bytes())
            if self.csv:
                folder = Path(tmp) / "csv"
                folder.mkdir()
                export.write_csv_files(result, folder)
                files["csv"] = {
                    f"{n}.csv": _packed((folder / f"{n}.csv").read_bytes())
                    for n in export.CSV_NAMES
                }
        if self.report:
            from fsdp_trace.render.report import render_html

            files["report"] = _packed(render_html(result).encode("utf-8"))
        return Produced(violated, text.getvalue(), len(result.runs), **files)
