"""A run of many ranks in the terminal: the per-rank tables keep the ranks that stand out (the
view keeps them all), and notices alike but for their numbers print once with a count."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fsdp_trace.present import view as view_mod
from fsdp_trace.present.view import Table, focus_ranks
from fsdp_trace.render import terminal


def _per(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "label": [f"rank {i}" for i in range(n)],
            "rank": range(n),
            "step_us": rng.permutation(n) * 10.0 + 1000.0,
            "exposed_pct": rng.permutation(n) * 0.1,
            "idle_pct": rng.permutation(n) * 0.2,
        }
    )


def test_focus_is_the_largest_of_each_figure_the_named_and_the_first():
    per = _per(100)
    per.loc[5, "idle_pct"] = np.nan  # unknown: never picked for it
    rng = np.random.default_rng(1)
    across = pd.DataFrame(
        {
            "rank": range(100),
            "wait_pct": rng.permutation(100) * 0.3,
            "arrived_last_share": rng.permutation(100) / 100,
        }
    )
    got = focus_ranks(per, {77, 1000}, across)  # named by findings (1000: not in the run)
    want = {"rank 0", "rank 77"}
    for frame, column in [(per, c) for c in ("step_us", "exposed_pct", "idle_pct")] + [
        (across, "wait_pct"),
        (across, "arrived_last_share"),
    ]:
        values = frame[column].dropna().sort_values(ascending=False)
        want |= {f"rank {frame.loc[i, 'rank']}" for i in values.index[: view_mod.FOCUS_PER_FIGURE]}
    assert set(got) == want
    assert got == sorted(got, key=lambda label: int(label.split()[1]))  # in rank order


def _printed(run) -> str:
    console = terminal.make_console(width=200)
    with console.capture() as out:
        run(console)
    return out.get()


def test_a_long_per_rank_table_shows_the_focus_rows_and_says_so():
    rows = [[f"rank {i}", str(i)] for i in range(40)]
    table = Table("ranks", "Per rank", ["rank", "value"], rows)
    focus = ["rank 0", "rank 7", "rank 39"]
    text = _printed(lambda c: terminal._print_ranks(c, table, focus))
    shown = [line for line in text.splitlines() if line.startswith("│ rank")]
    assert [line.split("│")[1].strip() for line in shown] == focus
    assert "3 of 40 rows" in text
    # Labels with the file name (rank numbers repeat) and detailed traces' rows; the
    # cross-rank table names ranks by number alone.
    named = [
        ["rank 3 (a.json)", "1"],
        ["rank 3 (b.json)", "2"],
        ["rank 3 (b.json) (detailed)", "3"],
    ]
    table2 = Table("ranks", "Per rank", ["rank", "value"], rows + named)
    text = _printed(lambda c: terminal._print_ranks(c, table2, ["rank 0", "rank 3 (b.json)"]))
    shown = [line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│ rank")]
    assert shown == ["rank 0", "rank 3", "rank 3 (b.json)", "rank 3 (b.json) (detailed)"]
    # No focus (a run of few ranks), or a table whose rows it does not name: every row.
    for f in ([], ["rank 99"]):
        text = _printed(lambda c, f=f: terminal._print_ranks(c, table, f))
        assert sum(line.startswith("│ rank") for line in text.splitlines()) == 40


def test_notices_alike_print_once_with_a_count_in_a_run_of_many_ranks():
    many = [f"rank {i}'s trace is rank {i % 2}'s" for i in range(2, 50)]
    dropped = [f"rank {i}: {n} duplicated events dropped" for i, n in enumerate([2, 5, 9000, 3])]
    few = ["rank 0: 3 events left out", "rank 1: 121 events left out"]
    notices = [*many, "another", *dropped, *few]
    text = _printed(lambda c: terminal.print_notices(c, notices, alike=True))
    lines = [line for line in text.splitlines() if line]
    assert lines == [
        "notice: rank 2's trace is rank 0's",
        "notice: rank 49's trace is rank 1's",  # the one with the largest number
        "(and 46 more notices like these: --json lists every one)",
        "notice: another",
        "notice: rank 0: 2 duplicated events dropped",
        "notice: rank 2: 9000 duplicated events dropped",
        "(and 2 more notices like these: --json lists every one)",
        "notice: rank 0: 3 events left out",
        "notice: rank 1: 121 events left out",
    ]
    # A run of few ranks: every notice, in order.
    text = _printed(lambda c: terminal.print_notices(c, notices))
    assert [line for line in text.splitlines() if line] == [f"notice: {n}" for n in notices]


def test_a_notice_many_traces_share_names_a_few_of_them_and_their_count():
    from types import SimpleNamespace

    from fsdp_trace.result import OWNERS_LISTED, _owners

    def traces(ranks, source="timing"):
        return [SimpleNamespace(rank=r, source=source, path=f"/x/rank{r}.json") for r in ranks]

    assert _owners(traces([0, 2, 4])) == "ranks 0, 2, 4"
    assert _owners(traces(range(OWNERS_LISTED))) == "ranks " + ", ".join(
        map(str, range(OWNERS_LISTED))
    )
    assert _owners(traces(range(0, 1000, 2))) == "500 ranks (0, 2, 4, 6, 8, 10, 12, 14, …, 998)"
    unnamed = [SimpleNamespace(rank=None, source="timing", path=f"/x/t{i}.json") for i in range(40)]
    assert _owners(unnamed) == ", ".join(f"t{i}.json" for i in range(8)) + ", … (40 traces)"
