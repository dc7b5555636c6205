"""The cache of parsed traces and of analyses: hits return the same objects, a changed file,
changed code or changed parameters miss, damaged entries (to the byte) are detected and
rewritten, the size budget evicts least recently used entries only, and `cache=False` /
`--no-cache` write nothing."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import re
import shutil
import struct
import time
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd
import pytest

from fsdp_trace import analyze
from fsdp_trace.analysis.job import perrank
from fsdp_trace.analysis.read import cache, cachefolder, columns, loader, parallel
from fsdp_trace.analysis.read import text as text_mod
from fsdp_trace.analysis.read import trace as trace_mod
from fsdp_trace.analysis.read.loader import load_trace
from fsdp_trace.analysis.results import RankAnalysis
from tests.conftest import SAMPLES, run_cli
from tests.synth import TraceBuilder

SAMPLE = SAMPLES / "gpt-small-2gpu" / "rank0.timing.json.gz"


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("FSDP_TRACE_CACHE_DIR", str(folder))
    monkeypatch.delenv("FSDP_TRACE_CACHE", raising=False)
    monkeypatch.delenv("FSDP_TRACE_CACHE_MAX_GB", raising=False)
    return folder


@pytest.fixture
def trace_file(tmp_path):
    path = tmp_path / "rank0.timing.json.gz"
    shutil.copy(SAMPLE, path)
    return path


@pytest.fixture
def fresh_code_versions():
    """Code versions recomputed from the (patched) sources, before and after the test."""
    cache.code_version.cache_clear()
    yield
    cache.code_version.cache_clear()


def entries(folder, kind: str = "") -> list:
    found = folder.glob(f"{kind}*{cache.SUFFIX}") if folder.exists() else []
    return sorted(found)


def no_parsing(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("parsed although the cache holds this content")

    monkeypatch.setattr(loader, "_parse", fail)


def no_analysis(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("analyzed although the cache holds this analysis")

    monkeypatch.setattr(perrank, "analyze_trace", fail)
    monkeypatch.setattr(perrank, "load_trace", fail)


def assert_same(a, b) -> None:
    """Every field equal, DataFrames to the bit with the same dtypes, index and column types,
    and object columns holding the same types (None stays None, NaN stays NaN). Not `reread`:
    how the run reads kernels again (through the cache or not), not what was analyzed."""
    assert type(a) is type(b)
    for field in dataclasses.fields(a):
        if field.name == "reread":
            continue
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, pd.DataFrame):
            pd.testing.assert_frame_equal(
                x, y, check_exact=True, check_index_type=True, check_column_type=True
            )
            assert list(x.dtypes) == list(y.dtypes), field.name
            for column in x.columns:
                if x[column].dtype == object:
                    assert list(map(type, x[column])) == list(map(type, y[column])), column
        else:
            assert x == y and type(x) is type(y), field.name


# --- parsed traces --------------------------------------------------------------------------


def test_second_load_hits_the_cache_with_identical_frames(cache_dir, trace_file, monkeypatch):
    first = load_trace(trace_file)
    (entry,) = entries(cache_dir)
    assert entry.name.startswith(f"trace-{cache.code_version('trace')}-")
    no_parsing(monkeypatch)
    second = load_trace(trace_file)
    assert_same(first, second)
    assert entries(cache_dir) == [entry]


def test_cached_load_equals_a_fresh_parse(cache_dir, trace_file):
    load_trace(trace_file)
    assert_same(load_trace(trace_file), load_trace(trace_file, cache=False))


def test_the_key_is_the_content_not_the_path(cache_dir, trace_file, tmp_path, monkeypatch):
    load_trace(trace_file)
    other = tmp_path / "copy" / "rank3.json.gz"
    other.parent.mkdir()
    shutil.copy(trace_file, other)
    no_parsing(monkeypatch)
    trace = load_trace(other)
    assert trace.path == str(other)
    assert trace.rank == 0  # distributedInfo's rank, not the name's
    assert len(entries(cache_dir)) == 1


def test_content_change_invalidates(cache_dir, tmp_path):
    path = tmp_path / "rank0.json"
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.kernel("gemm", 100, 100, launch_ts=5)
    b.write(path)
    before = load_trace(path)
    b.kernel("gemm2", 300, 50, launch_ts=20)
    b.write(path)  # same name, new content
    after = load_trace(path)
    assert len(after.events) == len(before.events) + 2
    assert "gemm2" in set(after.events["name"].astype(str))
    assert len(entries(cache_dir)) == 2
    assert_same(after, load_trace(path, cache=False))


def test_trace_entries_depend_on_every_module_the_loader_runs():
    """An edit to any module the loader imports (within fsdp_trace) must change the trace
    entries' code version: the sources list is checked against the loader's own imports,
    followed module by module (a new loader stage not listed would serve stale columns)."""
    import ast

    root = Path(loader.__file__).resolve().parents[3]
    seen, todo = set(), [Path(loader.__file__).resolve()]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        if path.name == "cache.py":  # listed itself; what it imports serves the analysis entries
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                if not name.startswith("fsdp_trace."):
                    continue
                file = root / (name.replace(".", "/") + ".py")
                if file.is_file() and file.name != "__init__.py":
                    todo.append(file.resolve())
    listed = {p.resolve() for p in cache._sources("trace")}
    # The progress bar's file name, imported lazily: no effect on the columns.
    missing = sorted(str(p.relative_to(root)) for p in seen - listed if p.name != "printable.py")
    assert not missing, missing
    assert {"text.py", "events.py", "columns.py", "parallel.py"} <= {p.name for p in listed}


@pytest.mark.parametrize("change", ["format", "loader source"])
def test_code_change_invalidates_and_keeps_the_other_versions_entries(
    cache_dir, trace_file, tmp_path, monkeypatch, fresh_code_versions, change
):
    load_trace(trace_file)
    (old,) = entries(cache_dir)
    if change == "format":
        monkeypatch.setattr(trace_mod, "FORMAT_VERSION", trace_mod.FORMAT_VERSION + 1)
    else:  # one more byte in a source file the entry depends on
        edited = tmp_path / "loader.py"
        edited.write_bytes((cache._sources("trace")[0]).read_bytes() + b"\n")
        sources = cache._sources
        monkeypatch.setattr(
            cache, "_sources", lambda kind: [edited, *sources(kind)[1:]] if kind == "trace" else []
        )
    cache.code_version.cache_clear()
    calls = []
    parse = loader._parse
    monkeypatch.setattr(loader, "_parse", lambda *a: calls.append(1) or parse(*a))
    load_trace(trace_file)
    assert calls == [1]
    # Both versions' entries stay: another installed version may still read its own.
    assert old in entries(cache_dir) and len(entries(cache_dir)) == 2
    info = cache.info()
    assert (info.traces, info.other_versions) == (1, 1)


def _payload_offset_of_first_array(entry) -> tuple[int, int]:
    """Where the first column array lies in an entry, read from its header."""
    data = entry.read_bytes()
    _, _, size = cache._PREFIX.unpack_from(data)
    header = msgspec.json.decode(data[cache._PREFIX.size : cache._PREFIX.size + size])
    offset, dtype, count = header["arrays"][0]
    return cache._PREFIX.size + size + offset, np.dtype(dtype).itemsize * count


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty", "prefix", "payload byte"])
def test_corrupt_entry_is_ignored_and_rewritten(cache_dir, trace_file, damage):
    good = load_trace(trace_file, cache=False)
    load_trace(trace_file)
    (entry,) = entries(cache_dir)
    data = entry.read_bytes()
    if damage == "payload byte":  # one byte of the timestamps column: still decodes
        start, nbytes = _payload_offset_of_first_array(entry)
        damaged = bytearray(data)
        damaged[start + nbytes // 2] ^= 0x10
        damaged = bytes(damaged)
    else:
        damaged = {
            "garbage": b"not a cache entry at all" * 10,
            "truncated": data[: len(data) // 2],
            "empty": b"",
            "prefix": data[:8] + b"\xff" * 16 + data[24:],
        }[damage]
    entry.write_bytes(damaged)
    assert_same(good, load_trace(trace_file))
    assert entry.read_bytes() == data  # rewritten whole
    assert_same(good, load_trace(trace_file))


def test_checksum_is_what_catches_a_flipped_payload_byte(cache_dir, trace_file):
    """Without its checksum the damaged entry above would load, with another timestamp."""
    load_trace(trace_file)
    (entry,) = entries(cache_dir)
    start, nbytes = _payload_offset_of_first_array(entry)
    data = bytearray(entry.read_bytes())
    data[start + nbytes // 2] ^= 0x10
    raw = np.frombuffer(bytes(data), dtype=np.uint8).copy()
    with pytest.raises(ValueError, match="checksum"):
        cache._decode(raw, loader.Trace, "trace")
    # Re-sealed with a matching checksum, the same bytes decode to different timestamps.
    hasher = cache.checksum_hasher()
    hasher.update(bytes(data[cache._PREFIX.size :]))
    struct.pack_into("<Q", data, 8, hasher.intdigest())
    forged = cache._decode(np.frombuffer(bytes(data), dtype=np.uint8).copy(), loader.Trace, "trace")
    fresh = load_trace(trace_file, cache=False)
    assert (forged.events["ts"] != fresh.events["ts"]).sum() == 1


# --- analyses -------------------------------------------------------------------------------


def test_second_analysis_reads_the_result_back_identical(cache_dir, tmp_path, monkeypatch):
    run = tmp_path / "run"
    shutil.copytree(SAMPLES / "gpt-small-2gpu", run)
    first = analyze(run)
    assert len(entries(cache_dir, "analysis")) == 4  # 2 ranks × (timing, detailed)
    assert len(entries(cache_dir, "trace")) == 4
    no_analysis(monkeypatch)
    second = analyze(run)
    for a, b in zip(first.ranks + first.detailed, second.ranks + second.detailed, strict=True):
        assert_same(a, b)


def test_cached_analyses_are_read_without_workers(cache_dir, tmp_path, monkeypatch):
    """With every analysis cached, `jobs=2` reads them here and forks nothing."""
    import concurrent.futures

    run = tmp_path / "run"
    shutil.copytree(SAMPLES / "gpt-small-2gpu", run)
    monkeypatch.setattr(perrank, "POOL_MIN_BYTES", 0)
    first = analyze(run, jobs=2)  # computed by workers, stored by them
    assert len(entries(cache_dir, "analysis")) == 4

    class NoPool:
        def __init__(self, *args, **kwargs):
            raise AssertionError("a worker pool was started")

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", NoPool)
    second = analyze(run, jobs=2)
    for a, b in zip(first.ranks + first.detailed, second.ranks + second.detailed, strict=True):
        assert_same(a, b)


def test_cached_analysis_equals_a_fresh_one(cache_dir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(SAMPLES / "cpu-gloo-2proc", run)  # CPU (gloo): None-filled object columns
    analyze(run)
    cached, fresh = analyze(run), analyze(run, cache=False)
    for a, b in zip(cached.ranks + cached.detailed, fresh.ranks + fresh.detailed, strict=True):
        assert_same(a, b)


def test_analysis_key_holds_file_source_and_name_rank(cache_dir, tmp_path, monkeypatch):
    """Per-rank analyses depend on the file, its source and the rank its name gives; what the
    run's configuration expects is applied after, so run.json is not part of the key."""
    b = TraceBuilder(rank=None)  # no distributedInfo: the rank comes from the file name
    b.step(1, 0, 1000)
    b.kernel("gemm", 100, 100, launch_ts=5)
    b.label("FSDP::all_gather (layers.0)", 25, 10)
    b.nccl("AllGather", 150, 80, launch_ts=30)
    path = b.write(tmp_path / "rank2.json")
    base = perrank.analyze_file(path)
    assert base.rank == 2
    assert len(entries(cache_dir, "analysis")) == 1
    # Another source: a new entry.
    assert perrank.analyze_file(path, source="timing").steps["source"].iloc[0] == "timing"
    assert len(entries(cache_dir, "analysis")) == 2
    # The same bytes under another rank's name: that rank, not the cached one.
    renamed = tmp_path / "rank5.json"
    shutil.copy(path, renamed)
    assert perrank.analyze_file(renamed).steps["rank"].iloc[0] == 5
    assert len(entries(cache_dir, "analysis")) == 3
    # Changed content: analyzed again.
    b.nccl("AllGather", 400, 80, launch_ts=40)
    b.write(path)
    assert len(perrank.analyze_file(path).collectives) == 2
    # And an unchanged one is a hit whose path is the file asked for.
    no_analysis(monkeypatch)
    again = perrank.analyze_file(renamed)
    assert again.path == str(renamed) and again.rank == 5


