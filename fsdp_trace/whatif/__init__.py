"""What if: the measured step replayed under changed FSDP knobs (`fsdp-trace whatif`).

    import fsdp_trace
    from fsdp_trace.whatif import Knobs, predict
    run = fsdp_trace.analyze("sample_traces/gpt-small-2gpu").only
    p = predict(run, Knobs(ac_coverage=1.0))
    p.predicted_step_us, p.uncertainty_us, p.ranks[0].predicted

The replay (`replay`) runs every rank's measured program (`program`) again, changed by the
knobs (`knobs`); its error on the unchanged step (the residual) is added back, so the
prediction is the measured step plus what the change does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fsdp_trace.analysis.rank.overlap_tax import tax_rate
from fsdp_trace.errors import UserError
from fsdp_trace.vocab import Parallelism
from fsdp_trace.whatif.knobs import Context, Knobs, apply, parse
from fsdp_trace.whatif.program import Program, extract
from fsdp_trace.whatif.replay import Timeline, replay

# The model's own error, as a share of the predicted step: no less than the 75th percentile of
# |predicted ÷ measured − 1| over the real validation pairs (README "What if"; the test
# `test_predictions_on_real_pairs_are_within_five_percent` fails when the pairs outgrow it).
MODEL_ERROR = 0.06
# The statistic of the un-profiled steps a prediction starts from (see Baseline).
ANCHOR = "p10"
HOST_SCALE_ITERATIONS = 12  # bisection steps for the host scale (1/4096 of the range)

__all__ = [
    "Knobs",
    "Prediction",
    "candidates",
    "finding_knobs",
    "parse",
    "predict",
    "rank_candidates",
    "unmodelled",
]


@dataclass
class Baseline:
    """The step a prediction starts from.

    With run.json's un-profiled timed steps, the measured step is their 10th percentile
    (`ANCHOR`): on a shared host, interference (other tenants, the OS) only ever lengthens
    a step, so the fast steps are the run's own speed, and the same statistic of another
    run compares with them where medians carry each run's share of interference (two
    captures of one setup on the same VM: medians 48.0 and 51.6 ms, 10th percentiles 44.3
    and 43.8). The profiler slows the host (a host-bound traced step is longer than the
    real one), so the replay's host launch times are scaled (`host_scale`): by the host's
    own un-profiled speed where capture probed it, else fitted until the unchanged step
    replays to the anchor. Without run.json it is the traced step, host times as traced."""

    step_us: float
    basis: str  # what step_us is, in words
    spread_us: float  # how far another run's same statistic may land from step_us
    traced_step_us: float  # the profiled step the programs come from
    host_scale: float | dict  # the host's launch times × this (per rank where measured)
    tax: float  # compute beside NCCL runs (1 + tax) times slower (measured)
    host_basis: str = "the host's speed as traced"
    anchor: str = "traced"  # which statistic step_us is: ANCHOR, "median" or "traced"
    median_us: float | None = None  # the un-profiled steps' median (run.json), to say beside it


@dataclass
class RankPrediction:
    rank: int | None
    measured: dict[str, float]  # the unchanged step replayed: its split (µs)
    predicted: dict[str, float]  # the changed step replayed: its split (µs)

    @property
    def measured_step_us(self) -> float:
        return self.measured["step_us"]

    @property
    def predicted_step_us(self) -> float:
        return self.predicted["step_us"]


@dataclass
class Prediction:
    knobs: Knobs
    step: int  # the traced step replayed
    baseline: Baseline
    ranks: list[RankPrediction]
    residual_us: float  # the measured step − its replay (added to both sides)
    uncertainty_us: float
    tokens_scale: float = 1.0  # tokens per step, changed ÷ measured (batch knobs)
    peak_memory_gib: float | None = None  # measured (run.json); the change's is not modelled
    notes: list[str] = field(default_factory=list)

    @property
    def measured_step_us(self) -> float:
        return self.baseline.step_us

    @property
    def predicted_step_us(self) -> float:
        """The ranks wait for each other: the step is the slowest rank's."""
        return max(r.predicted_step_us for r in self.ranks) + self.residual_us

    @property
    def step_change_pct(self) -> float:
        return 100.0 * (self.predicted_step_us / self.measured_step_us - 1.0)

    @property
    def throughput_gain_pct(self) -> float:
        """Tokens/s per GPU, predicted ÷ measured − 1 (in %)."""
        return 100.0 * (self.tokens_scale * self.measured_step_us / self.predicted_step_us - 1.0)

    @property
    def significant(self) -> bool:
        """The predicted change in tokens/s/GPU is larger than its uncertainty (a batch
        change counts its tokens, not only its step)."""
        ratio = self.tokens_scale * self.measured_step_us / self.predicted_step_us
        return abs(ratio - 1.0) > ratio * self.uncertainty_us / self.predicted_step_us


