"""Helpers for tests/test_dask.py that Dask workers import too (so: no pytest here): a trace
reader that ends its worker process, as the kernel's OOM killer would mid-parse, and a real
`dask scheduler` + `dask worker` cluster on 127.0.0.1, always stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from distributed.diagnostics.plugin import WorkerPlugin

REPO = Path(__file__).resolve().parent.parent
DIES = ".die.json"  # a file named so ends the worker process reading it


def _die(path: object, **options: object) -> None:
    os._exit(1)


def register_dying_reader() -> None:
    """Read `*.die.json` with `_die`, ahead of the Kineto reader (which takes any .json)."""
    from fsdp_trace.analysis.read import readers

    if not any(r.name == "dies" for r in readers.READERS):
        readers.READERS.insert(0, readers.Reader("dies", (DIES,), _die))


def unregister_dying_reader() -> None:
    from fsdp_trace.analysis.read import readers

    readers.READERS[:] = [r for r in readers.READERS if r.name != "dies"]


class DyingReader(WorkerPlugin):
    """Registers the dying reader on every worker, restarted ones included."""

    name = "fsdp-trace-test-dying-reader"

    def setup(self, worker: object) -> None:
        register_dying_reader()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def cli_cluster(logs: Path, workers: int = 2, env: dict | None = None) -> Iterator[str]:
    """`dask scheduler` and `workers` × `dask worker` (one thread each) on 127.0.0.1 at a
    free port; yields the scheduler's address; every process is stopped at the end (its
    process group: SIGTERM, then SIGKILL after 10 s). Logs land in `logs`."""
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    dask = [sys.executable, "-m", "dask"]  # the `dask` command of this environment
    full_env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        **(env or {}),
    }
    procs: list[subprocess.Popen] = []

    def start(args: list[str], name: str) -> None:
        out = open(logs / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        procs.append(
            subprocess.Popen(
                dask + args,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=full_env,
                cwd=REPO,
                start_new_session=True,
            )
        )

    try:
        start(
            ["scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
            "scheduler",
        )
        deadline = time.monotonic() + 30
        while not _listening(port):
            if time.monotonic() > deadline or procs[0].poll() is not None:
                raise RuntimeError(f"dask scheduler did not start: see {logs}/scheduler.log")
            time.sleep(0.1)
        for i in range(workers):
            start(
                [
                    "worker",
                    address,
                    "--nthreads",
                    "1",
                    "--no-dashboard",
                    "--host",
                    "127.0.0.1",
                    "--name",
                    f"w{i}",
                ],
                f"worker{i}",
            )
        yield address
    finally:
        for proc in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