def test_analysis_code_change_invalidates(
    cache_dir, trace_file, tmp_path, monkeypatch, fresh_code_versions
):
    perrank.analyze_file(trace_file)
    edited = tmp_path / "rank.py"
    edited.write_text("# another version of the analysis\n")
    sources = cache._sources
    monkeypatch.setattr(
        cache, "_sources", lambda kind: [*sources(kind), edited] if kind == "analysis" else []
    )
    cache.code_version.cache_clear()
    calls = []
    analyze_trace = perrank.analyze_trace
    monkeypatch.setattr(perrank, "analyze_trace", lambda *a: calls.append(1) or analyze_trace(*a))
    perrank.analyze_file(trace_file)
    perrank.analyze_file(trace_file)
    assert calls == [1]
    assert len(entries(cache_dir, "analysis")) == 2


def test_damaged_analysis_entry_is_recomputed(cache_dir, trace_file):
    good = perrank.analyze_file(trace_file, cache=False)
    perrank.analyze_file(trace_file)
    (entry,) = entries(cache_dir, "analysis")
    start, nbytes = _payload_offset_of_first_array(entry)
    data = bytearray(entry.read_bytes())
    data[start + nbytes // 2] ^= 0x01
    entry.write_bytes(bytes(data))
    assert_same(good, perrank.analyze_file(trace_file))


def test_no_cache_writes_nothing(cache_dir, trace_file):
    load_trace(trace_file, cache=False)
    analyze(trace_file, cache=False)
    analyze(trace_file, jobs=2, cache=False)
    assert not cache_dir.exists()


def test_cli_no_cache_writes_nothing(tmp_path):
    folder = tmp_path / "cli-cache"
    env = {"FSDP_TRACE_CACHE_DIR": str(folder), "FSDP_TRACE_CACHE": "1"}
    done = run_cli("analyze", str(SAMPLE), "--no-report", "--no-cache", env=env)
    assert done.returncode == 0, done.stderr
    assert not folder.exists()
    done = run_cli("analyze", str(SAMPLE), "--no-report", env=env)
    assert done.returncode == 0, done.stderr
    assert len(entries(folder, "analysis")) == 1 and len(entries(folder, "trace")) == 1


# --- the codec ------------------------------------------------------------------------------


@dataclasses.dataclass
class Holder:
    path: str
    frame: pd.DataFrame
    empty: pd.DataFrame
    value: object


def test_codec_round_trips_every_column_kind_exactly(cache_dir):
    frame = pd.DataFrame(
        {
            "f": [1.5, np.nan, -0.0],
            "i": np.array([1, -2, 3], dtype=np.int32),
            "b": [True, False, True],
            "s": pd.array(["x", None, "y"], dtype="str"),
            "o": pd.Series(["a", None, np.nan], dtype=object),
            "c": pd.Categorical(["k", "l", None], categories=["l", "k"]),
        },
        index=pd.RangeIndex(10, 16, 2),
    )
    frame["o"] = pd.Series(["a", None, np.nan], dtype=object, index=frame.index)
    assert frame["o"].dtype == object
    empty = pd.DataFrame({"start": pd.Series(dtype=object), "n": pd.Series(dtype=np.int64)})
    value = {"map": {(1, 2): "t", 3: [1.0, float("nan"), float("inf")]}, "t": (None, True)}
    original = Holder("a", frame, empty, value)
    entry = cache._Entry(cache_dir / f"x{cache.SUFFIX}", "trace")
    assert entry._write(original)
    back = entry._read(Holder, "b")
    assert back.path == "b"
    pd.testing.assert_frame_equal(back.frame, frame, check_exact=True, check_index_type=True)
    assert list(map(type, back.frame["o"])) == [str, type(None), float]
    assert back.frame["c"].cat.categories.tolist() == ["l", "k"]
    pd.testing.assert_frame_equal(back.empty, empty, check_index_type=True)
    assert back.value["map"][(1, 2)] == "t" and back.value["t"] == (None, True)
    assert np.isnan(back.value["map"][3][1]) and back.value["map"][3][2] == float("inf")


@pytest.mark.parametrize(
    "bad",
    [
        pd.DataFrame({"x": [1, 2]}, index=[5, 7]),  # not a RangeIndex
        pd.DataFrame({"x": np.array([1, "a"], dtype=object)}),  # objects other than str
        pd.DataFrame({0: [1.0]}),  # a non-string column name
    ],
)
def test_what_the_format_cannot_hold_is_not_written(cache_dir, bad):
    entry = cache._Entry(cache_dir / f"x{cache.SUFFIX}", "trace")
    assert not entry._write(Holder("a", bad, bad.iloc[:0], None))
    assert not entry._write(Holder("a", pd.DataFrame(), pd.DataFrame(), {1, 2}))  # a set
    assert not entries(cache_dir) and not list(cache_dir.glob(".tmp-*"))


# --- where, when, how much ------------------------------------------------------------------


def test_off_by_default_under_pytest_and_by_env(tmp_path, monkeypatch, trace_file):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("FSDP_TRACE_CACHE_DIR", raising=False)
    assert "PYTEST_CURRENT_TEST" in os.environ
    assert not cache.enabled()
    load_trace(trace_file)
    analyze(trace_file)
    assert not (tmp_path / "home").exists() and not (tmp_path / "xdg").exists()
    monkeypatch.setenv("FSDP_TRACE_CACHE_DIR", str(tmp_path / "c"))
    assert cache.enabled()
    monkeypatch.setenv("FSDP_TRACE_CACHE", "0")
    assert not cache.enabled()
    load_trace(trace_file)
    analyze(trace_file)
    assert not (tmp_path / "c").exists()


def test_unwritable_cache_dir_is_not_an_error(tmp_path, monkeypatch, trace_file):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv("FSDP_TRACE_CACHE_DIR", str(blocker / "cache"))
    assert len(load_trace(trace_file).events) > 0
    assert len(analyze(trace_file).steps) == 5
    assert not list(tmp_path.glob(".tmp-*"))


def test_default_location(monkeypatch, tmp_path):
    monkeypatch.delenv("FSDP_TRACE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.directory() == tmp_path / "fsdp-trace"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert cache.directory() == tmp_path / "h" / ".cache" / "fsdp-trace"


def _small_traces(tmp_path, n: int) -> list:
    paths = []
    for i in range(n):
        b = TraceBuilder()
        b.step(1, 0, 1000)
        b.kernel(f"gemm{i}", 100, 100, launch_ts=5)
        paths.append(b.write(tmp_path / f"t{i}.json"))
    return paths


def test_size_budget_evicts_the_least_recently_used(cache_dir, tmp_path, monkeypatch):
    paths = _small_traces(tmp_path, 3)
    files = [cache.TraceEntry.for_file(p).file for p in paths]
    load_trace(paths[0])
    load_trace(paths[1])
    written = time.time() - 100
    os.utime(files[0], (written, written))  # written first...
    os.utime(files[1], (written + 10, written + 10))
    no_parsing(monkeypatch)
    load_trace(paths[0])  # ...but read last: the second is now the least recently used
    monkeypatch.undo()
    monkeypatch.setenv("FSDP_TRACE_CACHE_DIR", str(cache_dir))
    monkeypatch.setenv("FSDP_TRACE_CACHE_MAX_GB", str(2.5 * files[0].stat().st_size / 1024**3))
    load_trace(paths[2])
    assert entries(cache_dir) == sorted([files[0], files[2]])


def test_temporary_files_old_are_deleted_young_are_counted(cache_dir, tmp_path, monkeypatch):
    paths = _small_traces(tmp_path, 2)
    load_trace(paths[0])
    (entry,) = entries(cache_dir)
    stale = cache_dir / ".tmp-crashed"
    stale.write_bytes(b"x" * 1000)
    hour_ago = time.time() - 2 * cache.TMP_MAX_AGE_S
    os.utime(stale, (hour_ago, hour_ago))
    young = cache_dir / ".tmp-writing"
    young.write_bytes(b"x" * 10 * entry.stat().st_size)
    assert cache.info().temporary == 2
    # The young file (another process writing) stays and counts: the budget leaves room
    # for it plus one entry, so the older entry goes.
    budget = young.stat().st_size + 1.5 * entry.stat().st_size
    monkeypatch.setenv("FSDP_TRACE_CACHE_MAX_GB", str(budget / 1024**3))
    os.utime(entry, (hour_ago, hour_ago))
    load_trace(paths[1])
    assert not stale.exists() and young.exists()
    assert entries(cache_dir) != [] and entry not in entries(cache_dir)


def test_info_and_clear(cache_dir, trace_file, tmp_path):
    assert cache.clear() == (0, 0)  # no folder yet
    perrank.analyze_file(trace_file)
    (cache_dir / ".tmp-x").write_bytes(b"12345")
    foreign = cache_dir / "notes.txt"
    foreign.write_text("not ours")
    info = cache.info()
    sizes = sum(p.stat().st_size for p in cache_dir.iterdir() if p != foreign)
    assert (info.traces, info.analyses, info.other_versions, info.temporary) == (1, 1, 0, 1)
    assert info.total_bytes == sizes and info.directory == cache_dir and info.enabled
    assert info.max_bytes == 20 * 1024**3
    assert str(cache_dir) in info.lines()[0]
    assert cache.clear() == (3, sizes)
    assert list(cache_dir.iterdir()) == [foreign]  # only the cache's own files go
    assert cache.info().total_bytes == 0


# --- raw size of gzip files (progress bar, two-process decode) ------------------------------


def _fake_gzip(path, stored: int, isize: int):
    """A sparse file with gzip's magic and an ISIZE trailer: all `raw_size` reads."""
    with open(path, "wb") as fh:
        fh.write(b"\x1f\x8b\x08\x00")
        fh.truncate(stored - 4)
        fh.seek(stored - 4)
        fh.write(struct.pack("<I", isize % (1 << 32)))
    return path


def test_raw_size_reads_gzip_isize(tmp_path):
    assert loader.raw_size(SAMPLE) == len(gzip.decompress(SAMPLE.read_bytes()))
    plain = tmp_path / "a.json"
    plain.write_bytes(b"[]" * 100)
    assert loader.raw_size(plain) == 200
    assert loader.raw_size(_fake_gzip(tmp_path / "b.gz", 40 << 20, 450 << 20)) == 450 << 20
    # 12 GB of JSON in 1 GB of gzip: ISIZE wrapped around 4 GiB twice.
    big = _fake_gzip(tmp_path / "c.gz", 1 << 30, 12 * 10**9)
    assert loader.raw_size(big) == 12 * 10**9
    assert loader.raw_size(tmp_path / "missing.gz") == 0


def test_a_cut_gzips_claimed_size_is_capped_at_what_the_reader_takes(tmp_path):
    """A cut gzip's last four bytes are compressed data, read as ISIZE: 2.5 GB claimed by 200
    bytes must not start the two-process decode; the reader refuses more than this anyway."""
    cut = _fake_gzip(tmp_path / "cut.gz", 200, 2_500_000_000)
    assert loader.raw_size(cut) == 1032 * 200  # deflate expands 1032x at most
    assert not parallel.parallel_worth_it(cut)
    middling = _fake_gzip(tmp_path / "mid.gz", 256 << 10, 200 << 20)  # 800x: deflate's, not ours
    assert loader.raw_size(middling) == text_mod.GZIP_RATIO_FLOOR
    bomb = _fake_gzip(tmp_path / "bomb.gz", 8 << 20, 4_000_000_000)  # 500x its size
    assert loader.raw_size(bomb) == text_mod.GZIP_MAX_RATIO * (8 << 20)


def test_progress_bar_threshold_is_the_raw_size(tmp_path, monkeypatch):
    class Terminal:
        def isatty(self) -> bool:
            return True

        def write(self, text: str) -> int:
            return len(text)

        def flush(self) -> None:
            pass

    monkeypatch.setattr("sys.stderr", Terminal())
    monkeypatch.delenv("FSDP_TRACE_QUIET", raising=False)
    packed = _fake_gzip(tmp_path / "big.json.gz", 6 << 20, 60 << 20)  # 6 MB on disk
    assert loader._ProgressBar(packed, None).progress is not None
    small = _fake_gzip(tmp_path / "small.json.gz", 1 << 20, 10 << 20)
    assert loader._ProgressBar(small, None).progress is None
    assert parallel.parallel_worth_it(packed) is False  # 60 MB: one process
    huge = _fake_gzip(tmp_path / "huge.json.gz", 40 << 20, 400 << 20)
    monkeypatch.setenv(columns.READER_ENV, "python")
    assert parallel.parallel_worth_it(huge) is ((os.cpu_count() or 1) >= 2)
    monkeypatch.delenv(columns.READER_ENV)  # the compiled reader, where built, reads it alone
    assert parallel.parallel_worth_it(huge) is (
        (os.cpu_count() or 1) >= 2 and not columns.compiled_reader()
    )


def test_json_header_of_an_entry_is_plain_json(cache_dir, trace_file):
    """No pickle anywhere: the header is JSON, the rest raw arrays it describes."""
    load_trace(trace_file)
    (entry,) = entries(cache_dir)
    data = entry.read_bytes()
    magic, _, size = cache._PREFIX.unpack_from(data)
    assert magic == cache.MAGIC
    header = json.loads(data[cache._PREFIX.size : cache._PREFIX.size + size])
    assert set(header["fields"]) == {f.name for f in dataclasses.fields(loader.Trace)}
    assert header["kind"] == "trace"
    end = max(o + np.dtype(d).itemsize * n for o, d, n in header["arrays"])
    assert cache._PREFIX.size + size + end <= len(data) < cache._PREFIX.size + size + end + 64


def test_rank_analysis_fields_are_all_stored(cache_dir, trace_file):
    perrank.analyze_file(trace_file)
    (entry,) = entries(cache_dir, "analysis")
    data = entry.read_bytes()
    _, _, size = cache._PREFIX.unpack_from(data)
    header = json.loads(data[cache._PREFIX.size : cache._PREFIX.size + size])
    assert set(header["fields"]) == {f.name for f in dataclasses.fields(RankAnalysis)}


def test_cache_commands_show_and_clear_the_folder(cache_dir, trace_file):
    """`fsdp-trace cache info|clear` on a cache that holds one analysed trace."""
    perrank.analyze_file(trace_file, cache=True)
    assert len(entries(cache_dir)) == 2  # the parsed columns and the analysis
    shown = run_cli("cache", "info")
    assert shown.returncode == 0, shown.stderr
    assert str(cache_dir) in shown.stdout
    assert "1 parsed traces, 1 analyses of this version" in shown.stdout
    cleared = run_cli("cache", "clear")
    assert cleared.returncode == 0, cleared.stderr
    assert "deleted 2 files" in cleared.stdout
    assert entries(cache_dir) == []


# --- the packed plotly.js kept in the cache folder --------------------------------------------


def plant_packed_plotly(folder) -> str:
    """A well-formed packed plotly.js in `folder`'s cache under the real plotly.js' key, holding
    a stand-in script; returns its packed text (a page holding it read it from the cache)."""
    from plotly.offline import get_plotlyjs

    from fsdp_trace.render import plotlyjs

    source = hashlib.sha256(get_plotlyjs().encode("utf-8")).hexdigest()
    stand_in = b"/* planted */ window.Plotly = {newPlot: function () {}};"
    text, packed_length = plotlyjs.pack(stand_in)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    name = f"{cache.PACKED_PREFIX}{plotlyjs.PACK_FORMAT}-{source[:32]}.txt"
    path = folder / cache.PACKED_PLOTLYJS / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{packed_length} {digest} {source}\n{text}", encoding="utf-8")
    path.chmod(0o600)
    return text


def _page_without_time(path) -> str:
    """A report's text with its generation time taken out."""
    return re.sub(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d(:\d\d)?", "TIME", path.read_text("utf-8"))


def test_no_cache_packs_plotly_js_once(tmp_path):
    """`analyze --no-cache` keeps the packed plotly.js (it depends on no input) and writes no
    entry: a second `--no-cache` report reads it back instead of packing ~2 s again, and its
    page is the same bytes; with FSDP_TRACE_CACHE=0 nothing at all is written."""
    from plotly.offline import get_plotlyjs

    from fsdp_trace.render import plotlyjs

    folder = tmp_path / "cache"
    trace = str(_small_traces(tmp_path, 1)[0])
    env = {"FSDP_TRACE_CACHE_DIR": str(folder), "FSDP_TRACE_CACHE": "1"}
    pages = [tmp_path / "r1.html", tmp_path / "r2.html", tmp_path / "r3.html"]
    done = run_cli("analyze", trace, "--no-cache", "--report", str(pages[0]), env=env)
    assert done.returncode == 0, done.stderr
    (stored,) = (folder / cache.PACKED_PLOTLYJS).iterdir()
    assert entries(folder) == []  # no parsed trace, no analysis
    text = pages[0].read_text(encoding="utf-8")
    assert plotlyjs.unpack_element(text, plotlyjs.PLOTLY_ID) == get_plotlyjs().encode("utf-8")
    written = stored.stat().st_mtime_ns
    done = run_cli("analyze", trace, "--no-cache", "--report", str(pages[1]), env=env)
    assert done.returncode == 0, done.stderr
    assert stored.stat().st_mtime_ns == written  # read back, not packed and written again
    assert _page_without_time(pages[1]) == _page_without_time(pages[0])
    off = {"FSDP_TRACE_CACHE_DIR": str(tmp_path / "off"), "FSDP_TRACE_CACHE": "0"}
    done = run_cli("analyze", trace, "--no-cache", "--report", str(pages[2]), env=off)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "off").exists()
    assert _page_without_time(pages[2]) == _page_without_time(pages[0])  # packed the same


def test_the_packed_plotly_js_is_packed_once_under_no_cache(cache_dir, monkeypatch):
    """Counted: under `--no-cache` (`cache.off()`) the second page packs nothing; a folder that
    cannot be written only means packing anew, with the same result."""
    from fsdp_trace.render import plotlyjs

    data = b"plotly.js stand-in " * 1000
    packs = []
    real = plotlyjs.pack
    monkeypatch.setattr(plotlyjs, "pack", lambda d: packs.append(len(d)) or real(d))
    with cache.off():
        first = plotlyjs._pack_cached(data)
        assert plotlyjs._pack_cached(data) == first
    assert packs == [len(data)]
    cache.clear()
    folder = cache_dir / cache.PACKED_PLOTLYJS
    folder.rmdir()
    folder.write_bytes(b"")  # a file where the folder goes: nothing can be written there
    with cache.off():
        assert plotlyjs._pack_cached(data) == first
        assert plotlyjs._pack_cached(data) == first
    assert len(packs) == 3 and folder.read_bytes() == b""


def test_a_packed_plotly_js_is_read_only_when_it_names_its_source(cache_dir):
    """A stored packed plotly.js is used only where its header names the full digest of the
    plotly.js being packed (the file name holds only a prefix of it)."""
    from plotly.offline import get_plotlyjs

    from fsdp_trace.render import plotlyjs

    planted = plant_packed_plotly(cache_dir)
    source = get_plotlyjs().encode("utf-8")
    assert plotlyjs._pack_cached(source)[0] == planted
    (stored,) = (cache_dir / cache.PACKED_PLOTLYJS).iterdir()
    length_digest, rest = stored.read_text("utf-8").split("\n", 1)
    wrong = length_digest.rsplit(" ", 1)[0] + " " + "0" * 64
    stored.write_text(f"{wrong}\n{rest}", encoding="utf-8")
    assert plotlyjs._pack_cached(source)[0] != planted  # packed anew


def test_a_packed_plotly_js_others_can_write_is_never_read(cache_dir, monkeypatch):
    from fsdp_trace.render import plotlyjs

    data = b"plotly.js stand-in " * 1000
    first = plotlyjs._pack_cached(data)
    (stored,) = (cache_dir / cache.PACKED_PLOTLYJS).iterdir()
    assert stored.stat().st_mode & 0o777 == 0o600
    planted = plotlyjs.pack(b"planted")
    digest = hashlib.sha256(planted[0].encode("utf-8")).hexdigest()
    source = hashlib.sha256(data).hexdigest()
    stored.write_text(f"{planted[1]} {digest} {source}\n{planted[0]}", encoding="utf-8")
    assert plotlyjs._pack_cached(data) == planted  # ours and private: read
    stored.chmod(0o620)  # writable by the group: anyone in it could have written it
    assert plotlyjs._pack_cached(data) == first
    assert stored.stat().st_mode & 0o777 == 0o600  # packed anew and rewritten
    monkeypatch.setenv("FSDP_TRACE_CACHE", "0")
    stored.unlink()
    assert plotlyjs._pack_cached(data) == first
    assert not stored.exists()  # nothing written either


def test_cache_clear_deletes_the_packed_plotly_js(cache_dir, trace_file):
    from fsdp_trace.render import plotlyjs

    perrank.analyze_file(trace_file, cache=True)
    plotlyjs._pack_cached(b"plotly.js stand-in " * 1000)
    (cache_dir / cache.PACKED_PLOTLYJS / ".tmp-crashed").write_bytes(b"x")
    info = cache.info()
    assert (info.traces, info.analyses, info.plotlyjs, info.temporary) == (1, 1, 1, 1)
    shown = run_cli("cache", "info")
    assert "packed plotly.js (for the HTML pages): 1" in shown.stdout, shown.stderr
    cleared = run_cli("cache", "clear")
    assert cleared.returncode == 0, cleared.stderr
    assert "deleted 4 files" in cleared.stdout
    assert list((cache_dir / cache.PACKED_PLOTLYJS).iterdir()) == []
    assert entries(cache_dir) == [] and cache.info().total_bytes == 0


def test_the_suite_caches_into_its_scratch_folder_never_the_users():
    """tests/conftest.py points this test process, and every process a test starts, at the
    run's scratch folder (one for all xdist workers), never at ~/.cache/fsdp-trace."""
    scratch = Path(os.environ["FSDP_TRACE_TEST_SCRATCH"])
    assert Path(os.environ["FSDP_TRACE_CACHE_DIR"]) == scratch / "cache"
    assert Path(os.environ["HOME"]) == scratch / "home" and scratch.is_dir()
    assert cache.directory() == scratch / "cache" and cache.enabled()
    shown = run_cli("cache", "info")
    assert shown.stdout.startswith(f"cache: {scratch / 'cache'} (on)"), shown.stdout


def test_a_run_scans_the_cache_folder_once_not_after_every_write(cache_dir, tmp_path, monkeypatch):
    """Eviction reads every file of the folder: after each of a thousand ranks' writes that is
    quadratic. While a run analyzes (`cache.deferred`), writes scan only once a sixteenth of
    the budget was written since the last scan, and the run's end scans once; a write outside
    a run scans at once, as before."""
    paths = _small_traces(tmp_path, 6)
    scans = []
    real = cachefolder.files
    monkeypatch.setattr(cachefolder, "files", lambda folder: scans.append(folder) or real(folder))
    load_trace(paths[0])
    assert len(scans) == 1  # outside a run: every write scans
    with cache.deferred():
        for p in paths[1:4]:
            load_trace(p)
        assert scans == [cache_dir]  # three writes, no scan
    assert len(scans) == 2  # the run's end: one scan
    # A small budget: each write in a run is more than a sixteenth of it, so each scans (and
    # evicts), and the folder stays within the budget as before.
    size = entries(cache_dir)[0].stat().st_size
    monkeypatch.setenv("FSDP_TRACE_CACHE_MAX_GB", str(2.5 * size / 1024**3))
    with cache.deferred():
        load_trace(paths[4])
        load_trace(paths[5])
        assert len(scans) == 4 and len(entries(cache_dir)) <= 2
    # A run's analysis defers: four traces analyzed, the folder scanned once at the end.
    scans.clear()
    monkeypatch.delenv("FSDP_TRACE_CACHE_MAX_GB")
    (tmp_path / "more").mkdir()
    more = _small_traces(tmp_path / "more", 4)
    perrank.analyze_all([perrank.TraceInput(p) for p in more], jobs=1, cache=True)
    assert scans == [cache_dir]