def _step(run) -> int:
    """The step every rank has whose length (the slowest rank's) is the median."""
    ranks = [r for r in run.ranks if r.n_kernels]
    common = set.intersection(*(set(r.steps["step"]) for r in ranks))
    if not common:
        raise UserError(
            f"{run.name}: the ranks' traces share no ProfilerStep number, so no step ran on "
            "every rank to replay: give traces of the same steps (one profiling session)"
        )
    length = {
        s: max(float(r.steps.set_index("step").at[s, "step_us"]) for r in ranks) for s in common
    }
    ordered = sorted(common, key=lambda s: (length[s], s))
    return ordered[(len(ordered) - 1) // 2]


def unmodelled(run) -> str | None:
    """Why the replay cannot model this run (None: it can): it replays FSDP2 steps of GPU
    kernels, not DDP's buckets, FSDP1's flat parameters or a CPU trace."""
    if not any(r.n_kernels for r in run.ranks):
        return f"{run.name}: no GPU kernels to replay (CPU/gloo traces have no GPU timing)"
    setup = run.config.setup.value
    if setup.parallelism in (Parallelism.DDP, Parallelism.FSDP1):
        return (
            f"{run.name} is {setup.describe()}: the what-if replay models FSDP2 (fully_shard) "
            "steps only"
        )
    if not run.config.labels and any(len(r.collectives) for r in run.ranks if r.n_kernels):
        return (
            f"{run.name}: collectives but no FSDP2 labels in the traces (pipeline parallel, "
            "or labels lost): the replay models FSDP2's schedule unit by unit and cannot place "
            "them; capture with FSDP2 (`fully_shard`) on torch >= 2.5"
        )
    return None


def programs(run) -> tuple[list[Program], dict]:
    """Every GPU rank's program of one common step, and the ranks' clock offsets. Reads each
    rank's kernels again (a run does not hold them: `RankAnalysis.load_kernels`), one rank at
    a time, keeping only its program of that step."""
    ranks = [r for r in run.ranks if r.n_kernels]
    reason = unmodelled(run)
    if reason is not None:
        raise UserError(reason)
    step = _step(run)
    cross = run.crossrank
    participants = None if cross.empty else cross.participants
    offsets = {} if cross.empty else cross.clock_offsets_us
    return [extract(r, step, participants) for r in ranks], offsets


def _job_step(timelines: list[Timeline]) -> float:
    return max(t.step_us for t in timelines)


def _median_spread(stats) -> float:
    """How far another run's anchor may land from this one's: the standard error of a
    median (1.25 σ/√n; a low quantile's is of that order) for each of the two runs."""
    if stats.stdev is None or not stats.n:
        return 0.0
    return 1.25 * float(stats.stdev) * 1e3 / np.sqrt(stats.n) * np.sqrt(2.0)


def _traced_spread(run) -> float:
    """Without run.json: the same from the traced steps' spread (their IQR as σ)."""
    steps = [r.steps["step_us"].to_numpy(dtype=np.float64) for r in run.ranks if r.n_kernels]
    n = min(len(s) for s in steps)
    if n < 2:
        return 0.0
    q1, q3 = np.percentile(np.max([s[:n] for s in steps], axis=0), [25, 75])
    return 1.25 * float(q3 - q1) / 1.35 / np.sqrt(n) * np.sqrt(2.0)


def baseline(run, progs: list[Program], offsets: dict) -> Baseline:
    """The measured step, and the host speed and overlap tax that replay it."""
    tax = tax_rate(run.ranks, set(run.config.blocks))
    traced = max(p.window_us for p in progs)
    figures = run.run.figures if run.run is not None else None
    stats = figures.step_time_ms if figures is not None else None
    if stats is None or not stats.median:
        return Baseline(traced, "the traced step", _traced_spread(run), traced, 1.0, tax)
    value = getattr(stats, ANCHOR)
    target = float(value if value else stats.median) * 1e3
    which = "10th percentile" if value else "median"
    basis = f"the {which} of {stats.n or '?'} un-profiled steps (run.json)"
    said = {"anchor": ANCHOR if value else "median", "median_us": float(stats.median) * 1e3}
    probed = _probed_host_scale(figures, progs)
    if probed is not None:
        return Baseline(
            target,
            basis,
            _median_spread(stats),
            traced,
            probed,
            tax,
            "the host's speed measured without the profiler (run.json)",
            **said,
        )
    fitted = _fitted_host_scale(progs, offsets, tax, target)
    host_basis = "the host's speed fitted to the un-profiled step"
    if fitted == 0.0:
        host_basis = (
            "the host taken as instant: even so the replay is longer than the un-profiled "
            "step, and the rest is left as not replayed"
        )
    return Baseline(target, basis, _median_spread(stats), traced, fitted, tax, host_basis, **said)


def _probed_host_scale(figures, progs: list[Program]) -> dict | None:
    """Per rank, the host issuing a step without the profiler ÷ with it (run.json's host
    probe ÷ the traced step's first-to-last launch); None without a probe."""
    probe = {
        f.rank: float(f.host_step_ms.median) * 1e3
        for f in figures.per_rank
        if f.host_step_ms is not None and f.host_step_ms.median
    }
    scales = {}
    for p in progs:
        if p.rank not in probe or p.host_span_us <= 0:
            return None
        scales[p.rank] = min(1.0, probe[p.rank] / p.host_span_us)
    return scales or None


def _fitted_host_scale(progs: list[Program], offsets: dict, tax: float, target: float) -> float:
    """The host speed (× the traced one) at which the unchanged step replays to `target`:
    the profiler's host overhead taken out. 1 where the traced step is not longer; 0 where
    even an instant host replays longer."""
    if _job_step(replay(progs, offsets, 1.0, tax)) <= target:
        return 1.0
    if _job_step(replay(progs, offsets, 0.0, tax)) >= target:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(HOST_SCALE_ITERATIONS):
        mid = (lo + hi) / 2
        if _job_step(replay(progs, offsets, mid, tax)) > target:
            hi = mid
        else:
            lo = mid
    return hi


def predict(run, knobs: Knobs) -> Prediction:
    """The run's step (one of its timing steps, the median's) replayed with `knobs`."""
    modelled_notes(knobs, run)  # a change the replay cannot make is refused before any work
    progs, offsets = programs(run)
    base = baseline(run, progs, offsets)
    return _predict(run, knobs, progs, offsets, base)


def _predict(run, knobs: Knobs, progs, offsets, base: Baseline) -> Prediction:
    ctx = Context(run.config, run.run, list(run.config.blocks))
    before = replay(progs, offsets, base.host_scale, base.tax)
    after = replay([apply(p, knobs, ctx) for p in progs], offsets, base.host_scale, base.tax)
    residual = base.step_us - _job_step(before)
    ranks = [
        RankPrediction(rank=b.program.rank, measured=b.breakdown(), predicted=a.breakdown())
        for b, a in zip(before, after, strict=True)
    ]
    delta = _job_step(after) - _job_step(before)
    uncertainty = float(np.hypot(base.spread_us, MODEL_ERROR * (base.step_us + delta)))
    scale = 1.0
    if knobs.batch_scale is not None:
        scale = knobs.batch_scale
    elif knobs.batch_size is not None and ctx.batch:
        scale = knobs.batch_size / ctx.batch
    memory = run.run.figures.peak_memory_gib if run.run is not None else None
    return Prediction(
        knobs=knobs,
        step=progs[0].step,
        baseline=base,
        ranks=ranks,
        residual_us=residual,
        uncertainty_us=uncertainty,
        tokens_scale=scale,
        peak_memory_gib=memory,
        notes=[*modelled_notes(knobs, run), *_unvalidated(knobs, run)],
    )


# Changes whose program edits assume one micro-batch per step (they move or add gathers by
# unit across the whole step).
PER_STEP_ONLY = (
    "reshard_after_forward",
    "keep_last_unsharded",
    "root_reshard_after_forward",
    "unsharded_units",
    "shard_embeddings",
    "prefetch_forward",
    "prefetch_backward",
)


def modelled_notes(knobs: Knobs, run) -> list[str]:
    """Notes on changes that change nothing (already the run's setting); UserError for a
    change the replay does not model (undoing embedding units, gradient sync back on, a
    shallower explicit prefetch), rather than a silent "no change"."""
    now = current(run)
    notes = []
    for name, value in knobs.changed().items():
        if name in ("batch_size", "batch_scale", "ac_coverage"):
            continue
        if name in now and now[name] == value:
            notes.append(f"{name}={value} is already the run's setting: it changes nothing")
            continue
        if name == "shard_embeddings" and value is False and now.get(name):
            raise UserError(
                "--set shard_embeddings=false: merging embedding units back into the root is "
                "not modelled (the replay can only split the root)"
            )
        if name == "accum_no_sync" and value is False and now.get(name):
            raise UserError(
                "--set accum_no_sync=false: adding reductions of earlier micro-batches is not "
                "modelled (the trace has only the last micro-batch's)"
            )
        if name in ("prefetch_forward", "prefetch_backward") and int(value) < int(
            now.get(name) or 0
        ):
            raise UserError(
                f"--set {name}={value}: a shallower explicit prefetch than the run's "
                f"({now.get(name)}) is not modelled (the replay only issues gathers earlier)"
            )
    micro = run.config.micro_batches.value or 1
    per_step = [name for name in PER_STEP_ONLY if name in knobs.changed()]
    if micro > 1 and per_step:
        raise UserError(
            f"--set {per_step[0]}: with {micro} micro-batches per step this change is not "
            "modelled yet (it moves gathers across micro-batches); AC coverage, batch, reduce "
            "dtype and no-sync are"
        )
    if knobs.accum_no_sync and micro == 1:
        notes.append("accum_no_sync: the step has one micro-batch, so there is nothing to skip")
    return notes


# Knobs the replay models whose predictions no real pair of captures (README 'What if') nor
# the co-simulation (tests/fsdp_sim.py) has checked yet: said with every such prediction.
UNVALIDATED = ("prefetch_backward", "reduce_dtype", "accum_no_sync")

# Changes real pairs measured beyond the prediction's uncertainty (README 'What if', the
# 2x H200 pairs of sample_traces/whatif-2gpu): (knob, applies to (value, the run's value,
# world size), what the pair showed), said with every such prediction.
MISSED_BY_PAIRS = (
    (
        "prefetch_forward",
        lambda value, now, world: True,
        "prefetch_forward: on a real pair where the host paces the step (2× H200, gpt-1.3b "
        "batch 2) one run measured −13 % where the replay predicts no change (GPU-bound at "
        "batch 8: within 1 %): treat the figure as a direction",
    ),
    (
        "reshard_after_forward",
        lambda value, now, world: value is True and now is False,
        "reshard_after_forward=true: on a real pair where the host paces the step (2× H200, "
        "gpt-1.3b batch 2) the step grew 16 % where the replay predicts 6.5 % (GPU-bound at "
        "batch 8: within 2 %): the replay adds the host time of the copy-outs, not the rest of "
        "FSDP's pre-backward work on the host",
    ),
    (
        "ac_coverage",
        lambda value, now, world: world > 1 and value > (now or 0.0),
        "ac_coverage: on a real pair where the host paces a 2-GPU step (2× H200, gpt-1.3b "
        "batch 2) the replay over-predicted more checkpointing by 9–14 % (GPU-bound at batch "
        "8: +5.7 %; 1 GPU and 2× H100 gpt-small: within 5 %)",
    ),
)


def _unvalidated(knobs: Knobs, run) -> list[str]:
    changed = knobs.changed()
    names = [name for name in UNVALIDATED if name in changed]
    notes = []
    if names:
        notes.append(
            f"{', '.join(names)}: modelled, not yet checked against real captures (README "
            "'What if'): treat the figure as a direction"
        )
    now = current(run)
    world = run.config.world_size.value or 1
    for name, applies, text in MISSED_BY_PAIRS:
        if name in changed and applies(changed[name], now.get(name), world):
            notes.append(text)
    return notes


STANDARD = "a standard FSDP2 knob"  # what names a candidate no finding named


def finding_knobs(run, finding) -> list[Knobs]:
    """The changes a finding names that the replay models, as knobs (its own change first),
    leaving out those already in effect in the run; [] where no knob models its change."""
    rule = finding.rule
    out: list[Knobs] = []
    if rule in ("first-allgather-exposed", "reduction-tail"):
        out = [Knobs(shard_embeddings=True), Knobs(reduce_dtype="bf16")]
    elif rule == "hsdp-allreduce":
        out = [Knobs(reduce_dtype="bf16")]
    elif rule == "last-unit-regathered":
        out = [Knobs(keep_last_unsharded=True)]
    elif rule == "root-resharded":
        out = [Knobs(root_reshard_after_forward=False)]
    elif rule == "communication-bound":
        out = [Knobs(reshard_after_forward=False), _doubled_batch(run), Knobs(ac_coverage=1.0)]
    elif rule == "ac-over-applied":
        n = len(run.config.blocks) or 1
        out = [Knobs(ac_coverage=finding.metrics.get("keep", 0) / n)]
    elif rule == "gradient-accumulation":
        out = [Knobs(accum_no_sync=True)]
    elif rule == "host-bound" and not finding.metrics.get("imbalanced"):
        # (a rank whose host is slower than its peers': its change is that host, no knob)
        out = [_doubled_batch(run), Knobs(prefetch_forward=1)]
    return [k for k in out if not in_effect(k, run) and _modelled(k, run)]


def candidates(run, standard: bool = False) -> list[tuple[Knobs, str]]:
    """The changes the diagnosis names, as knobs the replay models (each with the rule that
    named it); with `standard`, then FSDP2's usual knobs too. Changes already in effect in
    the run (run.json's options, else the inferred configuration) are left out."""
    out: list[tuple[Knobs, str]] = [
        (k, finding.rule) for finding in run.diagnosis.all() for k in finding_knobs(run, finding)
    ]
    if standard:
        out += [
            (Knobs(reshard_after_forward=False), STANDARD),
            (Knobs(keep_last_unsharded=True), STANDARD),
            (Knobs(shard_embeddings=True), STANDARD),
            (Knobs(reduce_dtype="bf16"), STANDARD),
            (Knobs(prefetch_forward=1), STANDARD),
            (Knobs(prefetch_backward=2), STANDARD),
        ]
    unique: dict[str, tuple[Knobs, str]] = {}
    for k, rule in out:
        if not in_effect(k, run) and _modelled(k, run):
            unique.setdefault(k.describe(), (k, rule))
    return list(unique.values())


def _modelled(knobs: Knobs, run) -> bool:
    try:
        modelled_notes(knobs, run)
    except UserError:
        return False
    return True


def _doubled_batch(run) -> Knobs:
    """Twice the tokens per step: as a batch size where run.json gives the batch (the knob a
    capture takes, and what a measured run records), else as a factor."""
    batch = run.run.model.batch_size if run.run is not None else None
    return Knobs(batch_size=2 * batch) if batch else Knobs(batch_scale=2.0)


def current(run) -> dict[str, object]:
    """The run's knob values: run.json's capture options, else what the trace showed."""
    if run.run is not None:
        c = run.run.config
        return {
            "ac_coverage": c.ac_coverage,
            "reshard_after_forward": c.reshard_after_forward,
            "keep_last_unsharded": c.keep_last_unsharded,
            "root_reshard_after_forward": c.root_reshard_after_forward,
            "shard_embeddings": c.shard_embeddings,
            "prefetch_forward": c.prefetch_forward,
            "prefetch_backward": c.prefetch_backward,
            "reduce_dtype": c.reduce_dtype,
            "accum_no_sync": c.accum_no_sync,
        }
    config = run.config
    blocks = config.blocks or []
    done = len(config.checkpointed.value or [])
    return {
        "ac_coverage": done / len(blocks) if blocks else 0.0,
        "reduce_dtype": str(config.reduce_dtype.value or ""),
        "prefetch_forward": config.forward_prefetch.value or 0,
        "prefetch_backward": config.backward_prefetch.value or 0,
    }


def in_effect(knobs: Knobs, run) -> bool:
    """Every change `knobs` makes is already the run's setting."""
    now = current(run)
    changes = {k: v for k, v in knobs.changed().items() if k not in ("batch_size", "batch_scale")}
    if not changes or len(changes) != len(knobs.changed()):
        return False
    return all(k in now and now[k] == v for k, v in changes.items())


def rank_candidates(run, standard: bool = False) -> list[tuple[Prediction, str]]:
    """Every candidate change (`candidates`), predicted, best throughput gain first."""
    progs, offsets = programs(run)
    base = baseline(run, progs, offsets)
    out = [
        (_predict(run, knobs, progs, offsets, base), rule)
        for knobs, rule in candidates(run, standard)
    ]
    return sorted(out, key=lambda pr: -pr[0].throughput_gain_pct)
