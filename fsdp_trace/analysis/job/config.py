"""The FSDP configuration a run used, inferred from its traces (run.json, when present, wins;
where the two disagree a notice says so). Every expectation the analysis and the diagnosis
hold a run to (gathers per unit, reduce-scatters, micro-batches) comes from here, never from a
silent default.

What the trace shows and how it is read:
- units: the paths in `FSDP::pre_forward (unit)` labels, in the order forward first runs them;
  the root is the label without a path.
- `reshard_after_forward` per unit: a unit whose parameters are gathered again in backward
  reshards after forward (True; an int when the backward gather runs on a smaller group);
  one gathered in forward only keeps them (False).
- micro-batches per optimizer step: `FSDP::root_pre_forward` per profiled step.
- activation checkpointing: units whose backward re-runs forward ops (recompute).
- prefetch depth: how many units ahead of the issuing unit a prefetched all-gather runs
  (`FSDP::forward_prefetch for X` inside `FSDP::pre_forward (Y)`).
- device mesh: the groups the collectives run on (`Group size`, `Process Group Name`, the
  trace's `distributedInfo.pg_config`): all-gathers and reduce-scatters on the shard group,
  HSDP's gradient all-reduce on the replicate group.
- torch.compile: compiled regions on the CPU side.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from fsdp_trace.analysis import intervals as iv
from fsdp_trace.analysis.rank import context
from fsdp_trace.analysis.rank import setup as setup_mod
from fsdp_trace.analysis.rank.context import display_name
from fsdp_trace.analysis.read.trace import pg_sizes
from fsdp_trace.analysis.results import RankAnalysis
from fsdp_trace.analysis.table import array_of, dtype_of
from fsdp_trace.fmt import plural
from fsdp_trace.runrecord import RunRecord
from fsdp_trace.vocab import (
    NON_BLOCK_UNITS,
    ROOT,
    UNATTRIBUTED,
    Collective,
    MeshKind,
    Parallelism,
    Phase,
)


class From:
    """Where a configuration item came from."""

    TRACE = "trace"
    RUN = "run.json"
    DEFAULT = "FSDP2 default"  # neither says: FSDP2's documented default is assumed, and said


@dataclass(frozen=True)
class Item:
    """One configuration item: its value, where it came from, and what showed it."""

    value: Any
    source: str
    evidence: str = ""


@dataclass(frozen=True)
class Unit:
    """One FSDP unit as the run used it."""

    name: str  # as users know it (wrapper segments stripped)
    raw: str  # the path in the trace's FSDP2 labels
    reshard_after_forward: Item  # True, False or an int group size
    gathers_per_micro_batch: float | None  # measured: all-gathers per forward+backward
    checkpointed: bool


@dataclass(frozen=True)
class Mesh:
    """The data-parallel mesh: 1-D FSDP over `shard` ranks, or HSDP `replicate` × `shard`."""

    kind: str  # a MeshKind
    shard: int | None
    replicate: int | None
    shard_group: str | None = None  # process group name/description of the gathers
    replicate_group: str | None = None  # ... of HSDP's gradient all-reduce
    other_groups: list[str] = field(default_factory=list)

    def describe(self) -> str:
        if self.kind == MeshKind.HSDP:
            return f"HSDP, {self.replicate} replicas × {self.shard} shards"
        if self.kind == MeshKind.FSDP:
            return f"FSDP over {self.shard} ranks" if self.shard else "FSDP"
        if self.kind == MeshKind.DDP:
            return f"DDP over {self.replicate} ranks" if self.replicate else "DDP"
        if self.kind == MeshKind.SINGLE:
            return "one rank (no communication)"
        return "unknown"


@dataclass(frozen=True)
class InferredConfig:
    """What the run's FSDP configuration was, item by item with its source."""

    setup: Item  # value: fsdp_trace.analysis.rank.setup.SetUp (wrapper, offload, float8)
    world_size: Item
    mesh: Item  # value: Mesh
    units: list[Unit]  # forward order, the root last
    micro_batches: Item  # per optimizer step
    checkpointed: Item  # value: list of units that recompute
    forward_prefetch: Item  # depth; 0 = FSDP2's implicit forward prefetch
    backward_prefetch: Item  # depth; FSDP2's default is 1
    compiled: Item  # bool
    reduce_dtype: Item  # the reduce-scatter's dtype ("Float", "BFloat16"), None unknown
    accum_no_sync: Item  # bool: gradients reduced once per step under accumulation
    labels: bool  # the traces carry FSDP2 labels (attribution possible)
    notices: list[str] = field(default_factory=list)

    def unit(self, name: str) -> Unit | None:
        return next((u for u in self.units if u.name == name), None)

    @property
    def parallelism(self) -> str:
        """FSDP2, FSDP1, DDP or none (a `Parallelism`)."""
        return self.setup.value.parallelism

    @property
    def blocks(self) -> list[str]:
        """The transformer-block units: one module each, not the root, in forward order."""
        return [u.name for u in self.units if u.name not in NON_BLOCK_UNITS and ", " not in u.name]

    def reshards(self, unit: str) -> bool | int | None:
        found = self.unit(unit)
        return None if found is None else found.reshard_after_forward.value

    def expected(self, unit: str, collective: str) -> float:
        """Collectives of `unit` per optimizer step the configuration implies: per
        micro-batch 2 all-gathers when it reshards after forward, 1 when it keeps its
        parameters; 1 reduce-scatter (HSDP: and 1 all-reduce), once per step when gradients
        sync only on the last micro-batch. NaN where nothing is implied."""
        if unit == UNATTRIBUTED:
            return float("nan")
        micro = float(self.micro_batches.value)
        if collective == Collective.ALL_GATHER:
            reshard = self.reshards(unit)
            if reshard is None:
                return float("nan")
            return micro * (1.0 if reshard is False else 2.0)
        if collective in (Collective.REDUCE_SCATTER, Collective.ALL_REDUCE):
            if collective == Collective.ALL_REDUCE and self.mesh.value.kind != MeshKind.HSDP:
                return float("nan")
            return 1.0 if self.accum_no_sync.value else micro
        return float("nan")


