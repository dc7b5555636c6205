"""Stage 1, reading: a path or URL → the run it describes (`inputs`), each trace's events
(`readers` → `loader`, checked by `validate`, held as a `trace.Trace`), the cache of parsed
traces and analyses (`cache`), remote files (`remote`), traces grouped into runs
(`grouping`). Imports the records and the ground floor below it; nothing of `rank` or `job`."""
