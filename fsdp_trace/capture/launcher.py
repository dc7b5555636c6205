"""`fsdp-trace capture --nproc-per-node N` without torchrun: start torchrun's own machinery.

The launcher checks what it can first (options, --out and its lock, the model factory),
takes --out's lock (single node) and re-runs `python -m fsdp_trace capture ...` on every rank
through `torch.distributed.run`, then reports on one line the rank that failed first: one
killed by a signal, else the earliest error a rank wrote.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fsdp_trace.capture.config import CaptureConfig
from fsdp_trace.capture.outputs import (
    ARGV_ENV,
    COMMAND_ENV,
    ERROR_DIR_ENV,
    LOCK_ENV,
    OutLock,
    lock_for_cleanup,
    lock_out_dir,
    out_dir_problem,
    remove_empty_dir,
    remove_incomplete_outputs,
)
from fsdp_trace.errors import UserError
from fsdp_trace.fmt import agree, plural

# The signals torchrun's agent turns into SignalException (its default list).
AGENT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


def parse_nnodes(text: str) -> tuple[int, int]:
    """`--nnodes N` or `MIN:MAX`, as torchrun takes it, checked before torchrun sees it."""
    parts = str(text).split(":")
    try:
        if len(parts) > 2:
            raise ValueError
        low, high = int(parts[0]), int(parts[-1])
    except ValueError:
        raise UserError(
            f"--nnodes must be a node count like 2 or a range MIN:MAX like 1:4, not {text!r}"
        ) from None
    if low < 1 or high < low:
        raise UserError(f"--nnodes {text}: need 1 <= MIN <= MAX")
    return low, high


def check_port(option: str, port: int | str) -> None:
    try:
        ok = 1 <= int(port) <= 65535
    except ValueError:
        ok = False
    if not ok:
        raise UserError(f"{option}: the port must be a number from 1 to 65535, not {port!r}")


@dataclass
class Rendezvous:
    """How many processes the standalone launcher starts here, and torchrun's rendezvous
    options, passed through unchanged for multi-node runs. Like CaptureConfig, each field's
    docstring is its `fsdp-trace capture --help` text."""

    nproc_per_node: int | None = None
    """Processes on this node when not run under torchrun (default: GPUs, or 1)."""
    nnodes: str = "1"
    """torchrun --nnodes: N or MIN:MAX (multi-node: give the rendezvous options too)."""
    node_rank: int | None = None
    """torchrun --node-rank."""
    rdzv_backend: str | None = None
    """torchrun --rdzv-backend (e.g. c10d)."""
    rdzv_endpoint: str | None = None
    """torchrun --rdzv-endpoint (HOST:PORT)."""
    rdzv_id: str | None = None
    """torchrun --rdzv-id."""
    master_addr: str | None = None
    """torchrun --master-addr."""
    master_port: int | None = None
    """torchrun --master-port."""

    @property
    def single_node(self) -> bool:
        return self.nnodes == "1" and not self.rdzv_endpoint and not self.master_addr

    def validate(self) -> Rendezvous:
        _, max_nodes = parse_nnodes(self.nnodes)
        if self.node_rank is not None and not 0 <= self.node_rank < max_nodes:
            raise UserError(f"--node-rank must be in [0, {max_nodes}), not {self.node_rank}")
        if self.master_port is not None:
            check_port("--master-port", self.master_port)
        if self.rdzv_endpoint and ":" in self.rdzv_endpoint:
            check_port(f"--rdzv-endpoint {self.rdzv_endpoint}", self.rdzv_endpoint.rsplit(":")[-1])
        return self

    def _set_options(self) -> list[tuple[str, object]]:
        """The rendezvous options given, as (flag, value) pairs."""
        pairs = (
            ("--node-rank", self.node_rank),
            ("--rdzv-backend", self.rdzv_backend),
            ("--rdzv-endpoint", self.rdzv_endpoint),
            ("--rdzv-id", self.rdzv_id),
            ("--master-addr", self.master_addr),
            ("--master-port", self.master_port),
        )
        return [(flag, value) for flag, value in pairs if value is not None]

    def capture_args(self) -> list[str]:
        """These options as `fsdp-trace capture` takes them (for the recorded command)."""
        if self.single_node:
            return []
        args = ["--nnodes", self.nnodes]
        for flag, value in self._set_options():
            args += [flag, str(value)]
        return args

    def torchrun_args(self) -> list[str]:
        if self.single_node:
            return ["--standalone", "--nnodes=1"]
        return [f"--nnodes={self.nnodes}"] + [f"{f}={v}" for f, v in self._set_options()]


class CaptureFailed(Exception):
    """A rank failed; the message is that rank's one-line error."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


def default_nproc() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 1


def rank_errors(folder: Path) -> dict[int, dict]:
    """The one-line errors the ranks wrote, by rank."""
    errors = {}
    for path in folder.glob("rank*.json"):
        try:
            error = json.loads(path.read_text())
            errors[int(error["rank"])] = error
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return errors


