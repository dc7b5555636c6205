"""Small synthetic Kineto traces built in tests: exact, hand-checkable edge cases."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

CPU_PID, MAIN, AUTOGRAD = 100, 100, 101
# The PyTorch 1.12-era layout: capitalised categories, no `Collective name` (or message size)
# arguments on NCCL kernels, and NCCL <= 2.18 kernel names.
LEGACY_CATEGORIES = {
    "kernel": "Kernel",
    "cuda_runtime": "Runtime",
    "cuda_driver": "Runtime",
    "cpu_op": "Operator",
    "user_annotation": "Operator",
    "gpu_memcpy": "Memcpy",
    "gpu_memset": "Memset",
}
LEGACY_NCCL = {
    "AllGather": "ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)",
    "ReduceScatter": "ncclKernel_ReduceScatter_RING_LL_Sum_float(ncclWorkElem)",
    "AllReduce": "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)",
}
MODERN_ONLY_ARGS = (
    "Collective name",
    "dtype",
    "In msg nelems",
    "Out msg nelems",
    "Group size",
    "Process Group Name",
)


class TraceBuilder:
    """Append CPU ops, labels, launches and kernels; `write` produces a Kineto-style file."""

    def __init__(self, rank: int | None = 0, world_size: int = 2) -> None:
        self.events: list[dict[str, Any]] = []
        self.rank = rank
        self.world_size = world_size
        self.cpu_pid = CPU_PID + (rank or 0)  # each rank its own process, as in a real run
        self._corr = 1000

    def cpu(
        self, name: str, ts: float, dur: float, tid: int = MAIN, cat: str = "cpu_op", **args: Any
    ) -> None:
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": self.cpu_pid,
                "tid": tid,
                "ts": ts,
                "dur": dur,
                "args": args,
            }
        )

    def label(self, name: str, ts: float, dur: float, tid: int = MAIN) -> None:
        self.cpu(name, ts, dur, tid, cat="user_annotation")

    def step(self, n: int, ts: float, dur: float) -> None:
        self.label(f"ProfilerStep#{n}", ts, dur)

    def kernel(
        self,
        name: str,
        ts: float,
        dur: float,
        launch_ts: float | None,
        stream: int = 7,
        launch_tid: int = MAIN,
        cat: str = "kernel",
        **args: Any,
    ) -> int:
        """A GPU event; with launch_ts, also its cudaLaunchKernel (linked by correlation)."""
        self._corr += 1
        corr = self._corr
        if launch_ts is not None:
            self.events.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "pid": self.cpu_pid,
                    "tid": launch_tid,
                    "ts": launch_ts,
                    "dur": 1.0,
                    "args": {"correlation": corr},
                }
            )
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": 0,
                "tid": stream,
                "ts": ts,
                "dur": dur,
                "args": {"correlation": corr, "stream": stream, "device": 0, **args},
            }
        )
        return corr

    def nccl(
        self,
        collective: str,
        ts: float,
        dur: float,
        launch_ts: float | None,
        stream: int = 20,
        launch_tid: int = MAIN,
        nelems: int = 1_000_000,
        dtype: str = "BFloat16",
    ) -> int:
        name = {
            "AllGather": "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            "ReduceScatter": "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgs)",
            "AllReduce": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgs)",
        }[collective]
        coll_name = {
            "AllGather": "_allgather_base",
            "ReduceScatter": "_reduce_scatter_base",
            "AllReduce": "allreduce",
        }[collective]
        in_n = nelems // self.world_size if collective == "AllGather" else nelems
        out_n = nelems if collective == "AllGather" else nelems // self.world_size
        return self.kernel(
            name,
            ts,
            dur,
            launch_ts,
            stream,
            launch_tid,
            **{
                "Collective name": coll_name,
                "dtype": dtype,
                "In msg nelems": in_n,
                "Out msg nelems": out_n,
                "Group size": self.world_size,
                "Process Group Name": "0",
            },
        )

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"schemaVersion": 1, "traceEvents": self.events}
        if self.rank is not None:
            doc["distributedInfo"] = {
                "backend": "nccl",
                "rank": self.rank,
                "world_size": self.world_size,
            }
        return doc

    def legacy_events(self) -> list[dict[str, Any]]:
        """The events as PyTorch 1.12 wrote them: capitalised categories, GPU threads named
        like "stream 7", whole-µs integer timestamps, NCCL kernels named `ncclKernel_*`
        without collective arguments."""
        out = []
        for event in self.events:
            e = {**event, "args": dict(event["args"])}
            e["cat"] = LEGACY_CATEGORIES.get(event["cat"], event["cat"])
            assert float(e["ts"]).is_integer() and float(e["dur"]).is_integer()
            e["ts"], e["dur"] = int(e["ts"]), int(e["dur"])
            if "Collective name" in e["args"]:
                kind = next(k for k in LEGACY_NCCL if k in e["name"])
                e["name"] = LEGACY_NCCL[kind]
            for key in MODERN_ONLY_ARGS:
                e["args"].pop(key, None)
            if event["cat"] in ("kernel", "gpu_memcpy", "gpu_memset"):
                e["tid"] = f"stream {event['tid']}"
            out.append(e)
        return out

    def legacy_document(self) -> dict[str, Any]:
        doc = {**self.document(), "traceEvents": self.legacy_events()}
        doc["computeProperties"] = [{"id": 0, "name": "Tesla V100-SXM2-16GB"}]  # pre-2.0 key
        return doc

    def write(self, path: Path, layout: str = "current") -> Path:
        """`layout`: "current", "legacy" (1.12-era events in a Kineto object) or
        "legacy-list" (the same events as a bare top-level JSON list)."""
        document = {
            "current": self.document,
            "legacy": self.legacy_document,
            "legacy-list": self.legacy_events,
        }[layout]()
        data = json.dumps(document).encode()
        path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
        return path


def random_unit_rows(rng, n: int, longest: float):
    """`n` kernels of random units (some of none: None) and phases, over 0–100 µs, each up to
    `longest` µs (times to 0.1 µs): block, phase, starts, ends."""
    import numpy as np

    block = rng.choice(np.array(["layers.0", "layers.1", None], dtype=object), n)
    phase = rng.choice(np.array(["forward", "backward"], dtype=object), n)
    starts = np.round(rng.uniform(0, 100, n), 1)
    return block, phase, starts, starts + np.round(rng.uniform(0, longest, n), 1)
