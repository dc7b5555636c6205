"""Trace analysis: pure functions from Kineto traces to dataclasses and DataFrames."""

from fsdp_trace.analyze.api import analyze, analyze_file, resolve
from fsdp_trace.analyze.loader import Trace, load_trace
from fsdp_trace.analyze.rank import Expectations, analyze_trace
from fsdp_trace.analyze.results import Analysis, RankAnalysis

__all__ = [
    "Analysis",
    "Expectations",
    "RankAnalysis",
    "Trace",
    "analyze",
    "analyze_file",
    "analyze_trace",
    "load_trace",
    "resolve",
]
