"""What a capture writes into --out (and reading its run.json back), how a failed or
interrupted run takes it back, and the lock that keeps two captures out of one --out.

Torch-free on purpose: the launcher (and the CLI's checks before launching) use it on machines
where torch may be missing, to give a one-line error instead of an import traceback.

The lock is `--out/.fsdp-trace.lock`, held with `flock` on an open descriptor for as long as
the capture runs: the kernel drops it when its holder exits, however it exits, so a killed
capture never leaves a stale lock (its file may stay behind; it is ignored, reused, and
removed by the next capture's end). The file names the holder (pid, host, start time) and the
run's token: the ranks of the capture that holds it (started by the standalone launcher, or
on other nodes of the same job sharing --out) recognise their own run by that token.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fsdp_trace.errors import UserError
from fsdp_trace.runrecord import RUN_FILE

try:  # POSIX; elsewhere captures are not locked
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

ERROR_DIR_ENV = "FSDP_TRACE_ERROR_DIR"
COMMAND_ENV = "FSDP_TRACE_COMMAND"
ARGV_ENV = "FSDP_TRACE_ARGV"
LOCK_ENV = "FSDP_TRACE_LOCK"  # the token of the run whose launcher holds --out's lock
LOCK_NAME = ".fsdp-trace.lock"
# How long a lock that looks taken is retried: a check by another capture holds it (shared)
# for microseconds, and a new holder writes its details just after taking it.
LOCK_SETTLE_S = 1.0


def trace_name(rank: int, phase: str) -> str:
    return f"rank{rank}.{phase}.json.gz"


def trace_temp_name(path: Path, pid: int) -> Path:
    """A hidden sibling of a trace that keeps `.json.gz` (the profiler gzips by suffix)."""
    return path.with_name(f".{path.name[: -len('.json.gz')]}.tmp-{pid}.json.gz")


def out_dir_problem(out: Path, overwrite: bool, own_token: str | None = None) -> str | None:
    """Why the output directory cannot be used, or None. A capture running into it comes
    first (--overwrite never takes over a running capture); the lock file alone does not make
    --out "not empty"."""
    if out.exists() and not out.is_dir():
        return f"--out {out} exists and is not a directory"
    if not out.is_dir():
        return None
    busy = locked_by_another(out, own_token)
    if busy:
        return busy
    if not overwrite and any(p.name != LOCK_NAME for p in out.iterdir()):
        return f"--out {out} already exists and is not empty: pass --overwrite or choose another"
    return None


# -- the lock ---------------------------------------------------------------------------------

_OPEN_FLAGS = (
    getattr(os, "O_NOFOLLOW", 0)  # a symlink planted as the lock file is never followed
    | getattr(os, "O_NONBLOCK", 0)  # nor is a FIFO waited on
    | getattr(os, "O_CLOEXEC", 0)  # nor is the descriptor passed on to the ranks
)


class OutLock:
    """--out's lock as one process has it: `held` (this process holds the flock until
    `release()`), or not held because the run's launcher or another node of the same run
    holds it, or the filesystem cannot lock."""

    def __init__(self, path: Path, fd: int | None, created: bool = False) -> None:
        self.path = path
        self._fd = fd
        self._created = created  # --out was made for this lock: removed with it if empty

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Remove the lock file (while still holding it, and only if it is still ours), then
        let go, and remove --out if this lock made it and nothing else is in it. A no-op when
        not held, and when called twice."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            mine = os.fstat(fd)
            there = os.stat(self.path, follow_symlinks=False)
            if (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino):
                self.path.unlink()
        except OSError:
            pass
        finally:
            os.close(fd)
        if self._created:
            remove_empty_dir(self.path.parent)

    def __enter__(self) -> OutLock:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def _read_holder(path: Path) -> dict[str, Any] | None:
    """The holder's details from the lock file, or None while they are not (yet) there."""
    try:
        fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        holder = json.loads(os.read(fd, 65536) or b"null")
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return holder if isinstance(holder, dict) else None


def held_message(out: Path, holder: dict[str, Any] | None) -> str:
    """The one line a capture gets when another one is writing to its --out."""
    who = "its lock file does not say which"
    if holder:
        try:
            started = dt.datetime.fromtimestamp(float(holder["started"]))
            who = (
                f"pid {int(holder['pid'])} on {holder.get('host') or 'an unknown host'}, "
                f"started {started:%Y-%m-%d %H:%M:%S}"
            )
        except (KeyError, TypeError, ValueError, OverflowError, OSError):
            pass
    return (
        f"another capture is writing to {out} ({who}): wait for it to end (or stop it), or "
        "choose another --out; --overwrite never replaces a running capture"
    )


def _flock(fd: int, shared: bool) -> bool | None:
    """Try to lock without waiting: True taken, False held by another, None cannot lock."""
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:  # ENOLCK, EOPNOTSUPP...: a filesystem without locks
        return None
    return True


