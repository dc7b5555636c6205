"""One rank of `fsdp-trace capture`: build, shard, warm up, profile twice, time, record.

Run under torchrun (RANK/WORLD_SIZE/LOCAL_RANK set). Every rank writes its two traces; rank 0
writes run.json last, so a run directory with run.json is a complete run.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import shlex
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from fsdp_trace import __version__
from fsdp_trace.atomic import write_text
from fsdp_trace.capture import environment, parallelize, schedule, train
from fsdp_trace.capture.config import CaptureConfig, hsdp_shape
from fsdp_trace.capture.models import (
    ModelSpec,
    build_model,
    check_model,
    count_parameters,
    resolve_shape,
)
from fsdp_trace.capture.outputs import (  # re-exported: the CLI imports them from here
    ARGV_ENV,
    COMMAND_ENV,
    ERROR_DIR_ENV,
    LOCK_ENV,
    RUN_FILE,
    OutLock,
    lock_out_dir,
    out_dir_problem,
    remove_outputs,
    trace_name,
)
from fsdp_trace.capture.summary import print_summary
from fsdp_trace.errors import UserError
from fsdp_trace.fmt import plural
from fsdp_trace.runrecord import read_run

__all__ = [
    "ERROR_DIR_ENV",
    "RUN_FILE",
    "leave_worker",
    "out_dir_problem",
    "trace_name",
    "worker_main",
]


def pick_device(requested: str, local_rank: int) -> torch.device:
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UserError("--device cuda asked for, but no CUDA GPU is visible")
    if local_rank >= torch.cuda.device_count():
        raise UserError(
            f"local rank {local_rank} has no GPU: {torch.cuda.device_count()} visible; "
            "lower --nproc-per-node"
        )
    return torch.device("cuda", local_rank)


_outputs_started = False  # set once this run may have written into --out
_out_lock: OutLock | None = None  # --out's lock, on the local rank 0 that holds it


def claim_out_dir(out: Path, local_rank: int, world_size: int) -> None:
    """Take --out's lock before anything is written or removed there: each node's local rank 0
    takes it for the run (the token comes from rank 0, or from the standalone launcher, which
    already holds it), then every rank hears whether all nodes got it. Another capture writing
    to --out fails this one on every rank, with one line naming it; nothing is touched."""
    global _out_lock
    token = [os.environ.get(LOCK_ENV) or uuid.uuid4().hex]
    dist.broadcast_object_list(token, src=0)
    problem = None
    if local_rank == 0:
        try:
            _out_lock = lock_out_dir(out, token[0])
        except UserError as exc:
            problem = exc.message
    refused = [p for p in gather(problem, world_size) if p]
    if refused:
        release_out_lock()
        raise UserError(refused[0])


def release_out_lock() -> None:
    """Let go of --out's lock (and remove its file), if this process holds it."""
    global _out_lock
    if _out_lock is not None:
        _out_lock.release()
        _out_lock = None


def prepare_out_dir(out: Path, local_rank: int) -> None:
    """Each node's local rank 0 creates the directory (and, under --overwrite, removes the
    previous run: run.json first, then traces and temp files a killed run left); the others
    wait. Per node, so --out need not be on a filesystem shared between nodes."""
    global _outputs_started
    _outputs_started = True
    if local_rank == 0:
        (out / RUN_FILE).unlink(missing_ok=True)
        remove_outputs(out)
        out.mkdir(parents=True, exist_ok=True)
    dist.barrier()