# --- inference ------------------------------------------------------------------------------


def infer(ranks: list[RankAnalysis], run: RunRecord | None) -> InferredConfig:
    """The configuration of one run from its ranks' analyses (timing or plain traces) and,
    when given, its run.json."""
    notices: list[str] = []
    facts = _Labels.of(ranks)
    coll = _collectives(ranks)
    n_steps = max(1, _n_steps(facts, coll))
    labels = facts.any

    found = setup_mod.infer([r.signals for r in ranks])
    setup = Item(found, From.TRACE, found.parallelism_evidence)
    micro = _micro_batches(facts, run, notices)
    order = _unit_order(facts, coll)
    recompute_units = facts.recompute
    raw_names = {}
    for r in ranks:
        raw_names.update(r.meta.get("unit_names") or {})
    units = [
        Unit(
            name=name,
            raw=raw_names.get(name, name),
            reshard_after_forward=_reshard(name, coll, run, notices),
            gathers_per_micro_batch=_gathers(name, coll, n_steps * len(ranks), micro.value),
            checkpointed=name in recompute_units,
        )
        for name in order
    ]
    return InferredConfig(
        setup=setup,
        world_size=_world_size(ranks, run),
        mesh=_mesh(ranks, coll, run, notices, found),
        units=units,
        micro_batches=micro,
        checkpointed=_checkpointed(recompute_units, run, notices),
        forward_prefetch=_prefetch(coll, order, Phase.FORWARD, run),
        backward_prefetch=_prefetch(coll, order, Phase.BACKWARD, run),
        compiled=_compiled(ranks, run, notices),
        reduce_dtype=_reduce_dtype(coll, run),
        accum_no_sync=_no_sync(coll, micro.value, n_steps * len(ranks), run),
        labels=labels,
        notices=notices + _attribution_notices(labels, coll, found),
    )


