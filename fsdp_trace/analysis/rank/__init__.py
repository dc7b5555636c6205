"""Stage 2, one trace: a `trace.Trace`'s events → its `RankAnalysis` tables (`analyze`):
kernels classified, their context, steps, blocks, collectives, the step's breakdown, the
overlap tax, the host side, the set-up signals. Pure functions of one trace; imports
`read.trace` and the records below it, nothing of `job`."""