class Progress:
    """Rich progress on rank 0 only, one bar per phase of the schedule (warmup, detailed,
    timing, timed), each counting its own steps; a no-op elsewhere. A profiled phase counts
    its profiled steps; the profiler's warmup step before them is said beside the bar."""

    def __init__(self, enabled: bool, phases: list[tuple[str, int, str]]) -> None:
        self._progress = None
        self._tasks: dict[str, Any] = {}
        self._current: str | None = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._progress = RichProgress(
                TextColumn("[bold]{task.description:<8}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("[dim]{task.fields[note]}"),
                console=Console(stderr=True),
            )
            for name, total, note in phases:
                self._tasks[name] = self._progress.add_task(
                    name, total=total, start=False, visible=total > 0, note=note
                )

    @contextlib.contextmanager
    def running(self) -> Iterator[Progress]:
        if self._progress is None:
            yield self
            return
        with self._progress:
            yield self

    def phase(self, name: str) -> None:
        """Start phase `name` (the previous one is done)."""
        if self._progress is None:
            return
        self._finish()
        self._current = name
        self._progress.start_task(self._tasks[name])

    def _finish(self) -> None:
        if self._current is not None:
            task = self._tasks[self._current]
            self._progress.update(task, completed=self._progress.tasks[task].total)
            self._progress.stop_task(task)

    def done(self) -> None:
        if self._progress is not None:
            self._finish()
            self._current = None

    def advance(self) -> None:
        if self._progress is not None and self._current is not None:
            self._progress.advance(self._tasks[self._current])

    def counter(self, skip: int = 0) -> Callable[[], None]:
        """An `on_step` that counts every step after the first `skip` (a profiled phase's
        profiler warmup steps)."""
        seen = [0]

        def on_step() -> None:
            seen[0] += 1
            if seen[0] > skip:
                self.advance()

        return on_step


def progress_phases(cfg: CaptureConfig) -> list[tuple[str, int, str]]:
    """(phase, steps it counts, note) in schedule order."""
    warmup = schedule.PROFILER_WARMUP_STEPS
    note = f"after {plural(warmup, 'profiler warmup step')}" if warmup else ""
    return [
        ("warmup", cfg.warmup_steps, "untimed"),
        ("detailed", 1, note),
        ("timing", cfg.timing_steps, note),
        ("timed", cfg.timed_steps, "un-profiled"),
    ]


# PyTorch's profiler (libkineto, torch 2.13) writes a "USDT:<time> <pid>:<tid>
# SyncActivityProfilerHandler.cpp:52] profiler_start" line (and profiler_stop) to stderr at every
# start and stop: its USDT level ranks above ERROR, so the ERROR threshold torch sets does not
# hold it back and no KINETO_LOG_LEVEL silences it without silencing errors. During profiling,
# fd 2 goes through this filter, a small process of its own (so nothing is lost if the rank
# dies): it drops exactly those lines, anywhere in a line, and passes every other byte on at
# once (partial lines included: the progress bar), errors included.
USDT_FILTER = r"""
import os, re, signal
signal.signal(signal.SIGINT, signal.SIG_IGN)  # drain until the rank's end of the pipe closes
signal.signal(signal.SIGTERM, signal.SIG_IGN)
LINE = re.compile(rb"USDT:[^\n]*\] profiler_(?:start|stop)\r?\n")
MARK = b"USDT:"

def split(buf):
    buf = LINE.sub(b"", buf)
    start = buf.rfind(MARK)
    if start >= 0 and b"\n" not in buf[start:]:
        return buf[:start], buf[start:]
    for n in range(len(MARK) - 1, 0, -1):
        if buf.endswith(MARK[:n]):
            return buf[:-n], buf[-n:]
    return buf, b""

def write(data):
    while data:
        data = data[os.write(2, data):]

held = b""
while True:
    try:
        chunk = os.read(0, 65536)
    except InterruptedError:
        continue
    if not chunk:
        break
    out, held = split(held + chunk)
    write(out)
write(LINE.sub(b"", held))
"""


@contextlib.contextmanager
def profiler_lines_filtered() -> Iterator[None]:
    """Run the block with fd 2 through `USDT_FILTER` (nothing changes where it cannot start),
    then put fd 2 back and wait for the filter to pass on the last bytes."""
    sys.stderr.flush()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", USDT_FILTER], stdin=subprocess.PIPE
        )
    except OSError:
        yield
        return
    saved = os.dup(2)
    os.dup2(proc.stdin.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # something else still holds the pipe open
            proc.kill()


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or the CPU allocator's failure (a plain RuntimeError)."""
    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "DefaultCPUAllocator: can't allocate memory" in str(exc)
    )


def oom_message(cfg: CaptureConfig, batch: int, seq: int, device: torch.device) -> str:
    where = f"{torch.cuda.get_device_name(device)}" if device.type == "cuda" else "CPU"
    return (
        f"out of memory on {where} with batch {batch} x seq {seq}: lower --batch-size "
        f"or --seq-len, raise --ac-coverage (now {cfg.ac_coverage:g}), keep "
        "--reshard-after-forward true, or shard over more GPUs"
    )


def gather(payload: Any, world_size: int) -> list[Any]:
    result: list[Any] = [None] * world_size
    dist.all_gather_object(result, payload)
    return result