# The columns of the ranks' collectives read here (`_collectives`).
READ = [
    "rank",
    "step",
    "collective",
    "block",
    "phase",
    "issued_by",
    "prefetched",
    "start_us",
    "group_size",
    "dtype",
    "pg_name",
    "pg_desc",
]


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if f is not None and len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _collectives(ranks: list[RankAnalysis]) -> pd.DataFrame:
    """Every rank's collectives at once, as read here: only the `READ` columns, and each text
    column that no rank misses a value of as one categorical over every rank's values
    (categories sorted: grouped and sorted as the strings; a byte per row where the strings
    take a pointer). On a large run this table is the client's peak. Column by column: no
    copy of any rank's frame."""
    frames = [r.collectives for r in ranks if len(r.collectives)]
    if not frames:
        return pd.DataFrame()
    read = [c for c in READ if any(c in f for f in frames)]
    # Each column's dtype a rank, then its values, read from the frames (no Series a rank).
    dtypes = {c: [dtype_of(f, c) if c in f else None for f in frames] for c in read}
    text = [
        c
        for c in read
        if all(d is not None and _is_text(d) for d in dtypes[c])
        and not any(pd.isna(array_of(f, c)).any() for f in frames)
    ]
    rest = [c for c in read if c not in text]
    if all(d is not None for c in rest for d in dtypes[c]):
        coll = pd.DataFrame({c: _joined(frames, c, dtypes[c]) for c in rest})
    else:  # ranks without some column: aligned as concat aligns frames
        coll = _concat([f[[c for c in rest if c in f]] for f in frames])
    for c in text:  # its categories sorted, as union_categoricals(sort_categories=True); the
        # values joined as Python objects (pandas' concat of a thousand ranks' categoricals of
        # differing categories costs ~0.6 ms a rank)
        coll[c] = pd.Categorical(np.concatenate([array_of(f, c, object) for f in frames]))
    return coll


def _joined(frames: list[pd.DataFrame], name: str, dtypes: list[Any]) -> pd.Series:
    """`pd.concat([f[name] for f in frames], ignore_index=True)`; columns of one numpy dtype
    joined as arrays (a thousand ranks' columns: pandas' concat costs ~10 µs a part)."""
    dtype = dtypes[0]
    if isinstance(dtype, np.dtype) and all(d == dtype for d in dtypes):
        return pd.Series(np.concatenate([array_of(f, name) for f in frames]), dtype=dtype)
    return pd.concat([f[name] for f in frames], ignore_index=True)


def _is_text(dtype: Any) -> bool:
    if isinstance(dtype, pd.StringDtype | pd.CategoricalDtype):
        return True
    return isinstance(dtype, np.dtype) and dtype.kind == "O"


@dataclass
class _Labels:
    """What `infer` reads of the ranks' FSDP label facts (`RankAnalysis.fsdp`), gathered rank
    by rank: every rank's facts are never concatenated (on a large run, that copy would be
    the client's peak)."""

    any: bool = False  # any label at all
    # Per rank: FSDP::root_pre_forward per step; the steps labelled.
    roots: dict[Any, pd.Series] = field(default_factory=dict)
    steps: dict[Any, np.ndarray] = field(default_factory=dict)
    # Per unit, its first pre_forward on the lowest labelled rank (units in the forward order).
    first_forward: pd.DataFrame | None = None
    recompute: set[str] = field(default_factory=set)  # units whose forward re-runs in backward
    root: bool = False  # a label of the root

    @classmethod
    def of(cls, ranks: list[RankAnalysis]) -> _Labels:
        """Rank by rank; traces claiming one rank count as one rank, as grouping by rank
        counts them."""
        out = cls()
        # The lowest labelled rank's pre_forward facts (only theirs are read).
        lowest: Any = None
        forward: list[pd.DataFrame] = []
        for r in ranks:
            facts = r.fsdp
            if not len(facts):
                continue
            out.any = True
            kind, unit = array_of(facts, "kind"), array_of(facts, "unit")
            rows = unit[kind == context.RECOMPUTE_FACT]
            out.recompute |= {str(u) for u in rows if u not in NON_BLOCK_UNITS}
            out.root = out.root or bool((unit == ROOT).any())
            if r.rank is None:  # grouped by rank, a trace without one is left out
                continue
            step = array_of(facts, "step")
            is_root = kind == context.ROOT_PRE_FORWARD
            if is_root.any():
                sums = _sum_per_step(step[is_root], array_of(facts, "count")[is_root])
                seen = out.roots.get(r.rank)
                out.roots[r.rank] = sums if seen is None else seen.add(sums, fill_value=0)
            steps = iv.unique(step)
            out.steps[r.rank] = np.union1d(out.steps.get(r.rank, steps), steps)
            is_pre = kind == context.PRE_FORWARD
            if is_pre.any() and (lowest is None or r.rank <= lowest):
                if r.rank != lowest:
                    lowest, forward = r.rank, []
                forward.append(facts[is_pre])
        if forward:
            pre = pd.concat(forward)
            out.first_forward = pre.groupby("unit", observed=True)["first_ts"].min().reset_index()
        return out


