"""Per-trace analysis: pure functions from Kineto traces to `RankAnalysis` tables, and the
run-level pieces the pipeline (`fsdp_trace.pipeline`) joins them with: the inferred
configuration, the cross-rank view, the step breakdown."""
