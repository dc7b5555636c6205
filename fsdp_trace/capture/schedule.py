"""The two-phase profiler schedule: one detailed step, then several lean timing steps.

`record_shapes`/`with_stack` are fixed per profiler session and sessions cannot nest, so the
phases are two sequential sessions, each `repeat=1` with exactly warmup + active steps: running
past the cycle would re-arm the profiler and a later export could be empty.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from fsdp_trace.capture.outputs import trace_temp_name
from fsdp_trace.capture.train import StepFn

PROFILER_WARMUP_STEPS = 1


def activities_for(device: torch.device) -> list[ProfilerActivity]:
    acts = [ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(ProfilerActivity.CUDA)
    return acts


def export_atomically(prof: profile, path: Path) -> None:
    """Write to a temp name and rename, so a killed run never leaves a half-written trace
    (a temp file a SIGKILL leaves behind is removed by the launcher or by --overwrite)."""
    tmp = trace_temp_name(path, os.getpid())
    try:
        prof.export_chrome_trace(str(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def profile_phase(
    step: StepFn,
    first_index: int,
    active_steps: int,
    path: Path,
    device: torch.device,
    detailed: bool,
    on_step: Callable[[], None] | None = None,
) -> int:
    """Profile `active_steps` steps after one profiler warmup step; returns steps run."""
    total = PROFILER_WARMUP_STEPS + active_steps
    with profile(
        activities=activities_for(device),
        schedule=schedule(wait=0, warmup=PROFILER_WARMUP_STEPS, active=active_steps, repeat=1),
        record_shapes=detailed,
        with_stack=detailed,
        on_trace_ready=lambda prof: export_atomically(prof, path),
    ) as prof:
        for i in range(total):
            step(first_index + i)
            prof.step()
            if on_step is not None:
                on_step()
    if not path.exists():
        raise RuntimeError(f"the profiler exported no trace to {path}")
    return total
