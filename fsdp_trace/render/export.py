"""--json / --csv: every number of the analysis, with stable column names, written atomically;
and the checks that every output path is writable before anything runs."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import pandas as pd

from fsdp_trace import atomic
from fsdp_trace.errors import UserError
from fsdp_trace.result import Result


def write_json(result: Result, path: Path) -> None:
    """Everything (`present.payload.to_json`), as --json writes it: `json.dumps(..., indent=1)`'s
    text, made by its C encoder (compact) and indented by msgspec (the same bytes; the
    indenting encoder is pure Python and ~10x slower)."""
    import msgspec

    from fsdp_trace.present.payload import to_json

    payload = to_json(result)
    try:
        text = msgspec.json.format(json.dumps(payload).encode(), indent=1)
    except msgspec.DecodeError:
        # A lone surrogate (how Python holds the bytes of a file name that are not UTF-8),
        # which strict JSON readers refuse: each written as "?".
        text = json.dumps(payload, ensure_ascii=False).encode("utf-8", errors="replace")
        text = msgspec.json.format(text, indent=1)
    atomic.write_text(path, text.decode() + "\n")


CSV_NAMES = ("steps", "breakdown", "blocks", "collectives")  # tables, one NAME.csv each


def csv_table(result: Result, name: str) -> pd.DataFrame:
    """One table over every run (a `run` column first when there are several)."""
    frames = [getattr(run, name) for run in result.runs]
    if len(frames) == 1:
        return frames[0]
    return pd.concat(
        [
            f.assign(run=run.name)[["run", *f.columns]]
            for f, run in zip(frames, result.runs, strict=True)
        ],
        ignore_index=True,
    )


def write_csv_files(result: Result, folder: Path) -> None:
    """steps.csv, breakdown.csv, blocks.csv and collectives.csv into `folder` (a staged
    folder: the caller moves it into place with the other outputs)."""
    try:
        for name in CSV_NAMES:
            csv_table(result, name).to_csv(folder / f"{name}.csv", index=False)
    except OSError as exc:
        raise UserError(f"{folder}: cannot write ({exc.strerror or exc})") from None


def _first_existing(path: Path) -> Path:
    """`path` or its nearest ancestor that exists (the folder that new folders go into)."""
    for candidate in (path, *path.parents):
        if candidate.exists() or candidate.is_symlink():
            return candidate
    return Path.cwd()


def output_problem(path: Path, folder: bool = False) -> str | None:
    """Why `path` cannot be written as an output file (or, with folder, an output folder);
    None when it can. Checked before anything is written, so a bad path costs nothing."""
    try:
        return _output_problem(Path(path), folder)
    except OSError as exc:  # a name too long, a loop of links, ...
        return f"cannot be used as a path ({exc.strerror or exc}): give another path"


def _output_problem(path: Path, folder: bool) -> str | None:
    if path.exists():
        if folder and not path.is_dir():
            return "exists and is not a folder: give a folder path"
        if not folder and path.is_dir():
            return "is a folder: give a file path"
        if not folder and not path.is_file():
            return "exists and is not a regular file: give a file path"
    parent = path if folder and path.is_dir() else path.parent
    base = _first_existing(parent)
    if not base.is_dir():
        return f"{base} is a file, not a folder: choose another path"
    if not os.access(base, os.W_OK | os.X_OK):
        return f"no permission to write in {base}"
    return None


def check_outputs(
    files: dict[str, Path | None],
    folders: dict[str, Path | None],
    inputs: list[Path] = (),
) -> None:
    """Every output path of one command (option name -> path), before anything is written:
    one UserError naming the first bad one, two options that would write the same file, or an
    output that would replace one of the `inputs`."""
    protected = {os.path.realpath(p) for p in inputs}
    for option, path in files.items():
        if path is not None and os.path.realpath(path) in protected:
            raise UserError(
                f"{option} {path}: is one of the inputs: refusing to overwrite it, give another "
                "path"
            )
    for option, path in folders.items():
        if path is not None and any(
            os.path.dirname(p) == os.path.realpath(path) and os.path.basename(p).endswith(".csv")
            for p in protected
        ):
            raise UserError(f"{option} {path}: would overwrite an input: give another folder")
    seen: dict[Path, str] = {}
    for option, path, is_folder in [
        *((o, p, False) for o, p in files.items()),
        *((o, p, True) for o, p in folders.items()),
    ]:
        if path is None:
            continue
        problem = output_problem(path, folder=is_folder)
        if problem:
            raise UserError(f"{option} {path}: {problem}")
        key = Path(os.path.abspath(path))
        if key in seen:
            raise UserError(f"{option} {path}: {seen[key]} writes there too: give another path")
        seen[key] = option


class StagedOutputs:
    """Outputs written beside their targets under temporary names, then moved into place
    together by `commit`: a failure before that leaves no output behind, half-written or
    whole, and removes the folders it created."""

    def __init__(self) -> None:
        self.files: list[tuple[Path, Path]] = []  # (staged, final)
        self.folders: list[tuple[Path, Path]] = []
        self.created: list[Path] = []  # folders made for the outputs, outermost first

    def __enter__(self) -> StagedOutputs:
        return self

    def __exit__(self, exc_type, *exc: object) -> None:
        if exc_type is not None:
            self.abort()

    def _make_parent(self, path: Path) -> None:
        missing = [p for p in (path, *path.parents) if not p.exists()]
        try:
            for folder in reversed(missing):
                folder.mkdir()
                self.created.append(folder)
        except OSError as exc:
            raise UserError(f"{path}: cannot create the folder ({exc.strerror or exc})") from None

    def file(self, final: Path) -> Path:
        """Where to write the output that will become `final`."""
        final = Path(final)
        self._make_parent(final.parent)
        staged = final.parent / f".{final.name}.staged-{os.getpid()}"
        self.files.append((staged, final))
        return staged

    def folder(self, final: Path) -> Path:
        """A folder to write the files that will go into the folder `final`."""
        final = Path(final)
        self._make_parent(final.parent)
        try:
            staged = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
        except OSError as exc:
            raise UserError(f"{final}: cannot write ({exc.strerror or exc})") from None
        self.folders.append((staged, final))
        return staged

    def commit(self) -> None:
        """Move every staged output into place."""
        try:
            for staged, final in self.folders:
                final.mkdir(exist_ok=True)
                for item in sorted(staged.iterdir()):
                    os.replace(item, final / item.name)
                staged.rmdir()
            for staged, final in self.files:
                os.replace(staged, final)
        except OSError as exc:
            raise UserError(f"cannot move an output into place ({exc})") from None
        self.files, self.folders, self.created = [], [], []

    def abort(self) -> None:
        for staged, _ in self.files:
            staged.unlink(missing_ok=True)
        for staged, _ in self.folders:
            shutil.rmtree(staged, ignore_errors=True)
        for folder in reversed(self.created):
            with contextlib.suppress(OSError):  # not empty: something else wrote there
                folder.rmdir()
        self.files, self.folders, self.created = [], [], []