def _sum_per_step(step: np.ndarray, count: np.ndarray) -> pd.Series:
    """`groupby("step")["count"].sum()` of integer counts: per step ascending, their sum."""
    steps, where = iv.unique(step, return_inverse=True)
    sums = np.bincount(where, weights=count, minlength=steps.size).astype(np.int64)
    return pd.Series(sums, index=pd.Index(steps, name="step"), name="count")


def _n_steps(facts: _Labels, coll: pd.DataFrame) -> int:
    """Profiled steps per rank (the most any rank has)."""
    if not coll.empty and "step" in coll:
        per_rank = coll.groupby("rank", observed=True)["step"].nunique() if "rank" in coll else None
        return int(per_rank.max()) if per_rank is not None else int(coll["step"].nunique())
    return max((len(s) for s in facts.steps.values()), default=1)


def _world_size(ranks: list[RankAnalysis], run: RunRecord | None) -> Item:
    if run is not None:
        return Item(run.world.world_size, From.RUN)
    sizes = {r.meta.get("world_size") for r in ranks} - {None}
    if sizes:
        return Item(int(max(sizes)), From.TRACE, "distributedInfo.world_size")
    return Item(len(ranks) or None, From.TRACE, "number of traces")


def _micro_batches(facts: _Labels, run: RunRecord | None, notices: list[str]) -> Item:
    roots = [s.to_numpy() for s in facts.roots.values()]
    seen = int(np.median(np.concatenate(roots))) if roots else None
    if run is not None:
        recorded = run.parallel.grad_accum
        if seen is not None and seen != recorded:
            notices.append(
                f"run.json records {recorded} micro-batches per step, the trace shows {seen} "
                "forwards of the root per profiled step: run.json is used"
            )
        return Item(recorded, From.RUN)
    if seen is not None:
        return Item(max(seen, 1), From.TRACE, f"{seen} FSDP::root_pre_forward per profiled step")
    return Item(1, From.DEFAULT, "no FSDP::root_pre_forward label: one forward per step assumed")


def _unit_order(facts: _Labels, coll: pd.DataFrame) -> list[str]:
    """Units in the order forward first reaches them (their pre_forward, on the lowest
    labelled rank), the root last."""
    names: list[str] = []
    if facts.first_forward is not None:
        one = facts.first_forward.sort_values("first_ts")
        names = [u for u in one["unit"].astype(str) if u != ROOT]
    if not names and not coll.empty:  # no labels beyond the collectives' own
        gathers = coll[coll["collective"] == Collective.ALL_GATHER]
        firsts = gathers.groupby("block", observed=True)["start_us"].min().sort_values()
        names = [u for u in firsts.index.astype(str) if u not in NON_BLOCK_UNITS]
    has_root = facts.root or (not coll.empty and (coll["block"] == ROOT).any())
    return names + ([ROOT] if has_root else [])


def _gathers(name: str, coll: pd.DataFrame, rank_steps: int, micro: int) -> float | None:
    if coll.empty:
        return None
    ag = coll[(coll["collective"] == Collective.ALL_GATHER) & (coll["block"] == name)]
    if ag.empty:
        return None
    return len(ag) / rank_steps / max(micro, 1)


