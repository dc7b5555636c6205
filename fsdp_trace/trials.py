"""What `fsdp-trace tune` records (tune.json): every run of its loop as a `Trial`, the loop's
`TuneResult`, and the words its tables show. Records: the standard library only, so the
presentation (`fsdp_trace.present.tune`) reads them without importing the tuning loop."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field, fields
from typing import Any

TUNE_FILE = "tune.json"
# 2: gains on the anchored statistic (`speed`), efficiency against the baseline of the same
# batch. A format-1 file is read, and `remeasure` recomputes its figures from the runs.
TUNE_FORMAT = 2
READ_FORMATS = (1, 2)
# Why a row has no scaling efficiency, where that is the same for every row of the tune.
ONE_GPU = "a 1-GPU tune has no scaling efficiency (it is tokens/s/GPU on N GPUs ÷ that on 1)"
ON_CPU = "a CPU run's timing says nothing about scaling"


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
    tokens_per_s_per_gpu: float | None = None  # run.json's (its median step)
    predicted_pct: float | None = None  # `speed` vs `against`, by the replay
    predicted_uncertainty_pct: float | None = None
    measured_pct: float | None = None  # `speed` vs `against`, measured (`gain_pct`)
    kept: bool = False
    failed: str = ""  # why the capture failed (e.g. out of memory): nothing measured
    speed: float | None = None  # tokens/s/GPU at the `statistic` step: what gains compare
    statistic: str = ""  # the step statistic `speed` is on: "p10", or "median" without one
    efficiency: float | None = None  # tokens/s/GPU ÷ the 1-GPU baseline's at the same batch
    baseline: str = ""  # the baseline run `efficiency` is against
    no_efficiency: str = ""  # why `efficiency` is blank


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
        known = {f.name for f in fields(Trial)}
        trials = [
            Trial(**{**{k: v for k, v in t.items() if k in known}, "role": Role(t["role"])})
            for t in data["trials"]
        ]
        return cls(
            trials, data["noise_pct"], data["kept"], data["stopped"], data["nproc"], data["notes"]
        )

    def trial(self, name: str) -> Trial | None:
        return next((t for t in self.trials if t.name == name), None)

    def of_role(self, role: Role) -> Trial | None:
        return next((t for t in self.trials if t.role is role), None)


def describe(changes: dict[str, Any]) -> str:
    """Capture changes as the what-if knobs write them: "batch_size=64, ac_coverage=0.5"."""

    def text(value: Any) -> str:
        if isinstance(value, bool):
            return str(value).lower()
        return f"{value:g}" if isinstance(value, float) else str(value)

    return ", ".join(f"{k}={text(v)}" for k, v in changes.items()) or "(nothing)"
