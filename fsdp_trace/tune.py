"""`fsdp-trace tune`: the tuning write-up's table, measured. Capture the 1-GPU baseline and
the N-GPU eager run (twice: the difference is the run-to-run noise), then repeatedly take the
knob the what-if replay predicts to gain most on the run kept so far, capture it, and keep it
only when the measured gain is beyond the noise. Each row of the table says which knob bought
which points, predicted and measured.

Gains and the noise are measured on the statistic the replay predicts (`whatif.ANCHOR`): tokens
per step per GPU ÷ the run's 10th-percentile un-profiled step (`speed`), not run.json's
tokens/s/GPU (its median step), which carries each run's share of a shared host's
interference. Scaling efficiency is run.json's tokens/s/GPU ÷ that of the 1-GPU baseline at
the same batch: a kept change of batch captures a 1-GPU baseline at the new batch (outside the
budget), since against the old one the batch change itself would read as better scaling.

The loop is pure orchestration over three parts that exist on their own: `capture.launcher`
(a capture), `whatif` (candidates and predictions), `sweep` (a run's figures). The capture
is a parameter (`Capture`), so the loop runs the same with real captures and in tests."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsdp_trace import atomic
from fsdp_trace.errors import UserError
from fsdp_trace.runrecord import RunRecord, read_run
from fsdp_trace.trials import (
    ON_CPU,
    ONE_GPU,
    READ_FORMATS,
    TUNE_FILE,
    Role,
    Trial,
    TuneResult,
    describe,
)

if TYPE_CHECKING:
    from fsdp_trace.present.tune import TuneView

# A knob's gain is kept when it is beyond the noise: the eager run against its repeat, and
# no less than twice the standard error of a difference of two runs' step statistics.
SE_FACTOR = 2.0
# The options that change a step's tokens: a 1-GPU baseline is comparable only at the same.
BATCH_OPTIONS = ("batch_size", "seq_len", "grad_accum")


# A capture: (config, processes) → the run directory it wrote; raises CaptureFailed.
Capture = Callable[[Any, int], Path]


def parse_target(text: str | None) -> float | None:
    """--target: scaling efficiency as a fraction ("0.9") or a percentage ("90%")."""
    if text is None or text == "":
        return None
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError:
        raise UserError(f"--target {text!r}: give an efficiency like 0.9 or 90%") from None
    if not 0.0 < value <= 1.0:
        raise UserError(f"--target {text!r}: give an efficiency between 0 and 1 (e.g. 0.9)")
    return value


def _positive(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None


def tokens_per_s(run: RunRecord) -> float | None:
    """run.json's tokens/s/GPU: tokens per step per GPU ÷ the median un-profiled step."""
    return _positive(run.figures.tokens_per_s_per_gpu)


def _anchor() -> str:
    from fsdp_trace.whatif import ANCHOR

    return ANCHOR


def speed(run: RunRecord) -> tuple[float | None, str]:
    """What gains and the noise are measured on, and its step statistic: tokens per step per
    GPU ÷ the run's 10th-percentile un-profiled step (`whatif.ANCHOR`, the statistic the
    replay predicts), or ÷ the median where run.json has no 10th percentile ("median")."""
    figures = run.figures
    stats = figures.step_time_ms
    median = _positive(stats.median) if stats is not None else None
    tokens = _positive(figures.tokens_per_step_per_gpu)
    if tokens is None and median is not None and tokens_per_s(run) is not None:
        tokens = tokens_per_s(run) * median / 1e3  # run.json's tokens/s is over the median
    anchor = _anchor()
    step = _positive(getattr(stats, anchor, None)) if stats is not None else None
    which = anchor
    if step is None:
        step, which = median, "median"
    if tokens is None or step is None:
        return None, ""
    return tokens / (step / 1e3), which


def _step_ms(run: RunRecord, statistic: str) -> float | None:
    stats = run.figures.step_time_ms
    return _positive(getattr(stats, statistic, None)) if stats is not None else None


def relative_se(run: RunRecord, statistic: str) -> float | None:
    """The standard error of a run's step statistic, relative to it (σ/√n ÷ the statistic)."""
    stats = run.figures.step_time_ms
    step = _step_ms(run, statistic)
    if stats is None or not stats.stdev or not stats.n or step is None:
        return None
    return stats.stdev / math.sqrt(stats.n) / step


