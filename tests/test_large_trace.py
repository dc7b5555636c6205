"""benchmarks/make_large_trace.py on a small size (its output is a valid trace of N× the real
capture's steps), the streaming loader against a whole-file decode, and parallel analysis
against serial. No timing here: benchmarks/bench_vs_hta.py measures speed."""

from __future__ import annotations

import gc
import gzip
import importlib.util
import itertools
import json
import os
import re
import signal
import struct
import sys
import time
import weakref
from collections import Counter
from decimal import Decimal
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd
import pytest

from fsdp_trace import analyze
from fsdp_trace.analysis.job import perrank
from fsdp_trace.analysis.rank.analyze import analyze_trace
from fsdp_trace.analysis.read import columns, events, loader, parallel, text
from fsdp_trace.analysis.read.loader import load_trace
from fsdp_trace.errors import UserError
from tests.conftest import REPO, SAMPLES
from tests.synth import TraceBuilder


@pytest.fixture(autouse=True, params=["compiled", "python"])
def reader(request, monkeypatch) -> str:
    """Each test with each reader: the compiled one (where built), and msgspec alone (what an
    install without a C compiler runs; the two-process decode is used only then)."""
    if request.param == "compiled" and not columns.compiled_reader():
        pytest.skip("the compiled reader is not built here")
    monkeypatch.setenv(columns.READER_ENV, "" if request.param == "compiled" else "python")
    return request.param


SOURCE = SAMPLES / "gpt-small-2gpu" / "rank0.timing.json.gz"
N = 3


