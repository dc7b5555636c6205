"""Match each collective across ranks and split its duration into transfer and waiting.

A collective's kernel on every member rank ends at about the same moment (they finish
together); it starts when that rank arrives. So the shortest duration across the members
approximates the transfer time, each rank's excess is time spent waiting for the last one to
arrive, and the rank that starts last is the one the others waited for.

Matching is per process group, among its member ranks: the group is the kernel's `Process
Group Ranks` (else the rank's `distributedInfo.pg_config` entry for its `Process Group
Name`, else every analyzed rank), so HSDP/TP subgroups match within themselves. The profiler
cuts `Process Group Ranks` after 30 ranks (`[0, 1, ..., 29, ...]`): a cut list is never
taken as the members; pg_config's list is, else the analyzed ranks whose traces hold that
group. Within a group the trace's `Seq` (torch >= 2.12) identifies a collective on every
member; without it, the k-th collective of a group in a profiled step is the k-th on every
member (NCCL requires that order), launch order being the kernels' correlation order. Keying
by step keeps ranks aligned even when they dropped different numbers of kernels launched
before the profiled window. Matched kernels must agree on collective type, unit and bytes;
the others are left out, with a notice. Clocks of different hosts can disagree: each rank's
offset is the median difference of matched end times, chained from the lowest rank through
the groups, and start times are corrected by it before deciding who arrived last.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from fsdp_trace import fmt
from fsdp_trace.analysis import classify
from fsdp_trace.analysis import intervals as iv
from fsdp_trace.analysis.rank.breakdown import Matched
from fsdp_trace.analysis.results import RankAnalysis
from fsdp_trace.analysis.table import array_of, dtype_of
from fsdp_trace.vocab import Device

# Matched collectives end within a few µs of each other on one host (NCCL's own completion
# skew); only a larger median difference means the ranks' clocks disagree.
CLOCK_TOLERANCE_US = 50.0
# Arrivals closer than this are a tie: nobody arrived last. Matched kernels on one host end
# within ±5 µs of each other (5th–95th percentile on the gpt-1.3b-b4-2gpu sample), so start
# differences below that are not evidence of who was late.
ARRIVAL_TIE_US = 5.0
ALL_RANKS = "*"  # members of a group whose ranks the trace does not name
# Members of a group whose list the profiler cut: the analyzed ranks that hold the group.
OBSERVED = "?"
_NUMBERS = re.compile(r"-?\d+")


@dataclass
class CrossRank:
    """Matched collectives and per-rank waiting; empty when nothing matched (see notices)."""

    matched: pd.DataFrame  # one row per matched collective
    per_rank: pd.DataFrame  # rank, n_matched, wait_us_per_step, wait_pct, arrived_last, ...
    clock_offsets_us: dict[int, float] = field(default_factory=dict)
    notices: list[str] = field(default_factory=list)
    # One row per rank × matched collective: rank, correlation, match, transfer_us, wait_us.
    participants: pd.DataFrame = field(default_factory=pd.DataFrame)
    # Process groups by the id `matched.group` holds: pg (name) and members ('0,1', or '*'
    # where the trace names none and every analyzed rank counts).
    groups: pd.DataFrame = field(default_factory=pd.DataFrame)

    def __post_init__(self) -> None:
        self._matched_by_rank = _split_by_rank(self.participants)
        self._transfer_by_rank: dict[int, pd.Series] = {
            rank: pd.Series(m.transfer_us, index=m.correlation)
            for rank, m in self._matched_by_rank.items()
        }

    def matched_by_rank(self) -> dict[int, Matched]:
        """Each rank's rows of `participants` (in their order), as the breakdown reads them."""
        return self._matched_by_rank

    def transfer_us(self, rank: int | None, correlations: pd.Series) -> np.ndarray:
        """The cross-rank transfer time of a rank's collectives (NaN where unmatched)."""
        series = self._transfer_by_rank.get(rank) if rank is not None else None
        if series is None:
            return np.full(len(correlations), np.nan)
        return series.reindex(correlations.to_numpy()).to_numpy(dtype=np.float64)

    def without_waiting(self, rank: int | None, collectives: pd.DataFrame) -> pd.DataFrame:
        """A rank's collectives with waiting for late peers taken out: `transfer_us` (the
        cross-rank transfer time, the kernel's duration where unmatched) and `exposed_us`
        capped by it. Waiting is the straggler's cost (rule 10), not the collective's."""
        transfer = self.transfer_us(rank, collectives["correlation"])
        duration = array_of(collectives, "dur_us", np.float64)
        exposed = array_of(collectives, "exposed_us", np.float64)
        matched = ~np.isnan(transfer)
        return pd.DataFrame(
            {
                "transfer_us": np.where(matched, transfer, duration),
                "exposed_us": np.where(matched, np.fmin(exposed, transfer), exposed),
                "matched": matched,
            },
            index=collectives.index,
        )

    @property
    def empty(self) -> bool:
        return self.matched.empty


