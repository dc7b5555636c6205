"""One rank's analysis (`RankAnalysis`) and the documented columns of every table.
The run-level result (`fsdp_trace.result`) holds these, one per trace."""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple, Protocol

import numpy as np
import pandas as pd

from fsdp_trace.analysis.intervals import overlapping
from fsdp_trace.analysis.table import array_of, one_object_each
from fsdp_trace.errors import UserError

# Per rank × step (µs unless the name says otherwise). Documented in README "Definitions".
STEP_COLUMNS = [
    "rank",
    "source",
    "step",
    "start_us",
    "end_us",
    "step_us",
    "compute_us",
    "comm_us",
    "overlap_us",
    "exposed_us",
    "exposed_pct",
    "idle_us",
    "idle_pct",
    "overlap_pct",
    "ag_us",
    "rs_us",
    "recompute_us",
    "recompute_pct",
    "n_comm_kernels",
    "n_compute_kernels",
    # The step's breakdown (fsdp_trace.analysis.rank.breakdown): its parts add up to step_us.
    # `model_compute_us` is `compute_us` without FSDP's own kernels and recompute.
    "model_compute_us",
    "fsdp_copy_us",
    "exposed_transfer_us",
    "exposed_wait_us",
    "exposed_unsplit_us",
]
# One row per communication kernel (or CPU collective on gloo traces).
COLLECTIVE_COLUMNS = [
    "rank",
    "source",
    "step",
    "collective",
    "block",
    "phase",
    "issued_by",
    "prefetched",
    "start_us",
    "end_us",
    "dur_us",
    "exposed_us",
    "bytes",
    "group_size",
    "algbw_gbps",
    "busbw_gbps",
    "dtype",
    "pg_name",
    "pg_desc",
    "pg_ranks",
    "seq",
    "stream",
    "correlation",
    "kernel",
    # From the cross-rank match (NaN where the collective matched no other rank's):
    "transfer_us",  # the shortest duration of the collective across its group's ranks
    "wait_us",  # this rank's duration − transfer: waiting for the last rank to arrive
    "exposed_transfer_us",  # the part of [end − transfer, end] no compute hides
]
# Per block × phase × collective, averaged per step over the analyzed steps.
BLOCK_COLUMNS = [
    "rank",
    "source",
    "block",
    "phase",
    "collective",
    "count_per_step",
    "unit_count_per_step",
    "expected_per_step",
    "excess",
    "time_us_per_step",
    "exposed_us_per_step",
    "bytes_per_step",
    "algbw_gbps",
    "busbw_gbps",
    "compute_us_per_step",
    "recompute_us_per_step",
]


# Ranks the report's step timeline draws at most (fsdp_trace.render.report.timeline): a local
# run of no more timing traces, analyzed without the cache, keeps its ranks' kernels
# (fsdp_trace.analysis.job.perrank.analyze_all), which the timeline would otherwise parse again.
MAX_TIMELINE_RANKS = 8

# Per block op measured with NCCL beside it and alone (fsdp_trace.analysis.rank.overlap_tax).
OP_TAX_COLUMNS = [
    "shape",
    "nth",
    "kernel",
    "phase",
    "median_with",
    "time_with",
    "n_with",
    "median_alone",
    "n_alone",
    "slowdown",
    "added_us",
]


# The parts, in the order they take precedence, and the per-step table's columns.
PARTS = (
    "recompute_us",
    "compute_us",
    "fsdp_copy_us",
    "exposed_transfer_us",
    "exposed_wait_us",
    "exposed_unsplit_us",
    "idle_us",
)
BREAKDOWN_COLUMNS = ["rank", "source", "step", "step_us", *PARTS]
EXPOSED_PARTS = ("exposed_transfer_us", "exposed_wait_us", "exposed_unsplit_us")