def _generator():
    spec = importlib.util.spec_from_file_location(
        "make_large_trace", REPO / "benchmarks" / "make_large_trace.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def replicated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("large")
    assert (
        _generator().main(["--source", str(SOURCE), "--replicas", str(N), "--out", str(out)]) == 0
    )
    return out / "rank0.json"


def _events(path: Path) -> list[dict]:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return json.loads(data, parse_float=Decimal)["traceEvents"]


LAUNCH_CATS = {"cuda_runtime", "cuda_driver"}
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def _links(events: list[dict]) -> tuple[Counter, set]:
    """Kernels per correlation id, and the correlation ids of launches."""
    kernels = Counter(e["args"]["correlation"] for e in events if e.get("cat") in GPU_CATS)
    launches = {
        e["args"]["correlation"]
        for e in events
        if e.get("cat") in LAUNCH_CATS and "correlation" in e.get("args", {})
    }
    return kernels, launches


def test_replicas_link_every_kernel_to_its_launch(replicated):
    source, out = _events(SOURCE), _events(replicated)
    src_kernels, src_launches = _links(source)
    kernels, launches = _links(out)
    assert sum(kernels.values()) == N * sum(src_kernels.values())
    # Correlation ids stay unique to one kernel, as in the source, and linked as often.
    assert max(kernels.values()) == max(src_kernels.values()) == 1
    linked = sum(1 for c in src_kernels if c in src_launches)
    assert sum(1 for c in kernels if c in launches) == N * linked
    assert len(launches) == N * len(src_launches)


def test_replicas_have_distinct_steps_and_shifted_exact_timestamps(replicated):
    source, out = _events(SOURCE), _events(replicated)
    steps = [
        e["name"]
        for e in out
        if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
    ]
    src_steps = [
        e["name"]
        for e in source
        if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
    ]
    assert len(steps) == len(set(steps)) == N * len(src_steps)
    numbers = sorted(int(s.split("#")[1]) for s in steps)
    assert numbers == list(range(1, N * len(src_steps) + 1))
    # Replica k is the source shifted by k periods, to the ns (decimal text, no float error).
    replicated_src = [e for e in source if e.get("ph") in ("X", "f", "s") and e["cat"] != "Trace"]
    per = len(replicated_src)
    body = [e for e in out if e.get("ph") in ("X", "f", "s") and e["cat"] != "Trace"]
    assert len(body) == N * per
    period = body[per]["ts"] - replicated_src[0]["ts"]
    assert period > 0 and period == period.to_integral_value()
    for k in range(N):
        for a, b in zip(replicated_src, body[k * per : (k + 1) * per], strict=True):
            assert b["ts"] - a["ts"] == k * period
            assert (
                b.get("dur") == a.get("dur") and b["name"].split("#")[0] == a["name"].split("#")[0]
            )
    # Metadata and the Trace span appear once.
    meta = [e for e in out if e.get("ph") == "M"]
    assert len(meta) == sum(1 for e in source if e.get("ph") == "M")


def test_analysis_of_n_replicas_is_n_times_the_source(replicated):
    src = analyze_trace(load_trace(SOURCE, cache=False))
    big = analyze_trace(load_trace(replicated, cache=False))
    assert len(big.steps) == N * len(src.steps)
    assert len(big.collectives) == N * len(src.collectives)
    assert len(big.kernels) == N * len(src.kernels)
    for column in ("n_comm_kernels", "n_compute_kernels"):
        assert big.steps[column].sum() == N * src.steps[column].sum()
    # Every replica's steps hold the source's kernels and exposure (windows of all but the
    # replica's last step are identical; the last one runs to the next replica's start).
    s = len(src.steps)
    for k in range(N):
        part = big.steps.iloc[k * s : (k + 1) * s].reset_index(drop=True)
        for column in ("n_comm_kernels", "n_compute_kernels", "comm_us", "compute_us"):
            pd.testing.assert_series_equal(
                part[column], src.steps[column], check_names=False, rtol=1e-9
            )
    # Per-block averages per step are the source's.
    key = ["block", "phase", "collective"]
    a = src.blocks.set_index(key).sort_index()
    b = big.blocks.set_index(key).sort_index()
    pd.testing.assert_index_equal(a.index, b.index)
    for column in ("count_per_step", "bytes_per_step", "exposed_us_per_step"):
        pd.testing.assert_series_equal(a[column], b[column], rtol=1e-6)


def test_ranks_option_writes_one_file_per_rank(tmp_path):
    out = tmp_path / "ranks"
    _generator().main(
        [
            "--source",
            str(SAMPLES / "gpt-small-2gpu"),
            "--replicas",
            "1",
            "--ranks",
            "3",
            "--out",
            str(out),
            "--gzip",
        ]
    )
    files = sorted(out.glob("rank*.json.gz"))
    assert [f.name for f in files] == ["rank0.json.gz", "rank1.json.gz", "rank2.json.gz"]
    for r, f in enumerate(files):
        trace = load_trace(f, cache=False)
        assert (trace.rank, trace.world_size) == (r, 3)


# --- the streaming loader -------------------------------------------------------------------


def _whole(path: Path) -> loader.Trace:
    """The same file decoded in one piece (the loader's fallback path, here allowed to hold
    the whole file: normally only files under its look-ahead bound are)."""
    saved = text.EVENTS_KEY, text.LOOKAHEAD
    text.EVENTS_KEY = re.compile(rb"(?!)")  # never matches: decode whole
    text.LOOKAHEAD = 1 << 40
    try:
        return load_trace(path, cache=False)
    finally:
        text.EVENTS_KEY, text.LOOKAHEAD = saved


def _same(a: loader.Trace, b: loader.Trace) -> None:
    pd.testing.assert_frame_equal(a.events, b.events, check_exact=True)
    for attr in (
        "rank",
        "world_size",
        "thread_names",
        "process_names",
        "string_ids",
        "raw_event_count",
        "base_time_ns",
        "device_properties",
    ):
        assert getattr(a, attr) == getattr(b, attr), attr


def test_streamed_pieces_equal_a_whole_decode(replicated):
    _same(load_trace(replicated, cache=False), _whole(replicated))


def test_cuts_inside_events_are_recovered(tmp_path, monkeypatch):
    """Args holding `},{` (objects in a list) look like event boundaries; tiny pieces make
    the loader cut there, fail to decode, and take a larger piece instead."""
    b = TraceBuilder()
    for i in range(40):
        b.step(i + 1, i * 1000, 900)
        b.cpu("aten::mm", i * 1000 + 10, 50, nested=[{"a": 1}, {"b": "},{"}, {"c": [{}]}])
        b.kernel("gemm", i * 1000 + 100, 100, launch_ts=i * 1000 + 20)
        b.nccl("AllGather", i * 1000 + 150, 80, launch_ts=i * 1000 + 30)
    b.events.append(
        {"ph": "M", "name": "thread_name", "pid": "Spans", "tid": "x", "args": {"name": "spans"}}
    )
    b.events.append(
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "odd",
            "pid": "Spans",
            "tid": 5,
            "ts": 5.5,
            "dur": None,
            "args": {"correlation": None},
        }
    )
    b.events.append({"ph": "X", "cat": "cpu_op", "name": "no ts", "pid": 1, "tid": 1})
    path = b.write(tmp_path / "rank0.json")
    whole = _whole(path)
    for piece in (64, 300, 4096):
        monkeypatch.setattr(events, "PIECE", piece)
        monkeypatch.setattr(events, "COMPILED_PIECE", piece)
        _same(load_trace(path, cache=False), whole)
    assert whole.string_ids == {"Spans": -2, "x": -3}
    assert "odd" in set(whole.events["name"].astype(str))


