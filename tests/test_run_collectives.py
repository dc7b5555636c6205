"""The diagnosis's run-wide collectives (`diagnose.context.RunCollectives`): a rank's column is
what its own table gives (the net columns as the rules define them, computed here apart),
where the ranks' dtypes differ or a rank has no rows too; the per-rank bounds the rules skip
ranks by are the largest and the positive sum a direct per-rank loop finds; and skipping by
them leaves every finding as it was."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from fsdp_trace import analyze
from fsdp_trace.analysis import intervals as iv
from fsdp_trace.diagnose import diagnose
from fsdp_trace.diagnose.context import SUM_MARGIN, Context, RunCollectives
from tests.conftest import SAMPLES


def _rank(rows: int, seed: int, **override) -> SimpleNamespace:
    rng = np.random.default_rng(seed)
    transfer = rng.uniform(1, 50, rows)
    transfer[rng.random(rows) < 0.3] = np.nan  # unmatched
    exposed_transfer = np.where(np.isnan(transfer), np.nan, rng.uniform(-1, 20, rows))
    exposed_transfer[rng.random(rows) < 0.1] = np.nan
    table = pd.DataFrame(
        {
            "collective": rng.choice(["AllGather", "ReduceScatter", "AllReduce"], rows),
            "phase": rng.choice(["forward", "backward"], rows),
            "step": rng.integers(0, 3, rows),
            "dur_us": rng.uniform(1, 80, rows),
            "exposed_us": rng.uniform(0, 30, rows),
            "transfer_us": transfer,
            "exposed_transfer_us": exposed_transfer,
            **override,
        }
    )
    return SimpleNamespace(collectives=table)


def _net(table: pd.DataFrame) -> dict[str, np.ndarray]:
    """The net columns as the rules define them, one row at a time."""
    net, exposed, matched = [], [], []
    for row in table.itertuples():
        ok = not np.isnan(row.transfer_us)
        net.append(row.transfer_us if ok else row.dur_us)
        exposed.append(row.exposed_transfer_us if ok else row.exposed_us)
        matched.append(ok)
    return {"net_us": np.array(net), "exposed_net_us": np.array(exposed), "matched": matched}


def test_a_ranks_columns_are_its_own_tables():
    ranks = [_rank(26, 0), _rank(0, 1), _rank(7, 2), _rank(40, 3)]
    run = RunCollectives(ranks)
    for r in ranks:
        table = r.collectives
        for name in table.columns:
            got = run.column(r, name)
            want = table[name].to_numpy()
            assert got.dtype == want.dtype and len(got) == len(want)
            assert pd.Series(got).equals(pd.Series(want)), name
            assert not got.flags.writeable or not len(table)  # shared by the rules
        for name, want in _net(table).items():
            got = run.column(r, name)
            np.testing.assert_array_equal(got, np.asarray(want, dtype=got.dtype))
    assert run.column(ranks[1], "dur_us").size == 0


def test_a_column_whose_dtype_differs_between_ranks_is_read_per_rank():
    ints = _rank(5, 4, step=np.arange(5, dtype=np.int32))
    ranks = [_rank(6, 5), ints]
    run = RunCollectives(ranks)
    assert run.joined("step") is None
    assert run.column(ints, "step").dtype == np.int32
    assert run.column(ranks[0], "step").dtype == np.int64
    assert run.rank_bound("step") == {}
    assert run.rank_bound("dur_us", collective=["AllGather"], step=[0]) == {}  # step: not joined
    outsider = _rank(3, 6)  # not of the run: its own table
    np.testing.assert_array_equal(
        run.column(outsider, "net_us"), _net(outsider.collectives)["net_us"]
    )


@pytest.mark.parametrize("total", [False, True])
def test_rank_bounds_are_each_ranks_largest_or_positive_sum(total):
    ranks = [_rank(n, 10 + n) for n in (9, 0, 1, 30, 4)]
    negative = ranks[3].collectives  # a gather's exposed time below 0 on the largest rank
    first = np.flatnonzero(negative["collective"].to_numpy() == "AllGather")[:3]
    negative.loc[first, "transfer_us"] = np.nan  # unmatched: its exposed_us is read
    negative.loc[first, "exposed_us"] = [-40.0, -5.0, -0.5]
    run = RunCollectives(ranks)
    got = run.rank_bound("exposed_net_us", total=total, collective=["AllGather"])
    assert set(got) == {id(r) for r in ranks if len(r.collectives)}
    for r in ranks:
        if not len(r.collectives):
            continue
        values = [
            v
            for v, kind in zip(
                _net(r.collectives)["exposed_net_us"], r.collectives["collective"], strict=True
            )
            if kind == "AllGather" and not np.isnan(v)
        ]
        if total:
            want = math.fsum(max(v, 0.0) for v in values)
            assert want <= got[id(r)] <= want * (1 + 2 * SUM_MARGIN) + 1e-12
        else:
            assert got[id(r)] == (max(values) if values else -np.inf)


def test_a_sum_bound_is_never_below_the_compensated_sum_a_rule_takes():
    """Twelve reductions of one step, all in its tail: the rule's sum (compensated) is
    16826.06, a plain sum 16826.059999999998 (found by review): the bound must not fall
    below the rule's figure."""
    values = [1712.054, 281.535, 1174.141, 221.223, 1428.501, 1285.619]
    values += [1271.212, 1758.901, 368.072, 2801.307, 2052.151, 2471.344]
    rank = _rank(len(values), 0, exposed_transfer_us=values, transfer_us=np.ones(len(values)))
    run = RunCollectives([rank])
    bound = run.rank_bound("exposed_net_us", total=True)
    rule_sum = float(iv.group_sum(np.zeros(len(values), dtype=np.int64), np.array(values), 1)[0])
    assert bound[id(rank)] >= rule_sum >= math.fsum(values) - 1e-9