class DictRecord:
    """A frozen dataclass a RankAnalysis keeps as a plain dict (cached as JSON, pickled as
    such): read back by its fields, ignoring keys an older or newer version wrote."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None):
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in (values or {}).items() if k in known})


class Reread(NamedTuple):
    """How a per-rank result that holds no kernels reads them again: the trace analyzed as
    `source` (the cache key's), through the cache when `cache` (as the run was analyzed);
    what identifies the analyzed content: `entry`, the key of the cache entry of the
    analysis (read by that key: the analyzed kernels, whatever the trace holds now), and
    `stamp`, the file's as analyzed (`fsdp_trace.analysis.job.perrank.stamp`: size and
    modification time, a URL's version), checked before the trace is parsed again."""

    source: str
    cache: bool
    entry: str | None = None
    stamp: str | None = None


@dataclass(frozen=True)
class Signals(DictRecord):
    """One rank's evidence of its set-up: label counts over the trace, and per step (median
    over its steps, µs) the GPU time of the work a set-up adds."""

    steps: int = 0
    fsdp2_labels: int = 0  # FSDP::… record_functions
    fsdp1_labels: int = 0  # FullyShardedDataParallel.… record_functions
    ddp_forwards: int = 0  # DistributedDataParallel.forward
    float8_gemms: float = 0.0  # aten::_scaled_mm per step
    float8_cast_us: float = 0.0  # compute launched by float8 ops other than their GEMM
    float8_cast_kernels: float = 0.0  # such kernels per step
    h2d_pinned_us: float = 0.0  # pinned host → device copies (CPU offload's parameters)
    d2h_pinned_us: float = 0.0  # device → pinned host copies (CPU offload's gradients)
    offload_copies_exposed_us: float = 0.0  # those copies' time with no compute beside them
    optimizer_cpu_us: float = 0.0  # the host inside Optimizer.step#…
    optimizer_gpu_us: float = 0.0  # GPU kernels launched by it
    optimizer_idle_us: float = 0.0  # the GPU idle while the host is in the optimizer step


@dataclass(frozen=True)
class HostTime(DictRecord):
    """Per step (median over the steps): the GPU's idle time and what the launching host
    thread did during it, by category (µs); the operators taking most of it themselves (name,
    µs per step of self time: the operators they call are theirs); the profiler's events per
    step."""

    idle_us: float = 0.0
    by_category: dict[str, float] = field(default_factory=dict)
    top_ops: list[list[Any]] = field(default_factory=list)
    events_per_step: float = 0.0
    # The main thread's whole step (its CPU ProfilerStep span) by the same categories: what
    # tells a slow host from its peers' (their gaps may be empty).
    main_by_category: dict[str, float] = field(default_factory=dict)
    # The host's own time per step: the main thread's step less its waiting for the GPU
    # (synchronizations), each timing step's (µs); what tells one slow host from its peers.
    host_steps: list[float] = field(default_factory=list)
    optimizer_impl: str = ""  # "fused", "foreach" or "" (per tensor, or none seen)

    @property
    def host_us(self) -> float:
        """The host's own time per step (median over the steps; NaN: unknown)."""
        return float(np.median(self.host_steps)) if self.host_steps else float("nan")

    @property
    def largest(self) -> str | None:
        found = {k: v for k, v in self.by_category.items() if v > 0}
        return max(found, key=found.get) if found else None


# The empty defaults, copied for each result (a copy costs ~1/10 of making one; every GPU
# rank's analysis replaces them).
_NO_BACKWARD_END = pd.DataFrame({"step": np.empty(0, np.int64), "end_us": np.empty(0)})
_NO_OP_TAX = pd.DataFrame(columns=OP_TAX_COLUMNS)


@dataclass
class RankAnalysis:
    """One trace (one rank, one capture phase) analyzed.

    Fresh from its trace (and in the cache) it holds its kernels, one row per kept GPU event;
    the per-rank result a run keeps does not (`as_kept`, `without_kernels`): what travels
    back from a worker and stays on the client is tables of steps, blocks, collectives and
    exposed intervals, never of events, held compact where exact (`_compact`). What the run
    reads of the kernels is made with the analysis (`fsdp_trace.analysis.rank.kernel_figures`);
    the views that draw or replay kernels read them again (`load_kernels`). One exception,
    where reading again would cost a parse and holding costs little: a local run of at most
    `MAX_TIMELINE_RANKS` timing traces analyzed without the cache keeps them
    (`fsdp_trace.analysis.job.perrank.analyze_all`)."""

    rank: int | None
    path: str
    source: str  # "timing", "detailed" or "trace"
    device: str  # "gpu" or "cpu"
    steps: pd.DataFrame
    collectives: pd.DataFrame
    blocks: pd.DataFrame
    # The kept GPU events with step, phase and block, or None where not held (`kernels`).
    kernel_table: pd.DataFrame | None
    exposed: pd.DataFrame  # exposed-communication intervals: start_us, end_us, step
    compute_phases: pd.DataFrame  # per step: forward/backward/recompute/optimizer compute µs
    fsdp: pd.DataFrame  # per step × FSDP2 label kind × unit: count (context.FACT_COLUMNS)
    streams: dict[int, str] = field(default_factory=dict)  # stream id -> role
    notices: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    # Figures of the kernels (fsdp_trace.analysis.rank.kernel_figures), made with the analysis so
    # that the run reads them without the kernels (the steps' model_compute_us and
    # fsdp_copy_us are made there too):
    n_kernels: int = 0  # kept GPU events
    n_compute: int = 0  # of them, compute kernels
    compute_mean_us: float | None = None  # their mean duration (None: none)
    backward_end: pd.DataFrame = field(default_factory=lambda: _NO_BACKWARD_END.copy())
    op_tax: pd.DataFrame = field(default_factory=lambda: _NO_OP_TAX.copy())
    op_tax_blocks: list[str] = field(default_factory=list)  # the blocks `op_tax` measures
    op_blocks: list[str] = field(default_factory=list)  # every block of a measurable op
    # Compute time per step by kernel name (the `KERNEL_TIME_TOP` largest): what tells which
    # kernels make one rank's GPU slower than its peers'.
    kernel_time: dict[str, float] = field(default_factory=dict)
    reread: Reread | None = None  # where the kernels are read again when not held
    # The set-up evidence of the trace (fsdp_trace.analysis.rank.setup.Signals, as a dict).
    setup: dict[str, Any] = field(default_factory=dict)
    # What the host did while the GPU idled (fsdp_trace.analysis.rank.hostside.HostTime, a dict).
    host: dict[str, Any] = field(default_factory=dict)
    # The trace's CPU slices (fsdp_trace.analysis.rank.analyze.CpuSlices), set on the instance only
    # while `rank.keeping_cpu_slices()` is on: a class attribute, not a field, so the cache
    # never stores it.
    cpu_slices: ClassVar[Any] = None

    @property
    def signals(self) -> Signals:
        """What the trace shows of its set-up (wrapper labels, offload copies, float8)."""
        return Signals.from_dict(self.setup)

    @property
    def host_time(self) -> HostTime:
        """What the launching host thread did while the GPU idled, per step."""
        return HostTime.from_dict(self.host)

    @property
    def kernels(self) -> pd.DataFrame:
        """The kept GPU events (one row per kernel: times, stream, kind, name, step, phase,
        block, ...). Not held by a run's per-rank result: read again (`load_kernels`: through
        the cache when the run used it, else from the trace)."""
        return self.load_kernels()

    def load_kernels(self, step: int | None = None, cache: bool | None = None) -> pd.DataFrame:
        """The kernels (of one `step` when given, rows and index as in the whole table):
        held, else the table read last for this analysis (one kept at a time, while the
        analysis lives, so successive views of one rank read once), else read again
        (`Reread`): from the cache entry of its analysis where the run used the cache and
        `cache` is not False, else from its trace, parsed again if unchanged since (else a
        one-line `UserError`)."""
        k = self._at_hand()
        if k is None:
            k = _read_kernels(self, cache)
        return k if step is None else k[array_of(k, "step") == step]

    def _at_hand(self) -> pd.DataFrame | None:
        """The kernels without reading anything: held, or the table read last for this
        analysis (None: neither)."""
        if self.kernel_table is not None:
            return self.kernel_table
        last = _last  # read once: another thread may replace it
        return last[1] if last is not None and last[0]() is self else None

    def rereads_by_parsing(self) -> bool:
        """Whether `load_kernels` would parse the trace here: not held, not read last, and
        no cache entry of the analysis readable by its key on this machine."""
        if self._at_hand() is not None:
            return False
        return _kernel_reader().parses(self.reread)

    def without_kernels(
        self, cache: bool, entry: str | None = None, stamp: str | None = None
    ) -> RankAnalysis:
        """This analysis as a run keeps it (`as_kept`), without its kernels (`cache`: whether
        they are read again through the cache)."""
        return self.as_kept(cache, kernels=False, entry=entry, stamp=stamp)

    def as_kept(
        self, cache: bool, kernels: bool, entry: str | None = None, stamp: str | None = None
    ) -> RankAnalysis:
        """This analysis as a run keeps it: its tables of their own and compact (`_compact`:
        what travels back from a worker and stays on the client per rank), its kernels only
        when `kernels` (else read again, through the cache when `cache`: `Reread`, with the
        analysis's cache `entry` key and the file's `stamp`). Once kept without kernels,
        kept as it is."""
        if self.kernel_table is None:
            return self
        changes: dict[str, Any] = {
            f.name: _compact(getattr(self, f.name), *_NARROW.get(f.name, ((), ())))
            for f in dataclasses.fields(self)
            if f.name != "kernel_table" and isinstance(getattr(self, f.name), pd.DataFrame)
        }
        if not kernels:
            changes["kernel_table"] = None
        changes["reread"] = Reread(str(self.source), cache, entry, stamp)
        out = dataclasses.replace(self, **changes)
        out.cpu_slices = self.cpu_slices  # not a field: carried by hand (--perfetto's)
        return out

    def exposed_collectives(self) -> list[list[int]]:
        """For each exposed interval, the rows of `collectives` running during it."""
        if self.exposed.empty or self.collectives.empty:
            return [[] for _ in range(len(self.exposed))]
        return overlapping(
            self.exposed["start_us"],
            self.exposed["end_us"],
            self.collectives["start_us"],
            self.collectives["end_us"],
        )

    def summary(self) -> dict[str, Any]:
        """Median and min–max over this trace's steps of the headline figures."""
        out: dict[str, Any] = {"rank": self.rank, "source": self.source, "n_steps": len(self.steps)}
        for column in (
            "step_us",
            "exposed_us",
            "exposed_pct",
            "overlap_pct",
            "idle_pct",
            "comm_us",
            "compute_us",
            "recompute_pct",
        ):
            values = array_of(self.steps, column, np.float64) if len(self.steps) else np.empty(0)
            values = values[~np.isnan(values)]
            if values.size:
                out[column] = {
                    "median": float(np.median(values)),
                    "min": float(values.min()),
                    "max": float(values.max()),
                }
            else:
                out[column] = None
        return out


# Columns a run keeps narrower, per table: (int32 where every value fits, categorical). The
# longest tables a rank keeps after its collectives: its exposed intervals (their step) and
# its FSDP label facts (step, count; the label's kind and unit, a handful of strings on
# thousands of rows), read by the timeline, --perfetto and the configuration's inference,
# which compare, group and count them, never multiply nor assign new labels. The collectives'
# text stays text: readers assign to it (a categorical refuses a new value).
_NARROW: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "exposed": (("step",), ()),
    "fsdp": (("step", "count"), ("kind", "unit")),
}