def test_two_decoding_processes_equal_one(replicated, monkeypatch):
    monkeypatch.setattr(parallel, "BATCH", 1 << 18)  # many batches, shared by both processes
    done = parallel.stream_parallel(replicated, None)
    assert done is not None  # the two-process path ran (no fallback)
    _, columns = done
    one = load_trace(replicated, cache=False, parallel=False)
    pd.testing.assert_frame_equal(columns.frame(), one.events, check_exact=True)
    _same(load_trace(replicated, cache=False, parallel=True), one)


def test_two_processes_fall_back_on_cuts_inside_events(tmp_path, monkeypatch):
    b = TraceBuilder()
    for i in range(200):
        b.step(i + 1, i * 1000, 900)
        b.cpu("aten::mm", i * 1000 + 10, 50, nested=[{"a": 1}, {"b": 2}])
        b.kernel("gemm", i * 1000 + 100, 100, launch_ts=i * 1000 + 20)
    path = b.write(tmp_path / "rank0.json")
    monkeypatch.setattr(parallel, "BATCH", 64)
    monkeypatch.setattr(events, "PIECE", 64)
    monkeypatch.setattr(events, "COMPILED_PIECE", 64)
    assert parallel.stream_parallel(path, None) is None  # a batch cut inside an event
    _same(load_trace(path, cache=False, parallel=True), _whole(path))


def _takes_nothing(tasks, answers) -> None:
    """A decoding helper that never answers nor takes a batch (stuck on a lock held at the
    fork)."""
    while True:
        time.sleep(60)


def _takes_but_never_answers(tasks, answers) -> None:
    while True:
        tasks.get()


def _dies_halfway_through_an_answer(tasks, answers) -> None:
    tasks.get()
    # A message's length (1 MB), then a few of its bytes, then the process is gone (as when
    # killed for memory while its answer was being written).
    os.write(answers.fileno(), struct.pack("!i", 1 << 20) + b"\x80\x05")
    os._exit(1)


def _deaf_to_sigterm(tasks, answers) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        time.sleep(60)


class _Hang(BaseException):
    """Raised into a wait that has no bound (no `except Exception` or OSError takes it)."""


