"""What a run keeps per rank: no per-event table (`RankAnalysis.without_kernels`), whatever
runs the per-rank analyses (here, a `--jobs` pool; tests/test_dask.py: a Dask cluster), but for
a small local run without the cache, which keeps its kernels rather than parse again; and the
figures of the kernels made with each rank's analysis equal to what the kernels give. The
kernels read again (the report's timeline, what-if, --perfetto) are the fresh analysis's."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import fsdp_trace
from fsdp_trace.analysis.job import perrank
from fsdp_trace.analysis.rank.breakdown import Spans, partition
from fsdp_trace.analysis.rank.overlap_tax import measure, moving, op_tax
from fsdp_trace.analysis.results import RankAnalysis
from tests.conftest import SAMPLES, counting_parses

GPT = SAMPLES / "gpt-small-2gpu"
FULL_AC = SAMPLES / "gpt-small-2gpu-fullac"
GPU_EVENT_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def gpu_events(path: Path) -> int:
    """The trace's GPU events, counted from its JSON (not by fsdp-trace's loader)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    return sum(1 for e in events if e.get("ph") == "X" and e.get("cat") in GPU_EVENT_CATS)


def tables(obj: object, prefix: str = "") -> dict[str, int]:
    """Every table-like value an analysis holds (fields and attributes set on the instance,
    one level into dicts), by name: its length."""
    found: dict[str, int] = {}
    values = dict(vars(obj))
    values.update({f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)})
    for name, value in values.items():
        if isinstance(value, pd.DataFrame | pd.Series | np.ndarray | list | tuple):
            found[prefix + name] = len(value)
        elif isinstance(value, dict):
            found[prefix + name] = len(value)
            for key, inner in value.items():
                if isinstance(inner, pd.DataFrame | pd.Series | np.ndarray | list):
                    found[f"{prefix}{name}.{key}"] = len(inner)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            found.update(tables(value, f"{prefix}{name}."))
    return found


def per_event_tables(rank: RankAnalysis, events: int) -> dict[str, int]:
    """The tables of `rank` with as many rows as half of its trace's GPU events (`events`):
    the kernels table holds ~95 % of them; per-collective tables (130 rows here), exposed
    intervals (≤ 769) and per-step tables stay far below."""
    return {name: n for name, n in tables(rank).items() if n >= events / 2}


def timing_traces(run: Path) -> dict[int, Path]:
    return {int(p.name[4]): p for p in sorted(run.glob("rank*.timing.json.gz"))}


@pytest.mark.parametrize("how", ["cache", "more-ranks-than-the-timeline"])
@pytest.mark.parametrize("jobs", [1, 2])
def test_a_runs_ranks_hold_no_per_event_table(jobs, how, tmp_path, monkeypatch):
    """Through the cache (its entries read back cheaply), or without it in a run of more
    timing traces than the report's timeline draws (here made 1), no rank keeps its kernels."""
    monkeypatch.setattr(perrank, "POOL_MIN_BYTES", 0)  # jobs=2: a pool even for small traces
    if how == "cache":
        monkeypatch.setenv("FSDP_TRACE_CACHE_DIR", str(tmp_path / "cache"))
        monkeypatch.delenv("FSDP_TRACE_CACHE", raising=False)
    else:
        monkeypatch.setattr(perrank, "MAX_TIMELINE_RANKS", 1)
    result = fsdp_trace.analyze(GPT, jobs=jobs, cache=how == "cache")
    traces = timing_traces(GPT)
    for r in result.only.ranks:
        events = gpu_events(traces[r.rank])
        assert r.kernel_table is None
        assert per_event_tables(r, events) == {}
        assert 0.9 * events < r.n_kernels <= events  # what the kernels were: counted
    assert all(r.kernel_table is None for r in result.only.detailed)


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_small_run_without_the_cache_parses_each_trace_once(jobs, tmp_path, monkeypatch):
    """A local run of no more timing traces than the timeline draws, analyzed without the
    cache, keeps its ranks' kernels: the report (timeline, what-if panel) and what-if parse
    no trace again (reading them again would cost a second parse each)."""
    from fsdp_trace import whatif
    from fsdp_trace.render.report import write_report
    from fsdp_trace.render.report.timeline import MAX_TIMELINE_RANKS

    monkeypatch.setattr(perrank, "POOL_MIN_BYTES", 0)  # jobs=2: parsed in the pool's workers
    parsed = counting_parses(monkeypatch)
    result = fsdp_trace.analyze(GPT, jobs=jobs, cache=False)
    run = result.only
    assert len(run.ranks) <= MAX_TIMELINE_RANKS
    here = len(parsed)
    assert here == (4 if jobs == 1 else 0)  # 2 timing + 2 detailed traces, each parsed once
    write_report(result, tmp_path / "report.html")
    assert whatif.rank_candidates(run)
    assert parsed[here:] == []
    for r in run.ranks:
        assert r.kernel_table is not None and len(r.kernel_table) == r.n_kernels
    assert all(r.kernel_table is None for r in run.detailed)  # no view draws their kernels