def _split_by_rank(participants: pd.DataFrame) -> dict[int, Matched]:
    """`participants` split by rank once, each rank's rows in their order (a boolean pick of
    the whole table per rank is quadratic in the ranks)."""
    if participants.empty:
        return {}
    ranks = array_of(participants, "rank")
    order = np.flatnonzero(pd.notna(ranks))  # rows of no rank in no rank's (as groupby)
    order = order[np.argsort(ranks[order], kind="stable")]
    ranks = ranks[order]
    if not ranks.size:
        return {}
    columns = [array_of(participants, c)[order] for c in ("correlation", "transfer_us", "wait_us")]
    cuts = np.flatnonzero(ranks[1:] != ranks[:-1]) + 1
    starts = np.concatenate([[0], cuts])
    ends = np.concatenate([cuts, [ranks.size]])
    return {
        int(ranks[a]): Matched(*(column[a:b] for column in columns))
        for a, b in zip(starts.tolist(), ends.tolist(), strict=True)
    }


def _members_text(raw: Any) -> str | None:
    """'[0, 1]' → '0,1'; a list the profiler cut ('..., 29, ...]') → OBSERVED; empty or
    absent → None."""
    if not isinstance(raw, str):
        return None
    if "..." in raw or "…" in raw:
        return OBSERVED
    return ",".join(_NUMBERS.findall(raw)) or None


def _pg_config_members(rank: RankAnalysis) -> dict[str, str]:
    """pg_name → '0,1' from the trace's distributedInfo.pg_config."""
    config = (rank.meta.get("distributed") or {}).get("pg_config") or []
    return {
        str(pg["pg_name"]): _members_of(tuple(pg["ranks"]))
        for pg in config
        if isinstance(pg, dict) and pg.get("pg_name") is not None and pg.get("ranks")
    }


@functools.lru_cache(maxsize=256)
def _members_of(ranks: tuple) -> str:
    """'0,1' from a member list: made once per distinct list (a thousand ranks of one job
    share theirs), not once per rank."""
    return ",".join(str(int(r)) for r in ranks)


@dataclass
class _Groups:
    """Process groups seen on any rank, numbered: (name, members) → id. Rows carry the id,
    so a group's member list (thousands of ranks) is parsed once per rank, never per row."""

    ids: dict[tuple[str, str], int] = field(default_factory=dict)

    def id(self, pg: str, members: str) -> int:
        return self.ids.setdefault((pg, members), len(self.ids))

    def frame(self) -> pd.DataFrame:
        keys = list(self.ids)
        return pd.DataFrame(
            {"pg": [k[0] for k in keys], "members": [k[1] for k in keys]},
            index=pd.Index(list(self.ids.values()), name="group"),
        )


def _group_ids(rank: RankAnalysis, groups: _Groups) -> np.ndarray:
    """Each of the rank's collectives' process group (an id in `groups`)."""
    c = rank.collectives
    pg = array_of(c, "pg_name", object)
    raw = array_of(c, "pg_ranks", object) if "pg_ranks" in c else np.full(len(c), None)
    # Each (name, list) pair numbered in order of first appearance (missing values a value
    # of their own), as a groupby's ngroup numbers them: one factorization per column and one
    # of the pairs, over the rows; the rest per group.
    pg_code, _ = pd.factorize(pg, use_na_sentinel=False)
    raw_code, raw_values = pd.factorize(raw, use_na_sentinel=False)
    codes, _ = pd.factorize(pg_code.astype(np.int64) * len(raw_values) + raw_code)
    _, first = np.unique(codes, return_index=True)
    configured = _pg_config_members(rank)

    def members(name: Any, text: Any) -> str:
        listed = _members_text(text)
        if listed is None or listed == OBSERVED:
            return configured.get(str(name)) or listed or ALL_RANKS
        return listed

    ids = np.array(
        [
            groups.id("default" if pd.isna(name) else str(name), members(name, text))
            for name, text in zip(pg[first], raw[first], strict=True)
        ],
        dtype=np.int64,
    )
    return ids[codes]


