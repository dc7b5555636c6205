"""A run's analysis and everything written of it print no warning: on CPU (gloo) traces the
exposed-time and size columns are all NaN, whose median pandas 2 (what the `hta` extra pins)
took with numpy's nanmedian, which warns "Mean of empty slice" on stderr (pandas 3 does not:
this test guards the pandas 2 install)."""

from __future__ import annotations

import warnings

import pytest

from fsdp_trace import analyze
from fsdp_trace.present.payload import to_json
from tests.conftest import SAMPLES


@pytest.mark.parametrize(
    "path", ["cpu-hsdp-2x2", "cpu-root-reshard", "foreign-cpu/fsdp2-root-only", "gpt-small-2gpu"]
)
def test_a_run_is_analyzed_and_written_without_a_warning(path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = analyze(SAMPLES / path, cache=False)
        for run in result.runs:
            run.distortion()
            to_json(run)