def death_signal(exit_code: int | None) -> signal.Signals | None:
    """The signal that ended a rank: a negative exit code (killed), or 128 + N (a rank that
    turned SIGTERM / SIGINT into its exit)."""
    if exit_code is None:
        return None
    number = -exit_code if exit_code < 0 else exit_code - 128 if exit_code > 128 else 0
    try:
        return signal.Signals(number) if number else None
    except ValueError:
        return None


# Which signal death is the cause when several ranks died by one: a kill or a crash comes
# first; SIGABRT is how a rank that lost its peer often ends (NCCL's watchdog aborts).
_SIGNAL_ORDER = {"SIGKILL": 0, "SIGSEGV": 0, "SIGBUS": 0, "SIGILL": 0, "SIGFPE": 0, "SIGABRT": 2}
_SIGNAL_WHY = {
    "SIGKILL": "the kernel's out-of-memory killer, see dmesg, or a kill from outside",
    "SIGSEGV": "a crash in native code",
    "SIGBUS": "a crash in native code",
    "SIGILL": "a crash in native code",
    "SIGFPE": "a crash in native code",
    "SIGABRT": "an abort in native code",
}


@contextmanager
def failures_before_teardown() -> Iterator[set[int]]:
    """The pids of the ranks that had already failed when torchrun's agent began stopping the
    others (its first `close()`): the ranks it then stops (SIGTERM, SIGKILL after 30 s for
    one stuck in a collective) are recorded among the failures too, and are not the cause.
    Empty if this torch's agent does not expose them (the report then goes by written errors
    alone)."""
    from torch.distributed.elastic.multiprocessing import api

    early: set[int] = set()
    original = api.PContext.close

    def close(self, *args, **kwargs):
        failures = getattr(self, "_failures", None)
        if not early and isinstance(failures, dict):
            early.update(getattr(f, "pid", None) for f in failures.values())
            early.discard(None)
        return original(self, *args, **kwargs)

    api.PContext.close = close
    try:
        yield early
    finally:
        api.PContext.close = original


def failure_report(
    exit_codes: Mapping[int, int | None],
    errors: Mapping[int, dict],
    alone: bool = False,
    early: set[int] | None = None,
) -> CaptureFailed:
    """One line for a failed job, from the exit codes of the ranks torchrun saw fail and the
    errors ranks wrote. `early`: the ranks among them that failed before torchrun stopped the
    rest (None: not known).

    A rank that died by a signal without a word (SIGKILL: the OOM killer, a user) is the
    cause: the others then fail in their next collective with a connection error, which they
    do write, often before torchrun notices the dead rank. Else the earliest written error."""
    killed = {
        rank: sig
        for rank, code in exit_codes.items()
        if early is not None
        and rank in early
        and rank not in errors
        and (sig := death_signal(code)) is not None
    }
    if killed:
        rank = min(killed, key=lambda r: (_SIGNAL_ORDER.get(killed[r].name, 1), r))
        sig, code = killed[rank], exit_codes[rank]
        why = _SIGNAL_WHY.get(sig.name)
        verb = "killed" if code is not None and code < 0 else "stopped"
        message = (
            f"rank {rank} was {verb} by {sig.name} (exit code {code}{': ' + why if why else ''})"
        )
        if not alone:
            message += "; the other ranks stopped after it"
        return CaptureFailed(message, 1)
    if errors:
        error = min(errors.values(), key=lambda e: e["time"])
        return CaptureFailed(f"rank {error['rank']}: {error['message']}", error["code"])
    rank = min(exit_codes)
    return CaptureFailed(f"rank {rank} exited with code {exit_codes[rank]} and left no message", 1)


