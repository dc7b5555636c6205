"""Words every view shares: counts agree with their nouns (one plural helper, `fmt.plural`), and
a CPU (gloo) run's headline never shows a scaling efficiency as a figure, even where an older
run.json still holds one."""

from __future__ import annotations

import dataclasses
import json

import pytest

from fsdp_trace.present import fmt, headline
from fsdp_trace.runrecord import RunRecord
from tests.conftest import SAMPLES


@pytest.mark.parametrize(
    ("args", "text"),
    [
        ((1, "finding"), "1 finding"),
        ((2, "finding"), "2 findings"),
        ((0, "file"), "0 files"),
        ((1.0, "more time"), "1 more time"),
        ((1.5, "gradient reduction"), "1.5 gradient reductions"),
        ((1, "allocator retry", "allocator retries"), "1 allocator retry"),
        ((3, "allocator retry", "allocator retries"), "3 allocator retries"),
    ],
)
def test_plural_agrees_with_the_count(args, text):
    assert fmt.plural(*args) == text


def test_agree_and_ranks_text():
    assert [fmt.agree(n, "is", "are") for n in (0, 1, 2, 1.0, 0.5)] == [
        "are",
        "is",
        "are",
        "is",
        "are",
    ]
    assert fmt.ranks_text([3]) == "rank 3"
    assert fmt.ranks_text([0, 1]) == "ranks 0, 1"


def record(sample: str, **figures) -> RunRecord:
    """A shipped run's run.json, with some of its figures replaced."""
    run = RunRecord.from_json(json.loads((SAMPLES / sample / "run.json").read_text()))
    return dataclasses.replace(run, figures=dataclasses.replace(run.figures, **figures))


def card(run: RunRecord, key: str) -> headline.Figure | None:
    return next((f for f in headline.figures(run) if f.key == key), None)


def row(run: RunRecord, label: str) -> str | None:
    return dict(headline.summary_rows(run)).get(label)


def test_a_cpu_run_never_shows_a_scaling_efficiency():
    """A CPU run.json from before capture stopped computing it (7.1 on a gloo sweep)."""
    cpu = record("cpu-gloo-2proc", scaling_efficiency=7.1, baseline_tokens_per_s=900.0)
    shown = card(cpu, "scaling_efficiency")
    assert shown is not None and shown.value == fmt.DASH and "CPU" in shown.sub
    assert "710" not in shown.value + shown.sub
    assert row(cpu, "scaling efficiency") == headline.CPU_SCALING
    # Without a device, the gloo backend says CPU; a GPU run keeps its figure.
    no_device = dataclasses.replace(cpu, world=dataclasses.replace(cpu.world, device=None))
    assert card(no_device, "scaling_efficiency").value == fmt.DASH
    gpu = record("gpt-small-2gpu")
    assert card(gpu, "scaling_efficiency").value == "86.9 %"
    assert row(gpu, "scaling efficiency").startswith("0.869 vs ")
    # A CPU run without one says nothing about it.
    assert card(record("cpu-gloo-2proc"), "scaling_efficiency") is None
    assert row(record("cpu-gloo-2proc"), "scaling efficiency") is None


def test_headline_counts_agree():
    one = record(
        "gpt-small-2gpu",
        num_alloc_retries=1,
        step_time_ms=dataclasses.replace(record("gpt-small-2gpu").figures.step_time_ms, n=1),
    )
    assert card(one, "step_ms_unprofiled").sub == "median of 1 timed step"
    assert card(one, "peak_memory").sub.endswith("; 1 allocator retry")
    assert row(one, "step time").endswith(", 1 step)")
    assert "; 1 allocator retry in the timed steps" in row(one, "peak memory")
    many = record("gpt-small-2gpu", num_alloc_retries=4)
    assert card(many, "step_ms_unprofiled").sub == "median of 10 timed steps"
    assert card(many, "peak_memory").sub.endswith("; 4 allocator retries")
    assert row(many, "step time").endswith(", 10 steps)")


def test_a_note_has_no_cost_or_try_line_in_the_terminal():
    """A note (no cost of its own) folded under a cause, and a finding without a capture
    option: no "()" after the note's title, no "0.00 ms", no empty `try:` line."""
    import io
    import re

    from rich.console import Console

    from fsdp_trace.present.view import FindingView
    from fsdp_trace.render.terminal import _finding

    note = FindingView(
        0,
        "fsdp1",
        "FSDP1: the FullyShardedDataParallel class",
        "",
        "c",
        "ev",
        "w",
        "ch",
        "",
        "",
        "measured",
        "",
        [],
        kind="note",
    )
    cause = dataclasses.replace(
        note,
        number=1,
        rule="host-bound",
        title="Host-bound",
        cost="13.18 ms per step",
        kind="cause",
        symptoms=[note],
    )
    console = Console(file=io.StringIO(), width=100, color_system=None)
    _finding(cause, console)
    text = console.file.getvalue()
    assert "explains: FSDP1: the FullyShardedDataParallel class\n" in text, text
    assert "()" not in text and "0.00 ms" not in text
    assert not re.search(r"try:\s*$", text, re.MULTILINE)
