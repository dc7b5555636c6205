"""Cross-rank matching against independent computations: per process group among its member
ranks, by Seq where present, ties, mismatches and the notices that explain what was left out."""

from __future__ import annotations

import dataclasses
import gzip
import json
import tempfile
import warnings
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fsdp_trace import analyze
from fsdp_trace.analysis.job.crossrank import ARRIVAL_TIE_US, CLOCK_TOLERANCE_US, match
from fsdp_trace.analysis.read.inputs import RunInput
from fsdp_trace.analysis.results import RankAnalysis
from fsdp_trace.pipeline import analyze_run
from tests.conftest import SAMPLES
from tests.synth import TraceBuilder

DIAG = SAMPLES / "diagnosis"


@cache
def _ranks(path: str) -> tuple[RankAnalysis, ...]:
    return tuple(analyze(SAMPLES / path, detailed=False).ranks)


def _with(analysis: RankAnalysis, **changes) -> RankAnalysis:
    """A copy of a rank's analysis with replaced frames (the cached one stays untouched)."""
    return dataclasses.replace(analysis, **changes)


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, -np.inf
    for s, e in sorted(intervals):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def _last(starts: dict[int, float]) -> int:
    """The rank that started last, or -1 when the latest two are within the tie tolerance."""
    order = sorted(starts, key=starts.get)
    if starts[order[-1]] - starts[order[-2]] <= ARRIVAL_TIE_US:
        return -1
    return order[-1]


def test_two_ranks_against_the_raw_trace():
    """Per profiled step, the k-th NCCL kernel (launch order) of each rank is one collective:
    transfer = the shortest duration, the rest waiting; per step, the union of each rank's
    waiting over the step's length, median over steps; the later start (beyond the tie
    tolerance) arrived last."""
    run = DIAG / "straggler"
    ranks = _ranks("diagnosis/straggler")
    per_rank = {}
    for rank in (0, 1):
        events = json.loads(gzip.decompress((run / f"rank{rank}.timing.json.gz").read_bytes()))[
            "traceEvents"
        ]
        steps = [
            (e["ts"], e["ts"] + e["dur"], int(e["name"].split("#")[1]))
            for e in events
            if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
        ]
        launch = {
            e["args"]["correlation"]: e["ts"]
            for e in events
            if e.get("cat") in ("cuda_runtime", "cuda_driver")
        }
        by_step: dict[int, list] = {}
        for e in sorted(
            (e for e in events if e.get("cat") == "kernel" and e["name"].startswith("nccl")),
            key=lambda e: e["args"]["correlation"],
        ):
            t = launch.get(e["args"]["correlation"])
            step = next((n for s, end, n in steps if t is not None and s <= t <= end), None)
            if step is not None:
                by_step.setdefault(step, []).append(e)
        per_rank[rank] = by_step
    waiting = {0: {}, 1: {}}
    last = {0: 0, 1: 0}
    n = 0
    for step in per_rank[0]:
        for a, b in zip(per_rank[0][step], per_rank[1][step], strict=True):
            n += 1
            transfer = min(a["dur"], b["dur"])
            for rank, e in ((0, a), (1, b)):
                wait = e["dur"] - transfer
                waiting[rank].setdefault(step, []).append((e["ts"], e["ts"] + wait))
            who = _last({0: a["ts"], 1: b["ts"]})
            if who >= 0:
                last[who] += 1
    cross = match(list(ranks))
    assert len(cross.matched) == n > 50
    table = cross.per_rank.set_index("rank")
    for rank in (0, 1):
        step_us = ranks[rank].steps.set_index("step")["step_us"]
        lengths = {s: _union_length(iv) for s, iv in waiting[rank].items()}
        assert table.loc[rank, "wait_us_per_step"] == pytest.approx(
            np.median(list(lengths.values())), rel=1e-6, abs=1e-3
        )
        assert table.loc[rank, "wait_pct"] == pytest.approx(
            np.median([100 * v / step_us[s] for s, v in lengths.items()]), rel=1e-6, abs=1e-6
        )
        assert table.loc[rank, "arrived_last"] == last[rank]
        assert table.loc[rank, "wait_pct"] < 100  # a share of the step, per step
    assert cross.clock_offsets_us[0] == 0.0 and abs(cross.clock_offsets_us[1]) < 50  # one host


