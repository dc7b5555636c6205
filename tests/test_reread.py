"""Kernels read again (`RankAnalysis.load_kernels`) are the analyzed trace's, or a one-line
error: through the cache, the entry the analysis wrote, read by its key (a trace changed or
removed since still gives them); without it, the trace parsed again only when its size and
modification time are as analyzed. Views that read every rank's kernels (whatif, --perfetto)
keep them instead, and the report's what-if panel parses no run of more ranks than the
timeline draws."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

import fsdp_trace
from fsdp_trace import cli
from fsdp_trace.analysis import results
from fsdp_trace.analysis.job import perrank
from fsdp_trace.analysis.results import MAX_TIMELINE_RANKS
from fsdp_trace.errors import UserError
from tests.conftest import SAMPLES, counting_parses
from tests.fsdp_sim import Sim
from tests.test_report import payload

GPT = SAMPLES / "gpt-small-2gpu"
CHANGED = "changed (or was removed) since it was analyzed: analyze it again"


@pytest.fixture
def cached(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("FSDP_TRACE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FSDP_TRACE_CACHE", raising=False)
    return tmp_path / "cache"


def one_trace(tmp_path: Path) -> Path:
    path = tmp_path / "rank0.timing.json.gz"
    shutil.copyfile(GPT / "rank0.timing.json.gz", path)
    return path


def forget_last_read(monkeypatch) -> None:
    monkeypatch.setattr(results, "_last", None)


def test_a_trace_changed_after_its_analysis_reads_the_analyzed_kernels_from_its_entry(
    tmp_path, cached, monkeypatch
):
    path = one_trace(tmp_path)
    want = perrank.analyze_file(path, cache=False).kernel_table
    rank = fsdp_trace.analyze(path).ranks[0]
    assert rank.kernel_table is None
    shutil.copyfile(GPT / "rank1.timing.json.gz", path)  # another trace in its place
    forget_last_read(monkeypatch)
    parsed = counting_parses(monkeypatch)
    pd.testing.assert_frame_equal(rank.load_kernels(), want, check_exact=True)
    assert parsed == []


@pytest.mark.parametrize("how", ["replaced", "removed"])
def test_a_trace_changed_after_its_analysis_without_the_cache_is_one_line(
    tmp_path, monkeypatch, how
):
    monkeypatch.setattr(perrank, "MAX_TIMELINE_RANKS", 0)  # kernels not kept: read again
    path = one_trace(tmp_path)
    rank = fsdp_trace.analyze(path, cache=False).ranks[0]
    assert rank.kernel_table is None
    if how == "replaced":
        shutil.copyfile(GPT / "rank1.timing.json.gz", path)
    else:
        path.unlink()
    forget_last_read(monkeypatch)
    with pytest.raises(UserError) as caught:
        rank.load_kernels()
    assert caught.value.message == f"{path} {CHANGED}"
    assert "\n" not in caught.value.message


def test_an_unchanged_trace_without_the_cache_is_parsed_again(tmp_path, monkeypatch):
    monkeypatch.setattr(perrank, "MAX_TIMELINE_RANKS", 0)
    path = one_trace(tmp_path)
    rank = fsdp_trace.analyze(path, cache=False).ranks[0]
    forget_last_read(monkeypatch)
    parsed = counting_parses(monkeypatch)
    assert len(rank.load_kernels()) == rank.n_kernels
    assert parsed == [str(path)]


def test_a_trace_removed_after_its_analysis_through_the_cache_still_reports(
    tmp_path, cached, monkeypatch
):
    from fsdp_trace.render.report import write_report

    path = one_trace(tmp_path)
    result = fsdp_trace.analyze(path)
    path.unlink()
    forget_last_read(monkeypatch)  # read from the entry, not from memory
    write_report(result, tmp_path / "report.html")
    page = payload((tmp_path / "report.html").read_text(encoding="utf-8"))
    assert "fig-timeline" in {f["id"] for f in page["figures"]}


def test_the_timeline_of_a_changed_trace_is_a_note_not_a_failed_report(tmp_path, monkeypatch):
    from fsdp_trace.render.report import write_report

    monkeypatch.setattr(perrank, "MAX_TIMELINE_RANKS", 0)
    path = one_trace(tmp_path)
    result = fsdp_trace.analyze(path, cache=False)
    shutil.copyfile(GPT / "rank1.timing.json.gz", path)
    forget_last_read(monkeypatch)
    write_report(result, tmp_path / "report.html")
    text = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "No timeline: " in text and CHANGED in text
    assert "fig-timeline" not in {f["id"] for f in payload(text)["figures"]}


def test_the_last_table_read_is_read_once(monkeypatch):
    """Another thread may replace the last table read at any moment: `load_kernels` reads it
    once, so a rank never gets the table another rank's read put there. Here the replacement
    happens while the rank is being compared with the one it belongs to."""
    rank = fsdp_trace.analyze(GPT / "rank0.timing.json.gz", cache=False).ranks[0]
    rank.kernel_table = None
    mine, other = pd.DataFrame({"step": [1]}), pd.DataFrame({"step": [2]})

    def owner_replaced_meanwhile():
        results._last = (lambda: None, other)  # another thread's read, stored
        return rank

    monkeypatch.setattr(results, "_last", (owner_replaced_meanwhile, mine))
    assert rank.load_kernels() is mine


def sim_run(tmp_path: Path, ranks: int = MAX_TIMELINE_RANKS + 2) -> Path:
    folder = tmp_path / "run"
    Sim(ranks=ranks, host_speed=4.0).write(folder)
    return folder


@pytest.mark.parametrize("command", ["whatif", "perfetto"])
def test_views_of_every_rank_parse_each_trace_once_without_the_cache(
    tmp_path, monkeypatch, command
):
    """`whatif` and `--perfetto` read every rank's kernels: the analysis keeps them (a run of
    more ranks than the timeline draws, without the cache, would parse each trace twice)."""
    folder = sim_run(tmp_path)
    parsed = counting_parses(monkeypatch)
    if command == "whatif":
        args = ["whatif", str(folder), "--no-cache"]
    else:
        out = tmp_path / "out.pftrace"
        args = ["analyze", str(folder), "--no-cache", "--no-report", "--perfetto", str(out)]
    got = CliRunner().invoke(cli.app, args)
    assert got.exit_code == 0, got.output
    assert sorted(parsed) == sorted(str(p) for p in folder.glob("rank*.json"))
    assert len(parsed) == MAX_TIMELINE_RANKS + 2


def test_the_report_of_many_ranks_without_readable_entries_says_to_run_whatif(
    tmp_path, monkeypatch
):
    from fsdp_trace.render.report import write_report

    folder = sim_run(tmp_path)
    result = fsdp_trace.analyze(folder, cache=False)
    assert all(r.kernel_table is None for r in result.only.ranks)
    parsed = counting_parses(monkeypatch)
    write_report(result, tmp_path / "report.html")
    text = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "what-if needs every rank&#x27;s kernels again" in text or (
        "what-if needs every rank's kernels again" in text
    )
    assert f"fsdp-trace whatif {folder}" in text
    assert len(parsed) <= MAX_TIMELINE_RANKS  # the timeline's ranks only


def test_the_report_of_many_ranks_through_the_cache_replays(tmp_path, cached):
    from fsdp_trace.render.report import write_report

    folder = sim_run(tmp_path)
    result = fsdp_trace.analyze(folder)
    write_report(result, tmp_path / "report.html")
    text = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "kernels again" not in text
    assert "fig-whatif" in {f["id"] for f in payload(text)["figures"]}


def test_small_runs_keep_their_kernels_each_on_its_own(tmp_path):
    """Whether a run keeps its kernels is decided per run: a small run beside a large one
    (without the cache) keeps them, the large one does not."""
    small, large = tmp_path / "small", tmp_path / "large"
    Sim(ranks=2, host_speed=4.0).write(small, {})
    Sim(ranks=MAX_TIMELINE_RANKS + 2, host_speed=4.0).write(large, {})
    result = fsdp_trace.analyze([small, large], cache=False)
    kept = {
        Path(run.run_dir).name: {r.kernel_table is not None for r in run.ranks}
        for run in result.runs
    }
    assert kept == {"small": {True}, "large": {False}}


def test_a_removed_cache_entry_reads_an_unchanged_trace_again(tmp_path, cached, monkeypatch):
    path = one_trace(tmp_path)
    rank = fsdp_trace.analyze(path).ranks[0]
    for entry in cached.glob("analysis-*"):
        entry.unlink()
    forget_last_read(monkeypatch)
    assert len(rank.load_kernels()) == rank.n_kernels
    os.utime(path, ns=(0, 0))  # touched: its stamp moved, its bytes are the analyzed ones
    forget_last_read(monkeypatch)
    for entry in cached.glob("analysis-*"):
        entry.unlink()
    assert len(rank.load_kernels()) == rank.n_kernels
    shutil.copyfile(GPT / "rank1.timing.json.gz", path)  # other bytes: changed
    forget_last_read(monkeypatch)
    for entry in cached.glob("analysis-*"):
        entry.unlink()
    with pytest.raises(UserError, match="changed"):
        rank.load_kernels()


def test_an_entry_the_cache_would_not_read_counts_as_none(tmp_path, cached):
    """An entry writable by others (or another user's) is not read: the what-if panel then
    counts the rank as one to parse."""
    rank = fsdp_trace.analyze(one_trace(tmp_path)).ranks[0]
    results._last = None
    assert not rank.rereads_by_parsing()
    (entry,) = cached.glob("analysis-*")
    entry.chmod(entry.stat().st_mode | stat.S_IWGRP)
    assert rank.rereads_by_parsing()


def test_a_versionless_url_without_the_cache_keeps_its_kernels(monkeypatch):
    """Nothing would tell a re-read of it from another object: its kernels are not dropped."""
    import fsspec

    from fsdp_trace.analysis.read import remote

    monkeypatch.setattr(remote, "_VERSION_KEYS", ())
    fs = fsspec.filesystem("memory")
    fs.pipe("/fsdp-trace-reread/rank0.json.gz", (GPT / "rank0.timing.json.gz").read_bytes())
    url = "memory://fsdp-trace-reread/rank0.json.gz"
    try:
        rank = fsdp_trace.analyze(url, cache=False).ranks[0]
        kept = fsdp_trace.analyze(url).ranks[0]
    finally:
        fs.rm("/fsdp-trace-reread", recursive=True)
    assert rank.kernel_table is not None and len(rank.kernel_table) == rank.n_kernels
    assert kept.reread is not None and kept.reread.entry  # cached: read again by its key