def _compact(
    frame: pd.DataFrame, int32: tuple[str, ...] = (), categorical: tuple[str, ...] = ()
) -> pd.DataFrame:
    """A copy of `frame` in memory of its own (a cache entry's frames are views of the whole
    entry's bytes, which would otherwise stay with them), its repeated text held once (a
    collective's block, phase, kernel name ... repeat on every row): one object per distinct
    string, None and NaN left as they are; the `categorical` columns, where no value is
    missing, as categoricals (a byte per row; categories sorted, so grouping and sorting
    order as the strings did). The `int32` columns are held as int32 where every value
    fits. Every value reads back as it was."""
    out = frame.copy()
    for name in int32:
        values = array_of(out, name) if name in out else None
        narrowed = narrow_int(values) if values is not None else None
        if narrowed is not values:
            out[name] = narrowed
    for name, dtype in out.dtypes.items():  # each column read only where it is text
        if not _compacted_text(dtype):
            continue
        raw = array_of(out, name, object)
        if name not in categorical and _held_once(raw):
            continue  # one object per distinct value already (the analysis's own text)
        held = categorical_text(raw) if name in categorical else None
        if held is not None:
            out[name] = held
            continue
        shared = one_object_each(raw)
        if shared is raw:
            continue  # nothing repeats, values 1 and 1.0 (equal) would merge, or held once
        out[name] = (
            pd.array(shared, dtype=dtype)
            if isinstance(dtype, pd.StringDtype)
            else pd.Series(shared, index=out.index, dtype=object)
        )
    return out