def run_worker(cfg: CaptureConfig, command: str, argv: list[str]) -> None:
    """The body of one rank. Raises UserError for problems the user can fix, out of memory
    included wherever it happens (model build, init, optimizer, or the steps)."""
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    hsdp_shape(cfg.hsdp, world_size)  # before any rank connects or writes
    device = pick_device(cfg.device, local_rank)
    batch, seq = resolve_shape(cfg.model, cfg.batch_size, cfg.seq_len)
    check_model(cfg.model)  # a factory that cannot be imported: one line, before connecting
    out = Path(cfg.out)
    # Every rank checks before anyone writes (a capture running into --out included).
    problem = out_dir_problem(out, cfg.overwrite, own_token=os.environ.get(LOCK_ENV))

    timeout = dt.timedelta(seconds=cfg.timeout_s)
    try:
        if device.type == "cuda":
            torch.cuda.set_device(device)
            dist.init_process_group("nccl", timeout=timeout, device_id=device)
        else:
            dist.init_process_group("gloo", timeout=timeout)
        if problem:
            raise UserError(problem)
        claim_out_dir(out, local_rank, world_size)
        _run_initialized(cfg, command, argv, rank, world_size, local_rank, device, out)
    except (torch.OutOfMemoryError, RuntimeError) as exc:
        if not is_out_of_memory(exc):
            raise
        raise UserError(oom_message(cfg, batch, seq, device)) from None
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _run_initialized(
    cfg: CaptureConfig,
    command: str,
    argv: list[str],
    rank: int,
    world_size: int,
    local_rank: int,
    device: torch.device,
    out: Path,
) -> None:
    # Weights are initialised per shard; DTensor's CPU RNG caveat does not matter for profiling.
    warnings.filterwarnings("ignore", message="DTensor random operators")
    # One cycle per session is exactly the schedule here (see schedule.py).
    warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle")
    torch.manual_seed(cfg.seed)
    mesh = parallelize.build_mesh(device.type, world_size, cfg.hsdp)
    spec = build_model(
        cfg.model,
        cfg.batch_size,
        cfg.seq_len,
        device,
        seed=cfg.seed,
        rank=rank,
        world_size=world_size,
    )
    model = spec.model
    params = count_parameters(model)
    block_paths = parallelize.module_paths(model, spec.blocks)
    ac_indices = parallelize.select_ac_blocks(len(block_paths), cfg.ac_coverage)
    ac_blocks = parallelize.apply_activation_checkpointing(
        model, block_paths, ac_indices, cfg.ac_mode
    )
    if cfg.compile:
        parallelize.apply_compile(model, block_paths)
    units = parallelize.plan_units(block_paths, spec.embedding_units, cfg.shard_embeddings)
    plan = parallelize.apply_fsdp(
        model,
        mesh,
        units,
        param_dtype=cfg.dtype,
        reduce_dtype=cfg.reduce_dtype,
        reshard=cfg.reshard_after_forward,
        keep_last_unsharded=cfg.keep_last_unsharded,
        forward_prefetch=cfg.prefetch_forward,
        backward_prefetch=cfg.prefetch_backward,
        block_paths=block_paths,
        root_reshard=cfg.root_reshard_after_forward,
    )
    if any(p.is_meta for p in model.parameters()):
        model.to_empty(device=device)
        if spec.init_weights is None:
            raise UserError("the model was built on the meta device but gives no init_weights")
        spec.init_weights()
    optimizer = train.build_optimizer(model, cfg.lr, device)
    delay = cfg.straggler_delay_ms / 1e3 if cfg.straggler_rank == rank else 0.0
    step = train.make_train_step(model, spec, optimizer, delay, cfg.grad_accum, cfg.accum_no_sync)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()

    progress = Progress(
        rank == 0 and os.environ.get("FSDP_TRACE_QUIET") != "1", progress_phases(cfg)
    )
    skip = schedule.PROFILER_WARMUP_STEPS
    index = 0
    try:
        with progress.running():
            prepare_out_dir(out, local_rank)
            progress.phase("warmup")
            for _ in range(cfg.warmup_steps):
                step(index)
                index += 1
                progress.advance()
            sync()
            progress.phase("detailed")
            detailed_path = out / trace_name(rank, "detailed")
            with profiler_lines_filtered():
                index += schedule.profile_phase(
                    step,
                    index,
                    1,
                    detailed_path,
                    device,
                    detailed=True,
                    on_step=progress.counter(skip),
                )
            sync()
            progress.phase("timing")
            timing_path = out / trace_name(rank, "timing")
            with profiler_lines_filtered():
                index += schedule.profile_phase(
                    step,
                    index,
                    cfg.timing_steps,
                    timing_path,
                    device,
                    detailed=False,
                    on_step=progress.counter(skip),
                )
            sync()
            progress.phase("timed")
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            counters = train.allocator_counters(device)

            def timed_step(i: int) -> None:
                step(i)
                progress.advance()  # host side, a few µs: the step's own work is queued

            step_ms = train.time_steps(timed_step, index, cfg.timed_steps, device)
            progress.done()
            memory = train.memory_figures(device, counters)
            host_ms = (  # the host's own speed, for the what-if replay (GPU runs)
                train.host_probe(step, index + cfg.timed_steps, train.HOST_PROBE_STEPS, device)
                if device.type == "cuda"
                else []
            )
    except (torch.OutOfMemoryError, RuntimeError) as exc:
        if not is_out_of_memory(exc):
            raise
        raise UserError(oom_message(cfg, spec.batch_size, spec.seq_len, device)) from None

    per_rank = gather(
        {"rank": rank, "step_ms": step_ms, "host_ms": host_ms, "memory": memory}, world_size
    )
    if rank == 0:
        record = build_record(
            cfg,
            command=command,
            argv=argv,
            world=world_info(world_size, device),
            env=environment.collect(device),
            spec=spec,
            params=params,
            block_paths=block_paths,
            ac_blocks=ac_blocks,
            plan=plan,
            per_rank=per_rank,
        )
        write_text(out / RUN_FILE, json.dumps(record, indent=2, default=str) + "\n")
    dist.barrier()
    if rank == 0:
        print_summary(record, str(out))