def quiet_elastic_loggers() -> None:
    """torchrun's agent logs warnings ("Received 15 death signal ...") on loggers that each
    set their own level: silence them all; fsdp-trace reports failures on one line itself."""
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def require_torch() -> None:
    """Capture runs PyTorch; without it, say how to install it instead of a traceback."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name == "torch":
            raise UserError(
                'capture needs PyTorch, which is not installed: pip install "fsdp-trace[capture]"'
                " (or the torch build for your CUDA)"
            ) from None
        raise UserError(f"capture needs PyTorch, but importing it failed: {exc}") from None


def check_launch(cfg: CaptureConfig, nproc_per_node: int | None, rendezvous: Rendezvous) -> None:
    """Everything torchrun would reject with a traceback (or accept silently), checked first."""
    if nproc_per_node is not None and nproc_per_node < 1:
        raise UserError(f"--nproc-per-node must be at least 1, not {nproc_per_node}")
    rendezvous.validate()
    problem = out_dir_problem(Path(cfg.out), cfg.overwrite)
    if problem:
        raise UserError(problem)


def check_factory(model: str) -> None:
    """A factory model that cannot be imported fails here, before any rank starts. It is
    imported as the ranks will import it (`python -m`: the working directory first on the
    path); they import it anyway, so doing it once more here costs nothing new."""
    from fsdp_trace.capture.models import check_model

    cwd = os.getcwd()
    sys.path.insert(0, cwd)
    try:
        check_model(model)
    finally:
        sys.path.remove(cwd)


@contextmanager
def restored_signal_handlers() -> Iterator[None]:
    """torchrun's agent installs handlers that raise SignalException and leaves them in place;
    put the caller's back, so a later Ctrl-C (between a sweep's captures) is an ordinary one."""
    saved = {}
    for name in AGENT_SIGNALS:
        sig = getattr(signal, name, None)
        if sig is not None:
            saved[sig] = signal.getsignal(sig)
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)


def take_back(out: Path, created: bool, lock: OutLock | None) -> None:
    """After a failed or interrupted run: remove what it wrote, under --out's lock (never the
    files of another capture that took --out since)."""
    with lock_for_cleanup(out, lock) as allowed:
        if allowed:
            remove_incomplete_outputs(out, created)


def interrupted(out: Path, created: bool, signum: int, lock: OutLock | None) -> CaptureFailed:
    """Ctrl-C / SIGTERM: the ranks are stopped; take back what they wrote, say so once."""
    take_back(out, created, lock)
    name = signal.Signals(signum).name
    return CaptureFailed(
        f"interrupted by {name}: every rank stopped, no run written "
        f"(incomplete traces and temp files removed from {out})",
        128 + signum,
    )


def launch(cfg: CaptureConfig, nproc_per_node: int | None, rendezvous: Rendezvous) -> None:
    """Run the capture on `nproc_per_node` local processes (and other nodes via rendezvous)."""
    check_launch(cfg, nproc_per_node, rendezvous)
    require_torch()
    check_factory(cfg.model)
    import torch
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    nproc = nproc_per_node or default_nproc()
    if cfg.device != "cpu" and torch.cuda.is_available() and nproc > torch.cuda.device_count():
        visible = torch.cuda.device_count()
        raise UserError(
            f"--nproc-per-node {nproc} but only {plural(visible, 'GPU')} "
            f"{agree(visible, 'is', 'are')} visible: lower it (or pass --device cpu)"
        )
    out = Path(cfg.out)
    existed = out.exists()
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    quiet_elastic_loggers()
    recorded = {
        COMMAND_ENV: cfg.capture_command(nproc, rendezvous.capture_args()),
        ARGV_ENV: json.dumps(sys.argv),
    }
    # One node: the launcher holds --out's lock from before any rank starts until the last
    # has exited, and tells the ranks its token. Several nodes: each node's local rank 0
    # takes it (the token is agreed on between the ranks), as under a plain torchrun.
    lock: OutLock | None = None
    if rendezvous.single_node:
        token = uuid.uuid4().hex
        lock = lock_out_dir(out, token)
        recorded[LOCK_ENV] = token
    try:
        with (
            tempfile.TemporaryDirectory(prefix="fsdp-trace-errors-") as folder,
            restored_signal_handlers(),
        ):
            os.environ.update({**recorded, ERROR_DIR_ENV: folder})
            # torchrun's agent makes a log folder per run (without --log-dir, a new
            # /tmp/torchelastic_* left behind by every capture): this run's goes with `folder`.
            parsed = torchrun.parse_args(
                [
                    f"--nproc-per-node={nproc}",
                    *rendezvous.torchrun_args(),
                    "--max-restarts=0",
                    f"--log-dir={Path(folder) / 'torchrun'}",
                    "--module",
                    "fsdp_trace",
                    "capture",
                    *cfg.to_cli_args(),
                ]
            )
            try:
                with failures_before_teardown() as early_pids:
                    torchrun.run(parsed)
            except ChildFailedError as exc:
                take_back(out, not existed, lock)
                failures = exc.failures
                codes = {rank: failure.exitcode for rank, failure in failures.items()}
                early = {r for r, f in failures.items() if f.pid in early_pids} or None
                alone = rendezvous.single_node and nproc == 1
                raise failure_report(codes, rank_errors(Path(folder)), alone, early) from None
            except SignalException as exc:
                raise interrupted(out, not existed, int(exc.sigval), lock) from None
            except KeyboardInterrupt:  # before the agent installed its handlers
                raise interrupted(out, not existed, int(signal.SIGINT), lock) from None
            except RendezvousError as exc:
                take_back(out, not existed, lock)
                first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                raise CaptureFailed(
                    f"rendezvous failed ({first_line}): check --nnodes, --rdzv-endpoint and "
                    "that every node started",
                    1,
                ) from None
            finally:
                for name in (*recorded, ERROR_DIR_ENV):
                    os.environ.pop(name, None)
    finally:
        if lock is not None:
            lock.release()
        if not existed:
            remove_empty_dir(out)