@pytest.mark.parametrize(
    "path", ["diagnosis/p2p-disabled", "gpt-small-2gpu", "diagnosis/tuned-b16"]
)
def test_skipping_ranks_by_their_bounds_changes_no_finding(path, monkeypatch):
    result = analyze(SAMPLES / path, cache=False).only
    with_bounds = diagnose(result)
    monkeypatch.setattr(RunCollectives, "rank_bound", lambda self, *a, **k: {})
    without = diagnose(result)
    assert [f.__dict__ for f in with_bounds.findings] == [f.__dict__ for f in without.findings]
    assert with_bounds.verdict == without.verdict


def test_the_gathers_read_the_run_columns():
    result = analyze(SAMPLES / "diagnosis" / "p2p-disabled", cache=False).only
    ctx = Context(result)
    for r in result.ranks:
        frame = ctx.collectives(r)
        gathers = ctx.gathers(r)
        rows = np.flatnonzero(frame["collective"].to_numpy() == "AllGather")
        np.testing.assert_array_equal(gathers.rows, rows)
        for name in ("exposed_net_us", "net_us", "matched", "bytes", "block"):
            want = frame[name].to_numpy()[rows]
            assert pd.Series(gathers[name]).equals(pd.Series(want)), name


def test_a_tail_of_several_reductions_is_bounded_by_their_sum(tmp_path, monkeypatch):
    """HSDP: each step's tail holds a reduce-scatter and an all-reduce, so the tail's exposed
    time exceeds any one reduction's. With the step made so long that the threshold is that
    time exactly, the rule still fires: a rank is skipped by the sum of its reductions, never
    by the largest one."""
    from fsdp_trace.diagnose.rules import communication
    from tests.fsdp_sim import Sim
    from tests.test_diagnosis import simulate

    sim = Sim(ranks=4, blocks=4, bwd_us=2000.0, rs_us=60.0, root_rs_us=60.0, ar_us=1500.0)
    sim.hsdp_replicas = 2
    result = simulate(tmp_path, sim)
    exposed = result.diagnosis.get("reduction-tail").metrics["exposed_us"]
    ctx = Context(result)
    largest = max(
        float(
            np.nanmax(
                ctx.column(r, "exposed_net_us")[
                    np.isin(ctx.column(r, "collective"), ["ReduceScatter", "AllReduce"])
                ]
            )
        )
        for r in result.ranks
    )
    assert largest < exposed  # the case: no single reduction reaches the tail's time
    monkeypatch.setattr(Context, "step_us", lambda self, r: exposed / communication.TAIL_EXPOSED)
    finding = communication.reduction_tail(Context(result))
    assert finding is not None and finding.metrics["exposed_us"] == exposed
