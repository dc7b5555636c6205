"""A finding costs what its change buys: the what-if replay's saving for the knob it names,
the same figure `fsdp-trace whatif RUN --set KNOB` gives, checked here against `predict` on
real traces; causes no knob models keep their measured time and say so; a run the replay
cannot model (DDP, a CPU trace) is refused by `whatif` in one line."""

from __future__ import annotations

from functools import cache

import pytest

from fsdp_trace import analyze
from fsdp_trace.diagnose.causes import cost_text
from fsdp_trace.whatif import parse, predict
from tests.conftest import SAMPLES, run_cli

PRICED = [
    "gpt-small-2gpu-fullac",
    "diagnosis/grad-accum",
    "diagnosis/comm-bound",
    "foreign-2gpu/fsdp2",
    "diagnosis/p2p-disabled",
]


@cache
def run(path: str):
    return analyze(SAMPLES / path).only


def test_every_priced_cost_is_the_whatif_saving_of_its_change():
    checked = set()
    for path in PRICED:
        r = run(path)
        for f in r.diagnosis.all():
            if f.saving is None:
                continue
            p = predict(r, parse(f.saving.knobs.split(", ")))
            saving = p.measured_step_us - p.predicted_step_us / p.tokens_scale
            assert f.cost_us == pytest.approx(max(0.0, saving), rel=1e-9, abs=1e-6), (path, f.rule)
            assert f.step_us == pytest.approx(p.measured_step_us)
            assert f.saving.uncertainty_us == pytest.approx(p.uncertainty_us / p.tokens_scale)
            assert f.basis == "predicted" and f.measured_us is not None
            checked.add(path)
    assert len(checked) >= 4, checked


def test_unmodelled_changes_keep_their_measured_time():
    r = run("diagnosis/p2p-disabled")
    bandwidth = r.diagnosis.get("low-bus-bandwidth")
    assert bandwidth.saving is None and bandwidth.cost_us == bandwidth.measured_us
    assert bandwidth.cost_note.startswith("not a prediction")


def test_a_saving_within_the_noise_is_minor():
    r = run("diagnosis/grad-accum")
    accum = r.diagnosis.get("gradient-accumulation")
    assert accum in r.diagnosis.minor and accum.saving.within_noise


@pytest.mark.parametrize(
    ("path", "knob"),
    [("foreign-2gpu/ddp", "batch_scale=2"), ("foreign-2gpu/fsdp1", "batch_scale=2")],
)
def test_whatif_refuses_what_it_cannot_model(path, knob):
    done = run_cli("whatif", str(SAMPLES / path), "--set", knob)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "models FSDP2 (fully_shard) steps only" in lines[0]
    r = run(path)
    for f in r.diagnosis.all():
        if f.kind == "cause" and f.costed:
            assert f.saving is None and "not a prediction" in f.cost_note


def test_a_cause_measured_below_one_percent_is_not_priced():
    """The comm-bound sample's blocks expose 0.16 ms (0.2 %): a larger batch would buy far
    more, by amortizing the host, but that saving is not this cause's: it stays measured,
    and minor."""
    r = run("diagnosis/comm-bound")
    bound = r.diagnosis.get("communication-bound")
    assert bound.saving is None and bound.cost_us == bound.measured_us
    assert bound.cost_us < 0.01 * bound.step_us and bound in r.diagnosis.minor


def test_a_batch_change_is_said_as_the_tokens_it_buys():
    """Priced by a larger batch, a cause says the tokens/s its change buys — what `whatif`
    prints as the throughput gain — not a shorter step: the step holds twice the tokens."""
    r = run("foreign-2gpu/fsdp2")
    first = r.diagnosis.findings[0]
    assert first.saving is not None and first.saving.tokens_scale == 2
    p = predict(r, parse(first.saving.knobs.split(", ")))
    assert first.saving.throughput_gain_pct == pytest.approx(p.throughput_gain_pct)
    text = cost_text(first)
    assert f"buys {p.throughput_gain_pct:+.1f} % tokens/s per GPU" in text
    assert "saves" not in text and "2× the tokens per step" in text


def test_an_all_reduce_in_the_tail_is_named_by_the_mesh():
    """DDP's buckets are DDP's gradient all-reduce, never HSDP's."""
    tail = run("foreign-2gpu/ddp").diagnosis.get("reduction-tail")
    assert tail is not None and "DDP's gradient all-reduce" in tail.evidence
    assert "HSDP" not in tail.evidence