def _reshard(name: str, coll: pd.DataFrame, run: RunRecord | None, notices: list[str]) -> Item:
    """Whether the unit is gathered again in backward (reshards after forward)."""
    seen, evidence = None, ""
    if not coll.empty:
        ag = coll[(coll["collective"] == Collective.ALL_GATHER) & (coll["block"] == name)]
        fwd = ag[ag["phase"] == Phase.FORWARD]
        bwd = ag[ag["phase"].isin([Phase.BACKWARD, Phase.RECOMPUTE])]
        if len(bwd):
            seen = True
            evidence = "gathered again in backward"
            fwd_size, bwd_size = fwd["group_size"].max(), bwd["group_size"].min()
            if len(fwd) and bwd_size == bwd_size and fwd_size == fwd_size and bwd_size < fwd_size:
                seen = int(bwd_size)
                evidence = f"gathered again in backward, on a group of {seen}"
        elif len(fwd):
            seen, evidence = False, "gathered in forward only"
    if run is not None and name in _recorded_units(run):
        recorded = _recorded_reshard(name, run)
        if recorded is not None:
            if seen is not None and bool(seen) != bool(recorded):
                notices.append(
                    f"{name}: run.json records reshard_after_forward={recorded}, the trace "
                    f"shows it {evidence}: run.json is used"
                )
            return Item(recorded, From.RUN)
    if seen is not None:
        return Item(seen, From.TRACE, evidence)
    # No gathers to read it from (a single rank, or no labels): FSDP2's default (torch >= 2.8).
    return Item(name != ROOT, From.DEFAULT)


def _recorded_reshard(name: str, run: RunRecord) -> bool | int | None:
    """A unit's recorded setting; "default" is FSDP2's default for it (torch >= 2.8: True
    except the root; before 2.8 the root never resharded after forward)."""
    setting = _recorded_units(run).get(name)
    if setting is None:
        return None
    if name == ROOT and _torch_before(run.environment.torch or "", (2, 8)):
        return False
    if setting == "default":
        return name != ROOT
    if isinstance(setting, str):
        text = setting.strip().lower()
        return True if text == "true" else False if text == "false" else None
    return setting


def _recorded_units(run: RunRecord) -> dict[str, bool | int | str]:
    """run.json's reshard setting per unit, by the unit's name as shown (wrappers stripped)."""
    return {display_name(u): v for u, v in run.parallel.reshard_after_forward.items()}


def _torch_before(version: str, limit: tuple[int, int]) -> bool:
    match = re.match(r"^(\d+)\.(\d+)", version)
    return bool(match) and (int(match.group(1)), int(match.group(2))) < limit


def _checkpointed(seen: set[str], run: RunRecord | None, notices: list[str]) -> Item:
    """Checkpointed units: run.json records what `--ac-coverage` applied; recompute in the
    trace is a fact too (a model may checkpoint its own blocks): the union, and a notice
    where they differ."""
    ordered = sorted(seen, key=_natural)
    if run is None:
        return Item(ordered, From.TRACE, "forward ops re-run inside backward")
    recorded = [display_name(b) for b in run.parallel.ac_blocks]
    extra = [b for b in ordered if b not in recorded]
    missing = [b for b in recorded if seen and b not in seen]
    if extra or missing:
        parts = []
        if extra:
            parts.append(f"recompute run.json does not record: {', '.join(extra)}")
        if missing:
            parts.append(f"recorded as checkpointed, no recompute seen: {', '.join(missing)}")
        notices.append(
            "run.json's checkpointed blocks and the trace differ (" + "; ".join(parts) + "): "
            "both are taken as checkpointed"
        )
    union = sorted(set(recorded) | seen, key=_natural)
    source = From.RUN if not extra else f"{From.RUN} + {From.TRACE}"
    return Item(union, source, "recorded, and forward ops re-run inside backward")


def _natural(name: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(name))]


