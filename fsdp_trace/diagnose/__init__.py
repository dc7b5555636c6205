"""Diagnosis: which cause costs the most, what it explains, and what to change.

    from fsdp_trace.diagnose import diagnose
    diagnosis = diagnose(run_analysis)  # the facade runs it: fsdp_trace.analyze(...)

The rules live in `fsdp_trace.diagnose.rules` (a registry); `pricing` costs each cause by
what its change buys (the what-if replay); `causes` orders and folds them.
"""

from fsdp_trace.diagnose.causes import order
from fsdp_trace.diagnose.context import Context
from fsdp_trace.diagnose.finding import Change, Diagnosis, Finding, Saving
from fsdp_trace.diagnose.pricing import price
from fsdp_trace.diagnose.rules import RULES, run_rules
from fsdp_trace.vocab import Basis, MeshKind


def diagnose(analysis) -> Diagnosis:
    """The diagnosis of one run (`fsdp_trace.result.RunAnalysis`)."""
    ctx = Context(analysis)
    findings = run_rules(ctx)
    notices = []
    unmatched = ctx.unmatched_share()
    if unmatched > 0.5:  # waiting for peers cannot be told apart from transfer
        for f in findings:
            if RULES[f.rule].communication and f.costed:
                f.upper_bound = True
                f.basis = Basis.INFERRED
                f.evidence += (
                    " — an upper bound: these collectives matched no other rank's trace, so "
                    "their time may include waiting for peers"
                )
        world = ctx.config.world_size.value
        notices.append(
            f"{100 * unmatched:.0f} % of the collectives matched no other rank's trace (traces "
            f"of {len(ctx.gpu_ranks)} of {world} ranks): communication costs are upper bounds "
            "that may include waiting; give every rank's trace to tell them apart"
        )
    if not analysis.gpu:  # gloo: collectives on the host, no GPU timing to cost anything
        for f in findings:
            f.costed = False
    notices += price(analysis, findings)
    diagnosis = order(findings)
    diagnosis.notices = notices
    if not analysis.gpu:
        diagnosis.healthy = False
        diagnosis.verdict = (
            "not measured: CPU (gloo) traces have no GPU kernels, so no cause can be costed; "
            "what is shown is which collectives run where"
        )
    mesh = analysis.config.mesh.value
    if mesh.kind == MeshKind.HSDP:
        diagnosis.verdict = f"{mesh.describe()}: {diagnosis.verdict}"
    return diagnosis


__all__ = ["RULES", "Change", "Diagnosis", "Finding", "Saving", "diagnose"]
