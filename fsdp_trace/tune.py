"""`fsdp-trace tune`: the tuning write-up's table, measured. Capture the 1-GPU baseline and
the N-GPU eager run (twice: the difference is the run-to-run noise), then repeatedly take the
knob the what-if replay predicts to gain most on the run kept so far, capture it, and keep it
only when the measured gain in tokens/s/GPU is beyond the noise. Each row of the table says
which knob bought which points, predicted and measured.

The loop is pure orchestration over three parts that exist on their own: `capture.launcher`
(a capture), `whatif` (candidates and predictions), `sweep` (a run's figures). The capture
is a parameter (`Capture`), so the loop runs the same with real captures and in tests."""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from fsdp_trace import atomic
from fsdp_trace.errors import UserError
from fsdp_trace.runrecord import RunRecord, read_run

TUNE_FILE = "tune.json"
TUNE_FORMAT = 1
# A knob's gain is kept when it is beyond the noise: the eager run against its repeat, and
# no less than twice the standard error of a difference of two runs' medians.
SE_FACTOR = 2.0


class Role(str, enum.Enum):
    """What a run in the tuning loop is for."""

    BASELINE = "1-GPU baseline"
    EAGER = "eager"
    REPEAT = "eager, repeated (noise)"
    TRIAL = "trial"


@dataclass
class Trial:
    """One capture of the loop and what it measured against the run kept before it."""

    name: str  # its run directory, under the tune folder
    role: Role
    knob: str = ""  # the change tried ("reshard_after_forward=false"); "" for the base runs
    rule: str = ""  # the finding that named it, or "a standard FSDP2 knob"
    changes: dict[str, Any] = field(default_factory=dict)  # capture options it changed
    against: str = ""  # the kept run it is measured against
    tokens_per_s_per_gpu: float | None = None
    predicted_pct: float | None = None  # tokens/s/GPU vs `against`, by the replay
    predicted_uncertainty_pct: float | None = None
    measured_pct: float | None = None  # tokens/s/GPU vs `against`, measured
    kept: bool = False
    failed: str = ""  # why the capture failed (e.g. out of memory): nothing measured