def _prefetch(coll: pd.DataFrame, order: list[str], phase: str, run: RunRecord | None) -> Item:
    """Prefetch depth: how far ahead of the issuing unit a prefetched gather runs."""
    if run is not None:
        depth = (
            run.config.prefetch_forward if phase == Phase.FORWARD else run.config.prefetch_backward
        )
        if depth:
            return Item(depth, From.RUN)
    default = 0 if phase == Phase.FORWARD else 1
    if coll.empty or not order:
        return Item(default, From.DEFAULT)
    ag = coll[
        (coll["collective"] == Collective.ALL_GATHER)
        & (coll["phase"] == phase)
        & coll["prefetched"].astype(bool)
    ]
    position = {name: i for i, name in enumerate(order)}
    pairs = [
        abs(position[b] - position[i])
        for b, i in zip(ag["block"].astype(str), ag["issued_by"].astype(str), strict=True)
        if b in position and i in position and b != i
    ]
    if pairs:
        depth = int(max(pairs))
        return Item(depth, From.TRACE, f"gathers issued up to {plural(depth, 'unit')} ahead")
    if phase == Phase.FORWARD:
        return Item(0, From.TRACE, "each unit gathers its own parameters (implicit prefetch)")
    return Item(default, From.DEFAULT)


def _compiled(ranks: list[RankAnalysis], run: RunRecord | None, notices: list[str]) -> Item:
    regions = sum(int(r.meta.get("compiled_regions") or 0) for r in ranks)
    if run is not None:
        if regions and not run.config.compile:
            notices.append("the trace shows torch.compile regions where run.json records none")
        return Item(run.config.compile, From.RUN)
    if regions:
        return Item(True, From.TRACE, f"{regions} compiled regions")
    return Item(False, From.TRACE, "no compiled regions")


def _reduce_dtype(coll: pd.DataFrame, run: RunRecord | None) -> Item:
    if run is not None:
        return Item(
            run.parallel.mixed_precision.get("reduce_dtype", run.config.reduce_dtype), From.RUN
        )
    if coll.empty or "dtype" not in coll:
        return Item(None, From.TRACE)
    rs = coll.loc[coll["collective"] == Collective.REDUCE_SCATTER, "dtype"].dropna()
    if rs.empty:
        return Item(None, From.TRACE)
    dtype = str(rs.mode().iloc[0])
    return Item(DTYPE_NAMES.get(dtype, dtype), From.TRACE, f"reduce-scatter dtype {dtype}")


# The trace's dtype names as the capture options spell them.
DTYPE_NAMES = {"Float": "fp32", "BFloat16": "bf16", "Half": "fp16", "Float16": "fp16"}


def _no_sync(coll: pd.DataFrame, micro: int, rank_steps: int, run: RunRecord | None) -> Item:
    if run is not None:
        return Item(run.config.accum_no_sync, From.RUN)
    if micro <= 1 or coll.empty:
        return Item(False, From.DEFAULT if coll.empty else From.TRACE)
    rs = coll[coll["collective"] == Collective.REDUCE_SCATTER]
    per_unit = rs.groupby("block", observed=True).size() / max(rank_steps, 1)
    once = bool(len(per_unit)) and float(per_unit.median()) <= 1.0
    return Item(once, From.TRACE, "reduce-scatters per unit and step")


def _group_label(name: Any, desc: Any) -> str:
    parts = [str(v) for v in (desc, name) if v is not None and v == v]
    return " / ".join(dict.fromkeys(parts)) or "?"