def test_kernels_read_again_are_the_fresh_analysis(tmp_path):
    result = fsdp_trace.analyze(GPT, detailed=False)
    for r in result.only.ranks:
        fresh = perrank.analyze_file(r.path, r.source, cache=False)
        again = r.load_kernels()
        pd.testing.assert_frame_equal(again, fresh.kernel_table, check_exact=True)
        step = int(r.steps["step"].iloc[1])
        want = fresh.kernel_table[fresh.kernel_table["step"] == step]
        pd.testing.assert_frame_equal(r.load_kernels(step), want, check_exact=True)
        assert r.n_kernels == len(again)


def test_kernels_read_again_in_a_fresh_process_from_a_pickled_result(tmp_path, monkeypatch):
    """A saved result, unpickled where nothing was analyzed (the job stage not imported),
    still reads its ranks' kernels again: the record finds the reader on first use."""
    import os
    import pickle
    import subprocess
    import sys

    monkeypatch.setenv("FSDP_TRACE_CACHE_DIR", str(tmp_path / "cache"))
    result = fsdp_trace.analyze(GPT, detailed=False, cache=True)
    assert all(r.kernel_table is None for r in result.only.ranks)  # read again, not held
    saved = tmp_path / "result.pkl"
    saved.write_bytes(pickle.dumps(result))
    script = (
        "import pickle, sys\n"
        "result = pickle.loads(open(sys.argv[1], 'rb').read())\n"
        "assert 'fsdp_trace.analysis.job.perrank' not in sys.modules\n"
        "print([len(r.load_kernels()) for r in result.only.ranks])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(saved)],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str([r.n_kernels for r in result.only.ranks])


def test_kernels_are_read_again_as_the_run_was_asked_to_cache(tmp_path, monkeypatch):
    """A run analyzed without the cache reads its kernels again without it (nothing
    written); one analyzed with it reads them from the entry its analysis wrote."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("FSDP_TRACE_CACHE_DIR", str(folder))
    monkeypatch.delenv("FSDP_TRACE_CACHE", raising=False)
    path = tmp_path / "rank0.timing.json.gz"
    path.write_bytes((GPT / "rank0.timing.json.gz").read_bytes())
    monkeypatch.setattr(perrank, "MAX_TIMELINE_RANKS", 0)  # not kept: read again
    load = perrank.load_trace
    parsed = counting_parses(monkeypatch)
    plain = fsdp_trace.analyze(path, cache=False).ranks[0]
    assert plain.kernel_table is None
    assert len(plain.kernels) == plain.n_kernels
    # analyzed, then parsed once more (the diagnosis replays the step to price its findings;
    # the view finds those kernels at hand), its parsed columns not cached
    assert parsed == [str(path), str(path)]
    assert not folder.exists() or not any(folder.iterdir())
    monkeypatch.setattr(perrank, "load_trace", load)
    cached = fsdp_trace.analyze(path).ranks[0]
    assert any(folder.glob("analysis-*"))

    def no_parsing(*args, **kwargs):
        raise AssertionError("parsed again although the cache holds the analysis")

    monkeypatch.setattr(perrank, "load_trace", no_parsing)
    assert len(cached.kernels) == cached.n_kernels


@pytest.mark.parametrize("run", [GPT, FULL_AC], ids=["no-ac", "full-ac"])
def test_kernel_figures_equal_what_the_kernels_give(run):
    """The figures each rank's analysis makes of its kernels (so that they need not travel)
    are, to the bit, what the kernels give: the whole step breakdown (its compute half made
    with the analysis, its exposed half from the collectives and exposed intervals once the
    transfers are known) equals one partition of the kernels with those transfers."""
    analysis = fsdp_trace.analyze(run, detailed=False).only
    blocks = set(analysis.config.blocks)
    assert blocks
    participants = analysis.crossrank.participants
    for r in analysis.ranks:
        k = r.load_kernels()
        compute = k[k["kind"] == "compute"]
        assert (r.n_kernels, r.n_compute) == (len(k), len(compute))
        assert r.compute_mean_us == float(compute["dur"].mean())
        backward = compute[compute["phase"].isin(["backward", "recompute"])]
        last = backward.groupby("step")["end"].max()
        assert r.backward_end["step"].tolist() == last.index.tolist()
        assert r.backward_end["end_us"].tolist() == last.tolist()
        pd.testing.assert_frame_equal(
            op_tax(r, blocks),
            measure(k, blocks, moving(r.collectives)).set_index(["shape", "nth"]),
            check_exact=True,
        )
        assert len(op_tax(r, blocks)) > 0
        # The breakdown in one piece, from the kernels and the cross-rank transfers.
        mine = participants[participants["rank"] == r.rank].set_index("correlation")
        comm = k[k["kind"] == "comm"]
        transfer = mine["transfer_us"].reindex(comm["correlation"].to_numpy()).to_numpy()
        is_compute = (k["kind"] == "compute").to_numpy()
        recompute = is_compute & (k["phase"] == "recompute").to_numpy()
        spans = Spans(
            k["ts"].to_numpy(),
            k["end"].to_numpy(),
            is_compute,
            recompute,
            is_compute & k["fsdp"].to_numpy(dtype=bool) & ~recompute,
        )
        whole = partition(
            spans,
            comm["ts"].to_numpy(),
            comm["end"].to_numpy(),
            transfer,
            r.steps["start_us"].to_numpy(dtype=np.float64),
            r.steps["end_us"].to_numpy(dtype=np.float64),
        )
        columns = {"compute_us": "model_compute_us"}
        for part in ("compute_us", "fsdp_copy_us", *[p for p in whole if "exposed" in p]):
            got = r.steps[columns.get(part, part)].to_numpy()
            assert got.tolist() == whole[part].tolist(), part


def test_op_tax_of_other_blocks_is_measured_from_the_kernels_read_again():
    r = fsdp_trace.analyze(GPT, detailed=False).ranks[1]
    some = {r.op_tax_blocks[0], r.op_tax_blocks[1]}
    got = op_tax(r, some)
    again = measure(r.load_kernels(), some, moving(r.collectives)).set_index(["shape", "nth"])
    pd.testing.assert_frame_equal(got, again, check_exact=True)
    assert set(r.op_tax["kernel"]) >= set(got["kernel"])


# --- what a run keeps of a rank: compact, read back as the fresh analysis -------------------

COMPACT_RUNS = [GPT, FULL_AC, SAMPLES / "cpu-hsdp-2x2", SAMPLES / "diagnosis" / "straggler"]


def fresh_and_kept(run: Path) -> tuple[list[RankAnalysis], list[RankAnalysis], object]:
    """A run's timing traces analyzed afresh (as the analysis makes them) and as a run keeps
    them (`RankAnalysis.as_kept`), and its run.json."""
    from fsdp_trace.analysis.read.inputs import resolve

    (run_in,) = resolve(run).runs
    fresh = [
        perrank.analyze_file(t.path, t.source, cache=False)
        for t in run_in.traces
        if t.source != "detailed"
    ]
    return fresh, [r.as_kept(False, kernels=False) for r in fresh], run_in.run


def as_values(frame: pd.DataFrame) -> pd.DataFrame:
    """Every cell as the Python value it reads back as (dtypes aside)."""
    return frame.astype(object)


@pytest.mark.parametrize("run", COMPACT_RUNS, ids=lambda p: p.name)
def test_a_kept_rank_reads_back_as_its_fresh_analysis(run):
    """Compact where exact: every value of every table reads back as the analysis made it
    (None and NaN kept apart); the exposed intervals' and label facts' steps (and the facts'
    counts) as int32, the facts' kind and unit as categoricals with sorted categories; the
    collectives' text stays text (readers assign to it)."""
    fresh, kept, _ = fresh_and_kept(run)
    for a, b in zip(fresh, kept, strict=True):
        for f in dataclasses.fields(a):
            x, y = getattr(a, f.name), getattr(b, f.name)
            if f.name == "kernel_table":
                assert y is None
            elif isinstance(x, pd.DataFrame):
                pd.testing.assert_frame_equal(as_values(y), as_values(x), check_exact=True)
                for column in x.columns:
                    if x[column].dtype == object:
                        assert list(map(type, x[column])) == list(map(type, y[column])), column
        if len(b.exposed):
            assert b.exposed["step"].dtype == np.int32
        if len(b.fsdp):
            assert {b.fsdp[c].dtype for c in ("step", "count")} == {np.dtype(np.int32)}
            for column in ("kind", "unit"):
                categories = list(b.fsdp[column].cat.categories)
                assert categories == sorted(categories)
        assert list(b.collectives.dtypes) == list(a.collectives.dtypes)


@pytest.mark.parametrize("run", COMPACT_RUNS, ids=lambda p: p.name)
def test_inference_and_matching_read_kept_ranks_as_fresh_ones(run):
    """The configuration inferred and the cross-rank match (both reading every rank at once,
    on the client) are the same from the compact ranks a run keeps as from fresh ones; the
    inference concatenates only the columns it reads, its text as categoricals."""
    from fsdp_trace.analysis.job import config
    from fsdp_trace.analysis.job.crossrank import match

    fresh, kept, record = fresh_and_kept(run)
    assert config.infer(kept, record) == config.infer(fresh, record)
    a, b = match(fresh), match(kept)
    assert a.notices == b.notices and a.clock_offsets_us == b.clock_offsets_us
    for name in ("matched", "per_rank", "participants", "groups"):
        pd.testing.assert_frame_equal(getattr(b, name), getattr(a, name), check_exact=True)
    coll = config._collectives(kept)
    assert set(coll.columns) <= set(config.READ)
    assert isinstance(coll["block"].dtype, pd.CategoricalDtype)


@pytest.mark.parametrize("path", [GPT / "rank0.timing.json.gz", GPT / "rank1.detailed.json.gz"])
def test_numpy_ways_equal_pandas_ways(path):
    """The per-rank steps done in numpy (issue 23: a groupby or merge costs ~1 ms however few
    its rows) give what the pandas ways give, to the bit: the overlap tax's per-op table and
    the units' compute windows (`merge_asof`)."""
    from fsdp_trace.analysis import classify
    from fsdp_trace.analysis import intervals as iv
    from fsdp_trace.analysis.rank import context
    from fsdp_trace.analysis.rank import overlap_tax as tax
    from fsdp_trace.analysis.rank.analyze import analyze_trace
    from fsdp_trace.analysis.read.loader import load_trace
    from fsdp_trace.vocab import Kind

    trace = load_trace(path, cache=False)
    k = analyze_trace(trace).kernel_table
    blocks = {b for b in tax.op_blocks(k) if tax.block_like(b)}
    comm = k[k["kind"] == Kind.COMM]
    compute = k[(k["kind"] == Kind.COMPUTE) & k["block"].isin(blocks)].sort_values("ts")
    compute = compute[compute["grid"].notna() & compute["block_dim"].notna()]
    beside = iv.union(comm["ts"].to_numpy(), comm["end"].to_numpy())
    dur = compute["dur"].to_numpy(dtype=np.float64)
    ts, end = compute["ts"].to_numpy(), compute["end"].to_numpy()
    frac = iv.overlap_each(ts, end, beside) / np.where(dur > 0, dur, np.inf)
    touched = iv.overlap_each(ts, end, beside)
    expected = tax._ops_frame(compute, dur, frac, touched)
    assert len(expected) > 0
    pd.testing.assert_frame_equal(
        tax._ops(compute, dur, frac > 0.5, touched == 0), expected, check_exact=True
    )

    kinds = classify.event_kinds(trace.events)
    cpu = trace.events.loc[classify.kind_mask(kinds, classify.CPU_OP, classify.ANNOTATION)]
    labels = context.fsdp_labels(cpu)
    kind = labels["kind"].to_numpy()
    opens, closes = np.flatnonzero(kind == "pre_forward"), np.flatnonzero(kind == "post_forward")
    left = labels.iloc[opens][["pid", "tid", "fqn", "end"]].rename(columns={"end": "w_start"})
    right = labels.iloc[closes][["pid", "tid", "fqn", "ts"]].rename(columns={"ts": "w_end"})
    merged = pd.merge_asof(
        left.sort_values("w_start"),
        right.sort_values("w_end"),
        left_on="w_start",
        right_on="w_end",
        by=["pid", "tid", "fqn"],
        direction="forward",
    ).dropna(subset=["w_end"])
    assert len(merged) > 0
    pd.testing.assert_frame_equal(
        pd.DataFrame(context._first_close_after(labels, opens, closes)),
        merged.reset_index(drop=True),
        check_exact=True,
    )


_ASKED: list[str] = []


def _type_name(value) -> str:
    return type(value).__name__


def _asked_if_fsdp(name):
    """A question that holds nothing of its own (module names only), counting its askings."""
    _ASKED.append(name)
    return name.startswith("FSDP::")


def test_per_category_answers_are_kept_for_the_next_rank_only_where_the_question_is_pure():
    """A question without state of its own is asked once per set of names (the next rank of
    the job reads the kept answers); a closure's answers depend on what it holds: asked again."""
    from fsdp_trace.analysis import classify

    _ASKED.clear()
    names = tuple(f"FSDP::op{i}" if i % 2 else f"aten::op{i}" for i in range(40))
    first = classify.category_table(names, _asked_if_fsdp, bool, "nan")
    again = classify.category_table(tuple(list(names)), _asked_if_fsdp, bool, "nan")  # a copy
    assert len(_ASKED) == len(names) + 1  # asked once, the missing value too
    assert np.array_equal(first, [n.startswith("FSDP::") for n in names] + [False])
    assert again is first and not first.flags.writeable
    other = classify.category_table(names[:-1], _asked_if_fsdp, bool, "nan")  # other names
    assert len(_ASKED) == 2 * len(names) + 1 and other.size == len(names)

    def prefixed(prefix):
        return lambda name: name.startswith(prefix)

    fsdp = classify.category_table(names, prefixed("FSDP::"), bool, "nan")
    aten = classify.category_table(names, prefixed("aten::"), bool, "nan")
    assert np.array_equal(fsdp[:-1], ~aten[:-1])  # one code, two closures: never shared
    for i in range(classify._TABLES_KEPT + 5):  # bounded: the oldest go
        classify.category_table((f"n{i}",), _asked_if_fsdp, bool, "nan")
    assert len(classify._TABLES) <= classify._TABLES_KEPT


@pytest.mark.parametrize("column", ["sorted categories", "unsorted categories", "missing", "text"])
def test_kernel_time_by_codes_is_the_groupby_of_names(column):
    """The top kernel names by compute time per step, read from the name column's codes,
    against `groupby(names).sum()` sorted descending written here (ties: the first name)."""
    from fsdp_trace.analysis.rank.kernel_figures import KERNEL_TIME_TOP, _kernel_time

    rng = np.random.default_rng(3)
    pool = [f"kernel_{i:03d}_{'x' * (i % 7)}" for i in range(120)]
    names = rng.choice(pool, 3000)
    dur = np.round(rng.exponential(20.0, 3000), 1)  # rounded: ties between names
    if column == "sorted categories":
        series = pd.Series(pd.Categorical(names))
    elif column == "unsorted categories":
        series = pd.Series(pd.Categorical(names, categories=sorted(pool, reverse=True)))
    elif column == "missing":
        series = pd.Series(pd.Categorical(np.where(rng.random(3000) < 0.1, None, names)))
    else:
        series = pd.Series(names, dtype=object)
    rows = rng.random(3000) < 0.7
    expected = (
        (pd.Series(dur[rows]).groupby(series.astype(str).to_numpy()[rows]).sum() / 4)
        .sort_values(ascending=False, kind="quicksort")
        .head(KERNEL_TIME_TOP)
    )
    got = _kernel_time(series, rows, dur[rows], 4)
    assert list(got) == [str(n) for n in expected.index]
    assert np.array_equal(np.array(list(got.values())), expected.to_numpy())


def test_per_category_answers_of_methods_and_numbers_are_not_kept_and_threads_share_them():
    """A bound method holds its instance (two instances, one code): never kept; numeric names
    (1 and 1.0 are equal keys) are not kept; threads evicting at once never fail."""
    import threading

    from fsdp_trace.analysis import classify

    class Prefix:
        def __init__(self, prefix):
            self.prefix = prefix

        def hit(self, name):
            return name is not None and name.startswith(self.prefix)

    names = ("FSDP::a", "aten::b")
    assert classify.category_table(names, Prefix("FSDP::").hit, bool, None).tolist()[:2] == [
        True,
        False,
    ]
    assert classify.category_table(names, Prefix("aten::").hit, bool, None).tolist()[:2] == [
        False,
        True,
    ]
    ints, floats = pd.Categorical([1, 2]), pd.Categorical([1.0, 2.0])  # equal as keys
    assert classify.per_category(ints, _type_name, object).tolist() == ["int", "int"]
    assert classify.per_category(floats, _type_name, object).tolist() == ["float", "float"]
    failures: list[BaseException] = []

    def ask(offset: int) -> None:
        try:
            for i in range(300):
                classify.category_table((f"t{offset}-{i}",), _asked_if_fsdp, bool, "nan")
        except BaseException as exc:  # any failure fails the test
            failures.append(exc)

    threads = [threading.Thread(target=ask, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures and len(classify._TABLES) <= classify._TABLES_KEPT


def test_kind_names_are_typed_as_a_mapped_column_also_when_empty():
    """The kernel table's kind names against `Series.map(KIND_NAMES)` (values and dtype), for
    kept kernels and for none (every kernel launched outside the profiled steps)."""
    from fsdp_trace.analysis import classify
    from fsdp_trace.analysis.rank.analyze import _kind_names

    for kinds in (np.array([1, 2, 3, 2], dtype=np.int8), np.empty(0, dtype=np.int8)):
        expected = pd.Series(kinds).map(classify.KIND_NAMES)
        got = pd.DataFrame({"kind": _kind_names(kinds)})["kind"]
        pd.testing.assert_series_equal(got, expected, check_names=False)