def world_info(world_size: int, device: torch.device) -> dict[str, Any]:
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    return {
        "world_size": world_size,
        "local_world_size": local,
        "nnodes": world_size // max(1, local),
        "backend": dist.get_backend(),
        "device": device.type,
    }


def step_time_per_step(per_rank: list[dict[str, Any]]) -> list[float]:
    """The slowest rank sets the pace: per step, the maximum over ranks."""
    columns = zip(*(r["step_ms"] for r in per_rank), strict=True)
    return [max(values) for values in columns]


def build_record(
    cfg: CaptureConfig,
    *,
    command: str,
    argv: list[str],
    world: dict[str, Any],
    env: dict[str, Any],
    spec: ModelSpec,
    params: dict[str, int],
    block_paths: list[str],
    ac_blocks: list[str],
    plan: parallelize.ShardPlan,
    per_rank: list[dict[str, Any]],
) -> dict[str, Any]:
    """run.json: knobs, model, world, measured figures and environment (pure: no torch calls,
    so its arithmetic is tested on given numbers)."""
    figures: dict[str, Any] = {"notices": []}
    tokens_per_step = spec.batch_size * spec.seq_len * cfg.grad_accum
    if cfg.timed_steps:
        pace = step_time_per_step(per_rank)
        stats = train.summarize(pace)
        figures["step_time_ms"] = stats
        figures["tokens_per_step_per_gpu"] = tokens_per_step
        figures["tokens_per_s_per_gpu"] = tokens_per_step / (stats["median"] / 1e3)
        flops = spec.flops_per_token
        if flops is None:
            flops = 6.0 * params["non_embedding"]
            figures["notices"].append("FLOPs per token estimated as 6*N: attention term unknown")
        figures["flops_per_token"] = flops
        peak = env.get("dense_bf16_peak_tflops")
        if world["device"] != "cuda":
            figures["mfu"] = None
            figures["notices"].append("MFU omitted: not a GPU run")
        elif cfg.dtype == "fp32":
            figures["mfu"] = None
            figures["notices"].append("MFU omitted: fp32 params have no bf16 tensor-core peak")
        elif peak is None:
            figures["mfu"] = None
            figures["notices"].append(
                f"MFU omitted: no dense bf16 peak known for {env.get('gpu_name')!r} "
                "(fsdp_trace/capture/environment.py lists the known GPUs)"
            )
        else:
            achieved = figures["tokens_per_s_per_gpu"] * flops
            figures["achieved_tflops_per_gpu"] = achieved / 1e12
            figures["mfu"] = achieved / (peak * 1e12)
        if cfg.baseline and world["device"] != "cuda":
            figures["scaling_efficiency"] = None
            figures["notices"].append(
                "scaling efficiency omitted: not computed on CPU (the host's cores are shared "
                "by every rank, not GPUs)"
            )
        elif cfg.baseline:
            scaling = scaling_against(cfg.baseline, figures["tokens_per_s_per_gpu"])
            figures.update(scaling)
            if scaling["scaling_efficiency"] is None:
                figures["notices"].append(
                    f"scaling efficiency omitted: {scaling['baseline_error']}"
                )
            elif scaling["baseline_world_size"] not in (None, 1):
                figures["notices"].append(
                    f"the baseline {cfg.baseline} ran on {scaling['baseline_world_size']} ranks, "
                    "not 1: scaling efficiency is relative to it"
                )
    figures["per_rank"] = [
        {
            "rank": r["rank"],
            "step_time_ms": train.summarize(r["step_ms"]) if r["step_ms"] else None,
            "host_step_ms": train.summarize(r["host_ms"]) if r.get("host_ms") else None,
            **r["memory"],
        }
        for r in per_rank
    ]
    probes = [r["host_ms"] for r in per_rank if r.get("host_ms")]
    if probes and len(probes) == len(per_rank):
        figures["host_step_ms"] = train.summarize([max(v) for v in zip(*probes, strict=True)])
    memory_keys = ("peak_allocated_gib", "peak_reserved_gib", "peak_rss_gib")
    for key in memory_keys:
        values = [r["memory"][key] for r in per_rank if key in r["memory"]]
        if values:
            figures[key] = max(values)
    for key in ("num_alloc_retries", "num_ooms"):  # during the timed steps, summed over ranks
        if any(key in r["memory"] for r in per_rank):
            figures[key] = sum(r["memory"].get(key, 0) for r in per_rank)

    return {
        "tool": "fsdp-trace",
        "version": __version__,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "argv": argv,
        "config": cfg.to_dict(),
        "model": {
            **spec.description,
            "batch_size": spec.batch_size,
            "seq_len": spec.seq_len,
            "params_total": params["total"],
            "params_non_embedding": params["non_embedding"],
            "flops_per_token": figures.get("flops_per_token"),
            "flops_note": spec.flops_note,
            "blocks": block_paths,
            "n_blocks": len(block_paths),
        },
        "parallel": {
            **plan.to_dict(),
            "mesh": parallelize.mesh_record(cfg.hsdp, world["world_size"]),
            "ac_blocks": ac_blocks,
            "ac_coverage_effective": len(ac_blocks) / len(block_paths) if block_paths else 0.0,
            "ac_mode": cfg.ac_mode,
            "compile": cfg.compile,
            "grad_accum": cfg.grad_accum,
            "accum_no_sync": cfg.accum_no_sync,
        },
        "world": world,
        "steps": {
            "warmup": cfg.warmup_steps,
            "profiler_warmup_per_phase": schedule.PROFILER_WARMUP_STEPS,
            "detailed": 1,
            "timing": cfg.timing_steps,
            "timed": cfg.timed_steps,
        },
        "figures": figures,
        "environment": env,
        "files": {
            "detailed": [trace_name(r, "detailed") for r in range(world["world_size"])],
            "timing": [trace_name(r, "timing") for r in range(world["world_size"])],
        },
    }