def gain_pct(run: RunRecord, kept: RunRecord) -> float | None:
    """`run`'s gain over `kept` in % of `speed`: what measured Δ, the repeat and the noise
    all are (one definition, so the table's numbers agree)."""
    a, b = speed(run)[0], speed(kept)[0]
    return 100.0 * (a / b - 1.0) if a is not None and b is not None else None


def measure_noise(eager: RunRecord, repeat: RunRecord) -> float | None:
    """Run-to-run noise in % of `speed`: the repeat's gain over the eager run (`gain_pct`),
    in size, and no less than SE_FACTOR standard errors of the difference of the two runs'
    step statistics."""
    repeat_pct = gain_pct(repeat, eager)
    if repeat_pct is None:
        return None
    errors = [e for e in (relative_se(r, speed(r)[1]) for r in (eager, repeat)) if e is not None]
    se_pct = 100.0 * SE_FACTOR * math.sqrt(sum(e * e for e in errors)) if errors else 0.0
    return max(abs(repeat_pct), se_pct)


def keeps(measured_pct: float | None, noise_pct: float | None) -> bool:
    """A knob is kept when it bought more than run-to-run noise explains."""
    return measured_pct is not None and measured_pct > (noise_pct or 0.0)


def batch_of(run: RunRecord) -> tuple[Any, Any, Any]:
    """What a step's tokens are made of: (local batch, sequence length, micro-batches)."""
    return (
        run.model.batch_size or run.config.batch_size,
        run.model.seq_len or run.config.seq_len,
        run.config.grad_accum or 1,
    )


def batch_text(batch: tuple[Any, Any, Any]) -> str:
    size, seq, accum = batch
    text = f"batch {size if size is not None else '?'} × {seq if seq is not None else '?'}"
    return text + (f" × {accum} micro-batches" if accum and accum != 1 else "")


def efficiency_of(
    trial: Trial, run: RunRecord, baselines: dict[tuple, tuple[str, RunRecord]], nproc: int
) -> tuple[float | None, str, str]:
    """(efficiency, the baseline it is against, why it is blank): run.json's tokens/s/GPU ÷
    the tokens/s of the 1-GPU baseline at the same batch. None on a 1-GPU tune, on CPU, and
    where no baseline has the run's batch (a batch change is not better scaling)."""
    if nproc <= 1:
        return None, "", ONE_GPU
    if run.world.device == "cpu":
        return None, "", ON_CPU
    if trial.role is Role.BASELINE:
        return 1.0, trial.name, ""  # the reference
    batch = batch_of(run)
    if batch not in baselines:
        others = ", ".join(f"{name}: {batch_text(b)}" for b, (name, _) in baselines.items())
        return (
            None,
            "",
            f"its {batch_text(batch)} differs from every 1-GPU baseline's "
            f"({others or 'none measured'}): a batch change is not better scaling, so "
            "--target is not judged on it",
        )
    name, base = baselines[batch]
    mine, theirs = tokens_per_s(run), tokens_per_s(base)
    if mine is None or theirs is None:
        return None, name, f"no tokens/s/GPU measured ({name} or this run)"
    return mine / theirs, name, ""


def settle(result: TuneResult, runs: dict[str, RunRecord]) -> None:
    """Every trial's figures from its run (`runs` by name; a failed capture has none): its
    tokens/s/GPU, `speed`, measured Δ against the run it names, efficiency against the
    1-GPU baseline at its batch, and the noise. The loop calls it after each capture;
    `remeasure` with the runs read back from a tune folder."""
    baselines: dict[tuple, tuple[str, RunRecord]] = {}
    for t in result.trials:
        if t.role is Role.BASELINE and t.name in runs:
            baselines.setdefault(batch_of(runs[t.name]), (t.name, runs[t.name]))
    for t in result.trials:
        run = runs.get(t.name)
        if run is None:
            t.tokens_per_s_per_gpu = t.speed = t.measured_pct = t.efficiency = None
            t.statistic = t.baseline = t.no_efficiency = ""
            continue
        t.tokens_per_s_per_gpu = tokens_per_s(run)
        t.speed, t.statistic = speed(run)
        if t.statistic == "median":
            _note(
                result,
                f"{t.name}: run.json has no {_anchor()} step time: its gain is measured on "
                "the median step",
            )
        against = runs.get(t.against) if t.against else None
        t.measured_pct = gain_pct(run, against) if against is not None else None
        t.efficiency, t.baseline, t.no_efficiency = efficiency_of(t, run, baselines, result.nproc)
    eager, repeat = result.of_role(Role.EAGER), result.of_role(Role.REPEAT)
    if eager is not None and repeat is not None and {eager.name, repeat.name} <= runs.keys():
        result.noise_pct = measure_noise(runs[eager.name], runs[repeat.name])
    else:
        result.noise_pct = None


