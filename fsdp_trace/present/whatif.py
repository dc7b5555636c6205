"""What the what-if front ends show: one prediction beside the measured step, or the ranking
of the knobs the findings name. Terminal, JSON and the report's panel render these, so they
cannot disagree."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from fsdp_trace import fmt
from fsdp_trace.present.view import EXPOSED_PARTS, PART_LABELS, STACK_ORDER, Table
from fsdp_trace.runrecord import RunRecord
from fsdp_trace.whatif import MODEL_ERROR, Baseline, Knobs, Prediction, RankPrediction

RESIDUAL_SHOWN_US = 10.0  # the replay's gap to the measured step, shown from this size


@dataclass(frozen=True)
class PredictionView:
    title: str
    table: Table  # measured | predicted | change, per part of the step
    ranks: Table | None  # per rank, where there are several
    basis: list[str]  # what each side is (the measured step, the model's inputs)


@dataclass(frozen=True)
class RankingPoint:
    """One candidate for the figure: its predicted step and, where a run of the same job made
    that very change, the step it measured; in ms for the measured step's tokens (a change of
    batch divides by its tokens' ratio, so every point compares with the measured step)."""

    label: str
    predicted_ms: float
    uncertainty_ms: float
    measured_ms: float | None
    gain_pct: float


@dataclass(frozen=True)
class RankingView:
    title: str
    table: Table
    basis: list[str]
    measured_ms: float  # the run's own step
    points: list[RankingPoint]
    statistic: str = ""  # which statistic measured_ms is (`statistic`)


def exposed(parts: dict[str, float]) -> float:
    return sum(parts[p] for p in EXPOSED_PARTS)


def _slowest(p: Prediction, side: str) -> RankPrediction:
    return max(p.ranks, key=lambda r: getattr(r, side)["step_us"])


def _change(before: float, after: float) -> str:
    if not fmt.finite(before) or not fmt.finite(after) or before == 0:
        return fmt.DASH
    return fmt.signed(100.0 * (after / before - 1.0), " %")


def prediction_view(p: Prediction, run_name: str) -> PredictionView:
    """The slowest rank's step, measured and predicted, part by part."""
    before = _slowest(p, "measured").measured
    after = _slowest(p, "predicted").predicted
    rows = [
        [
            "step",
            fmt.ms(p.measured_step_us, " ms"),
            f"{fmt.ms(p.predicted_step_us)} ± {fmt.ms(p.uncertainty_us, ' ms')}",
            _change(p.measured_step_us, p.predicted_step_us),
        ]
    ]
    for part in STACK_ORDER:
        rows.append([f"  {PART_LABELS[part]}", fmt.ms(before[part]), fmt.ms(after[part]), fmt.DASH])
    rows.insert(
        1,
        [
            "  exposed communication",
            fmt.ms(exposed(before)),
            fmt.ms(exposed(after)),
            _change(exposed(before), exposed(after)),
        ],
    )
    if p.residual_us >= RESIDUAL_SHOWN_US:
        rows.append(
            ["  not replayed (measured − replay)", fmt.ms(p.residual_us), fmt.ms(p.residual_us), ""]
        )
    elif p.residual_us <= -RESIDUAL_SHOWN_US:  # the parts above add up to more than the step
        over = fmt.ms(-p.residual_us)
        rows.append(["  replay longer than the measured step (subtracted)", over, over, ""])
    rows.append(
        [
            "tokens/s per GPU",
            "1×",
            f"{p.tokens_scale * p.measured_step_us / p.predicted_step_us:.3f}×",
            fmt.signed(p.throughput_gain_pct, " %"),
        ]
    )
    if p.peak_memory_gib is not None:
        rows.append(["peak memory", fmt.gib(p.peak_memory_gib), "not modelled", ""])
    table = Table(
        "whatif",
        f"What if {p.knobs.describe()} ({run_name}; ms per step, the slowest rank; now: "
        f"{statistic(p.baseline)})",
        ["", "now", "predicted", "change"],
        rows,
        names=(),  # labels of the step's parts, not names to type
    )
    return PredictionView(table.title, table, _rank_table(p), basis(p))


def _rank_table(p: Prediction) -> Table | None:
    if len(p.ranks) < 2:
        return None
    rows = [
        [
            str(r.rank),
            fmt.ms(r.measured_step_us + p.residual_us),
            fmt.ms(r.predicted_step_us + p.residual_us),
            fmt.ms(exposed(r.measured)),
            fmt.ms(exposed(r.predicted)),
        ]
        for r in p.ranks
    ]
    headers = ["rank", "now ms (replay)", "predicted", "exposed ms (replay)", "predicted exposed"]
    return Table("whatif-ranks", "Per rank", headers, rows)


def statistic(b: Baseline) -> str:
    """Which statistic the measured step is, in a few words."""
    if b.anchor == "traced":
        return "the traced step (no run.json: no un-profiled timing)"
    which = "10th percentile" if b.anchor == "p10" else "median"
    return f"the {which} of the un-profiled steps"


