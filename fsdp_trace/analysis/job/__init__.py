"""Stage 3, the job: every trace read and analyzed (`perrank`: locally, in processes, or
on a Dask cluster with `cluster`), then joined: the cross-rank view (`crossrank`), the
inferred configuration (`config`), HTA's cross-check (`hta_check`). Imports `read`, `rank`
and the records below it."""