class _Columns:
    """Every usable rank's collectives in (rank, correlation) order, read a column at a time
    from the ranks' own tables: on a large run matching is the client's peak, so it never
    holds every rank's copy beside the whole, nor the columns of kernels that match nothing."""

    def __init__(self, usable: list[RankAnalysis], groups: _Groups) -> None:
        group_ids = [_group_ids(r, groups) for r in usable]  # numbered in the order given
        by_rank = sorted(range(len(usable)), key=lambda i: int(usable[i].rank))
        self.ranks = [int(usable[i].rank) for i in by_rank]
        self.tables = [usable[i].collectives for i in by_rank]
        self.orders = [np.argsort(array_of(c, "correlation"), kind="stable") for c in self.tables]
        self.group = np.concatenate(
            [group_ids[i][o] for i, o in zip(by_rank, self.orders, strict=True)]
        )

    def column(self, name: str, dtype: Any = None, text: bool = False) -> np.ndarray:
        """One column of every rank's collectives (`text`: as strings)."""
        parts = []
        for c, order in zip(self.tables, self.orders, strict=True):
            if text and not _is_str(dtype_of(c, name)):
                values = c[name].astype(str).to_numpy(dtype=dtype)
            else:  # a column of str already is its own astype(str): read without a Series
                values = array_of(c, name, dtype)
            parts.append(values[order])
        return np.concatenate(parts)

    def keys(self) -> pd.DataFrame:
        """What matching keys on: rank, step, correlation, Seq, process group (an id)."""
        rank = np.repeat(np.array(self.ranks, dtype=np.int64), [len(c) for c in self.tables])
        columns = {
            "rank": rank,
            "step": self.column("step"),
            "correlation": self.column("correlation"),
            "seq": self.column("seq"),
            "group": self.group,
        }
        return pd.DataFrame(columns, copy=False)

    def described(self, rows: pd.DataFrame, chosen: np.ndarray) -> pd.DataFrame:
        """`rows` (the rows of `keys` at the positions `chosen`) with what a match reports of
        each kernel."""
        rows["collective"] = self.column("collective")[chosen]
        rows["block"] = self.column("block", text=True)[chosen]
        rows["phase"] = self.column("phase")[chosen]
        for name in ("bytes", "group_size", "start_us", "end_us"):
            rows[name] = self.column(name, np.float64)[chosen]
        return rows


def _is_str(dtype: Any) -> bool:
    """pandas' `str` dtype (pandas 3's for text, either storage): `astype(str)` keeps it,
    missing values too. Not pandas 2's `string[pyarrow_numpy]` (its `future.infer_string`),
    whose `astype(str)` writes a missing value as 'nan'."""
    return (
        isinstance(dtype, pd.StringDtype)
        and dtype.na_value is not pd.NA
        and dtype.storage in ("python", "pyarrow")
    )