def remeasure(result: TuneResult, folder: Path) -> TuneResult:
    """`result`'s figures recomputed from its run directories in `folder` (a tune.json of an
    older format keeps its decisions; where one disagrees with the figures now, a note says
    so)."""
    runs = {t.name: read_run(folder / t.name) for t in result.trials if not t.failed}
    settle(result, runs)
    for t in result.trials:
        if t.role is not Role.TRIAL or t.failed:
            continue
        if t.kept != keeps(t.measured_pct, result.noise_pct):
            _note(
                result,
                f"{t.name} was {'kept' if t.kept else 'not kept'} when captured; its measured "
                f"Δ {_pct(t.measured_pct, signed=True)} on the {t.statistic} step is "
                f"{'within' if t.kept else 'beyond'} the noise ({_pct(result.noise_pct)}) now",
            )
    return result


def _note(result: TuneResult, note: str) -> None:
    if note not in result.notes:
        result.notes.append(note)


def identity(changes: dict[str, Any]) -> tuple:
    """What was tried: the capture changes (a batch factor already a batch size), so a
    doubling after a kept doubling is a new run."""
    return tuple(sorted((k, repr(v)) for k, v in changes.items()))


def capture_changes(knobs, run: RunRecord, where: Path) -> dict[str, Any]:
    """The capture options a what-if change sets (a batch factor becomes a batch size)."""
    changes = dict(knobs.changed())
    scale = changes.pop("batch_scale", None)
    if scale is not None:
        batch = run.model.batch_size or run.config.batch_size
        if not batch:
            raise UserError(f"{where}: run.json gives no batch size to scale")
        changes["batch_size"] = max(1, round(batch * scale))
    return changes


@dataclass(frozen=True)
class Candidate:
    knobs: Any  # whatif.Knobs
    rule: str
    predicted_pct: float | None
    uncertainty_pct: float | None
    changes: dict[str, Any] = field(default_factory=dict)  # `capture_changes` of `knobs`


def next_candidates(
    run_dir: Path, run: RunRecord, tried: set[tuple], current: Any = None
) -> tuple[list[Candidate], str]:
    """The changes to try on the kept run, best predicted first (the findings' changes and
    FSDP2's standard knobs, less those in effect, tried before (by their capture changes,
    `identity`) or changing nothing of `current`, the kept capture config), and a note.
    Where the replay cannot predict (CPU traces have no GPU kernels) they come in the
    findings' order, unpredicted, and the note says so."""
    import fsdp_trace
    from fsdp_trace import whatif

    analyzed = fsdp_trace.analyze(run_dir).only
    note = ""
    try:
        ranked = [
            (p.knobs, rule, p.throughput_gain_pct, 100.0 * p.uncertainty_us / p.predicted_step_us)
            for p, rule in whatif.rank_candidates(analyzed, standard=True)
        ]
    except UserError as exc:
        ranked = [(k, rule, None, None) for k, rule in whatif.candidates(analyzed, standard=True)]
        note = f"knobs tried in the findings' order, not predicted: {exc}"
    found = []
    for knobs, rule, predicted, uncertainty in ranked:
        try:
            changes = capture_changes(knobs, run, run_dir)
        except UserError:
            continue  # a batch factor where run.json gives no batch: nothing to capture
        if identity(changes) in tried:
            continue
        if current is not None and all(
            getattr(current, k, object()) == v for k, v in changes.items()
        ):
            continue  # the kept run already has it
        found.append(Candidate(knobs, rule, predicted, uncertainty, changes))
    return found, note


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")[:48] or "knob"


def _changes_batch(changes: dict[str, Any], current: Any) -> bool:
    return any(k in changes and changes[k] != getattr(current, k, None) for k in BATCH_OPTIONS)