def _mesh(
    ranks: list[RankAnalysis],
    coll: pd.DataFrame,
    run: RunRecord | None,
    notices: list[str],
    setup: setup_mod.SetUp,
) -> Item:
    world = max([int(r.meta.get("world_size") or 0) for r in ranks] + [0]) or None
    seen = None
    if setup.parallelism == Parallelism.DDP and run is None:
        # Every rank holds every parameter; gradients are all-reduced over the world.
        group = _mode(coll["group_size"]) if not coll.empty else None
        return Item(
            Mesh(MeshKind.DDP, None, group or world, None, _group_of(coll)),
            From.TRACE,
            f"{setup_mod.DDP_FORWARD} labels; all-reduces over {group or world} ranks",
        )
    if not coll.empty:
        gathers = coll[
            coll["collective"].isin([Collective.ALL_GATHER, Collective.REDUCE_SCATTER])
            & (coll["block"] != UNATTRIBUTED)
        ]
        reduces = coll[
            (coll["collective"] == Collective.ALL_REDUCE) & (coll["phase"] == Phase.BACKWARD)
        ]
        shard = _mode(gathers["group_size"])
        replicate = _mode(reduces["group_size"])
        shard_name = _group_of(gathers)
        replicate_name = _group_of(reduces)
        others = sorted(
            {_group_label(n, d) for n, d in zip(coll["pg_name"], coll["pg_desc"], strict=True)}
            - {shard_name, replicate_name}
        )
        hsdp = shard is not None and replicate is not None and replicate > 1
        if hsdp and world and shard * replicate != world:
            # A backward all-reduce that is not HSDP's (R × S would be the world): e.g.
            # tensor parallelism beside FSDP. Named, not taken for a replicate group.
            others = [*others, f"all-reduce over {replicate} ranks ({replicate_name})"]
            hsdp = False
        if hsdp:
            seen = Mesh(MeshKind.HSDP, shard, replicate, shard_name, replicate_name, others)
        elif shard is not None:
            seen = Mesh(MeshKind.FSDP, shard, 1, shard_name, None, others)
    if seen is None and world:
        sizes = sorted(
            set().union(*(pg_sizes(r.meta.get("distributed") or {}).values() for r in ranks))
        )
        if world == 1:
            seen = Mesh(MeshKind.SINGLE, 1, 1)
        elif sizes:
            seen = Mesh(MeshKind.FSDP, world, 1)
    if run is not None and run.parallel.mesh is not None:
        recorded = run.parallel.mesh
        mesh = Mesh(
            recorded.kind,
            recorded.shard,
            recorded.replicate,
            seen.shard_group if seen else None,
            seen.replicate_group if seen else None,
            seen.other_groups if seen else [],
        )
        if seen is not None and (seen.kind, seen.shard) != (mesh.kind, mesh.shard):
            notices.append(
                f"run.json records {mesh.describe()}, the collectives show {seen.describe()}: "
                "run.json is used"
            )
        return Item(mesh, From.RUN)
    if seen is not None:
        return Item(seen, From.TRACE, "collective group sizes")
    if run is not None:
        size = run.world.world_size
        return Item(Mesh(MeshKind.FSDP if size > 1 else MeshKind.SINGLE, size, 1), From.RUN)
    return Item(Mesh(MeshKind.UNKNOWN, None, None), From.TRACE)


def _mode(values: pd.Series) -> int | None:
    values = pd.to_numeric(values, errors="coerce").dropna()
    return int(values.mode().iloc[0]) if len(values) else None


def _group_of(frame: pd.DataFrame) -> str | None:
    if frame.empty:
        return None
    pairs = frame[["pg_name", "pg_desc"]].astype(object)
    first = pairs.iloc[0]
    return _group_label(first["pg_name"], first["pg_desc"])


def _attribution_notices(labels: bool, coll: pd.DataFrame, setup: setup_mod.SetUp) -> list[str]:
    if coll.empty:
        return []
    unattributed = float((coll["block"] == UNATTRIBUTED).mean())
    if setup.parallelism == Parallelism.DDP:
        return [
            "DDP: every rank holds every parameter and gradients are all-reduced in buckets "
            "during backward; there are no FSDP units, gathers or reduce-scatters, so the "
            "per-block figures do not apply"
        ]
    if setup.parallelism == Parallelism.FSDP1 and unattributed > 0.5:
        return [
            "FSDP1 (the FullyShardedDataParallel class): its labels name no module and its "
            "collectives here could not be placed by the order of its hooks (on a CPU trace "
            "they are the host's own records): they are `unattributed`"
        ]
    if setup.parallelism == Parallelism.FSDP1:
        return [
            "FSDP1 (the FullyShardedDataParallel class): its labels name no module, so its "
            "units are named by forward order (root, unit 1 … unit N) and each collective is "
            "attributed by the order of FSDP1's hooks"
        ]
    if not labels:
        return [
            "no FSDP2 labels in the traces (FSDP1, torch < 2.5, or labels lost): every "
            "collective is `unattributed`, so per-block figures, reshard and prefetch cannot "
            "be read; capture with FSDP2 (`fully_shard`) on torch >= 2.5"
        ]
    if unattributed > 0.5:
        return [
            f"{100 * unattributed:.0f} % of the collectives have no FSDP2 label around their "
            "launch (`unattributed`): per-block figures cover the rest only"
        ]
    return []