def _now(p: Prediction) -> str:
    """What the measured step is and why it is not the other step times shown."""
    b = p.baseline
    traced = f"the traced step {p.step} ({fmt.ms(b.traced_step_us, ' ms')}" + (
        ", profiled: the profiler's overhead included)" if b.anchor != "traced" else ")"
    )
    replayed = (
        f"{traced} replayed unchanged (`fsdp-trace analyze` gives that step's measured breakdown)"
    )
    if b.anchor == "traced":
        return f"now: {replayed}"
    line = f"now: {b.basis}, {fmt.ms(b.step_us, ' ms')}"
    if b.anchor != "median" and b.median_us is not None:
        line += (
            f", not their median ({fmt.ms(b.median_us, ' ms')}): interference on a shared host "
            "only lengthens steps, so the fast ones are the run's own speed, and the same "
            "statistic of another run compares with it"
        )
    return f"{line}; its split is {replayed}"


def _host(p: Prediction) -> str:
    """How the replay's host launch times relate to the traced ones, in words."""
    b = p.baseline
    scale = b.host_scale
    if isinstance(scale, dict):
        per = ", ".join(f"rank {k}: {v:.2f}" for k, v in sorted(scale.items()))
        return f"host launch times × {per} ({b.host_basis})"
    if scale == 0.0:
        return (
            "host launch times: none, an instant host: even the GPU work of the traced step "
            f"alone replays {fmt.ms(max(-p.residual_us, 0.0), ' ms')} longer than the measured "
            "step (its kernels ran longer than in the fast un-profiled steps), subtracted on "
            "both sides"
        )
    if scale == 1.0:
        return f"host launch times as traced ({b.host_basis})"
    return (
        f"host launch times × {scale:.2f}: the profiled host's time between launches cut to "
        f"{100 * scale:.0f} % ({b.host_basis})"
    )


def basis(p: Prediction) -> list[str]:
    b = p.baseline
    lines = [
        _now(p),
        f"{_host(p)}; compute beside NCCL {fmt.fraction_pct(b.tax)} slower (measured overlap tax)",
        f"uncertainty: run-to-run spread of the measured step ({fmt.ms(b.spread_us, ' ms')}) and "
        f"{fmt.fraction_pct(MODEL_ERROR)} of the predicted step (the model's error on the real "
        "validation pairs, README 'What if')",
    ]
    return lines + p.notes


def ranking_view(
    ranked: list[tuple[Prediction, str]],
    run_name: str,
    measured: dict[str, float] | None = None,
) -> RankingView:
    """The candidates, best first; `measured`: the step (µs) other runs of the same job
    measured with a candidate's change (keyed by `Knobs.describe()`)."""
    measured = measured or {}
    rows, flags, points = [], [], []
    for p, rule in ranked:
        label = p.knobs.describe()
        seen = measured.get(label)
        rows.append(
            [
                label,
                rule,
                f"{fmt.ms(p.predicted_step_us)} ± {fmt.ms(p.uncertainty_us)}",
                _change(p.measured_step_us, p.predicted_step_us),
                fmt.signed(p.throughput_gain_pct, " %"),
                "yes" if p.significant else "within noise",
            ]
            + ([fmt.ms(seen) if seen is not None else fmt.DASH] if measured else [])
        )
        flags.append(p.significant and p.throughput_gain_pct > 0)
        per = 1e3 * p.tokens_scale  # ms for the measured step's tokens (batch changes)
        points.append(
            RankingPoint(
                label,
                p.predicted_step_us / per,
                p.uncertainty_us / per,
                seen / per if seen is not None else None,
                p.throughput_gain_pct,
            )
        )
    step = ranked[0][0].measured_step_us if ranked else float("nan")
    headers = ["change", "named by", "predicted step ms", "step", "tokens/s/GPU", "beyond noise"]
    table = Table(
        "whatif-ranking",
        f"What the findings' changes would buy ({run_name}; measured step "
        f"{fmt.ms(step, ' ms')}, {statistic(ranked[0][0].baseline) if ranked else ''}), best "
        "first",
        headers + (["measured step ms"] if measured else []),
        rows,
        numeric_from=2,
        highlight=flags,
    )
    lines = basis(ranked[0][0])[:3] if ranked else []
    which = statistic(ranked[0][0].baseline) if ranked else ""
    return RankingView(table.title, table, lines, step / 1e3, points, which)


# Capture options a what-if knob does not change: runs that differ in one are other jobs.
SAME_JOB = ("model", "seq_len", "dtype", "ac_mode", "compile", "grad_accum", "hsdp")


def knob_change(base: RunRecord, other: RunRecord) -> Knobs | None:
    """The knobs that turn `base`'s capture into `other`'s, when the two are the same job
    (model, world, sequence, dtype, ...) and differ only in knobs the replay models."""
    a, b = base.config, other.config
    if any(getattr(a, k) != getattr(b, k) for k in SAME_JOB):
        return None
    if base.world.world_size != other.world.world_size:
        return None
    changed = {
        f.name: getattr(b, f.name)
        for f in dataclasses.fields(Knobs)
        if hasattr(a, f.name) and getattr(a, f.name) != getattr(b, f.name)
    }
    if not changed or any(isinstance(v, str) and v == "default" for v in changed.values()):
        return None
    try:
        return Knobs(**changed)
    except TypeError:
        return None


