"""The collector's full passes deferred while a run's results are held (fsdp_trace.collector):
the thresholds set and given back (nested, across threads), where the pipeline, the report and
the analyze command use it, and why it is safe (a run's results hold no reference cycles: they
go by reference counting alone)."""

from __future__ import annotations

import gc
import threading

import pytest

from fsdp_trace import pipeline
from fsdp_trace.analysis.job import perrank
from fsdp_trace.collector import DEFERRED, full_passes_deferred
from fsdp_trace.render import report
from tests.conftest import SAMPLES


def _third_threshold_counts() -> bool:
    """Whether this Python's collector reads a third threshold (3.14.0-3.14.4's incremental
    collector ignores it: nothing to defer there)."""
    before = gc.get_threshold()
    gc.set_threshold(before[0], before[1], 12345)
    counts = gc.get_threshold()[2] == 12345
    gc.set_threshold(*before)
    return counts


pytestmark = pytest.mark.skipif(
    not _third_threshold_counts(), reason="this Python's collector has no third threshold"
)


@pytest.fixture
def thresholds():
    """The collector's thresholds, given back after the test whatever it did."""
    before = gc.get_threshold()
    yield before
    gc.set_threshold(*before)


def test_thresholds_raised_within_and_given_back(thresholds):
    gc.set_threshold(555, 7, 9)
    with full_passes_deferred():
        assert gc.get_threshold() == (555, 7, DEFERRED)
        with full_passes_deferred():
            assert gc.get_threshold() == (555, 7, DEFERRED)
        assert gc.get_threshold() == (555, 7, DEFERRED)
    assert gc.get_threshold() == (555, 7, 9)
    with pytest.raises(KeyError), full_passes_deferred():
        raise KeyError("x")
    assert gc.get_threshold() == (555, 7, 9)
    gc.set_threshold(555, 7, 2 * DEFERRED)  # already higher: left as it is
    with full_passes_deferred():
        assert gc.get_threshold() == (555, 7, 2 * DEFERRED)
    assert gc.get_threshold() == (555, 7, 2 * DEFERRED)
    gc.set_threshold(555, 7, 9)
    with full_passes_deferred():
        gc.set_threshold(1000, 20, 30)  # someone else's choice, made inside: it stays
    assert gc.get_threshold() == (1000, 20, 30)


def test_blocks_of_two_threads_overlapping_give_the_thresholds_back(thresholds):
    """A enters, B enters, A leaves, B leaves: the first in raised the threshold, the last
    out gives back what the first found (B alone saw the raised one)."""
    gc.set_threshold(555, 7, 9)
    b_entered, a_left = threading.Event(), threading.Event()
    seen = {}

    def second():
        with full_passes_deferred():
            b_entered.set()
            a_left.wait(10)
            seen["b after a left"] = gc.get_threshold()

    with full_passes_deferred():
        thread = threading.Thread(target=second)
        thread.start()
        assert b_entered.wait(10)
    seen["a left"] = gc.get_threshold()
    a_left.set()
    thread.join(10)
    assert seen["a left"] == (555, 7, DEFERRED)  # B still inside
    assert seen["b after a left"] == (555, 7, DEFERRED)
    assert gc.get_threshold() == (555, 7, 9)


def _noting_threshold(seen: dict, key: str, function):
    """`function`, noting the collector's third threshold under `key` whenever it is called."""

    def noted(*args, **kwargs):
        seen[key] = gc.get_threshold()[2]
        return function(*args, **kwargs)

    return noted


def test_pipeline_and_report_defer_full_passes(thresholds, monkeypatch):
    seen = {}
    monkeypatch.setattr(
        pipeline, "analyze_run", _noting_threshold(seen, "run level", pipeline.analyze_run)
    )
    result = pipeline.analyze(SAMPLES / "gpt-small-2gpu", cache=False)
    assert seen["run level"] == DEFERRED
    assert gc.get_threshold() == thresholds

    from fsdp_trace.render.report import page

    monkeypatch.setattr(page, "render", _noting_threshold(seen, "report", page.render))
    report.render_html(result)
    assert seen["report"] == DEFERRED
    assert gc.get_threshold() == thresholds


def test_the_analyze_command_defers_them_until_its_last_output(thresholds, monkeypatch):
    """The terminal (and the other outputs) render after `pipeline.analyze` returns: the
    command holds the results, deferred, until its end."""
    from typer.testing import CliRunner

    from fsdp_trace import cli
    from fsdp_trace.render import terminal

    seen = {}
    monkeypatch.setattr(terminal, "render", _noting_threshold(seen, "terminal", terminal.render))
    sample = str(SAMPLES / "gpt-small-2gpu")
    done = CliRunner().invoke(cli.app, ["analyze", sample, "--no-report", "--no-cache"])
    assert done.exit_code == 0, done.output
    assert seen["terminal"] == DEFERRED
    assert gc.get_threshold() == thresholds


@pytest.mark.parametrize("pool", [False, True])
def test_results_go_without_a_full_pass(pool, monkeypatch):
    """What deferring leaves uncollected is cyclic garbage older than the young generations:
    a run's results hold none, so dropping them frees everything they held at once (analyzed
    here or in a pool of worker processes, whose results come back pickled)."""
    if pool:
        monkeypatch.setattr(perrank, "POOL_MIN_BYTES", 0)  # a pool even for the small sample
    result = pipeline.analyze(SAMPLES / "gpt-small-2gpu", cache=False, jobs=2 if pool else 1)
    assert result.runs and result.runs[0].ranks
    gc.collect()  # whatever else was waiting
    del result
    assert gc.collect() == 0