@pytest.fixture
def bounded():
    """Fails a test that would otherwise hang (no pytest-timeout here)."""

    def expired(signum, frame):
        raise _Hang("waited on the decoding helper without a bound")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, 60, 5)  # again every 5 s: each wait fails, none hangs
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize(
    "helper", [_takes_nothing, _takes_but_never_answers, _dies_halfway_through_an_answer]
)
@pytest.mark.parametrize("gz", [False, True])
def test_a_stuck_or_dead_decoding_helper_sends_the_file_down_one_process(
    replicated, tmp_path, monkeypatch, bounded, gz, helper
):
    path = replicated
    if gz:
        path = tmp_path / "rank0.json.gz"
        path.write_bytes(gzip.compress(replicated.read_bytes(), compresslevel=1))
    monkeypatch.setattr(parallel, "STALL_SECONDS", 1.5)
    monkeypatch.setattr(parallel, "BATCH", 1 << 18)  # batches sent to the helper, never back
    decoder = parallel.Helper(target=helper)
    assert parallel.stream_parallel(path, None, decoder) is None  # not a hang
    assert not decoder.process.is_alive()
    monkeypatch.setattr(parallel, "_helper", helper)  # the loader's own helper, as stuck
    _same(load_trace(path, cache=False, parallel=True), load_trace(path, cache=False))


