"""The training step that gets profiled, and its un-profiled timing."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fsdp_trace.capture.models import ModelSpec

StepFn = Callable[[int], torch.Tensor]


def build_optimizer(model: nn.Module, lr: float, device: torch.device) -> torch.optim.Optimizer:
    """AdamW over the sharded parameters: built after fully_shard so its state is sharded too.

    Fused on GPU (one pass over param/grad/moments, as torchtitan does): the multi-pass
    foreach version costs ~3x the memory traffic, which at 1.3B parameters is a visible
    slice of the step and would blur the comparison between 1 and N GPUs.
    """
    fused = device.type == "cuda"
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, fused=fused)


def compute_loss(output: Any, targets: Any) -> torch.Tensor:
    if targets is None:
        return output
    return F.cross_entropy(output.flatten(0, -2).float(), targets.flatten())


def make_train_step(
    model: nn.Module,
    spec: ModelSpec,
    optimizer: torch.optim.Optimizer,
    delay_s: float = 0.0,
    grad_accum: int = 1,
    accum_no_sync: bool = False,
) -> StepFn:
    """One optimizer step over `grad_accum` micro-batches.

    `delay_s` sleeps on the host first (the straggler-injection knob). With `accum_no_sync`,
    non-final micro-batches skip the reduce-scatter (`set_requires_gradient_sync(False)`).
    """

    def step(index: int) -> torch.Tensor:
        if delay_s:
            time.sleep(delay_s)
        loss = None
        for micro in range(grad_accum):
            if accum_no_sync:
                model.set_requires_gradient_sync(micro == grad_accum - 1)
            inputs, targets = spec.batch_fn(index * grad_accum + micro)
            loss = compute_loss(model(inputs), targets) / grad_accum
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def time_steps(step: StepFn, first_index: int, count: int, device: torch.device) -> list[float]:
    """Milliseconds per step, boundary to boundary (CUDA events on the compute stream on GPU).

    Boundary-to-boundary timing counts GPU idle between steps, as throughput does.
    """
    if count == 0:
        return []
    if device.type == "cuda":
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(count + 1)]
        marks[0].record()
        for i in range(count):
            step(first_index + i)
            marks[i + 1].record()
        torch.cuda.synchronize(device)
        return [marks[i].elapsed_time(marks[i + 1]) for i in range(count)]
    times = []
    last = time.perf_counter()
    for i in range(count):
        step(first_index + i)
        now = time.perf_counter()
        times.append((now - last) * 1e3)
        last = now
    return times


HOST_PROBE_STEPS = 3  # steps issued alone after the timed ones, for the host's own speed


def host_probe(step: StepFn, first_index: int, count: int, device: torch.device) -> list[float]:
    """Milliseconds the host takes to issue one step, without the profiler: each step run
    alone after the GPU has drained, so its launches never wait for a full launch queue.
    The what-if replay reads it as the host's own speed (the profiled trace's launch times
    include the profiler's overhead)."""
    times = []
    for i in range(count):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        step(first_index + i)
        times.append((time.perf_counter() - start) * 1e3)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return times


def summarize(values: list[float]) -> dict[str, float]:
    """Median and spread of a list of step times."""
    ordered = sorted(values)
    n = len(ordered)

    def quantile(q: float) -> float:
        pos = q * (n - 1)
        lo = int(pos)
        hi = min(lo + 1, n - 1)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)

    return {
        "median": statistics.median(ordered),
        "mean": statistics.fmean(ordered),
        "min": ordered[0],
        "max": ordered[-1],
        "p10": quantile(0.10),
        "p90": quantile(0.90),
        "stdev": statistics.stdev(ordered) if n > 1 else 0.0,
        "n": n,
    }


ALLOCATOR_COUNTERS = ("num_alloc_retries", "num_ooms")


def allocator_counters(device: torch.device) -> dict[str, int]:
    """The caching allocator's cumulative counters (since process start: a peak reset does not
    clear them), read before the timed steps so that only theirs are recorded."""
    if device.type != "cuda":
        return {}
    stats = torch.cuda.memory_stats(device)
    return {key: int(stats.get(key, 0)) for key in ALLOCATOR_COUNTERS}


def memory_figures(device: torch.device, counters_before: dict[str, int]) -> dict[str, Any]:
    """Peak allocator figures since the last reset (GPU), or the process's peak RSS (CPU).

    `num_alloc_retries` / `num_ooms` count the timed steps only: the counters now minus
    `counters_before` (from `allocator_counters` right before the timed steps).
    """
    if device.type == "cuda":
        now = allocator_counters(device)
        return {
            "peak_allocated_gib": torch.cuda.max_memory_allocated(device) / 2**30,
            "peak_reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30,
            **{key: now[key] - counters_before.get(key, 0) for key in ALLOCATOR_COUNTERS},
        }
    import resource

    return {"peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
