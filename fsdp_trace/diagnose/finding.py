"""What the diagnosis says: findings, each a cause with its cost, evidence and the change to
make, ordered so that the first is the one to act on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fsdp_trace.vocab import Basis

# A finding whose cost is below this share of the step is minor: listed apart, never first.
MINOR = 0.01


@dataclass(frozen=True)
class Change:
    """What to change, three ways: in words, as the `fsdp-trace capture` option that tries
    it, and as the plain FSDP2 / PyTorch call (or environment) in the user's own code."""

    text: str
    cli: str = ""
    code: str = ""


class FindingKind:
    CAUSE = "cause"  # costs training time: act on it
    MEASUREMENT = "measurement"  # about the profile itself (costs un-profiled steps nothing)
    NOTE = "note"  # a fact about the set-up worth acting on, with no cost that can be measured


@dataclass(frozen=True)
class Saving:
    """What a finding's change buys, predicted by the what-if replay on the measured step:
    the same figures `fsdp-trace whatif RUN --set KNOBS` prints for it."""

    knobs: str  # the change replayed, as `--set` takes it ("shard_embeddings=true")
    measured_step_us: float  # the step the prediction starts from
    predicted_step_us: float  # for the measured step's tokens (a batch change: per its tokens)
    uncertainty_us: float  # of the predicted step, for the measured step's tokens
    step_basis: str  # what the measured step is ("the 10th percentile of 20 un-profiled …")
    # The change's tokens per step over the measured step's (a batch change: 2 for twice the
    # batch); the saving is then in step time per the measured step's tokens.
    tokens_scale: float = 1.0

    @property
    def saving_us(self) -> float:
        return self.measured_step_us - self.predicted_step_us

    @property
    def within_noise(self) -> bool:
        return abs(self.saving_us) <= self.uncertainty_us

    @property
    def throughput_gain_pct(self) -> float:
        """Tokens/s per GPU, predicted over measured, minus 1 (%)."""
        return 100.0 * (self.measured_step_us / self.predicted_step_us - 1.0)


@dataclass
class Finding:
    """One diagnosis: the cause, where (ranks, blocks), what it costs per step, the evidence,
    whether measured or inferred, and the change."""

    rule: str  # stable id, e.g. "host-bound"
    title: str
    cause: str  # the cause, one sentence
    evidence: str  # what was seen, with numbers and thresholds
    why: str
    change: Change
    cost_us: float  # per step (median over the timing steps)
    step_us: float  # the step the cost is a share of
    basis: Basis = Basis.MEASURED
    ranks: list[int] = field(default_factory=list)
    blocks: list[str] = field(default_factory=list)
    kind: str = FindingKind.CAUSE
    metrics: dict[str, Any] = field(default_factory=dict)
    symptoms: list[Finding] = field(default_factory=list)  # what this cause explains
    number: int = 0  # position in the output, 1..N (0: a folded symptom or minor)
    # The cost may include waiting for peers: collectives no other rank's trace matched.
    upper_bound: bool = False
    # False on CPU (gloo) traces: no GPU timing, so the finding is structural, not costed.
    costed: bool = True
    # What the cost is: the saving its change buys (`saving`, predicted) or, where no knob of
    # the what-if replay models the change, the measured time of the cause (`measured_us`,
    # the rule's own figure, kept either way) and why it is not a prediction (`cost_note`).
    measured_us: float | None = None
    saving: Saving | None = None
    cost_note: str = ""

    @property
    def cost_pct(self) -> float:
        return 100.0 * self.cost_us / self.step_us if self.step_us > 0 else 0.0

    @property
    def minor(self) -> bool:
        """A cause whose cost is below 1 % of the step, or whose predicted saving is within
        the run's noise: listed apart, never first."""
        if self.kind != FindingKind.CAUSE or not self.costed:
            return False
        noise = self.saving is not None and self.saving.within_noise
        return noise or self.cost_us < MINOR * self.step_us

    # The names the first version of the diagnosis used, kept for readers of old JSON.
    @property
    def saw(self) -> str:
        return self.evidence


@dataclass
class Diagnosis:
    """The findings of one run, in the order to act on them, the minor ones apart, and the
    verdict line that heads every view."""

    findings: list[Finding]  # causes first (costliest first), then measurement findings
    minor: list[Finding]
    verdict: str
    healthy: bool
    notices: list[str] = field(default_factory=list)

    def all(self) -> list[Finding]:
        """Every finding, symptoms included (for lookups by rule)."""
        out = []
        for f in self.findings + self.minor:
            out.append(f)
            out.extend(f.symptoms)
        return out

    def rules(self) -> set[str]:
        """The rules that found something (top level, folded or minor)."""
        return {f.rule for f in self.all()}

    def get(self, rule: str) -> Finding | None:
        return next((f for f in self.all() if f.rule == rule), None)
