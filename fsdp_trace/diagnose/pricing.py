"""A finding costs what its change would buy: each cause whose change a knob of the what-if
replay models is priced by replaying the measured step with that knob (the best of the knobs
its change names), the same figures `fsdp-trace whatif RUN --set KNOB` prints; its measured
time stays beside it. A cause no knob models keeps its measured time, said as such: not a
prediction. Causes are then ranked by that cost, and one whose saving is within the run's
noise is minor. A cause measured below 1 % of the step is not priced: it stays minor. A batch
change is priced per the measured step's tokens (the same tokens take that much less time)
and said as the tokens/s it buys.

Replaying reads every rank's kernels: done where the run holds them or reads them without a
parse (its cache entries), up to `MAX_PRICED_RANKS` ranks; beyond, costs stay measured and a
notice says so (`fsdp-trace whatif RUN` prices them)."""

from __future__ import annotations

from fsdp_trace.analysis.results import MAX_TIMELINE_RANKS
from fsdp_trace.diagnose.finding import MINOR, Finding, FindingKind, Saving
from fsdp_trace.errors import UserError
from fsdp_trace.vocab import Basis

# Ranks whose kernels a diagnosis replays at most (the report's timeline draws as many).
MAX_PRICED_RANKS = MAX_TIMELINE_RANKS
NOT_MODELLED = "not a prediction: no knob of the what-if replay models this change"


def price(analysis, findings: list[Finding]) -> list[str]:
    """Set each costed cause's cost to what its change buys, where the replay models it (in
    place); the notices to show (why nothing was priced, when that is the case)."""
    causes = [f for f in findings if f.kind == FindingKind.CAUSE and f.costed]
    for f in causes:
        f.measured_us = f.cost_us
    # Only a cause the trace shows costing the step is priced: a change that would buy more
    # (a larger batch amortizes everything) must not turn a 0.2 % symptom into a cause.
    causes = [f for f in causes if f.cost_us >= MINOR * f.step_us]
    if not causes:
        return []
    from fsdp_trace import whatif

    reason = _unpriceable(analysis, whatif)
    if reason is not None:
        for f in causes:
            f.cost_note = f"not a prediction: {reason}"
        return [f"costs are measured times, not predicted savings: {reason}"]
    # Upper bounds (collectives no other rank's trace matched) stay measured: the replay's
    # transfer times would hold the waiting too.
    knobs = {id(f): [] if f.upper_bound else whatif.finding_knobs(analysis, f) for f in causes}
    if not any(knobs.values()):
        for f in causes:
            f.cost_note = NOT_MODELLED
        return []
    try:
        progs, offsets = whatif.programs(analysis)
        base = whatif.baseline(analysis, progs, offsets)
        predicted = {
            id(f): [whatif._predict(analysis, k, progs, offsets, base) for k in knobs[id(f)]]
            for f in causes
        }
    except Exception as exc:  # any step the replay cannot rebuild: said, costs stay measured
        reason = str(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"
        for f in causes:
            f.cost_note = (
                f"not a prediction: the what-if replay could not replay this run ({reason})"
            )
        return [
            "costs are measured times, not predicted savings: the what-if replay could not "
            f"replay this run ({reason})"
        ]
    for f in causes:
        predictions = predicted[id(f)]
        if not predictions:
            f.cost_note = NOT_MODELLED
            continue
        best = max(predictions, key=lambda p: p.throughput_gain_pct)
        scale = best.tokens_scale
        f.saving = Saving(
            knobs=best.knobs.describe(),
            measured_step_us=best.measured_step_us,
            predicted_step_us=best.predicted_step_us / scale,
            uncertainty_us=best.uncertainty_us / scale,
            step_basis=base.basis,
            tokens_scale=scale,
        )
        f.cost_us = max(0.0, f.saving.saving_us)
        f.step_us = f.saving.measured_step_us
        f.basis = Basis.PREDICTED
    return []


def _unpriceable(analysis, whatif) -> str | None:
    """Why the replay cannot price this run's findings (None: it can)."""
    reason = whatif.unmodelled(analysis)
    if reason is not None:
        return reason.split(": ", 1)[-1]
    ranks = [r for r in analysis.ranks if r.n_kernels]
    if len(ranks) > MAX_PRICED_RANKS and any(r.rereads_by_parsing() for r in ranks):
        return (
            f"replaying {len(ranks)} ranks would parse their traces again; `fsdp-trace whatif "
            f"{analysis.name}` predicts what each change buys"
        )
    return None
