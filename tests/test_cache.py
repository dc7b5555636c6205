"""The parsed-trace cache: hits return the same frames, content or format changes miss,
corrupt entries are ignored and rewritten, and `cache=False` writes nothing."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

from fsdp_trace.analyze import analyze, cache, loader
from fsdp_trace.analyze.loader import load_trace
from tests.conftest import SAMPLES
from tests.synth import TraceBuilder

SAMPLE = SAMPLES / "gpt-small-2gpu" / "rank0.timing.json.gz"
META = (
    "rank",
    "world_size",
    "distributed",
    "device_properties",
    "base_time_ns",
    "thread_names",
    "process_names",
    "string_ids",
    "raw_event_count",
    "path",
)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("FSDP_TRACE_CACHE_DIR", str(folder))
    monkeypatch.delenv("FSDP_TRACE_CACHE", raising=False)
    return folder


@pytest.fixture
def trace_file(tmp_path):
    path = tmp_path / "rank0.timing.json.gz"
    shutil.copy(SAMPLE, path)
    return path


def entries(folder):
    return sorted(folder.glob("*.fsdptrace")) if folder.exists() else []


def no_parsing(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("parsed although the cache holds this content")

    monkeypatch.setattr(loader, "_parse", fail)


def assert_same(a: loader.Trace, b: loader.Trace) -> None:
    pd.testing.assert_frame_equal(a.events, b.events, check_exact=True)
    for attr in META:
        assert getattr(a, attr) == getattr(b, attr), attr


def test_second_load_hits_the_cache_with_identical_frames(cache_dir, trace_file, monkeypatch):
    first = load_trace(trace_file)
    (entry,) = entries(cache_dir)
    assert entry.name.startswith(f"v{loader.FORMAT_VERSION}-")
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


def test_format_version_invalidates(cache_dir, trace_file, monkeypatch):
    load_trace(trace_file)
    monkeypatch.setattr(loader, "FORMAT_VERSION", loader.FORMAT_VERSION + 1)
    calls = []
    parse = loader._parse
    monkeypatch.setattr(loader, "_parse", lambda *a: calls.append(1) or parse(*a))
    load_trace(trace_file)
    assert calls == [1]
    # The entry of the old format is dropped when the new one is written.
    assert [e.name.split("-")[0] for e in entries(cache_dir)] == [f"v{loader.FORMAT_VERSION}"]


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty", "header"])
def test_corrupt_entry_is_ignored_and_rewritten(cache_dir, trace_file, damage):
    good = load_trace(trace_file, cache=False)
    load_trace(trace_file)
    (entry,) = entries(cache_dir)
    data = entry.read_bytes()
    entry.write_bytes(
        {
            "garbage": b"not a cache entry at all" * 10,
            "truncated": data[: len(data) // 2],
            "empty": b"",
            "header": data[:8] + b"\xff" * 8 + data[16:],
        }[damage]
    )
    assert_same(good, load_trace(trace_file))
    assert entry.read_bytes() == data  # rewritten whole
    assert_same(good, load_trace(trace_file))


def test_no_cache_writes_nothing(cache_dir, trace_file):
    load_trace(trace_file, cache=False)
    analyze(trace_file, cache=False)
    assert not cache_dir.exists()


def test_analyze_threads_the_cache_flag(cache_dir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(SAMPLES / "gpt-small-2gpu", run)
    first = analyze(run)
    assert len(entries(cache_dir)) == 4  # 2 ranks × (timing, detailed)
    second = analyze(run)
    for a, b in zip(first.ranks + first.detailed, second.ranks + second.detailed, strict=True):
        pd.testing.assert_frame_equal(a.steps, b.steps)
        pd.testing.assert_frame_equal(a.blocks, b.blocks)
        pd.testing.assert_frame_equal(a.collectives, b.collectives)


def test_off_by_default_under_pytest_and_by_env(tmp_path, monkeypatch, trace_file):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("FSDP_TRACE_CACHE_DIR", raising=False)
    assert "PYTEST_CURRENT_TEST" in __import__("os").environ
    assert not cache.enabled()
    load_trace(trace_file)
    assert not (tmp_path / "home").exists() and not (tmp_path / "xdg").exists()
    monkeypatch.setenv("FSDP_TRACE_CACHE_DIR", str(tmp_path / "c"))
    assert cache.enabled()
    monkeypatch.setenv("FSDP_TRACE_CACHE", "0")
    assert not cache.enabled()
    load_trace(trace_file)
    assert not (tmp_path / "c").exists()


def test_unwritable_cache_dir_is_not_an_error(tmp_path, monkeypatch, trace_file):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv("FSDP_TRACE_CACHE_DIR", str(blocker / "cache"))
    assert len(load_trace(trace_file).events) > 0
    assert not list(tmp_path.glob(".tmp-*"))


def test_default_location(monkeypatch, tmp_path):
    monkeypatch.delenv("FSDP_TRACE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.directory() == tmp_path / "fsdp-trace"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert cache.directory() == tmp_path / "h" / ".cache" / "fsdp-trace"


def test_size_budget_evicts_the_oldest(cache_dir, tmp_path, monkeypatch):
    paths = []
    for i in range(3):
        b = TraceBuilder()
        b.step(1, 0, 1000)
        b.kernel(f"gemm{i}", 100, 100, launch_ts=5)
        paths.append(b.write(tmp_path / f"t{i}.json"))
    load_trace(paths[0])
    one = entries(cache_dir)[0].stat().st_size
    monkeypatch.setenv("FSDP_TRACE_CACHE_MAX_GB", str(2.5 * one / 1024**3))
    load_trace(paths[1])
    load_trace(paths[2])
    assert len(entries(cache_dir)) == 2