def tune(
    base,
    nproc: int,
    out: Path,
    capture: Capture,
    budget: int = 4,
    target: float | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> TuneResult:
    """Run the tuning loop (see the module docstring) into `out`; `base` is the eager
    CaptureConfig, `budget` the knob captures allowed (a 1-GPU baseline at a kept new batch
    is not one), `target` a scaling efficiency to stop at (GPU runs on more than one GPU
    only). Writes tune.json after every run, so an interrupted loop leaves what it
    measured."""
    from fsdp_trace.capture.launcher import CaptureFailed

    if budget < 0:
        raise UserError(f"--budget {budget}: give the number of knob captures, 0 or more")
    if target is not None and nproc <= 1:
        raise UserError(f"--target with --nproc-per-node {nproc}: {ONE_GPU}")
    out.mkdir(parents=True, exist_ok=True)
    trials: list[Trial] = []
    result = TuneResult(trials, None, {}, "", nproc)
    runs: dict[str, RunRecord] = {}

    def record(trial: Trial, run_dir: Path | None = None) -> None:
        trials.append(trial)
        if run_dir is not None:
            runs[trial.name] = read_run(run_dir)
        settle(result, runs)
        record_final(result, out)

    baseline_dir = None
    if nproc > 1:
        say("capturing the 1-GPU baseline")
        baseline_dir = capture(replace(base, out=str(out / "1gpu"), baseline=None), 1)
        record(Trial("1gpu", Role.BASELINE), baseline_dir)
    eager_cfg = replace(base, baseline=str(baseline_dir) if baseline_dir else None)
    say(f"capturing the eager run on {nproc}")
    kept_dir = capture(replace(eager_cfg, out=str(out / "eager")), nproc)
    record(Trial("eager", Role.EAGER), kept_dir)
    say("capturing the eager run again (run-to-run noise)")
    repeat_dir = capture(replace(eager_cfg, out=str(out / "eager-repeat")), nproc)
    record(Trial("eager-repeat", Role.REPEAT, against="eager"), repeat_dir)
    say(f"run-to-run noise: {_pct(result.noise_pct)}")

    tried: set[tuple] = set()
    current = eager_cfg
    kept_trial = result.trial("eager")
    used = 0
    result.stopped = f"budget of {budget} knob captures used"
    while True:
        reached = kept_trial.efficiency
        if target is not None and reached is not None and reached >= target:
            result.stopped = f"target efficiency {target:.0%} reached ({reached:.1%})"
            break
        if target is not None and reached is None and kept_trial.no_efficiency:
            why = kept_trial.no_efficiency
            _note(
                result,
                f"--target not judged: {why}"
                if why == ON_CPU
                else f"--target not judged on {kept_trial.name}: {why}",
            )
        if used >= budget:
            break
        candidates, note = next_candidates(kept_dir, runs[kept_trial.name], tried, current)
        if note:
            _note(result, note)
            say(note)
        pick = next(
            (c for c in candidates if c.predicted_pct is None or c.predicted_pct > 0.0), None
        )
        if pick is None:
            result.stopped = (
                "no knob left to try" if not candidates else "no knob left is predicted to gain"
            )
            break
        used += 1
        changes = pick.changes
        tried.add(identity(changes))
        new_batch = _changes_batch(changes, current)
        name = f"trial{used}-{slug(describe(changes))}"
        say(f"trial {used}/{budget}: {pick.knobs.describe()} ({_predicted(pick)})")
        trial = Trial(
            name,
            Role.TRIAL,
            knob=pick.knobs.describe(),
            rule=pick.rule,
            changes=changes,
            against=kept_trial.name,
            predicted_pct=pick.predicted_pct,
            predicted_uncertainty_pct=pick.uncertainty_pct,
        )
        # run.json's own efficiency only against a baseline of the same batch
        cfg = replace(current, out=str(out / name), **changes)
        if new_batch:
            cfg = replace(cfg, baseline=None)
        try:
            trial_dir = capture(cfg, nproc)
        except CaptureFailed as exc:
            trial.failed = exc.message
            record(trial)
            say(f"  capture failed: {exc.message}")
            continue
        trials.append(trial)
        runs[name] = read_run(trial_dir)
        settle(result, runs)
        trial.kept = keeps(trial.measured_pct, result.noise_pct)
        record_final(result, out)
        say(
            f"  measured {_pct(trial.measured_pct, signed=True)}: "
            + ("kept" if trial.kept else f"not kept (noise {_pct(result.noise_pct)})")
        )
        if not trial.kept:
            continue
        current = replace(current, **changes)
        result.kept.update(changes)
        kept_dir, kept_trial = trial_dir, trial
        if new_batch:
            current = replace(current, baseline=None)
            if nproc > 1 and runs[name].world.device != "cpu":
                current = _new_baseline(current, out, capture, record, runs, result, say)
    record_final(result, out)
    return result


def _new_baseline(current, out: Path, capture: Capture, record, runs, result, say):
    """A 1-GPU baseline at the kept run's new batch (efficiency is only ever against the
    same batch); the config to capture on with it, or without one where it failed."""
    from fsdp_trace.capture.launcher import CaptureFailed

    batch = {
        k: getattr(current, k)
        for k in BATCH_OPTIONS
        if getattr(current, k) is not None and (k != "grad_accum" or getattr(current, k) != 1)
    }
    stem = name = f"1gpu-{slug(describe(batch))}"
    taken = {t.name for t in result.trials}
    n = 1
    while name in taken:
        n += 1
        name = f"{stem}-{n}"
    say(f"capturing a 1-GPU baseline at the new batch ({describe(batch)})")
    trial = Trial(name, Role.BASELINE, changes=batch)
    try:
        run_dir = capture(replace(current, out=str(out / name), baseline=None), 1)
    except CaptureFailed as exc:
        trial.failed = exc.message
        record(trial)
        say(f"  capture failed: {exc.message}: no efficiency at this batch")
        return current
    record(trial, run_dir)
    return replace(current, baseline=str(run_dir))


def record_final(result: TuneResult, out: Path) -> None:
    atomic.write_text(out / TUNE_FILE, json.dumps(result.to_json(), indent=1) + "\n")


def read_tune(folder: Path) -> TuneResult:
    path = folder / TUNE_FILE
    try:
        data = json.loads(path.read_text())
        if data.get("format") not in READ_FORMATS:
            raise ValueError(f"format {data.get('format')!r}")
        result = TuneResult.from_json(data)
        _check(result)
        return result
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"{path}: not a readable fsdp-trace tune.json ({exc})") from None