def test_waiting_is_a_share_of_its_own_step():
    """The audit's case: host-bound showed 100.6 % (mean wait over median step). Per step, the
    union of waiting within the step can never exceed it."""
    cross = match(list(_ranks("diagnosis/host-bound")))
    waits = cross.per_rank.set_index("rank")["wait_pct"]
    assert 90 < waits[1] <= 100  # rank 1 waits for the host-bound rank 0 nearly all step
    assert waits[0] == 0


def _hsdp_like() -> tuple[list[RankAnalysis], dict]:
    """Four ranks from the real two-rank straggler capture: shard groups {0, 1} and {2, 3}
    (both named "1", as split_group names them), ranks 2 and 3 being ranks 1 and 0 moved to
    another host whose clock runs 1 s ahead, plus one global all-reduce per step over all four
    ranks with chosen arrivals."""
    real = _ranks("diagnosis/straggler")
    shift = 1_000_000.0
    source = {0: real[0], 1: real[1], 2: real[1], 3: real[0]}
    clock = {0: 0.0, 1: 0.0, 2: shift, 3: shift}
    members = {0: "[0, 1]", 1: "[0, 1]", 2: "[2, 3]", 3: "[2, 3]"}
    # Arrival (µs after the collective's earliest start) and a shared end, per step: rank 3
    # last except in step 3, where ranks 1 and 3 arrive within the tie tolerance.
    arrivals = {
        1: {0: 0.0, 1: 30.0, 2: 10.0, 3: 200.0},
        2: {0: 5.0, 1: 0.0, 2: 40.0, 3: 120.0},
        3: {0: 0.0, 1: 80.0, 2: 20.0, 3: 82.0},
    }
    transfer = 50.0
    ranks, expected = [], {"arrivals": arrivals, "transfer": transfer, "clock": clock}
    for r in range(4):
        base = source[r]
        c = base.collectives.copy()
        c["rank"] = r
        c["pg_name"] = "1"
        c["pg_ranks"] = members[r]
        c[["start_us", "end_us"]] += clock[r]
        steps = base.steps.copy()
        steps["rank"] = r
        steps[["start_us", "end_us"]] += clock[r]
        extra = []
        for step, arrive in arrivals.items():
            window = real[0].steps.set_index("step").loc[step]
            t0 = float(window["start_us"]) + 1000.0  # inside every rank's window
            end = t0 + max(arrive.values()) + transfer
            row = c.iloc[0].copy()
            row[["step", "collective", "block", "phase"]] = [step, "AllReduce", "root", "optimizer"]
            row[["start_us", "end_us"]] = [t0 + arrive[r] + clock[r], end + clock[r]]
            row["dur_us"] = end - t0 - arrive[r]
            row[["bytes", "group_size", "pg_name", "pg_ranks"]] = [4e6, 4.0, "0", "[0, 1, 2, 3]"]
            row["correlation"] = 10_000_000 + step
            extra.append(row)
        c = pd.concat([c, pd.DataFrame(extra)], ignore_index=True)
        ranks.append(_with(base, rank=r, collectives=c, steps=steps))
    return ranks, expected