def kept_columns(table: str, columns: dict[str, Any]) -> dict[str, Any]:
    """`columns` of the RankAnalysis table `table` as a run keeps them (`_NARROW`), for the
    analysis that makes the table: `_compact` then has nothing to set (a pandas column set
    costs ~0.1 ms, paid by every rank however small)."""
    int32, categorical = _NARROW.get(table, ((), ()))
    out = dict(columns)
    for name in int32:
        if name in out:
            out[name] = narrow_int(np.asarray(out[name]))
    for name in categorical:
        values = np.asarray(out[name], dtype=object) if name in out else np.empty(0, object)
        # Only text `_compact` would turn categorical: held as the frame would type it.
        if values.size and _compacted_text(pd.Series(values[:1]).dtype):
            held = categorical_text(values)
            if held is not None:
                out[name] = held
    return out


def _compacted_text(dtype: Any) -> bool:
    """Whether `_compact` shares (or makes categorical) a column of `dtype`: Python objects
    or strings pandas holds as Python objects (pyarrow's are left as they are)."""
    python_strings = isinstance(dtype, pd.StringDtype) and dtype.storage == "python"
    return python_strings or (isinstance(dtype, np.dtype) and dtype.kind == "O")


def narrow_int(values: np.ndarray) -> np.ndarray:
    """int64 `values` as int32 where every one fits (`values` itself otherwise): what a run
    keeps of a table's long integer columns (`_NARROW`)."""
    if values.dtype == np.int64 and len(values):
        limits = np.iinfo(np.int32)
        if limits.min <= values.min() and values.max() <= limits.max:
            return values.astype(np.int32)
    return values


