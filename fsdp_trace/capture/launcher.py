"""`fsdp-trace capture --nproc-per-node N` without torchrun: start torchrun's own machinery.

The launcher re-runs `python -m fsdp_trace capture ...` on every rank through
`torch.distributed.run`, then reports the first failing rank's one-line error.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fsdp_trace.capture.config import CaptureConfig
from fsdp_trace.capture.outputs import (
    ARGV_ENV,
    COMMAND_ENV,
    ERROR_DIR_ENV,
    out_dir_problem,
    remove_incomplete_outputs,
)
from fsdp_trace.errors import UserError

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
    """torchrun's rendezvous options, passed through unchanged for multi-node runs."""

    nnodes: str = "1"
    node_rank: int | None = None
    rdzv_backend: str | None = None
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    master_addr: str | None = None
    master_port: int | None = None

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


def first_error(folder: Path) -> dict | None:
    """The earliest error any rank wrote: the cause, not the ranks torn down after it."""
    errors = []
    for path in folder.glob("rank*.json"):
        try:
            errors.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return min(errors, key=lambda e: e["time"]) if errors else None


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


def interrupted(out: Path, created: bool, signum: int) -> CaptureFailed:
    """Ctrl-C / SIGTERM: the ranks are stopped; take back what they wrote, say so once."""
    remove_incomplete_outputs(out, created)
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
    import torch
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    nproc = nproc_per_node or default_nproc()
    if cfg.device != "cpu" and torch.cuda.is_available() and nproc > torch.cuda.device_count():
        raise UserError(
            f"--nproc-per-node {nproc} but only {torch.cuda.device_count()} GPUs are visible: "
            "lower it (or pass --device cpu)"
        )
    out = Path(cfg.out)
    existed = out.exists()
    args = [
        f"--nproc-per-node={nproc}",
        *rendezvous.torchrun_args(),
        "--max-restarts=0",
        "--module",
        "fsdp_trace",
        "capture",
        *cfg.to_cli_args(),
    ]
    parsed = torchrun.parse_args(args)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    quiet_elastic_loggers()
    recorded = {
        COMMAND_ENV: cfg.capture_command(nproc, rendezvous.capture_args()),
        ARGV_ENV: json.dumps(sys.argv),
    }
    with (
        tempfile.TemporaryDirectory(prefix="fsdp-trace-errors-") as folder,
        restored_signal_handlers(),
    ):
        os.environ.update({**recorded, ERROR_DIR_ENV: folder})
        try:
            torchrun.run(parsed)
        except ChildFailedError as exc:
            remove_incomplete_outputs(out, created=not existed)
            error = first_error(Path(folder))
            if error is None:
                rank, failure = next(iter(exc.failures.items()))
                raise CaptureFailed(
                    f"rank {rank} exited with code {failure.exitcode} and left no message", 1
                ) from None
            raise CaptureFailed(
                f"rank {error['rank']}: {error['message']}", error["code"]
            ) from None
        except SignalException as exc:
            raise interrupted(out, not existed, int(exc.sigval)) from None
        except KeyboardInterrupt:  # before the agent installed its handlers
            raise interrupted(out, not existed, int(signal.SIGINT)) from None
        except RendezvousError as exc:
            remove_incomplete_outputs(out, created=not existed)
            first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise CaptureFailed(
                f"rendezvous failed ({first_line}): check --nnodes, --rdzv-endpoint and that "
                "every node started",
                1,
            ) from None
        finally:
            for name in (*recorded, ERROR_DIR_ENV):
                os.environ.pop(name, None)
