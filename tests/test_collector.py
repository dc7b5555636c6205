"""The collector's full passes deferred while a run's results are held (fsdp_trace.collector):
the thresholds set and given back, where the pipeline and the report use it, and why it is
safe (a run's results hold no reference cycles: they go by reference counting alone)."""

from __future__ import annotations

import gc

import pytest

from fsdp_trace import pipeline
from fsdp_trace.collector import DEFERRED, full_passes_deferred
from fsdp_trace.render import report
from tests.conftest import SAMPLES


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


def test_pipeline_and_report_defer_full_passes(thresholds, monkeypatch):
    seen = {}
    run_level = pipeline.analyze_run

    def analyze_run(*args, **kwargs):
        seen["run level"] = gc.get_threshold()[2]
        return run_level(*args, **kwargs)

    monkeypatch.setattr(pipeline, "analyze_run", analyze_run)
    result = pipeline.analyze(SAMPLES / "gpt-small-2gpu", cache=False)
    assert seen["run level"] == DEFERRED
    assert gc.get_threshold() == thresholds

    from fsdp_trace.render.report import page

    render = page.render

    def page_render(*args, **kwargs):
        seen["report"] = gc.get_threshold()[2]
        return render(*args, **kwargs)

    monkeypatch.setattr(page, "render", page_render)
    report.render_html(result)
    assert seen["report"] == DEFERRED
    assert gc.get_threshold() == thresholds


@pytest.mark.parametrize("jobs", [1, 2])
def test_results_go_without_a_full_pass(jobs):
    """What deferring leaves uncollected is cyclic garbage older than the young generations:
    a run's results hold none, so dropping them frees everything they held at once."""
    result = pipeline.analyze(SAMPLES / "gpt-small-2gpu", cache=False, jobs=jobs)
    assert result.runs and result.runs[0].ranks
    gc.collect()  # whatever else was waiting
    del result
    assert gc.collect() == 0