def categorical_text(raw: np.ndarray) -> pd.Categorical | None:
    """Text `raw` (an object array) as the categorical a run keeps (`_NARROW`): where its
    values repeat, are all strings and none is missing; else None."""
    try:
        codes, uniques = pd.factorize(raw, use_na_sentinel=True)
    except TypeError:  # unhashable values
        return None
    texts = len(uniques) < len(raw) and all(isinstance(u, str) for u in uniques)
    return _sorted_categorical(codes, uniques) if texts and (codes >= 0).all() else None


def _sorted_categorical(codes: np.ndarray, uniques) -> pd.Categorical:
    """`pd.Categorical(values)` (its categories the values sorted) from a factorization of
    text values, none missing: the values are not hashed and sorted again."""
    order = np.argsort(np.asarray(uniques, dtype=object), kind="stable")
    place = np.empty(order.size, dtype=np.int64)
    place[order] = np.arange(order.size)
    names = pd.Index([uniques[i] for i in order.tolist()], dtype=str)
    return pd.Categorical.from_codes(place[codes], categories=names, validate=False)


def _held_once(values: np.ndarray) -> bool:
    """Whether every distinct value of `values` is one object (nothing for `_compact` to
    share): as many objects as values, without factorizing. Equal values that are distinct
    objects count twice among the objects; a NaN, unequal to itself, counts alike in both."""
    try:
        return len(set(map(id, values))) == len(set(values))
    except TypeError:  # unhashable values: `_compact` decides
        return False


# The kernels read last, and whose: one tuple, replaced whole (never changed in place), read
# once into a local by its readers (threads may read kernels at once).
_last: tuple[weakref.ref, pd.DataFrame] | None = None


def _forget(ref: weakref.ref) -> None:
    """The analysis whose kernels were read last is gone: its table goes too."""
    global _last
    last = _last
    if last is not None and last[0] is ref:
        _last = None


def _changed(rank: RankAnalysis) -> Exception:
    return UserError(
        f"{rank.path} changed (or was removed) since it was analyzed: analyze it again"
    )


class KernelReader(Protocol):
    """How a rank's kernels are read again: the job stage's (`fsdp_trace.analysis.job.perrank`
    hands it down with `set_kernel_reader` when imported), so the records import nothing
    above them at import time."""

    def read(self, rank: RankAnalysis, again: Reread, cache: bool) -> pd.DataFrame | None:
        """The kernel table (None: the trace changed since it was analyzed)."""

    def parses(self, again: Reread | None) -> bool:
        """Whether reading them again would parse the trace (no trusted cache entry)."""


_reader: KernelReader | None = None


def set_kernel_reader(reader: KernelReader) -> None:
    global _reader
    _reader = reader


def _kernel_reader() -> KernelReader:
    """The reader perrank hands down; imported here on first use where nothing has yet (a
    result unpickled in a process that never analyzed: the one import upward a record makes,
    named in tests/test_architecture.py)."""
    if _reader is None:
        import fsdp_trace.analysis.job.perrank  # noqa: F401  (sets the reader on import)
    assert _reader is not None
    return _reader


def _read_kernels(rank: RankAnalysis, cache: bool | None) -> pd.DataFrame:
    """A rank's kernels read again (`KernelReader.read`): from the cache entry its analysis
    wrote, else its trace parsed and analyzed again when unchanged; as many as the analysis
    kept, else a one-line `UserError`."""
    global _last
    again = rank.reread or Reread(str(rank.source), True)
    cache = again.cache if cache is None else cache and again.cache
    table = _kernel_reader().read(rank, again, cache)
    if table is None or len(table) != rank.n_kernels:
        raise _changed(rank)
    _last = (weakref.ref(rank, _forget), table)
    return table