def test_subgroups_match_among_their_members():
    ranks, expected = _hsdp_like()
    cross = match(ranks)
    m = cross.matched.assign(members=cross.matched["group"].map(cross.groups["members"]))
    pair = match(list(_ranks("diagnosis/straggler"))).matched  # the two-rank truth
    for members in ("0,1", "2,3"):
        group = m[(m["pg"] == "1") & (m["members"] == members)].reset_index(drop=True)
        assert len(group) == len(pair)
        assert np.allclose(group["transfer_us"], pair["transfer_us"])
        assert (group["n_ranks"] == 2).all()
    # In {2, 3}, rank 2 is the real rank 1: the straggler of its group.
    late = m[(m["members"] == "2,3")]["last_rank"].value_counts()
    assert late.index[0] == 2
    glob = m[m["pg"] == "0"].sort_values("step")
    assert len(glob) == 3 and (glob["n_ranks"] == 4).all()
    assert np.allclose(glob["transfer_us"], expected["transfer"])
    # Rank 3 arrived last in steps 1 and 2; step 3 is a tie (82 vs 80 µs): nobody.
    assert glob["last_rank"].tolist() == [3, 3, -1]
    # The 1 s clock difference of ranks 2 and 3 is found through the global group.
    for r in (2, 3):
        assert cross.clock_offsets_us[r] == pytest.approx(expected["clock"][r], abs=1e-3)
    assert any("clocks disagree" in n for n in cross.notices)
    # Each rank's arrived-last count: its group's (real pairs) plus the global ones.
    pair_last = match(list(_ranks("diagnosis/straggler"))).per_rank.set_index("rank")
    table = cross.per_rank.set_index("rank")
    real_of = {0: 0, 1: 1, 2: 1, 3: 0}
    for r in range(4):
        glob_last = int((glob["last_rank"] == r).sum())
        assert table.loc[r, "arrived_last"] == pair_last.loc[real_of[r], "arrived_last"] + glob_last
        assert table.loc[r, "n_matched"] == len(pair) + 3


def test_groups_with_ranks_left_out_match_among_the_ranks_given():
    """Ranks 0, 1, 2 of the four: the global all-reduce matches among three (with a notice
    saying so); group {2, 3} has one rank given, so nothing of it matches."""
    ranks, expected = _hsdp_like()
    cross = match(ranks[:3])
    m = cross.matched.assign(members=cross.matched["group"].map(cross.groups["members"]))
    assert set(m["members"]) == {"0,1", "0,1,2,3"}
    glob = m[m["pg"] == "0"].sort_values("step")
    assert (glob["n_ranks"] == 3).all()
    arrivals = expected["arrivals"]
    for row in glob.itertuples():  # the latest of the three given sets the transfer
        arrive = arrivals[row.step]
        latest_given = max(arrive[r] for r in range(3))
        assert row.transfer_us == pytest.approx(
            expected["transfer"] + max(arrive.values()) - latest_given, abs=1e-6
        )
    assert any("group 0: 3 of 4 ranks" in n for n in cross.notices)
    assert any("no counterpart on every member rank" in n for n in cross.notices)


def test_without_group_ranks_a_process_group_name_spans_every_rank():
    """Without Process Group Ranks (and no pg_config), a group is its name over every analyzed
    rank: the two same-named shard groups then match as one four-rank group. The group
    ranks are what keep HSDP/TP subgroups apart."""
    ranks, _ = _hsdp_like()
    unnamed = []
    for r in ranks:
        c = r.collectives.copy()
        c["pg_ranks"] = None
        unnamed.append(_with(r, collectives=c, meta={}))
    cross = match(unnamed)
    assert set(cross.groups.loc[cross.matched["group"], "members"]) == {"*"}
    m = cross.matched
    assert (m["n_ranks"] == 4).all()
    assert len(m) == len(_ranks("diagnosis/straggler")[0].collectives) + 3


def test_seq_matches_regardless_of_order_and_step_numbers():
    r0, r1 = _ranks("diagnosis/straggler")
    plain = match([r0, r1]).matched
    seq = {}
    for r in (r0, r1):
        c = r.collectives.sort_values("correlation").copy()
        c["seq"] = np.arange(len(c))
        seq[r.rank] = c
    shuffled = seq[1].copy()
    shuffled["correlation"] = shuffled["correlation"].to_numpy()[::-1]  # launch order lost
    shuffled["step"] += 10  # and other step numbers
    steps = r1.steps.assign(step=r1.steps["step"] + 10)
    cross = match([_with(r0, collectives=seq[0]), _with(r1, collectives=shuffled, steps=steps)])
    assert len(cross.matched) == len(plain)
    assert np.allclose(
        cross.matched.sort_values("index")["transfer_us"].to_numpy(),
        plain.sort_values(["step", "index"])["transfer_us"].to_numpy(),
    )