def test_a_helper_deaf_to_sigterm_is_killed(tmp_path, monkeypatch, bounded):
    """The CI hang's shape: a cut gzip (its read fails at once) while the helper ignores
    SIGTERM: closing it must not wait for it."""
    cut = tmp_path / "cut.json.gz"
    whole = gzip.compress(json.dumps({"traceEvents": [{"ph": "X"}] * 1000}).encode())
    cut.write_bytes(whole[: len(whole) // 2])
    monkeypatch.setattr(parallel, "KILL_AFTER_SECONDS", 0.5)
    decoder = parallel.Helper(target=_deaf_to_sigterm)
    try:
        time.sleep(0.2)  # the helper has set its handler
        started = time.monotonic()
        with pytest.raises(UserError, match="truncated or corrupt gzip"):
            parallel.stream_parallel(cut, None, decoder)
        assert time.monotonic() - started < 30
        assert not decoder.process.is_alive()
    finally:  # a failure here must not leave it for the interpreter's exit to wait on
        if decoder.process.is_alive():
            decoder.process.kill()


def test_gzip_and_plain_load_alike(tmp_path, replicated):
    packed = tmp_path / "rank0.json.gz"
    packed.write_bytes(gzip.compress(replicated.read_bytes(), compresslevel=1))
    _same(load_trace(packed, cache=False), load_trace(replicated, cache=False))


def test_one_block_files_are_read_without_a_thread(tmp_path, monkeypatch):
    """A plain file of one block or less is read in the calling thread (no reader thread
    started); a larger one, and any gzip file, on the reader thread: the same blocks and
    progress offsets either way."""
    import threading

    started: list[str] = []
    real_start = threading.Thread.start

    def start(self):
        started.append(self.name)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    monkeypatch.setattr(text, "BLOCK", 1000)
    data = bytes(range(32, 127)) * 30  # 2,850 bytes: three blocks
    path = tmp_path / "t.json"

    def read(body: bytes, gz: bool = False) -> tuple[list[bytes], list[int], list[str]]:
        path.write_bytes(gzip.compress(body) if gz else body)
        started.clear()
        offsets: list[int] = []
        blocks = list(text.read_blocks(path, offsets.append))
        return blocks, offsets, list(started)

    blocks, offsets, threads = read(data[:1000])
    assert (blocks, offsets, threads) == ([data[:1000]], [1000, 1000], [])
    blocks, offsets, threads = read(data)
    assert b"".join(blocks) == data and [len(b) for b in blocks] == [1000, 1000, 850]
    assert offsets == [1000, 2000, 2850, 2850] and threads == ["fsdp-trace-reader"]
    blocks, _, threads = read(data[:500], gz=True)
    assert blocks == [data[:500]] and threads == ["fsdp-trace-reader"]


def test_progress_bar_does_not_change_the_result(replicated, capsys):
    _same(load_trace(replicated, cache=False, progress=True), _whole(replicated))


def test_bare_list_layout_still_loads(tmp_path):
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.kernel("gemm", 100, 100, launch_ts=5)
    path = tmp_path / "rank0.json"
    path.write_bytes(msgspec.json.encode(b.events))
    assert len(load_trace(path, cache=False).events) == 3


# --- parallel analysis ----------------------------------------------------------------------


class _NoPool:
    def __init__(self, *args, **kwargs):
        raise AssertionError("a worker pool was started")


def test_small_inputs_start_no_pool(monkeypatch):
    """A few small traces are analyzed here, not by `--jobs` workers (whose interpreters
    would cost more memory than the second core saves time)."""
    import concurrent.futures

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", _NoPool)
    result = analyze(SAMPLES / "gpt-small-2gpu", jobs=2, cache=False)
    assert len(result.ranks) == 2
    monkeypatch.setattr(perrank, "POOL_MIN_BYTES", 0)
    with pytest.raises(AssertionError, match="pool was started"):
        analyze(SAMPLES / "gpt-small-2gpu", jobs=2, cache=False)


@pytest.mark.parametrize("per_task", [1, 4], ids=["a-trace-a-task", "traces-batched"])
def test_parallel_ranks_equal_serial(per_task, monkeypatch):
    """Each trace a task of the pool, or several traces a task (`perrank.batches`)."""
    run = SAMPLES / "gpt-small-2gpu"
    serial = analyze(run, jobs=1, cache=False)
    monkeypatch.setattr(perrank, "POOL_MIN_BYTES", 0)  # workers even for the small samples
    monkeypatch.setattr(perrank, "TASKS_PER_WORKER", 1)  # at most half of the bytes a task
    monkeypatch.setattr(perrank, "BATCH_BYTES", 1 << 40)
    monkeypatch.setattr(perrank, "BATCH_TRACES", per_task)
    tasks = []
    real = perrank.batches
    monkeypatch.setattr(perrank, "batches", lambda *a: tasks.extend(real(*a)) or tasks)
    parallel = analyze(run, jobs=2, cache=False)
    assert max(map(len, tasks)) == per_task if per_task == 1 else max(map(len, tasks)) > 1
    assert [r.path for r in serial.ranks + serial.detailed] == [
        r.path for r in parallel.ranks + parallel.detailed
    ]
    for a, b in zip(
        serial.ranks + serial.detailed, parallel.ranks + parallel.detailed, strict=True
    ):
        for attr in ("steps", "collectives", "blocks", "kernels", "exposed", "compute_phases"):
            pd.testing.assert_frame_equal(getattr(a, attr), getattr(b, attr), check_exact=True)
        assert (a.streams, a.notices, a.rank) == (b.streams, b.notices, b.rank)


def test_a_pools_tasks_are_consecutive_traces_within_bounds():
    """Every trace once, in order; at most BATCH_TRACES a task and BATCH_BYTES of JSON
    (a larger trace alone), and no task past a TASKS_PER_WORKER-th of a worker's share."""
    mb = 1 << 20
    raw = dict(enumerate([1 * mb] * 40 + [40 * mb] + [2 * mb] * 5 + [0] * 20))
    for jobs in (1, 2, 8):
        tasks = perrank.batches(list(raw), raw, jobs)
        assert [i for task in tasks for i in task] == list(raw)
        limit = min(perrank.BATCH_BYTES, sum(raw.values()) / (perrank.TASKS_PER_WORKER * jobs))
        for task in tasks:
            assert 1 <= len(task) <= perrank.BATCH_TRACES
            assert len(task) == 1 or sum(raw[i] for i in task) <= limit
            assert len(task) == 1 or all(raw[i] > 0 for i in task)  # unknown size: alone
        # Greedy: a task ends only where the next trace would pass a bound (or either's size
        # is unknown).
        for task, after in itertools.pairwise(tasks):
            size = sum(raw[i] for i in task)
            full = len(task) == perrank.BATCH_TRACES or size + raw[after[0]] > limit
            assert full or raw[task[-1]] == 0 or raw[after[0]] == 0
    assert [40] in perrank.batches(list(raw), raw, 2)  # over BATCH_BYTES: alone
    assert perrank.batches(list(raw), raw, 2)[-20:] == [[i] for i in range(46, 66)]
    assert perrank.batches([3, 7], {3: mb, 7: mb}, 2) == [[3], [7]]  # a task per worker
    assert perrank.batches([], {}, 2) == []


def test_one_traces_events_at_a_time(monkeypatch):
    """With one job, a rank's parsed events (its Trace, the events frame and their column
    arrays) are freed, by reference counting alone, before the next trace is loaded: the
    results keep copies of the few columns they need, never the events."""
    alive: list[weakref.ref] = []
    real = perrank.load_trace

    def tracking(*args, **kwargs):
        left = [r() for r in alive if r() is not None]
        assert not left, f"{len(left)} objects of an earlier trace are still alive"
        trace = real(*args, **kwargs)
        alive.append(weakref.ref(trace))
        alive.append(weakref.ref(trace.events))
        for column in ("ts", "end", "correlation", "name"):
            values = trace.events[column].array
            alive.append(weakref.ref(values))
            base = getattr(values, "_ndarray", getattr(values, "codes", None))
            while isinstance(base, np.ndarray):  # the buffer behind the column
                alive.append(weakref.ref(base))
                base = base.base
        return trace

    monkeypatch.setattr(perrank, "load_trace", tracking)
    gc.disable()  # freed by reference counting, not by a later collection
    try:
        result = analyze(SAMPLES / "gpt-small-2gpu", jobs=1, cache=False)
        assert not [r for r in alive if r() is not None]
    finally:
        gc.enable()
    assert len(result.ranks) == 2 and len(result.detailed) == 2
    assert len(alive) >= 4 * 6  # 4 traces, each with its frame and column buffers


def test_ranks_share_one_period_and_stay_aligned(tmp_path):
    """Ranks made from different sources (rank 0 and rank 1 of a real capture, whose spans
    differ) get the same period and replica count, so each replica's steps keep the
    capture's offsets between ranks instead of drifting by the spans' difference."""
    out = tmp_path / "aligned"
    source = SAMPLES / "gpt-small-2gpu"
    _generator().main(
        ["--source", str(source), "--replicas", "3", "--ranks", "2", "--out", str(out)]
    )

    def step_starts(path: Path) -> dict[int, Decimal]:
        return {
            int(e["name"].split("#")[1]): e["ts"]
            for e in _events(path)
            if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
        }

    src = [step_starts(source / f"rank{r}.timing.json.gz") for r in (0, 1)]
    got = [step_starts(out / f"rank{r}.json") for r in (0, 1)]
    n = len(src[0])
    assert len(src[1]) == n and len(got[0]) == len(got[1]) == 3 * n
    for step in got[0]:
        original = (step - 1) % n + 1
        assert got[1][step] - got[0][step] == src[1][original] - src[0][original]
    # Replica k is k periods after the source, the same period for both ranks.
    period = got[0][n + 1] - src[0][1]
    assert got[1][n + 1] - src[1][1] == period


def test_default_jobs_a_process_per_core_as_memory_allows(monkeypatch):
    """`--jobs`' default: min(cores, traces, half the available memory over 1.5x the largest
    trace's JSON), at least 1."""
    sizes = [1000, 4000, 2500]  # bytes of JSON
    monkeypatch.setattr(perrank.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    for free, want in ((10**9, 3), (4000 * 1.5 * 2 * 2, 2), (100, 1), (None, 3)):
        monkeypatch.setattr(perrank, "available_memory", lambda free=free: free)
        assert perrank.auto_jobs(sizes) == want, free
    monkeypatch.setattr(perrank, "available_memory", lambda: 10**9)
    assert perrank.auto_jobs(sizes[:1] * 20) == 8  # more traces than cores
    assert perrank.auto_jobs([]) == 1
