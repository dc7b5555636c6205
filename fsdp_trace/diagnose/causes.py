"""From the rules' findings to a diagnosis: causes first, each with the symptoms it explains
folded under it, costliest first; minor findings (< 1 % of the step) apart; measurement
findings last. The first finding is the one to act on.

A cause explains a symptom when fixing the cause would remove it: a host-bound rank makes
its peers wait (the straggler is that rank); a link far below its bandwidth makes blocks
communication-bound and every exposed gather or reduction longer; one hardware queue
(CUDA_DEVICE_MAX_CONNECTIONS=1) exposes whatever communication there is; a shard group
that leaves the node runs at the network's bandwidth. Only a cause that is itself worth
acting on (not minor) takes symptoms: a costly symptom never hides under a minor cause.

Costs that may include waiting for peers (collectives no other rank's trace matched) are
upper bounds: they come after the measured causes; CPU (gloo) findings are not costed."""

from __future__ import annotations

from collections.abc import Callable

from fsdp_trace.diagnose.context import ms
from fsdp_trace.diagnose.finding import Diagnosis, Finding, FindingKind
from fsdp_trace.fmt import plural, ranks_text

_EXPOSED_COMMUNICATION = (
    "communication-bound",
    "first-allgather-exposed",
    "reduction-tail",
    "last-unit-regathered",
)


def _same_rank(cause: Finding, symptom: Finding) -> bool:
    return bool(set(symptom.ranks) & set(cause.ranks))


def _always(cause: Finding, symptom: Finding) -> bool:
    return True


def _on_the_link(cause: Finding, symptom: Finding) -> bool:
    """The link's bandwidth (measured on all-gathers and reduce-scatters) explains a tail
    only when the tail is mostly those, not HSDP's all-reduce across replicas."""
    if symptom.rule != "reduction-tail":
        return True
    exposed = symptom.metrics.get("exposed_us") or 0.0
    return (symptom.metrics.get("all_reduce_us") or 0.0) < 0.5 * exposed


def _most_of(cause: Finding, symptom: Finding) -> bool:
    """On the same rank, the cause accounts for at least half of the symptom's time."""
    return _same_rank(cause, symptom) and cause.cost_us >= 0.5 * symptom.cost_us


def _launches(cause: Finding, symptom: Finding) -> bool:
    """The float8 casts are a large share of what the host launches on that rank."""
    return _same_rank(cause, symptom) and (cause.metrics.get("launch_share") or 0.0) >= 0.3


def _replicas(cause: Finding, symptom: Finding) -> bool:
    """A gradient-reduction tail that is mostly the HSDP all-reduce across replicas."""
    exposed = symptom.metrics.get("exposed_us") or 0.0
    return (symptom.metrics.get("all_reduce_us") or 0.0) >= 0.5 * exposed


# (cause rule, symptom rule, when the cause explains it)
EXPLAINS: tuple[tuple[str, str, Callable[[Finding, Finding], bool]], ...] = (
    ("host-bound", "straggler", _same_rank),
    ("cpu-offload", "host-bound", _most_of),
    ("float8-uncompiled", "host-bound", _launches),
    ("hsdp-allreduce", "reduction-tail", _replicas),
    ("ddp-allreduce", "reduction-tail", _always),
    ("one-unit", "first-allgather-exposed", _always),
    ("one-unit", "reduction-tail", _always),
    ("one-unit", "communication-bound", _always),
    *(("low-bus-bandwidth", s, _on_the_link) for s in _EXPOSED_COMMUNICATION),
    *(("max-connections-1", s, _always) for s in _EXPOSED_COMMUNICATION),
    ("max-connections-1", "overlap-tax", _always),
    ("shard-group-crosses-nodes", "low-bus-bandwidth", _always),
    ("shard-group-crosses-nodes", "communication-bound", _always),
)


# Relations where the symptom is the cause itself seen from elsewhere: the straggler is the
# host-bound rank, seen from its peers' waiting. Folded even under a minor cause (what its
# change buys is within noise) or a note (host-bound only under the profiler), never left to
# lead in its place.
SAME_CAUSE = frozenset({("host-bound", "straggler")})


