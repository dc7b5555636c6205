"""Diagnosis: which cause costs the most, what it explains, and what to change.

    from fsdp_trace.diagnose import diagnose
    diagnosis = diagnose(run_analysis)  # the facade runs it: fsdp_trace.analyze(...)

The rules live in `fsdp_trace.diagnose.rules` (a registry); `causes` orders and folds them.
"""

from fsdp_trace.diagnose.causes import order
from fsdp_trace.diagnose.context import Context
from fsdp_trace.diagnose.finding import Change, Diagnosis, Finding
from fsdp_trace.diagnose.rules import RULES, run_rules


def diagnose(analysis) -> Diagnosis:
    """The diagnosis of one run (`fsdp_trace.result.RunAnalysis`). Under HSDP the verdict
    says so first: every cost is read against that mesh."""
    diagnosis = order(run_rules(Context(analysis)))
    if not analysis.gpu:  # gloo: collectives on the host, no GPU timing to cost anything
        diagnosis.healthy = False
        diagnosis.verdict = (
            "not measured: CPU (gloo) traces have no GPU kernels, so no cause can be costed; "
            "what is shown is which collectives run where"
        )
    mesh = analysis.config.mesh.value
    if mesh.kind == "hsdp":
        diagnosis.verdict = f"{mesh.describe()}: {diagnosis.verdict}"
    return diagnosis


__all__ = ["RULES", "Change", "Diagnosis", "Finding", "diagnose"]
