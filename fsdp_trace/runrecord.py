"""run.json, typed: what `fsdp-trace capture` records about a run, read in one place.

Every reader (analysis, diagnosis, the views, sweep/compare, capture's own summary) gets a
`RunRecord` from `read_run` instead of walking the JSON with `.get()` chains; a run.json of the
wrong shape (a list, a figure that is a string) is refused with one line naming the field.
Standard library only: capture imports it on machines with torch, typer and rich alone.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import stat
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Union

from fsdp_trace.errors import UserError
from fsdp_trace.vocab import ROOT, MeshKind

RUN_FILE = "run.json"
RUN_FILE_MAX_BYTES = 16 << 20  # run.json files fsdp-trace writes are a few KB
INT_LIMIT = 1 << 63  # integers must fit in int64 (they end up in numpy columns)


class NotRegularFile(OSError):
    """The path is a FIFO, a device, a socket or a folder: never opened for reading."""


def open_regular(path: str | Path, follow_symlinks: bool = True) -> BinaryIO:
    """Open `path` for binary reading only if it is a regular file: the one way fsdp-trace
    opens an input (traces, run.json, cache entries). The open itself never blocks (a FIFO
    opened for reading would wait for a writer forever); the type is checked on the opened
    descriptor, so a file swapped after a check is caught too. Raises NotRegularFile (an
    OSError) for anything else, OSError when it cannot be opened."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(f"{path}: not a regular file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


@dataclass(frozen=True)
class StepStats:
    """Summary of per-step times (ms): the slowest rank's time per step, then these."""

    median: float
    mean: float | None = None
    min: float | None = None
    max: float | None = None
    p10: float | None = None
    p90: float | None = None
    stdev: float | None = None
    n: int | None = None


@dataclass(frozen=True)
class RankFigures:
    rank: int
    step_time_ms: StepStats | None = None
    host_step_ms: StepStats | None = None  # the host issuing a step alone (train.host_probe)
    peak_allocated_gib: float | None = None
    peak_reserved_gib: float | None = None
    peak_rss_gib: float | None = None
    num_alloc_retries: int | None = None
    num_ooms: int | None = None


@dataclass(frozen=True)
class Figures:
    """What the un-profiled timed steps measured."""

    notices: list[str] = field(default_factory=list)
    step_time_ms: StepStats | None = None
    host_step_ms: StepStats | None = None  # the slowest rank's host per probe step
    tokens_per_step_per_gpu: float | None = None
    tokens_per_s_per_gpu: float | None = None
    flops_per_token: float | None = None
    achieved_tflops_per_gpu: float | None = None
    mfu: float | None = None
    baseline_dir: str | None = None
    baseline_tokens_per_s: float | None = None
    baseline_world_size: int | None = None
    scaling_efficiency: float | None = None
    per_rank: list[RankFigures] = field(default_factory=list)
    peak_allocated_gib: float | None = None
    peak_reserved_gib: float | None = None
    peak_rss_gib: float | None = None
    num_alloc_retries: int | None = None
    num_ooms: int | None = None

    @property
    def peak_memory_gib(self) -> float | None:
        """Peak allocated GPU memory, else the host RSS of a CPU run."""
        return self.peak_allocated_gib if self.peak_allocated_gib is not None else self.peak_rss_gib

    def omitted(self, prefix: str) -> str | None:
        """The notice saying why a figure was omitted (e.g. "MFU omitted: ..."), if any."""
        return next((n for n in self.notices if n.startswith(prefix)), None)