def _check(result: TuneResult) -> None:
    """What `remeasure` and the view rely on: raises ValueError naming what is wrong."""
    if isinstance(result.nproc, bool) or not isinstance(result.nproc, int) or result.nproc < 1:
        raise ValueError(f"nproc {result.nproc!r}")
    if not isinstance(result.kept, dict) or not isinstance(result.notes, list):
        raise ValueError("kept or notes of the wrong type")
    names = set()
    for t in result.trials:
        name = t.name
        if not isinstance(name, str) or not name or Path(name).name != name or name in names:
            raise ValueError(f"trial name {name!r}")
        names.add(name)
        if not isinstance(t.against, str) or not isinstance(t.changes, dict):
            raise ValueError(f"trial {name}: against or changes of the wrong type")
        if not isinstance(t.failed, str) or not isinstance(t.knob, str):
            raise ValueError(f"trial {name}: failed or knob of the wrong type")


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "unknown"
    return f"{value:+.1f} %" if signed else f"{value:.1f} %"


def _predicted(c: Candidate) -> str:
    if c.predicted_pct is None:
        return "not predicted"
    return f"predicted {c.predicted_pct:+.1f} ± {c.uncertainty_pct:.1f} %"


def launcher_capture(rendezvous) -> Capture:
    """Real captures through the standalone launcher, each run's figures summarized into
    its analysis.json (as `sweep` does) so the table can be rebuilt without the traces."""
    from fsdp_trace.capture.launcher import launch
    from fsdp_trace.sweep import summarize_point

    def run(cfg, nproc: int) -> Path:
        launch(cfg, nproc, replace(rendezvous, nproc_per_node=nproc))
        summarize_point(Path(cfg.out))
        return Path(cfg.out)

    return run


def folder_view(result: TuneResult, folder: Path) -> TuneView:
    """The view of a tuning folder: its runs' figures read back (`sweep.run_table`)."""
    from fsdp_trace.present.tune import tune_view
    from fsdp_trace.sweep import run_table

    runs = [folder / t.name for t in result.trials if not t.failed]
    figures = run_table(runs, notify=None)
    return tune_view(result, folder, figures)
