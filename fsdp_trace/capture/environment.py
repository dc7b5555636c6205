"""The environment a capture ran in: versions, GPUs, interconnect, and the env vars that matter."""

from __future__ import annotations

import os
import platform
import re
import shutil
import socket
import subprocess
from typing import Any

import torch

ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "GLOO_")
ENV_NAMES = (
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "CUDA_VISIBLE_DEVICES",
    "PYTORCH_CUDA_ALLOC_CONF",
    "OMP_NUM_THREADS",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST",
)

# Dense (not sparse) peak TFLOP/s for bf16/fp16 tensor-core math, from the vendors' datasheets.
# Matched in order against torch.cuda.get_device_name(); an unmatched GPU gets no MFU.
DENSE_BF16_PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    (r"H200 NVL", 835.0),
    (r"H200", 989.0),
    (r"GH200", 989.0),
    (r"H100 NVL", 835.0),
    (r"H100 PCIe", 756.0),
    (r"H100", 989.0),  # 'NVIDIA H100 80GB HBM3' is the SXM part
    (r"H800 PCIe", 756.0),
    (r"H800", 989.0),
    (r"A100", 312.0),
    (r"A800", 312.0),
    (r"L40S", 362.0),
    (r"B200", 2250.0),
)


def dense_peak_tflops(gpu_name: str | None) -> float | None:
    if not gpu_name:
        return None
    for pattern, peak in DENSE_BF16_PEAK_TFLOPS:
        if re.search(pattern, gpu_name):
            return peak
    return None


def _run(cmd: list[str], timeout: float = 15.0) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def parse_topology_matrix(text: str) -> dict[str, str]:
    """GPU-pair link types ('NV18', 'PIX', 'SYS', ...) from `nvidia-smi topo -m`."""
    text = ANSI_ESCAPE.sub("", text)
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return {}
    header = lines[0].split()
    gpu_columns = [h for h in header if re.fullmatch(r"GPU\d+", h)]
    pairs: dict[str, str] = {}
    for line in lines[1:]:
        cells = line.split()
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]):
            continue
        row = int(cells[0][3:])
        for j, col in enumerate(gpu_columns):
            if j + 1 >= len(cells):
                break
            other = int(col[3:])
            if other > row:
                pairs[f"{row}-{other}"] = cells[j + 1]
    return pairs


def interconnect() -> dict[str, Any]:
    """How the GPUs of this host are linked: the topology matrix and a one-word summary."""
    text = _run(["nvidia-smi", "topo", "-m"])
    if text is None:
        return {"available": False}
    pairs = parse_topology_matrix(text)
    kinds = set(pairs.values())
    if not pairs:
        summary = "single-gpu"
    elif all(k.startswith("NV") for k in kinds):
        summary = "nvlink"
    elif any(k.startswith("NV") for k in kinds):
        summary = "mixed"
    else:
        summary = "pcie"
    return {
        "available": True,
        "summary": summary,
        "pairs": pairs,
        "matrix": ANSI_ESCAPE.sub("", text),
    }


def driver_version() -> str | None:
    text = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return text.splitlines()[0].strip() if text else None


def collect(device: torch.device) -> dict[str, Any]:
    """Everything run.json records about software and hardware (rank 0's view)."""
    env: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "env_vars": {
            k: v
            for k, v in sorted(os.environ.items())
            if k.startswith(ENV_PREFIXES) or k in ENV_NAMES
        },
    }
    if device.type == "cuda":
        nccl = torch.cuda.nccl.version()
        env["nccl"] = ".".join(str(x) for x in nccl) if isinstance(nccl, tuple) else str(nccl)
        env["gpu_name"] = torch.cuda.get_device_name(device)
        env["gpu_count"] = torch.cuda.device_count()
        props = torch.cuda.get_device_properties(device)
        env["gpu_memory_gib"] = round(props.total_memory / 2**30, 2)
        env["gpu_sm_count"] = props.multi_processor_count
        env["driver"] = driver_version()
        env["interconnect"] = interconnect()
        env["dense_bf16_peak_tflops"] = dense_peak_tflops(env["gpu_name"])
    else:
        env["gpu_name"] = None
        env["gpu_count"] = 0
        env["dense_bf16_peak_tflops"] = None
    return env