@dataclass(frozen=True)
class Knobs:
    """The capture options analysis reads (run.json `config`); the rest stays in `raw`."""

    model: str = "?"
    batch_size: int | None = None
    seq_len: int | None = None
    dtype: str = "bf16"
    reduce_dtype: str = "fp32"
    reshard_after_forward: bool | int | str = True
    root_reshard_after_forward: str | bool = "default"
    keep_last_unsharded: bool = False
    shard_embeddings: bool = False
    prefetch_forward: int = 0
    prefetch_backward: int = 0
    ac_coverage: float = 0.0
    ac_mode: str = "non-reentrant"
    compile: bool = False
    grad_accum: int = 1
    accum_no_sync: bool = False
    hsdp: int = 1
    baseline: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class ModelInfo:
    preset: str | None = None
    factory: str | None = None
    family: str | None = None
    n_layers: int | None = None
    d_model: int | None = None
    batch_size: int | None = None
    seq_len: int | None = None
    params_total: int | None = None
    params_non_embedding: int | None = None
    flops_per_token: float | None = None
    blocks: list[str] = field(default_factory=list)
    n_blocks: int | None = None

    @property
    def name(self) -> str:
        return self.preset or self.factory or "?"


@dataclass(frozen=True)
class Mesh:
    kind: str = MeshKind.FSDP.value  # a MeshKind
    shard: int | None = None
    replicate: int = 1
    dim_names: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Parallel:
    """How the model was sharded (recorded by capture, verbatim from what it applied)."""

    units: list[str] = field(default_factory=list)
    root: str = ROOT
    reshard_after_forward: dict[str, bool | int | str] = field(default_factory=dict)
    forward_prefetch: dict[str, list[str]] = field(default_factory=dict)
    backward_prefetch: dict[str, list[str]] = field(default_factory=dict)
    mixed_precision: dict[str, str] = field(default_factory=dict)
    mesh: Mesh | None = None
    ac_blocks: list[str] = field(default_factory=list)
    ac_coverage_effective: float = 0.0
    ac_mode: str = "non-reentrant"
    compile: bool = False
    grad_accum: int = 1
    accum_no_sync: bool = False


@dataclass(frozen=True)
class World:
    world_size: int = 1
    local_world_size: int | None = None
    nnodes: int | None = None
    backend: str | None = None
    device: str | None = None


@dataclass(frozen=True)
class Interconnect:
    available: bool = False
    summary: str | None = None  # "nvlink", "pcie", "mixed"
    pairs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Environment:
    hostname: str | None = None
    torch: str | None = None
    cuda: str | None = None
    nccl: str | None = None
    gpu_name: str | None = None
    gpu_count: int | None = None
    gpu_memory_gib: float | None = None
    env_vars: dict[str, str] = field(default_factory=dict)
    interconnect: Interconnect | None = None
    dense_bf16_peak_tflops: float | None = None

    @property
    def topology(self) -> str | None:
        return self.interconnect.summary if self.interconnect is not None else None


@dataclass(frozen=True)
class Files:
    timing: list[str] = field(default_factory=list)
    detailed: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RunRecord:
    """One capture run's run.json."""

    config: Knobs = field(default_factory=Knobs)
    model: ModelInfo = field(default_factory=ModelInfo)
    parallel: Parallel = field(default_factory=Parallel)
    world: World = field(default_factory=World)
    figures: Figures = field(default_factory=Figures)
    environment: Environment = field(default_factory=Environment)
    files: Files = field(default_factory=Files)
    command: str | None = None
    argv: list[str] = field(default_factory=list)
    version: str | None = None
    created: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, data: Any, where: str = RUN_FILE) -> RunRecord:
        """Validate and type a decoded run.json; UserError naming the first bad field."""
        if not isinstance(data, dict):
            raise UserError(
                f"{where}: not an fsdp-trace run.json (a JSON {_json_kind(data)}, not an "
                "object): re-run the capture or remove the file"
            )
        record = _decode(cls, data, where, "")
        return dataclasses.replace(record, raw=data)

    def env(self, name: str) -> str | None:
        """An environment variable the capture recorded (NCCL_*, CUDA_DEVICE_MAX_CONNECTIONS)."""
        return self.environment.env_vars.get(name)

    @property
    def on_gpu(self) -> bool:
        return self.world.device == "cuda"


