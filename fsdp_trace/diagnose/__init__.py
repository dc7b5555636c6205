"""Multi-rank matching and diagnosis: what the analysis means and which knob to change."""

from fsdp_trace.diagnose.crossrank import CrossRank, match
from fsdp_trace.diagnose.rules import Finding, diagnose

__all__ = ["CrossRank", "Finding", "diagnose", "match"]
