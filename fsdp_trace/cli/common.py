"""What several commands share: the cache switched off, the libraries imported (collector
paused, BLAS on one thread), inputs resolved, a Dask client, where outputs land beside their
inputs."""

import gc
import os
import sys
import typing
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from fsdp_trace.errors import UserError
from fsdp_trace.fmt import plural
from fsdp_trace.printable import printable


@contextmanager
def no_cache_if(no_cache: bool) -> Iterator[None]:
    """`--no-cache`: caching off for the whole command, so that nothing is read from or written
    to the cache folder (parsed traces, analyses, the packed plotly.js of the pages)."""
    if not no_cache:
        yield
        return
    # The cache folder's policy alone: the cache's entries import pandas, which the command
    # imports later, with the collector paused (`importing_libraries`).
    from fsdp_trace.analysis.read import cachefolder

    with cachefolder.off("--no-cache"):
        yield


@contextmanager
def importing_libraries() -> Iterator[None]:
    """While a command imports numpy, pandas and the analysis behind them:

    - Python's cyclic garbage collector off, and what they made frozen after: importing numpy
      and pandas creates ~10^5 objects, and each collection pass during the imports (and,
      unfrozen, every full pass later) scans them all, ~30 ms of a 0.3 s start. Imports leave
      no cyclic garbage to collect.
    - numpy's BLAS on one thread (`one_blas_thread`)."""
    one_blas_thread()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def one_blas_thread() -> None:
    """OpenBLAS, which numpy's wheels bundle, starts a thread per core when numpy is imported,
    and those threads spin: ~0.1 s of CPU at every start (a core of two, while the command
    imports), for nothing: no command here does linear algebra. One thread, unless the user
    chose a number (OpenBLAS reads any of these) or numpy is imported already (it reads the
    setting once, at import). The setting passes to the processes the command starts (its
    pool, a local Dask cluster), which do no linear algebra either."""
    chosen = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
    if "numpy" not in sys.modules and not any(name in os.environ for name in chosen):
        os.environ["OPENBLAS_NUM_THREADS"] = "1"


def analyze_modules() -> SimpleNamespace:
    """What `analyze` uses, imported (pandas, numpy, msgspec and the analysis behind them):
    the command's own imports, in one place so that benchmarks/speed_targets.py times these."""
    with importing_libraries():
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


def cluster_client(scheduler: str | None, jobs: int | None) -> AbstractContextManager[Any]:
    """The Dask client `--scheduler` asks for (None without it), closed at the end."""
    if scheduler is None:
        return nullcontext(None)
    if jobs not in (None, 1):
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


def run_inputs(runs: list[Path]) -> list[Path]:
    """The files `plot` and `compare` read in each run directory (run.json, analysis.json,
    traces): never an output."""
    return [p for run in runs for p in run.iterdir() if p.name.endswith(TRACE_SUFFIXES)]


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