def scaling_against(baseline_dir: str, tokens_per_s_per_gpu: float) -> dict[str, Any]:
    """Scaling efficiency against a 1-GPU baseline run (same local batch)."""
    try:
        base = read_run(baseline_dir)
    except UserError as exc:
        return {"scaling_efficiency": None, "baseline_error": exc.message}
    base_tps = base.figures.tokens_per_s_per_gpu
    if not base_tps:
        path = Path(baseline_dir) / RUN_FILE
        return {"scaling_efficiency": None, "baseline_error": f"{path}: no tokens/s recorded"}
    return {
        "baseline_dir": str(baseline_dir),
        "baseline_tokens_per_s": base_tps,
        "baseline_world_size": base.world.world_size,
        "scaling_efficiency": tokens_per_s_per_gpu / base_tps,
    }


def write_error_file(folder: str, rank: int, message: str, code: int) -> None:
    """Leave this rank's one-line error for the standalone launcher to report."""
    payload = {"rank": rank, "time": time.time(), "message": message, "code": code}
    with contextlib.suppress(OSError):
        Path(folder, f"rank{rank}.json").write_text(json.dumps(payload))


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def recorded_command(cfg: CaptureConfig, cli_command: str) -> tuple[str, list[str]]:
    """run.json's `command` (the equivalent `fsdp-trace capture`, rebuilt from the resolved
    config) and `argv` (the command line as typed). The standalone launcher passes both;
    under a plain torchrun they are rebuilt here from its environment and the CLI's view."""
    command = os.environ.get(COMMAND_ENV)
    if not command:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        nnodes = int(os.environ.get("WORLD_SIZE", local)) // max(1, local)
        command = cfg.capture_command(local, ["--nnodes", str(nnodes)] if nnodes > 1 else [])
    raw = os.environ.get(ARGV_ENV)
    argv = json.loads(raw) if raw else shlex.split(cli_command)
    return command, argv