def test_mismatched_pairs_are_left_out_with_a_notice():
    r0, r1 = _ranks("diagnosis/straggler")
    c = r1.collectives.copy()
    c.loc[c.index[5], "bytes"] *= 2
    c.loc[c.index[9], "collective"] = "AllReduce"
    cross = match([r0, _with(r1, collectives=c)])
    assert len(cross.matched) == len(r0.collectives) - 2
    assert any("2 matched collectives differ across ranks" in n for n in cross.notices)


def test_nothing_agreeing_leaves_an_empty_view_with_the_reason():
    r0, r1 = _ranks("diagnosis/straggler")
    cross = match([r0, _with(r1, collectives=r1.collectives.assign(bytes=1.0))])
    assert cross.empty
    assert any(f"{len(r0.collectives)} matched collectives differ" in n for n in cross.notices)


def test_ranks_covering_different_steps_get_a_notice_not_a_warning():
    r0, r1 = _ranks("diagnosis/straggler")
    later = r1.collectives.assign(step=r1.collectives["step"] + 100)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cross = match([r0, _with(r1, collectives=later)])
    assert cross.empty
    assert any(
        "no collective matched across ranks" in n and "rank 1: steps 101–103" in n
        for n in cross.notices
    )
    ranks = list(_ranks("diagnosis/straggler"))
    ranks[1] = _with(ranks[1], collectives=later)
    run = analyze_run(RunInput("straggler", []), ranks)  # the rules cope with no match
    assert run.crossrank.empty and "straggler" not in run.diagnosis.rules()


def test_clock_offsets_are_found_and_corrected():
    r0, r1 = _ranks("diagnosis/gpt-1.3b-b4-2gpu")
    shifted = r1.collectives.copy()
    shifted[["start_us", "end_us"]] += 5000.0  # pretend rank 1's clock runs 5 ms ahead
    plain = match([r0, r1])
    cross = match([r0, _with(r1, collectives=shifted)])
    assert cross.clock_offsets_us[1] == pytest.approx(plain.clock_offsets_us[1] + 5000.0, abs=1e-6)
    assert abs(plain.clock_offsets_us[1]) < CLOCK_TOLERANCE_US
    assert any("clocks disagree" in n for n in cross.notices)
    # After the correction, who arrived last is (all but near-ties) as with the true clocks.
    assert (cross.matched["last_rank"] == plain.matched["last_rank"]).mean() > 0.95


def test_exposed_transfer_is_the_uncovered_part_of_each_transfer():
    """Per collective, its transfer is the last `transfer` µs of its kernel (the shortest
    duration of the pair); the part of it no compute kernel covers is exposed transfer. Over a
    step, the collectives' shares add up to |∪ transfers \\ ∪ compute|, computed here in plain
    Python, and to the step breakdown's exposed_transfer_us."""
    run = analyze(SAMPLES / "gpt-small-2gpu", detailed=False).only
    r0, r1 = (r.collectives.sort_values("correlation").reset_index(drop=True) for r in run.ranks)
    transfer = np.minimum(r0["dur_us"].to_numpy(), r1["dur_us"].to_numpy())
    for r, c in zip(run.ranks, (r0, r1), strict=True):
        assert np.allclose(c["transfer_us"], transfer, atol=1e-2)
        assert np.allclose(c["wait_us"], c["dur_us"] - transfer, atol=1e-2)
        assert (c["exposed_transfer_us"] <= c["transfer_us"] + 1e-6).all()
        compute = r.kernels[r.kernels["kind"] == "compute"]
        busy = list(zip(compute["ts"], compute["end"], strict=True))
        for step, own in c.groupby("step"):
            window = r.steps.set_index("step").loc[step]
            lo, hi = float(window["start_us"]), float(window["end_us"])
            spans = [
                (max(e - t, s0), e)
                for s0, e, t in zip(own["start_us"], own["end_us"], own["transfer_us"], strict=True)
            ]
            both = _union_length(
                [(max(a, lo), min(b, hi)) for a, b in spans + busy if min(b, hi) > max(a, lo)]
            )
            alone = _union_length(
                [(max(a, lo), min(b, hi)) for a, b in busy if min(b, hi) > max(a, lo)]
            )
            uncovered = both - alone  # |T \\ K| within the step
            assert float(window["exposed_transfer_us"]) == pytest.approx(uncovered, abs=1e-3)
            assert own["exposed_transfer_us"].sum() == pytest.approx(uncovered, abs=0.5)