@dataclass
class TuneResult:
    """The loop's outcome: every run in order, the noise, what was kept, why it stopped."""

    trials: list[Trial]
    noise_pct: float | None
    kept: dict[str, Any]
    stopped: str
    nproc: int
    notes: list[str] = field(default_factory=list)  # e.g. why nothing was predicted

    def to_json(self) -> dict[str, Any]:
        return {
            "format": TUNE_FORMAT,
            "nproc": self.nproc,
            "noise_pct": self.noise_pct,
            "kept": self.kept,
            "stopped": self.stopped,
            "notes": self.notes,
            "trials": [{**asdict(t), "role": t.role.value} for t in self.trials],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TuneResult:
        trials = [Trial(**{**t, "role": Role(t["role"])}) for t in data["trials"]]
        return cls(
            trials, data["noise_pct"], data["kept"], data["stopped"], data["nproc"], data["notes"]
        )


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


def tokens_per_s(run: RunRecord) -> float | None:
    value = run.figures.tokens_per_s_per_gpu
    return float(value) if value is not None and math.isfinite(value) and value > 0 else None


def relative_se(run: RunRecord) -> float | None:
    """The standard error of a run's median step time, relative to it (σ/√n ÷ median)."""
    stats = run.figures.step_time_ms
    if stats is None or not stats.stdev or not stats.n or not stats.median:
        return None
    return stats.stdev / math.sqrt(stats.n) / stats.median


def measure_noise(eager: RunRecord, repeat: RunRecord) -> float | None:
    """Run-to-run noise in % of tokens/s/GPU: the eager run against its repeat, and no less
    than SE_FACTOR standard errors of the difference of two runs' medians."""
    a, b = tokens_per_s(eager), tokens_per_s(repeat)
    if a is None or b is None:
        return None
    repeat_pct = 100.0 * abs(a - b) / ((a + b) / 2.0)
    errors = [e for e in (relative_se(eager), relative_se(repeat)) if e is not None]
    se_pct = 100.0 * SE_FACTOR * math.sqrt(sum(e * e for e in errors)) if errors else 0.0
    return max(repeat_pct, se_pct)


def gain_pct(trial: RunRecord, kept: RunRecord) -> float | None:
    a, b = tokens_per_s(trial), tokens_per_s(kept)
    return 100.0 * (a / b - 1.0) if a is not None and b is not None else None


def keeps(measured_pct: float | None, noise_pct: float | None) -> bool:
    """A knob is kept when it bought more tokens/s/GPU than run-to-run noise explains."""
    return measured_pct is not None and measured_pct > (noise_pct or 0.0)


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


def next_candidates(run_dir: Path, tried: set[str]) -> tuple[list[Candidate], str]:
    """The changes to try on the kept run, best predicted first (the findings' changes and
    FSDP2's standard knobs, less those in effect or tried), and a note. Where the replay
    cannot predict (CPU traces have no GPU kernels) they come in the findings' order,
    unpredicted, and the note says so."""
    import fsdp_trace
    from fsdp_trace import whatif

    run = fsdp_trace.analyze(run_dir).only
    try:
        ranked = whatif.rank_candidates(run, standard=True)
    except UserError as exc:
        found = [
            Candidate(k, rule, None, None)
            for k, rule in whatif.candidates(run, standard=True)
            if k.describe() not in tried
        ]
        return found, f"knobs tried in the findings' order, not predicted: {exc}"
    found = []
    for prediction, rule in ranked:
        if prediction.knobs.describe() in tried:
            continue
        unc = 100.0 * prediction.uncertainty_us / prediction.predicted_step_us
        found.append(Candidate(prediction.knobs, rule, prediction.throughput_gain_pct, unc))
    return found, ""


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")[:48] or "knob"


def efficiency(run: RunRecord) -> float | None:
    value = run.figures.scaling_efficiency
    return float(value) if value is not None and math.isfinite(value) else None


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
    CaptureConfig, `budget` the knob captures allowed, `target` a scaling efficiency to stop
    at (GPU runs only: CPU runs have none). Writes tune.json after every run, so an
    interrupted loop leaves what it measured."""
    from fsdp_trace.capture.launcher import CaptureFailed

    if budget < 0:
        raise UserError(f"--budget {budget}: give the number of knob captures, 0 or more")
    out.mkdir(parents=True, exist_ok=True)
    trials: list[Trial] = []
    result = TuneResult(trials, None, {}, "", nproc)

    def record(trial: Trial) -> None:
        trials.append(trial)
        atomic.write_text(out / TUNE_FILE, json.dumps(result.to_json(), indent=1) + "\n")

    baseline_dir = None
    if nproc > 1:
        say("capturing the 1-GPU baseline")
        baseline_dir = capture(replace(base, out=str(out / "1gpu"), baseline=None), 1)
        one = read_run(baseline_dir)
        record(Trial("1gpu", Role.BASELINE, tokens_per_s_per_gpu=tokens_per_s(one)))
    eager_cfg = replace(base, baseline=str(baseline_dir) if baseline_dir else None)
    say(f"capturing the eager run on {nproc}")
    kept_dir = capture(replace(eager_cfg, out=str(out / "eager")), nproc)
    kept = read_run(kept_dir)
    record(Trial("eager", Role.EAGER, tokens_per_s_per_gpu=tokens_per_s(kept)))
    say("capturing the eager run again (run-to-run noise)")
    repeat_dir = capture(replace(eager_cfg, out=str(out / "eager-repeat")), nproc)
    repeat = read_run(repeat_dir)
    result.noise_pct = measure_noise(kept, repeat)
    record(
        Trial(
            "eager-repeat",
            Role.REPEAT,
            against="eager",
            tokens_per_s_per_gpu=tokens_per_s(repeat),
            measured_pct=gain_pct(repeat, kept),
        )
    )
    say(f"run-to-run noise: {_pct(result.noise_pct)}")

    tried: set[str] = set()
    current = eager_cfg
    used = 0
    result.stopped = f"budget of {budget} knob captures used"
    while True:
        reached = efficiency(kept)
        if target is not None and reached is not None and reached >= target:
            result.stopped = f"target efficiency {target:.0%} reached ({reached:.1%})"
            break
        if used >= budget:
            break
        candidates, note = next_candidates(kept_dir, tried)
        if note and note not in result.notes:
            result.notes.append(note)
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
        tried.add(pick.knobs.describe())
        changes = capture_changes(pick.knobs, kept, kept_dir)
        name = f"trial{used}-{slug(pick.knobs.describe())}"
        say(f"trial {used}/{budget}: {pick.knobs.describe()} ({_predicted(pick)})")
        trial = Trial(
            name,
            Role.TRIAL,
            knob=pick.knobs.describe(),
            rule=pick.rule,
            changes=changes,
            against=kept_dir.name,
            predicted_pct=pick.predicted_pct,
            predicted_uncertainty_pct=pick.uncertainty_pct,
        )
        try:
            trial_dir = capture(replace(current, out=str(out / name), **changes), nproc)
        except CaptureFailed as exc:
            trial.failed = exc.message
            record(trial)
            say(f"  capture failed: {exc.message}")
            continue
        run = read_run(trial_dir)
        trial.tokens_per_s_per_gpu = tokens_per_s(run)
        trial.measured_pct = gain_pct(run, kept)
        trial.kept = keeps(trial.measured_pct, result.noise_pct)
        record(trial)
        say(
            f"  measured {_pct(trial.measured_pct, signed=True)} tokens/s/GPU: "
            + ("kept" if trial.kept else f"not kept (noise {_pct(result.noise_pct)})")
        )
        if trial.kept:
            current = replace(current, **changes)
            result.kept.update(changes)
            kept_dir, kept = trial_dir, run
    record_final(result, out)
    return result


def record_final(result: TuneResult, out: Path) -> None:
    atomic.write_text(out / TUNE_FILE, json.dumps(result.to_json(), indent=1) + "\n")


def read_tune(folder: Path) -> TuneResult:
    path = folder / TUNE_FILE
    try:
        data = json.loads(path.read_text())
        if data.get("format") != TUNE_FORMAT:
            raise ValueError(f"format {data.get('format')!r}")
        return TuneResult.from_json(data)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: not a readable fsdp-trace tune.json ({exc})") from None


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