def _complete(table: pd.DataFrame, keys: list[str], expected: pd.Series) -> pd.Series:
    """Per kernel, whether its match key holds one kernel of every member rank its group
    expects (two at least): counted on the keys' numbers, not per-row transforms."""
    key = table.groupby(keys, sort=False).ngroup().to_numpy()
    rank = array_of(table, "rank")
    low = int(rank.min())
    span = int(rank.max()) - low + 1
    pairs = iv.unique(key * span + (rank - low))  # the distinct (key, rank) pairs
    n_ranks = np.bincount(pairs // span, minlength=int(key.max()) + 1)[key]
    once = np.bincount(key)[key] == n_ranks  # no rank with two kernels under one key
    wanted = table["group"].map(expected).to_numpy()
    return pd.Series((n_ranks == wanted) & (n_ranks >= 2) & once, index=table.index)


def _expected_members(groups: pd.DataFrame, ranks: list[int], table: pd.DataFrame) -> pd.Series:
    """Per group: how many analyzed ranks take part: the members the trace names, else (a
    cut list) the ranks whose traces hold the group, else all."""
    present = set(ranks)
    holders = table.groupby("group")["rank"].nunique()
    return pd.Series(
        [
            len(ranks)
            if members == ALL_RANKS
            else int(holders.get(g, 0))
            if members == OBSERVED
            else len(present.intersection(int(m) for m in members.split(",")))
            for g, members in zip(groups.index, groups["members"], strict=True)
        ],
        index=groups.index,
        dtype=np.int64,
    )


def _order(table: pd.DataFrame) -> pd.DataFrame:
    """Match key per kernel (`table` in (rank, correlation) order): (group, step, k-th in the
    group and step), or (group, Seq) where every kernel of the group carries one."""
    has_seq = table.groupby("group", sort=False)["seq"].transform("min") >= 0
    kth = table.groupby(["rank", "group", "step"], sort=False).cumcount()
    table["key_step"] = np.where(has_seq, -1, table["step"])
    table["index"] = np.where(has_seq, table["seq"], kth)
    return table


def _clock_offsets(rows: pd.DataFrame, ranks: list[int]) -> tuple[dict[int, float], list[int]]:
    """Each rank's clock offset from the lowest rank: median end-time difference to the
    lowest member of each matched collective, chained through the groups (breadth first)."""
    anchor_end = rows.groupby("match")["end_us"].transform("first")
    anchor = rows.groupby("match")["rank"].transform("first")
    diffs = (rows["end_us"] - anchor_end).groupby([anchor, rows["rank"]]).median()
    edges: dict[int, list[tuple[int, float]]] = {}
    for (a, r), d in diffs.items():
        if a != r:
            edges.setdefault(int(a), []).append((int(r), float(d)))
            edges.setdefault(int(r), []).append((int(a), -float(d)))
    reference = min(ranks)
    offsets = {reference: 0.0}
    frontier = [reference]
    while frontier:
        nxt = []
        for a in frontier:
            for r, d in edges.get(a, []):
                if r not in offsets:
                    offsets[r] = offsets[a] + d
                    nxt.append(r)
        frontier = nxt
    unreached = [r for r in ranks if r not in offsets]
    return {r: offsets.get(r, 0.0) for r in ranks}, unreached


def _wait_per_step(rows: pd.DataFrame, usable: list[RankAnalysis]) -> pd.DataFrame:
    """Per rank: median over steps of the time spent waiting inside NCCL kernels (the union of
    each kernel's waiting start, clipped to the step window) and of its share of that step."""
    windows = _windows(usable).rename(columns={"start_us": "w_start", "end_us": "w_end"})
    w = rows[["rank", "step", "start_us", "wait_us"]].merge(windows, on=["rank", "step"])
    start = np.clip(w["start_us"], w["w_start"], w["w_end"])
    end = np.clip(w["start_us"] + w["wait_us"], w["w_start"], w["w_end"])
    key = w.groupby(["rank", "step"], sort=False).ngroup()  # a number per rank × step
    waited = iv.grouped_union_length(key, start, end)
    steps = w.drop_duplicates(["rank", "step"]).assign(key=key)
    steps["wait_us"] = steps["key"].map(waited).fillna(0.0)
    steps["wait_pct"] = 100.0 * steps["wait_us"] / steps["step_us"]
    return steps.groupby("rank")[["wait_us", "wait_pct"]].median()


WINDOW_COLUMNS = ["step", "start_us", "end_us", "step_us"]


def _windows(usable: list[RankAnalysis]) -> pd.DataFrame:
    """Every rank's step windows and its rank, one table: `pd.concat` of each rank's
    `steps[WINDOW_COLUMNS]` with its `rank` (ignore_index), joined column by column where
    every rank has a number and its columns are numbers (a frame picked, assigned and
    concatenated per rank cost ~0.4 ms a rank)."""
    steps = [r.steps for r in usable]
    numeric = all(
        r.rank is not None and all(dtype_of(s, c).kind in "iuf" for c in WINDOW_COLUMNS)
        for r, s in zip(usable, steps, strict=True)
    )
    if not numeric or not steps:
        return pd.concat(
            [s[WINDOW_COLUMNS].assign(rank=r.rank) for r, s in zip(usable, steps, strict=True)],
            ignore_index=True,
        )
    columns = {c: np.concatenate([array_of(s, c) for s in steps]) for c in WINDOW_COLUMNS}
    lengths = [len(s) for s in steps]
    columns["rank"] = np.repeat(np.array([r.rank for r in usable], dtype=np.int64), lengths)
    return pd.DataFrame(columns)


def _steps_covered(usable: list[RankAnalysis]) -> str:
    parts = []
    for r in usable[:8]:
        steps = r.collectives["step"]
        parts.append(f"rank {r.rank}: steps {steps.min()}–{steps.max()}")
    return "; ".join(parts) + ("; …" if len(usable) > 8 else "")


def _empty(notices: list[str]) -> CrossRank:
    return CrossRank(pd.DataFrame(), pd.DataFrame(), notices=notices)


def match(ranks: list[RankAnalysis]) -> CrossRank:
    """Cross-rank view of the given ranks' collectives (GPU traces, one per rank)."""
    usable = [
        r
        for r in ranks
        if r.device == Device.GPU and not r.collectives.empty and r.rank is not None
    ]
    ids = [int(r.rank) for r in usable]
    if len(usable) < 2:
        return _empty([])
    if len(set(ids)) != len(ids):
        twice = sorted({r for r in ids if ids.count(r) > 1})
        return _empty(
            [f"several traces claim rank {', '.join(map(str, twice))}: no cross-rank view"]
        )
    notices: list[str] = []
    groups = _Groups()
    columns = _Columns(usable, groups)
    table = _order(columns.keys())
    group_info = groups.frame()
    expected = _expected_members(group_info, ids, table)
    named = ~group_info["members"].isin([ALL_RANKS, OBSERVED])
    sizes = group_info.loc[named, "members"].str.count(",") + 1
    partial = sizes[sizes > expected[named]]
    if len(partial):
        g = partial.index[0]
        notices.append(
            f"{fmt.plural(len(partial), 'process group')} {fmt.agree(len(partial), 'has', 'have')} "
            "ranks whose traces were not given (e.g. "
            f"group {group_info.loc[g, 'pg']}: {expected[g]} of {partial[g]} ranks): their "
            "collectives are matched among the ranks given, so transfer times are upper bounds "
            "and waiting lower bounds"
        )
    keys = ["group", "key_step", "index"]
    complete = _complete(table, keys, expected)
    if not complete.any():
        notices.append(
            "no collective matched across ranks (by process group, step and order): the "
            f"traces cover different steps or groups ({_steps_covered(usable)}); profile the "
            "same steps on every rank"
        )
        return _empty(notices)
    unmatched = int((~complete).sum())
    if unmatched:
        counts = table.groupby("rank").size()
        notices.append(
            f"{unmatched} of {len(table)} collective kernels have no counterpart on every "
            "member rank of their process group and are left out of the cross-rank view ("
            + ", ".join(f"rank {r}: {n}" for r, n in counts.head(8).items())
            + (", …" if len(counts) > 8 else "")
            + ")"
        )
    rows = table.loc[complete, ["rank", "step", "correlation", "group", "index"]]
    match_ids = table[complete].groupby(keys, sort=False).ngroup().to_numpy()
    order = np.lexsort((array_of(rows, "rank"), match_ids))  # by match, then rank
    rows = rows.iloc[order].assign(match=match_ids[order])
    rows = columns.described(rows, np.flatnonzero(complete.to_numpy())[order])
    del table, columns
    agree = (
        rows[["match", "collective", "block"]]
        .assign(bytes=rows["bytes"].fillna(-1.0))
        .groupby("match")[["collective", "block", "bytes"]]
        .nunique()
        .max(axis=1)
        == 1
    )
    if not agree.all():
        bad = agree[~agree].index
        example = rows[rows["match"] == bad[0]]
        notices.append(
            f"{len(bad)} matched collectives differ across ranks in type, unit or bytes and are "
            "left out (e.g. "
            + "; ".join(
                f"rank {e.rank}: {e.collective} {e.block} {e.bytes:.0f} B"
                for e in example.head(3).itertuples()
            )
            + "): a rank may have skipped a collective, or the traces come from different runs"
        )
        rows = rows[rows["match"].map(agree).to_numpy()]
        if rows.empty:
            return _empty(notices)
    rows["match"] = rows.groupby("match", sort=True).ngroup()

    offsets, unreached = _clock_offsets(rows, ids)
    if unreached:
        notices.append(
            f"no matched collective links {fmt.agree(len(unreached), 'rank', 'ranks')} "
            + ", ".join(map(str, unreached[:8]))
            + " to the others: their clocks are taken as is"
        )
    applied = {r: (o if abs(o) > CLOCK_TOLERANCE_US else 0.0) for r, o in offsets.items()}
    if any(applied.values()):
        shown = sorted(offsets.items())[:8]
        notices.append(
            "rank clocks disagree: aligned by matched collective ends ("
            + ", ".join(f"rank {r}: {o:+.1f} µs" for r, o in shown)
            + (", …" if len(offsets) > 8 else "")
            + ")"
        )
    rows["arrival"] = rows["start_us"] - rows["rank"].map(applied)
    duration = rows["end_us"] - rows["start_us"]
    by_match = rows.groupby("match", sort=True)
    transfer = duration.groupby(rows["match"]).min()
    rows["transfer_us"] = rows["match"].map(transfer)
    rows["wait_us"] = duration - rows["transfer_us"]

    ordered = rows[["match", "arrival", "rank"]].sort_values(["match", "arrival"], kind="stable")
    last_two = ordered.groupby("match", sort=True).tail(2)
    del ordered
    latest = last_two.groupby("match").last()
    runner_up = last_two.groupby("match")["arrival"].first()
    tie = (latest["arrival"] - runner_up) <= ARRIVAL_TIE_US
    last_rank = latest["rank"].where(~tie, -1).astype(np.int64)
    lateness = latest["arrival"] - by_match["arrival"].median()

    info = by_match.first()
    factor = classify.bus_factors(info["collective"], info["group_size"])
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = np.where(transfer > 0, info["bytes"] / (transfer * 1e-6) / 1e9, np.nan)
    matched = pd.DataFrame(
        {
            "group": info["group"],
            "pg": info["group"].map(group_info["pg"]),
            "n_ranks": by_match.size(),
            "step": info["step"],
            "index": info["index"],
            "collective": info["collective"],
            "block": info["block"],
            "phase": info["phase"],
            "bytes": info["bytes"],
            "transfer_us": transfer,
            "max_wait_us": by_match["wait_us"].max(),
            "last_rank": last_rank,
            "lateness_us": lateness.where(~tie, 0.0),
            "transfer_algbw_gbps": algbw,
            "transfer_busbw_gbps": algbw * factor,
        }
    ).reset_index(drop=True)

    rows["last"] = array_of(rows, "rank") == rows["match"].map(last_rank).to_numpy()
    per = rows.groupby("rank").agg(n_matched=("match", "size"), arrived_last=("last", "sum"))
    waits = _wait_per_step(rows, usable)
    per_rank = pd.DataFrame(
        {
            "rank": ids,
            "n_matched": per["n_matched"].reindex(ids, fill_value=0).to_numpy(),
            "wait_us_per_step": waits["wait_us"].reindex(ids).to_numpy(),
            "wait_pct": waits["wait_pct"].reindex(ids).to_numpy(),
            "arrived_last": per["arrived_last"].reindex(ids, fill_value=0).to_numpy(np.int64),
            "clock_offset_us": [offsets[r] for r in ids],
        }
    )
    per_rank["arrived_last_share"] = per_rank["arrived_last"] / per_rank["n_matched"].where(
        per_rank["n_matched"] > 0
    )
    per_rank = per_rank.sort_values("rank").reset_index(drop=True)
    participants = rows[["rank", "correlation", "match", "transfer_us", "wait_us"]].reset_index(
        drop=True
    )
    return CrossRank(matched, per_rank, offsets, notices, participants, group_info)
