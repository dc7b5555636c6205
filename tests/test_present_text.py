"""Words every view shares: counts agree with their nouns (one plural helper, `fmt.plural`), and
a CPU (gloo) run's headline never shows a scaling efficiency as a figure, even where an older
run.json still holds one."""

from __future__ import annotations

import dataclasses
import json

import pytest

from fsdp_trace import fmt
from fsdp_trace.present import headline
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
    assert card(one, "step_ms_unprofiled").sub.startswith("median of 1 timed step without")
    assert card(one, "peak_memory").sub.endswith("; 1 allocator retry")
    assert row(one, "step time").endswith(", 1 step)")
    assert "; 1 allocator retry in the timed steps" in row(one, "peak memory")
    many = record("gpt-small-2gpu", num_alloc_retries=4)
    assert card(many, "step_ms_unprofiled").sub.startswith("median of 10 timed steps without")
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


# --- three step times: each says which statistic it is ---------------------------------------


@pytest.fixture(scope="module")
def sample_run():
    import fsdp_trace

    return fsdp_trace.analyze(SAMPLES / "gpt-small-2gpu").only


def test_each_step_time_says_which_statistic_and_why_they_differ(sample_run):
    """The sample shows 45.43 ms un-profiled, 52.76 ms profiled and 40.27 ms as the what-if's
    measured step: at each figure, one sentence says which statistic it is and why."""
    import io

    from rich.console import Console

    from fsdp_trace.present.view import run_view
    from fsdp_trace.render import terminal

    view = run_view(sample_run)
    (unprofiled,) = [f for f in view.run_figures if f.key == "step_ms_unprofiled"]
    assert unprofiled.value == "45.43 ms"
    assert "median of 10 timed steps without the profiler" in unprofiled.sub, unprofiled.sub
    (profiled,) = [c for c in view.cards if c.key == "step_ms"]
    assert profiled.value == "52.76 ms" and "profiled" in profiled.label
    assert "median profiled step" in profiled.sub and "rank 0" in profiled.sub, profiled.sub
    assert "+16 % over the un-profiled median (45.43 ms)" in profiled.sub, profiled.sub
    assert "profiler's own overhead" in profiled.sub
    # Rank 1's exposed waiting beside the cross-rank table's waiting (hidden too).
    (waiting,) = [c for c in view.cards if c.key == "exposed_wait_pct"]
    assert "no compute hides" in waiting.sub and "Across ranks" in waiting.sub, waiting.sub
    assert "hidden behind compute or not" in view.crossrank.title, view.crossrank.title
    assert "waiting for peers" in view.crossrank.title
    # The terminal shows each of those sentences (the HTML cards show `sub` already).
    console = Console(file=io.StringIO(), width=300, color_system=None)
    terminal.render_run(view, console)
    text = console.file.getvalue()
    for sentence in (unprofiled.sub, profiled.sub, waiting.sub):
        assert sentence in text, sentence


def test_the_whatif_measured_step_says_it_is_the_10th_percentile(sample_run):
    from fsdp_trace.present.whatif import prediction_view, ranking_view
    from fsdp_trace.whatif import Knobs, predict, rank_candidates

    ranked = rank_candidates(sample_run)
    view = ranking_view(ranked, sample_run.name)
    assert "measured step 40.27 ms, the 10th percentile of the un-profiled steps" in view.title
    assert view.statistic == "the 10th percentile of the un-profiled steps"  # the figure's line
    now = view.basis[0]
    assert "not their median (45.43 ms)" in now and "interference" in now, now
    assert "52.76 ms" in now and "profiler" in now, now
    # The host taken as instant is said in words, never as "× 0.00"; the replay longer than
    # the measured step is a row that says so, not a negative "not replayed".
    p = predict(sample_run, Knobs(ac_coverage=1.0))
    assert p.baseline.host_scale == 0.0 and p.residual_us < 0  # the sample's case
    lines = prediction_view(p, sample_run.name)
    text = " ".join(lines.basis)
    assert "× 0.00" not in text and "an instant host" in text, text
    labels = [row[0].strip() for row in lines.table.rows]
    assert not any(label.startswith("not replayed") for label in labels), labels
    (over,) = [r for r in lines.table.rows if "longer than the measured step" in r[0]]
    assert over[1] == over[2] == "1.12", over  # the excess, taken off both sides