def read_run(run_dir: str | Path) -> RunRecord:
    """A capture run's run.json; unreadable or malformed is a UserError (one line)."""
    path = Path(run_dir) / RUN_FILE
    try:
        with open_regular(path) as fh:
            text = fh.read(RUN_FILE_MAX_BYTES + 1)
    except NotRegularFile:
        raise UserError(f"{path}: not a regular file: a run directory holds run.json") from None
    except OSError as exc:
        reason = exc.strerror or exc
        raise UserError(f"{path}: unreadable run.json ({reason}): re-run the capture") from None
    return parse_run(text, str(path))


def parse_run(text: bytes, path: str) -> RunRecord:
    """A run.json's bytes as a record (`path` names it in errors): a local file's, or one
    read through a URL (`fsdp_trace.analysis.read.remote`)."""
    if len(text) > RUN_FILE_MAX_BYTES:
        raise UserError(
            f"{path}: over {RUN_FILE_MAX_BYTES >> 20} MB, not a run.json fsdp-trace wrote "
            "(those are a few KB): re-run the capture or remove the file"
        )
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        reason = "nested too deeply" if isinstance(exc, RecursionError) else exc
        raise UserError(f"{path}: unreadable run.json ({reason}): re-run the capture") from None
    return RunRecord.from_json(data, path)


# --- decoding -------------------------------------------------------------------------------


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return {dict: "object", list: "array", str: "string", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def _bad(where: str, path: str, value: Any, expected: str) -> UserError:
    kind = _json_kind(value)
    article = "an" if kind[0] in "aeiou" else "a"
    return UserError(
        f"{where}: {path or 'the file'} is {article} {kind}, expected {expected}: not a "
        "run.json fsdp-trace wrote (re-run the capture, or fix the field)"
    )


@typing.no_type_check
def _decode(tp: Any, value: Any, where: str, path: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is Union or isinstance(tp, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _decode(option, value, where, path)
            except UserError as exc:
                errors.append(exc)
        if len(errors) == 1:
            raise errors[0]  # the one type it could be: its error names what is wrong
        names = " or ".join(_type_name(o) for o in options)
        raise _bad(where, path, value, names)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise _bad(where, path, value, "an object")
        hints = typing.get_type_hints(tp)
        kwargs = {}
        for spec in dataclasses.fields(tp):
            if spec.name == "raw":
                kwargs["raw"] = value
                continue
            if spec.name in value:
                kwargs[spec.name] = _decode(
                    hints[spec.name], value[spec.name], where, _join(path, spec.name)
                )
        return tp(**kwargs)
    if origin is list:
        if not isinstance(value, list):
            raise _bad(where, path, value, "an array")
        (item,) = typing.get_args(tp)
        return [_decode(item, v, where, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise _bad(where, path, value, "an object")
        _, item = typing.get_args(tp)
        return {str(k): _decode(item, v, where, _join(path, str(k))) for k, v in value.items()}
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _bad(where, path, value, "true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if not -INT_LIMIT <= value < INT_LIMIT:
                raise _bad(where, path, value, "an integer within ±2^63")
            return value
        raise _bad(where, path, value, "an integer")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:  # an integer of hundreds of digits
                number = math.inf
            if not math.isfinite(number):
                raise _bad(where, path, value, "a finite number")
            return number
        raise _bad(where, path, value, "a number")
    if tp is str:
        if isinstance(value, str):
            return value
        raise _bad(where, path, value, "a string")
    raise TypeError(f"runrecord cannot decode {tp!r}")  # a field type this module lacks


def _type_name(tp: Any) -> str:
    if dataclasses.is_dataclass(tp):
        return "an object"
    origin = typing.get_origin(tp)
    if origin is list:
        return "an array"
    if origin is dict:
        return "an object"
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string"}.get(
        tp, "null"
    )


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def on_cpu(record: RunRecord) -> bool:
    """A CPU run: device "cpu" (or, where run.json names none, the gloo backend)."""
    world = record.world
    return world.device == "cpu" or (world.device is None and world.backend == "gloo")