def test_a_process_group_list_cut_by_the_profiler_still_matches():
    """The profiler writes `Process Group Ranks` as the first 30 ranks and `...` for larger
    groups. 32 ranks of one group: every collective matches across all 32 (the cut list is
    not taken as the members), transfer = the shortest duration."""
    cut = "[" + ", ".join(map(str, range(30))) + ", ...]"
    ranks = []
    for rank in range(32):
        b = TraceBuilder(rank=rank, world_size=32)
        b.step(1, 0, 5000)
        for i, t in enumerate((100.0, 2100.0)):
            b.label("FSDP::all_gather (layers.0)", t, 10)
            start = t + 200 + (rank == 7) * 50.0 * (i + 1)  # rank 7 arrives late
            b.nccl("AllGather", start, t + 500 - start, launch_ts=t + 2, nelems=32_000_000)
        doc = b.document()
        for e in doc["traceEvents"]:
            if "Collective name" in e["args"]:
                e["args"]["Process Group Ranks"] = cut
                e["args"]["Group size"] = 32
        ranks.append(doc)
    frames = []
    for rank, doc in enumerate(ranks):
        folder = Path(tempfile.mkdtemp())
        path = folder / f"rank{rank}.json"
        path.write_text(json.dumps(doc))
        frames.append(path)
    run = analyze(frames, cache=False).only
    cross = run.crossrank
    assert len(cross.matched) == 2 and (cross.matched["n_ranks"] == 32).all()
    assert cross.matched["transfer_us"].tolist() == pytest.approx([250.0, 200.0])
    assert (cross.matched["last_rank"] == 7).all()
    assert not any("no counterpart" in n for n in cross.notices)


@pytest.mark.parametrize("seed", range(40))
def test_process_groups_numbered_by_first_appearance_missing_values_alike(seed):
    """Each collective's group id: (name, member list) pairs numbered in the order they first
    appear over every rank, a missing name or list (None or NaN alike) a value of its own;
    a cut list (the profiler's `...`) and a missing one read pg_config's members."""
    from types import SimpleNamespace

    from fsdp_trace.analysis.job import crossrank

    rng = np.random.default_rng(seed)
    names = np.array(["0", "1", None, np.nan], dtype=object)
    lists = np.array(["[0, 1]", "[2, 3]", None, np.nan, "[0, 1, ..., 29, ...]"], dtype=object)
    config = {"pg_config": [{"pg_name": "1", "ranks": [2, 3]}]}
    groups = crossrank._Groups()
    want_ids: dict[tuple, int] = {}
    for _ in range(3):  # three ranks, sharing the numbering
        n = int(rng.integers(1, 30))
        pg, raw = names[rng.integers(0, 4, n)], lists[rng.integers(0, 5, n)]
        rank = SimpleNamespace(
            collectives=pd.DataFrame({"pg_name": pg, "pg_ranks": raw}),
            meta={"distributed": config},
        )
        got = crossrank._group_ids(rank, groups)
        want = []
        for name, text in zip(pg, raw, strict=True):
            missing = text is None or text != text
            if missing or "..." in text:  # pg_config's list, else "?" (cut) or "*" (none)
                members = "2,3" if name == "1" else ("*" if missing else "?")
            else:
                members = text.strip("[]").replace(" ", "")
            name = "default" if name is None or name != name else name
            want.append(want_ids.setdefault((name, members), len(want_ids)))
        assert got.tolist() == want