def measured_points(run, peers) -> dict[str, float]:
    """Per change (its description), the step another run of the same job measured with it,
    in the statistic predictions start from (`whatif.ANCHOR`): the "measured point" beside a
    prediction."""
    from fsdp_trace.whatif import ANCHOR

    if run.run is None:
        return {}
    out = {}
    for other in peers:
        if other is run or other.run is None or other.run.figures.step_time_ms is None:
            continue
        change = knob_change(run.run, other.run)
        stats = other.run.figures.step_time_ms
        value = getattr(stats, ANCHOR) or stats.median
        if change is not None and value:
            out[change.describe()] = float(value) * 1e3
    return out


# --- JSON -----------------------------------------------------------------------------------


def _parts(parts: dict[str, float], residual: float) -> dict[str, float]:
    out = {k: float(v) for k, v in parts.items() if k != "step_us"}
    out["exposed_us"] = exposed(parts)
    # as the terminal and the report show it: host overhead the replay does not reproduce
    # (added), or a replay longer than the measured step (subtracted), never a negative part
    out["not_replayed_us"] = max(0.0, residual)
    out["replay_longer_us"] = max(0.0, -residual)
    return out


def payload(p: Prediction, run_name: str) -> dict[str, Any]:
    """`measured.step_us`, `predicted.step_us`, `predicted.breakdown`, per rank too."""
    b = p.baseline
    worst_before = _slowest(p, "measured").measured
    worst_after = _slowest(p, "predicted").predicted
    return {
        "run": run_name,
        "knobs": _knobs(p.knobs),
        "replayed_step": p.step,
        "measured": {
            "step_us": p.measured_step_us,
            "basis": b.basis,
            "traced_step_us": b.traced_step_us,
            # the traced step replayed unchanged (the measured step's split as the model
            # sees it; the analysis's `ranks[].breakdown` is the trace's own)
            "replayed_breakdown": _parts(worst_before, p.residual_us),
            "peak_memory_gib": p.peak_memory_gib,
        },
        "predicted": {
            "step_us": p.predicted_step_us,
            "uncertainty_us": p.uncertainty_us,
            "step_change_pct": p.step_change_pct,
            "throughput_gain_pct": p.throughput_gain_pct,
            "beyond_noise": p.significant,
            "breakdown": _parts(worst_after, p.residual_us),
        },
        "ranks": [
            {
                "rank": r.rank,
                "replayed": {
                    "step_us": r.measured_step_us + p.residual_us,
                    "breakdown": _parts(r.measured, p.residual_us),
                },
                "predicted": {
                    "step_us": r.predicted_step_us + p.residual_us,
                    "breakdown": _parts(r.predicted, p.residual_us),
                },
            }
            for r in p.ranks
        ],
        "model": {
            "host_scale": b.host_scale
            if not isinstance(b.host_scale, dict)
            else {str(k): v for k, v in b.host_scale.items()},
            "host_basis": b.host_basis,
            "overlap_tax": b.tax,
            "not_replayed_us": max(0.0, p.residual_us),
            "replay_longer_us": max(0.0, -p.residual_us),
            "model_error": MODEL_ERROR,
        },
        "notes": list(p.notes),
    }


def ranking_payload(ranked: list[tuple[Prediction, str]], run_name: str) -> dict[str, Any]:
    return {
        "run": run_name,
        "candidates": [{"named_by": rule, **payload(p, run_name)} for p, rule in ranked],
    }


def panel_view(run, peers) -> RankingView | str:
    """The report's what-if panel: the findings' changes ranked, with the measured point
    where a run among `peers` made the change; or why there is none (in words)."""
    from fsdp_trace.errors import UserError
    from fsdp_trace.whatif import rank_candidates

    if not run.gpu:
        return "CPU (gloo) traces have no GPU timing to replay: no prediction."
    from fsdp_trace.analysis.results import MAX_TIMELINE_RANKS

    # The replay reads every GPU rank's kernels again: beyond the timeline's few, not by
    # parsing traces here (no cache entry of theirs readable on this machine).
    parsing = sum(r.n_kernels > 0 and r.rereads_by_parsing() for r in run.ranks)
    if parsing > MAX_TIMELINE_RANKS:
        name = run.run_dir or " ".join(run.inputs) or run.name
        return f"what-if needs every rank's kernels again: run `fsdp-trace whatif {name}`"
    try:
        ranked = rank_candidates(run)
    except (UserError, ValueError) as exc:
        return f"No prediction: {exc}"
    if not ranked:
        return "No finding names a change the replay models: nothing to predict."
    return ranking_view(ranked, run.name, measured_points(run, peers))


def _knobs(knobs: Knobs) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(knobs).items() if v is not None}
