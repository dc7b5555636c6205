"""`fsdp-trace capture --nproc-per-node N` without torchrun: start torchrun's own machinery.

The launcher re-runs `python -m fsdp_trace capture ...` on every rank through
`torch.distributed.run`, then reports the first failing rank's one-line error.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fsdp_trace.capture.config import CaptureConfig
from fsdp_trace.capture.runner import ERROR_DIR_ENV, RUN_FILE, out_dir_problem
from fsdp_trace.errors import UserError


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

    def torchrun_args(self) -> list[str]:
        if self.single_node:
            return ["--standalone", "--nnodes=1"]
        args = [f"--nnodes={self.nnodes}"]
        for flag, value in (
            ("--node-rank", self.node_rank),
            ("--rdzv-backend", self.rdzv_backend),
            ("--rdzv-endpoint", self.rdzv_endpoint),
            ("--rdzv-id", self.rdzv_id),
            ("--master-addr", self.master_addr),
            ("--master-port", self.master_port),
        ):
            if value is not None:
                args.append(f"{flag}={value}")
        return args


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


def remove_incomplete_outputs(out: Path, created: bool) -> None:
    """After a failed run: no traces without run.json, and no directory we made for nothing."""
    if not out.is_dir() or (out / RUN_FILE).exists():
        return
    for path in out.glob("rank*.json.gz"):
        path.unlink(missing_ok=True)
    if created and not any(out.iterdir()):
        out.rmdir()


def launch(cfg: CaptureConfig, nproc_per_node: int | None, rendezvous: Rendezvous) -> None:
    """Run the capture on `nproc_per_node` local processes (and other nodes via rendezvous)."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    nproc = nproc_per_node or default_nproc()
    out = Path(cfg.out)
    problem = out_dir_problem(out, cfg.overwrite)
    if problem:
        raise UserError(problem)
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
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    os.environ["FSDP_TRACE_COMMAND"] = shlex.join(["fsdp-trace", *sys.argv[1:]])
    with tempfile.TemporaryDirectory(prefix="fsdp-trace-errors-") as folder:
        os.environ[ERROR_DIR_ENV] = folder
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
        finally:
            os.environ.pop(ERROR_DIR_ENV, None)
