"""The analysis, in three stages (ARCHITECTURE.md): `read` (a path or URL → the runs it holds
→ each trace's events), `rank` (one trace's events → its `RankAnalysis` tables) and `job` (a
run's ranks together: the inferred configuration, the cross-rank view, Dask); the records
they return (`results`) and the interval arithmetic and kernel kinds they share
(`intervals`, `classify`) sit below them, here."""