def locked_by_another(out: Path, own_token: str | None = None) -> str | None:
    """The one-line refusal when another capture holds --out's lock, else None. Checks with a
    shared lock, taken and dropped at once: it never keeps anyone out."""
    path = out / LOCK_NAME
    if fcntl is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
    except OSError:  # no lock file (or one that lock_out_dir will refuse with its reason)
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        deadline = time.monotonic() + LOCK_SETTLE_S
        while True:
            taken = _flock(fd, shared=True)
            if taken is not False:
                return None
            holder = _read_holder(path)
            if holder is not None and own_token and holder.get("token") == own_token:
                return None
            if holder is not None or time.monotonic() > deadline:
                return held_message(out, holder)
            time.sleep(0.02)
    finally:
        os.close(fd)  # drops the shared lock, if taken


def lock_out_dir(out: Path, token: str, create: bool = True) -> OutLock:
    """Take --out's lock for the run `token` (creating --out unless `create` is False), or
    raise UserError naming the capture that holds it. A lock held under the same token (the
    run's own launcher, or another node of the same job on a shared --out) is joined: the
    result is not `held`, and nothing is written."""
    path = out / LOCK_NAME
    deadline = time.monotonic() + LOCK_SETTLE_S
    created = False
    attempts = 0
    while True:
        if create:
            created = created or not out.is_dir()
            try:
                out.mkdir(parents=True, exist_ok=True)
            except FileExistsError:
                raise UserError(f"--out {out} exists and is not a directory") from None
            except OSError as exc:
                raise UserError(f"cannot create --out {out} ({exc.strerror or exc})") from None
        if fcntl is None:
            return OutLock(path, None)
        attempts += 1
        if attempts > 500:  # the file or --out keeps vanishing under us
            raise UserError(f"cannot take the capture lock {path}: it keeps being removed")
        writable = True
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | _OPEN_FLAGS, 0o644)
        except PermissionError as exc:  # another user's lock file: flock needs no write access
            try:
                fd = os.open(path, os.O_RDONLY | _OPEN_FLAGS)
            except OSError:
                raise UserError(
                    f"cannot create the capture lock {path} ({exc.strerror or exc})"
                ) from None
            writable = False
        except FileNotFoundError:
            if not create:
                return OutLock(path, None)
            continue  # --out was removed in between (a run that ended cleaning up): again
        except OSError as exc:
            raise UserError(
                f"cannot open the capture lock {path} ({exc.strerror or exc})"
            ) from None
        keep = False
        try:
            mine = os.fstat(fd)
            if not stat.S_ISREG(mine.st_mode):
                raise UserError(f"the capture lock {path} is not a plain file: remove it")
            taken = _flock(fd, shared=False)
            if taken is None:
                return OutLock(path, None)
            if not taken:
                holder = _read_holder(path)
                if holder is not None and holder.get("token") == token:
                    return OutLock(path, None)
                if holder is None and time.monotonic() < deadline:
                    time.sleep(0.02)  # just taken, details not written yet; or a check
                    continue
                if holder is None:
                    raise UserError(held_message(out, None))
                raise UserError(held_message(out, holder))
            try:  # the file we locked must still be the one at the path
                there = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                continue  # its holder removed it on the way out: lock the new one
            if (there.st_dev, there.st_ino) != (mine.st_dev, mine.st_ino):
                continue
            details = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": time.time(),
                "token": token,
            }
            if writable:
                os.ftruncate(fd, 0)
                os.pwrite(fd, (json.dumps(details) + "\n").encode(), 0)
            keep = True
            return OutLock(path, fd, created)
        finally:
            if not keep:
                os.close(fd)


@contextlib.contextmanager
def lock_for_cleanup(out: Path, lock: OutLock | None) -> Iterator[bool]:
    """Whether a failed run may take back what it wrote in --out: yes under its own lock;
    without one (a multi-node launcher: the ranks held it), only if no other capture has
    taken --out since."""
    if lock is not None:
        yield True
        return
    try:
        taken = lock_out_dir(out, f"cleanup-{os.getpid()}", create=False)
    except UserError:
        yield False
        return
    with taken:
        yield True


def remove_empty_dir(out: Path) -> None:
    """Remove --out if a run made it and left it empty (a race with another capture's lock
    file just created there is harmless: the directory is then not empty)."""
    with contextlib.suppress(OSError):
        out.rmdir()


def _capture_files(out: Path, rank: int | None) -> Iterator[Path]:
    """Files a capture writes: final traces, their hidden temp names, and (all ranks) run.json
    with its temp names. `rank` limits it to one rank's traces (`rank1.` never matches rank10)."""
    who = "*" if rank is None else str(rank)
    yield from out.glob(f"rank{who}.*.json.gz")
    yield from out.glob(f".rank{who}.*.tmp-*")
    if rank is None:
        yield from out.glob(RUN_FILE)
        yield from out.glob(f".{RUN_FILE}.*")


def remove_outputs(out: Path, rank: int | None = None) -> None:
    """Delete what a capture wrote (one rank's traces, or everything), temp files included.
    Tolerates another process deleting the same files (every node's local rank 0 may)."""
    if not out.is_dir():
        return
    for path in list(_capture_files(out, rank)):
        path.unlink(missing_ok=True)


def remove_incomplete_outputs(out: Path, created: bool) -> None:
    """After a failed or interrupted run: no traces and no temp files without run.json, and no
    directory we made for nothing."""
    if not out.is_dir() or (out / RUN_FILE).exists():
        return
    remove_outputs(out)
    if created and not any(out.iterdir()):
        out.rmdir()