def test_member_lists_are_shared_across_a_runs_ranks():
    """A thousand ranks of one job each list the same thousand members: a run keeps one list
    per distinct member list (equal values, one object), its other lists as they were."""
    from fsdp_trace.analysis.job.perrank import SharedGroups

    base = _ranks("gpt-small-2gpu")[0]
    shared = SharedGroups()
    kept = []
    for rank in range(4):
        world = list(range(64))
        own = [rank, rank + 64]
        meta = {
            **base.meta,
            "distributed": {
                "pg_config": [
                    {"pg_name": "0", "ranks": world},
                    {"pg_name": "1", "ranks": own},
                    {"pg_name": "2", "ranks": [0, 1, 2, 3] if rank else [5, 6, 7, 8]},
                ]
            },
        }
        kept.append(shared(dataclasses.replace(base, rank=rank, meta=meta)))
    lists = [[pg["ranks"] for pg in r.meta["distributed"]["pg_config"]] for r in kept]
    assert all(x[0] == list(range(64)) for x in lists)
    assert len({id(x[0]) for x in lists}) == 1  # one list for the world group
    assert [x[1] for x in lists] == [[r, r + 64] for r in range(4)]  # short: left alone
    assert len({id(x[2]) for x in lists[1:]}) == 1 and lists[1][2] == [0, 1, 2, 3]
    assert lists[0][2] == [5, 6, 7, 8]
    assert shared("not a result") == "not a result"  # failures pass through


def test_the_names_ranks_key_their_records_by_are_held_once():
    """Each rank names the same kernels in `kernel_time` (and the same figures in `host` and
    `setup`), its tables the same columns: a run keeps one string per name and one Index
    per set of column labels, every record and table equal to what arrived."""
    import pickle

    from fsdp_trace.analysis.job.perrank import SharedGroups

    base = _ranks("gpt-small-2gpu")[0]
    assert base.kernel_time and base.host["by_category"]
    shared = SharedGroups()
    arrived = [pickle.dumps(base) for _ in range(3)]  # each unpickled: its strings apart
    kept = [shared(pickle.loads(a)) for a in arrived]
    arrived = [pickle.loads(a) for a in arrived]
    for a, k in zip(arrived, kept, strict=True):
        assert (k.kernel_time, k.host, k.setup) == (a.kernel_time, a.host, a.setup)
        assert list(k.kernel_time) == list(a.kernel_time)  # in their order
    for record in (
        lambda r: r.kernel_time,
        lambda r: r.host,
        lambda r: r.host["by_category"],
        lambda r: r.setup,
    ):
        names = [list(record(k)) for k in kept]
        assert all(len({id(n[i]) for n in names}) == 1 for i in range(len(names[0])))
    for name in ("steps", "collectives", "blocks", "exposed", "fsdp", "op_tax"):
        assert len({id(getattr(k, name).columns) for k in kept}) == 1, name
        for a, k in zip(arrived, kept, strict=True):
            pd.testing.assert_frame_equal(getattr(k, name), getattr(a, name), check_exact=True)
    kept[0].collectives["extra"] = 1.0  # a column added: that table's own labels
    assert "extra" not in kept[1].collectives
    # Labels alike only in their values (a range, integers, named, in two levels) stay apart.
    kinds = [
        pd.RangeIndex(2),
        pd.Index([0, 1]),
        pd.Index([0, 1], name="x"),
        pd.MultiIndex.from_tuples([("a", 0), ("a", 1)]),
        pd.Index([("a", 0), ("a", 1)], tupleize_cols=False),
    ]
    for columns in kinds:
        table = pd.DataFrame(np.zeros((1, 2)), columns=columns)
        got = shared(dataclasses.replace(base, op_tax=table)).op_tax.columns
        assert type(got) is type(columns) and got.name == columns.name and got.equals(columns)


def test_each_ranks_matched_collectives_are_its_participant_rows_in_order():
    rng = np.random.default_rng(7)
    n = 500
    participants = pd.DataFrame(
        {
            "rank": rng.integers(0, 9, n),  # ranks interleaved, rank 9 never matched
            "correlation": rng.permutation(n) + 1000,
            "match": rng.integers(0, 50, n),
            "transfer_us": rng.random(n) * 100,
            "wait_us": rng.random(n) * 10,
        }
    )
    crossrank = dataclasses.replace(match([]), participants=participants)
    split = crossrank.matched_by_rank()
    assert sorted(split) == sorted(set(participants["rank"].tolist()))
    for rank, mine in split.items():
        rows = [i for i in range(n) if participants["rank"].iloc[i] == rank]  # file order
        expected = participants.iloc[rows]
        assert len(mine) == len(rows)
        for column in ("correlation", "transfer_us", "wait_us"):
            assert getattr(mine, column).tolist() == expected[column].tolist()
    assert match([]).matched_by_rank() == {}
