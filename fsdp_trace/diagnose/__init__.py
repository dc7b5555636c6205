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
    """The diagnosis of one run (`fsdp_trace.result.RunAnalysis`)."""
    return order(run_rules(Context(analysis)))


__all__ = ["RULES", "Change", "Diagnosis", "Finding", "diagnose"]