def _explainer(symptom: Finding, found: dict[str, Finding]) -> Finding | None:
    """The costliest finding worth acting on that explains `symptom`, following chains to
    the root cause."""
    candidates = [
        found[cause]
        for cause, rule, applies in EXPLAINS
        if rule == symptom.rule
        and cause in found
        and (
            (cause, rule) in SAME_CAUSE
            or (found[cause].kind == FindingKind.CAUSE and not found[cause].minor)
        )
        and applies(found[cause], symptom)
    ]
    if not candidates:
        return None
    best = max(candidates, key=lambda f: f.cost_us)
    return _explainer(best, found) or best


def _rank(f: Finding) -> tuple:
    """Order: measured causes by cost, then upper bounds by cost, then uncosted ones."""
    return (not f.costed, f.upper_bound, -f.cost_us)


def _one_change_one_cause(roots: list[Finding]) -> list[Finding]:
    """Causes priced by the same change (e.g. a larger batch for a host-bound step whose
    blocks are also communication-bound) buy one saving between them, not two: the one
    measured the larger leads and the others fold under it."""
    by_change: dict[str, Finding] = {}
    out = []
    for f in sorted(roots, key=lambda f: -(f.measured_us or 0.0)):
        change = f.saving.knobs if f.saving is not None else None
        lead = by_change.get(change) if change is not None else None
        if lead is None:
            if change is not None:
                by_change[change] = f
            out.append(f)
        else:
            lead.symptoms.append(f)
    return [f for f in roots if f in out]


def order(findings: list[Finding]) -> Diagnosis:
    """Fold, order and number the findings of one run."""
    found = {f.rule: f for f in findings}
    roots: list[Finding] = []
    for finding in findings:
        cause = _explainer(finding, found) if finding.kind == FindingKind.CAUSE else None
        if cause is not None and cause is not finding:
            cause.symptoms.append(finding)
        else:
            roots.append(finding)
    roots = _one_change_one_cause(roots)
    for finding in roots:
        finding.symptoms.sort(key=_rank)
    causes = sorted((f for f in roots if f.kind == FindingKind.CAUSE and not f.minor), key=_rank)
    measurement = [f for f in roots if f.kind != FindingKind.CAUSE]
    minor = sorted((f for f in roots if f.minor), key=_rank)
    ordered = causes + measurement
    for number, finding in enumerate(ordered, start=1):
        finding.number = number
    costed = [f for f in causes if f.costed]
    return Diagnosis(findings=ordered, minor=minor, verdict=verdict(costed), healthy=not causes)


def cost_text(f: Finding) -> str:
    """ "its change (`--set k=v`) saves 2.50 ms per step (6.2 %, predicted ± 2.93 ms)" or the
    measured time "13.18 ms per step (25.0 % of the step)"."""
    if f.saving is not None and f.saving.tokens_scale != 1.0:
        s = f.saving
        spread = 100.0 * s.uncertainty_us / s.predicted_step_us if s.predicted_step_us else 0.0
        return (
            f"{s.knobs} ({s.tokens_scale:g}× the tokens per step) buys "
            f"{s.throughput_gain_pct:+.1f} % tokens/s per GPU (predicted, ± {spread:.1f} %): "
            f"{ms(f.cost_us)} less step time per step's tokens ({f.cost_pct:.1f} %)"
        )
    if f.saving is not None:
        return (
            f"{f.saving.knobs} saves {ms(f.cost_us)} per step ({f.cost_pct:.1f} %; predicted, "
            f"± {ms(f.saving.uncertainty_us)})"
        )
    return f"{ms(f.cost_us)} per step ({f.cost_pct:.1f} % of the step)"


def verdict(causes: list[Finding]) -> str:
    """One line: the cause to act on first, or that nothing is worth acting on."""
    if not causes:
        return (
            "healthy: no cause costs 1 % of the step or more, and no change a finding names is "
            "predicted to save more than the run's noise"
        )
    top = causes[0]
    where = ""
    if top.ranks and len(top.ranks) <= 4 and ranks_text(top.ranks) not in top.title:
        where = f" ({ranks_text(top.ranks)})"
    cost = cost_text(top)
    if top.upper_bound:
        cost = f"up to {cost}: waiting for peers not told apart"
    more = f"; {plural(len(causes) - 1, 'more cause')}" if len(causes) > 1 else ""
    return f"{top.title}{where}: {cost}{more}"