def worker_main(cfg: CaptureConfig, command: str) -> int:
    """Run one rank and turn any failure into one line on stderr and an exit code.

    `command` is how the CLI describes this launch; run.json records it as `argv` when no
    standalone launcher recorded the real one.
    """
    import signal

    rank = int(os.environ.get("RANK", "0"))
    out = Path(cfg.out)
    # torchrun ends the other ranks with SIGTERM when one fails (and on Ctrl-C / SIGTERM to
    # the launcher): clean up on the way out.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        return _worker_body(cfg, command, rank, out)
    finally:
        release_out_lock()  # after this rank took back what it wrote


def _worker_body(cfg: CaptureConfig, command: str, rank: int, out: Path) -> int:
    """worker_main's body: the rank's exit code, its error said or written once."""
    import signal

    try:
        run_worker(cfg, *recorded_command(cfg, command))
    except (SystemExit, KeyboardInterrupt) as exc:
        if _outputs_started and not (out / RUN_FILE).exists():
            remove_outputs(out, rank)
        code = exc.code if isinstance(exc, SystemExit) else 128 + signal.SIGINT
        if not os.environ.get(ERROR_DIR_ENV):  # the standalone launcher says it once
            name = signal.Signals(code - 128).name if isinstance(code, int) and code > 128 else ""
            print(f"fsdp-trace capture: rank {rank}: stopped {name}".rstrip(), file=sys.stderr)
        return code if isinstance(code, int) else 1
    except UserError as exc:
        message = exc.message
        code = exc.exit_code
    except Exception as exc:  # a rank's failure must end the job with its own message
        message = failure_message(exc, cfg)
        code = 1
    else:
        return 0
    if _outputs_started and not (out / RUN_FILE).exists():
        remove_outputs(out, rank)
    folder = os.environ.get(ERROR_DIR_ENV)
    if folder:  # the standalone launcher reports the first failure once
        write_error_file(folder, rank, message, code)
    else:
        print(f"fsdp-trace capture: rank {rank}: {message}", file=sys.stderr, flush=True)
    return code


def leave_worker(code: int) -> NoReturn:
    """End this rank's process with `code`, skipping the interpreter's teardown.

    By then the rank's work is done: process group destroyed, traces and run.json closed and
    renamed. Teardown itself can abort a finished rank: C++ threads (gloo, autograd, the
    profiler) destroyed while joinable end in std::terminate ("terminate called without an
    active exception", SIGABRT), seen about once in 50 CPU captures, which torchrun reports as
    a failed rank."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


TIMEOUT_PATTERN = re.compile(r"timed out|collective operation timeout", re.IGNORECASE)
SOURCE_PREFIX = re.compile(r"^\[[^\]]*\.(?:cc|cpp|h|py):\d+\]\s*")  # gloo's "[file.cc:129] "


def failure_message(exc: Exception, cfg: CaptureConfig) -> str:
    """One line for an unexpected failure; a collective timeout says what it means."""
    first_line = SOURCE_PREFIX.sub("", (str(exc).strip().splitlines() or [""])[0])
    message = f"{type(exc).__name__}: {first_line}"[:500]
    if TIMEOUT_PATTERN.search(str(exc)):
        return (
            f"a collective waited longer than --timeout-s {cfg.timeout_s} for another rank, "
            f"which is stuck or far behind ({message})"
        )
    return message
