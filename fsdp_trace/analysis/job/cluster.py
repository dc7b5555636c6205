"""The per-rank map (`fsdp_trace.analysis.job.perrank`) as tasks on a Dask cluster: the executor
beside the local process pool, for runs with more ranks than one machine analyzes in time.

Each task reads one trace where its worker runs (a path on a shared filesystem, or a URL:
`fsdp_trace.analysis.read.remote`), through the worker's own cache, and sends back only that rank's
`RankAnalysis` without its kernels (`RankAnalysis.without_kernels`: per-step, per-block and
per-collective tables and the figures the run reads of the kernels, never a per-event table,
unless asked for the views that read every rank's: whatif, --perfetto);
where it goes next is the caller's choice:

- `analyze_and_produce` (`fsdp-trace analyze --scheduler`): the results stay on their
  workers and one more task assembles the run where they are (`pipeline.assemble`) and makes
  the command's outputs there; the client receives only those, so its memory stays flat in
  the number of ranks;
- `analyze_all` (`analyze(..., client=)`, `whatif`, `--perfetto`, `--hta`): the client gathers
  results as they finish and drops each future at once, so its memory grows by a rank's
  tables, compact (`RankAnalysis.as_kept`; ~0.36 MB pickled for a 100 MB trace, ~0.9 MB of
  the client's peak RSS; benchmarks/results/dask.md), not by its events.

The views that draw or replay kernels read them again where the run is assembled
(`RankAnalysis.load_kernels`). A trace that fails, or whose worker dies, is a `Failure` naming
its rank: the run is analyzed without it and says so.

`distributed` is imported only here, and this module only when a cluster is asked for
(`--scheduler`, `analyze(..., client=)`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsdp_trace.analysis.job.perrank import (
    Failure,
    SharedGroups,
    TraceInput,
    as_kept,
    lookup_for,
)
from fsdp_trace.analysis.read import cache as cache_mod
from fsdp_trace.analysis.read.trace import rank_from_name
from fsdp_trace.analysis.results import RankAnalysis
from fsdp_trace.errors import UserError

if TYPE_CHECKING:
    from fsdp_trace.result import Result

_LOCAL = re.compile(r"local:(\S+)")
# How long the run waits to reach the scheduler, and with no worker on the cluster (none
# yet, or all gone) before giving up: a cluster still scaling up gets this long.
# FSDP_TRACE_DASK_WAIT_S overrides it.
WAIT_S = 60.0
_POLL_S = 0.05  # how often finished tasks are collected
_CHECK_S = 2.0  # how often the workers are counted while none finishes

# Dask's nannies start workers with MALLOC_TRIM_THRESHOLD_=65536, which also turns off glibc's
# adaptive mmap threshold: every array over 128 KiB is then mmap'd and unmapped, and parsing a
# trace page-faults ~13x as often (one worker 12 % slower on 100 MB ranks;
# benchmarks/results/dask.md). Workers of `local:N` start without it (glibc's
# defaults, as `--jobs`); README says how to start `dask worker` without it (malloc settings
# in the shell's environment take precedence over Dask's).
TRIM_KEY = "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_"

SCHEDULER_FORMS = "tcp://HOST:PORT, a scheduler file (.json), or local:N"


def _distributed() -> Any:
    try:
        import distributed
    except ImportError:
        raise UserError(
            "--scheduler needs Dask's distributed: pip install 'fsdp-trace[dask]'"
        ) from None
    return distributed


def _wait_s() -> float:
    try:
        return max(1.0, float(os.environ.get("FSDP_TRACE_DASK_WAIT_S", WAIT_S)))
    except ValueError:
        return WAIT_S


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def workers_elsewhere(client: Any) -> bool:
    """Whether a worker's working folder is not this process's (a worker on another machine,
    or started in another folder), where a relative path names another file or none; asked
    of the workers connected now (one that cannot be asked counts as elsewhere)."""
    here = os.getcwd()
    try:
        folders = client.run(os.getcwd)
    except Exception:
        return True
    return any(folder != here for folder in folders.values())


@contextlib.contextmanager
def _workers_ignore_ctrl_c() -> Iterator[None]:
    """Ctrl-C ignored here while a LocalCluster starts its worker processes, which keep it
    ignored (a new program inherits an ignored signal): a terminal's Ctrl-C goes to every
    process of its group, and each worker printed a traceback before the command's one line.
    The command ends its workers itself (`connect`). The price: a Ctrl-C pressed in the second
    or so the workers take to start is not seen (holding it back instead, by blocking it,
    does not reach the workers: they are started from Dask's own thread). A handler that
    was not set from Python cannot be set again from it: Python's own is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)


@contextlib.contextmanager
def connect(scheduler: str) -> Iterator[Any]:
    """A `distributed.Client` of the cluster `scheduler` names, closed at the end:
    `local:N` starts a LocalCluster of N worker processes here (one thread each) and shuts it
    down after; `tcp://HOST:PORT` (any address distributed takes) or a scheduler file joins a
    running cluster, which is left running."""
    text = scheduler.strip()
    local = _LOCAL.fullmatch(text)
    if local is not None:
        try:
            workers = int(local.group(1))
        except ValueError:
            workers = 0
        if workers < 1:
            raise UserError(f"--scheduler {text}: give local:N with N worker processes, 1 or more")
        distributed = _distributed()
        import dask

        try:
            with dask.config.set({TRIM_KEY: None}), _workers_ignore_ctrl_c():  # see TRIM_KEY
                cluster = distributed.LocalCluster(
                    n_workers=workers,
                    threads_per_worker=1,  # decoding holds the GIL: processes, not threads
                    processes=True,
                    dashboard_address=":0",  # a free port: never "8787 is in use" on stderr
                    silence_logs=logging.CRITICAL,  # failures come back as notices
                )
        except Exception as exc:
            raise UserError(f"--scheduler {text}: cannot start ({_first_line(exc)})") from None
        try:
            with distributed.Client(cluster) as client:
                yield client
        finally:
            with contextlib.suppress(Exception):
                cluster.close(timeout=10)
        return
    if "://" in text:
        options: dict[str, Any] = {"address": text}
    elif text.endswith(".json"):
        _wait_for_file(Path(text))
        options = {"address": _scheduler_address(Path(text))}
    else:
        raise UserError(f"--scheduler {text}: give {SCHEDULER_FORMS}")
    distributed = _distributed()
    try:
        client = distributed.Client(**options, timeout=_wait_s())
    except Exception as exc:
        raise UserError(
            f"--scheduler {text}: cannot reach the Dask scheduler ({_first_line(exc)}): is it "
            "running? (`dask scheduler` starts one)"
        ) from None
    try:
        yield client
    finally:
        with contextlib.suppress(Exception):
            client.close(timeout=10)


SCHEDULER_FILE_MAX_BYTES = 1 << 20  # `dask scheduler --scheduler-file` writes ~1 KB


def _scheduler_address(path: Path) -> str:
    """The scheduler's address from its scheduler file, read here under a size bound (not
    by distributed, which reads any file whole)."""
    from fsdp_trace.runrecord import open_regular

    try:
        with open_regular(path) as handle:
            data = handle.read(SCHEDULER_FILE_MAX_BYTES + 1)
    except OSError as exc:
        raise UserError(f"--scheduler {path}: cannot read ({exc.strerror or exc})") from None
    if len(data) > SCHEDULER_FILE_MAX_BYTES:
        raise UserError(
            f"--scheduler {path}: over {SCHEDULER_FILE_MAX_BYTES >> 20} MB, not a scheduler "
            "file (`dask scheduler --scheduler-file` writes a few hundred bytes)"
        )
    try:
        address = json.loads(data).get("address")
    except (ValueError, AttributeError):
        address = None
    if not isinstance(address, str) or not address:
        raise UserError(
            f"--scheduler {path}: not a scheduler file (JSON with the scheduler's address): "
            "give the file `dask scheduler --scheduler-file` wrote, or tcp://HOST:PORT"
        )
    return address


def _wait_for_file(path: Path) -> None:
    """A scheduler file that a batch job's `dask scheduler` has not written yet is waited
    for (FSDP_TRACE_DASK_WAIT_S), so one job script can start both."""
    wait = _wait_s()
    deadline = time.monotonic() + wait
    while not path.is_file():
        if time.monotonic() > deadline:
            raise UserError(
                f"--scheduler {path}: no scheduler file there after {wait:.0f} s: start "
                f"`dask scheduler --scheduler-file {path}` (or give tcp://HOST:PORT)"
            )
        time.sleep(0.2)


def _version(everything: bool = False) -> tuple:
    """This process's fsdp-trace version and the hash of its analysis code (run on each
    worker): another checkout of one version differs in the second. `everything`: of all its
    code, and the versions of rich and plotly, for workers that also assemble the run and
    make its outputs."""
    from fsdp_trace import __version__
    from fsdp_trace.analysis.read.cache import code_version

    if not everything:
        return __version__, code_version("analysis")
    from importlib import metadata

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return __version__, code_version("all"), version("rich"), version("plotly")


def _check_workers(client: Any, everything: bool = False) -> None:
    """Some worker is there, and every worker runs this fsdp-trace: results of another
    version could differ from a local run's (`everything`: all of its code, see
    `_version`)."""
    from fsdp_trace import __version__

    where = getattr(client, "scheduler", None)
    where = getattr(where, "address", None) or "the scheduler"
    wait = _wait_s()
    try:
        client.wait_for_workers(1, timeout=wait)
    except Exception:
        raise UserError(
            f"no Dask worker joined {where} in {wait:.0f} s: start some with "
            f"`dask worker {where}` (where fsdp-trace is installed)"
        ) from None
    try:
        versions = client.run(_version, everything)
    except Exception as exc:
        raise UserError(
            f"the Dask workers of {where} cannot run fsdp-trace ({_first_line(exc)}): install "
            f"fsdp-trace {__version__} where they run"
        ) from None
    mine = _version(everything)
    seen = [tuple(v) if isinstance(v, tuple | list) else (v, None) for v in versions.values()]
    other = {str(v[0]) for v in seen if v[0] != __version__}
    if other:
        raise UserError(
            f"the Dask workers of {where} run fsdp-trace {', '.join(sorted(other))}, this client "
            f"{__version__}: install the same version on both"
        )
    if any(v != mine for v in seen):
        raise UserError(
            f"the Dask workers of {where} run other fsdp-trace {__version__} code than this "
            "client (another checkout, or other numpy/pandas/msgspec"
            + ("/rich/plotly" if everything else "")
            + " versions): install the same on both"
        )


def analyze_task(trace: TraceInput, cache: bool, keep: bool = False) -> RankAnalysis | Failure:
    """One trace's analysis on a worker, through the worker's cache (its own
    FSDP_TRACE_CACHE_DIR, else its home's), without its kernels unless `keep`: what travels
    back. A trace that cannot be read is a Failure naming it, not an exception: the other
    tasks and the run go on."""
    cache_mod.defer_for_this_process()  # a worker scans its cache folder now and then
    try:
        lookup = lookup_for(trace, cache)
        result = lookup.hit
        if result is None:
            result = lookup.compute(progress=False, parallel=False)
        return as_kept(result, lookup, keep)
    except UserError as exc:
        return _failure(trace, exc.message)


def _failure(trace: TraceInput, reason: str) -> Failure:
    rank = rank_from_name(Path(str(trace.path)))  # a URL's last part is its name too
    return Failure(str(trace.path), rank, reason, trace.source)


def _outcome(future: Any, trace: TraceInput) -> RankAnalysis | Failure:
    """A finished task's result, or the Failure that says what went wrong, in one line."""
    killed = _distributed().KilledWorker
    status = future.status
    if status == "finished":
        try:
            return future.result()
        except Exception as exc:  # the result could not be brought back
            return _failure(trace, f"{trace.path}: its result was lost ({_first_line(exc)})")
    if status == "error":
        exc = future.exception()
        if isinstance(exc, killed):
            return _failure(
                trace,
                f"{trace.path}: the Dask worker analyzing it died (out of memory? each worker "
                "holds one trace's events, several times the file's size)",
            )
        return _failure(trace, f"{trace.path}: failed on a Dask worker ({_first_line(exc)})")
    return _failure(trace, f"{trace.path}: not analyzed (its task was {status} on the cluster)")


def analyze_all(
    client: Any, work: list[TraceInput], cache: bool, keep: list[bool] | None = None
) -> list[RankAnalysis | Failure]:
    """Every trace's analysis (or Failure) in the order of `work`, computed on the cluster;
    each without its kernels but where `keep` says (per trace: views that read every rank's).

    All tasks are submitted at once (the scheduler spreads them over the workers); each
    result is taken as soon as its task finishes and its future released, so the cluster
    frees it and the client keeps only the small `RankAnalysis`. A cluster left with no
    worker for FSDP_TRACE_DASK_WAIT_S fails the traces not yet analyzed, never hangs."""
    return _run_tasks(client, work, cache, keep, gather=True)[0]


def analyze_and_produce(
    client: Any,
    plan: Any,
    cache: bool,
    assemble: Callable[..., Result],
    produce: Callable[[Result], Any],
) -> Any:
    """What `produce` makes of the Result of `plan` (a `pipeline.Plan`), all of it computed
    on the cluster: each trace analyzed as a task, its result left on its worker, then the
    run assembled where they are (`assemble`: `pipeline.assemble`, in a task of its own,
    whose worker gathers the ranks' results) and `produce` run there. The client holds futures and
    `produce`'s outputs, never a rank's results: its memory stays flat in the number of
    ranks (benchmarks/results/dask.md). A trace that fails is left out of its run, as
    `analyze_all` leaves it; the assembly failing (its worker lost) is one line."""
    work = plan.work
    outcomes, emptied = _run_tasks(client, work, cache, [False] * len(work), gather=False)
    if emptied:  # the results the cluster kept went with its workers
        with contextlib.suppress(Exception):
            client.cancel([o for o in outcomes if not isinstance(o, Failure)])
        raise UserError(
            f"no Dask worker left on the cluster for {_wait_s():.0f} s: nothing written; run again"
        )
    token = uuid.uuid4().hex[:12]
    future = client.submit(
        _assemble_task,
        plan,
        outcomes,
        cache,
        assemble,
        produce,
        key=f"fsdp-trace-run-{token}",
    )
    try:
        return _result(client, future)
    except UserError:
        raise
    except Exception as exc:
        _workers(client)  # a lost scheduler is said as such
        killed = _distributed().KilledWorker
        why = (
            "its Dask worker died (out of memory? it holds every rank's results)"
            if isinstance(exc, killed)
            else f"failed on a Dask worker ({_first_line(exc)})"
        )
        raise UserError(f"the run's assembly: {why}; nothing written") from None
    finally:
        with contextlib.suppress(Exception):
            client.cancel([future, *(o for o in outcomes if not isinstance(o, Failure))])


def _result(client: Any, future: Any) -> Any:
    """The future's result, waited for while some worker is on the cluster: with none for
    FSDP_TRACE_DASK_WAIT_S, one line (never a hang)."""
    wait = _wait_s()
    seen_worker = time.monotonic()
    while True:
        try:
            return future.result(timeout=_CHECK_S)
        except _distributed().TimeoutError:
            pass
        now = time.monotonic()
        if _workers(client) > 0:
            seen_worker = now
        elif now - seen_worker > wait:
            raise UserError(
                f"the run's assembly: no Dask worker left on the cluster for {wait:.0f} s: "
                "nothing written; run again"
            )


def _assemble_task(
    plan: Any, outcomes: list[RankAnalysis | Failure], cache: bool, assemble, produce
) -> Any:
    """`assemble` and `produce` on a worker, from the ranks' results (Dask gathers them here
    from the workers holding them)."""
    shared = SharedGroups()  # what every rank repeats, held once
    outcomes = [shared(o) for o in outcomes]
    with contextlib.ExitStack() as stack:
        if not cache:
            stack.enter_context(cache_mod.off("--no-cache"))
        return produce(assemble(plan, outcomes, cache=cache))


def _run_tasks(
    client: Any, work: list[TraceInput], cache: bool, keep: list[bool], gather: bool
) -> tuple[list[Any], bool]:
    """`analyze_all`'s tasks; `gather`: each result brought to the client (else its
    finished future is kept in its place, the result left on its worker). Also whether the
    cluster emptied (no worker for FSDP_TRACE_DASK_WAIT_S) before every task finished."""
    distributed = _distributed()
    _check_workers(client, everything=not gather)
    token = uuid.uuid4().hex[:12]
    keep = keep or [False] * len(work)
    futures = [
        client.submit(
            analyze_task, trace, cache, keep[i], key=f"fsdp-trace-analyze-{token}-{i}", pure=False
        )
        for i, trace in enumerate(work)
    ]
    index = {f.key: i for i, f in enumerate(futures)}
    outstanding = {f.key: f for f in futures}  # dropped one by one as they are taken
    done = distributed.as_completed(futures, loop=client.loop)
    del futures
    results: list[RankAnalysis | Failure | None] = [None] * len(work)
    emptied = False
    shared = SharedGroups()
    wait = _wait_s()
    checked = seen_worker = time.monotonic()
    with _Progress(len(work)) as progress:
        try:
            while outstanding:
                if not done.has_ready():
                    time.sleep(_POLL_S)
                    now = time.monotonic()
                    if now - checked >= _CHECK_S:
                        checked = now
                        if _workers(client) > 0:
                            seen_worker = now
                        elif now - seen_worker > wait:
                            emptied = True
                            break
                    continue
                for future in done.next_batch(block=False):
                    if future.status in ("lost", "pending"):  # its worker died holding the
                        done.add(future)  # result: the scheduler computes it again
                        continue
                    i = index[future.key]
                    outstanding.pop(future.key, None)
                    progress.advance()
                    if not gather and future.status == "finished":
                        results[i] = future  # its result stays on its worker
                        continue
                    results[i] = shared(_outcome(future, work[i]))
                    future.release()
        finally:  # interrupted, or the cluster emptied: leave no task of ours behind
            done.clear()
            if outstanding:
                with contextlib.suppress(Exception):
                    client.cancel(list(outstanding.values()))
    for i, result in enumerate(results):
        if result is None:
            results[i] = _failure(
                work[i],
                f"{work[i].path}: not analyzed: no Dask worker left on the cluster for "
                f"{wait:.0f} s",
            )
    return results, emptied  # type: ignore[return-value]


def _workers(client: Any) -> int:
    """Workers on the cluster now; a lost scheduler is a one-line error."""
    try:
        return len(client.nthreads())
    except Exception as exc:
        raise UserError(
            f"lost the Dask scheduler ({_first_line(exc)}): nothing written; run again"
        ) from None


class _Progress:
    """Traces analyzed so far on the cluster, on stderr when it is a terminal."""

    def __init__(self, total: int) -> None:
        self.bar = None
        if sys.stderr.isatty() and not os.environ.get("FSDP_TRACE_QUIET"):
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self.bar = Progress(
                TextColumn("analyzing traces on the cluster"),
                BarColumn(),
                MofNCompleteColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self.task = self.bar.add_task("traces", total=total)

    def __enter__(self) -> _Progress:
        if self.bar is not None:
            self.bar.start()
        return self

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.advance(self.task)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()
