"""`fsdp-trace ARGS` in this process, then this process's own peak RSS on stderr (issue 23).

    python benchmarks/client_rss.py analyze /tmp/ranks16 --scheduler local:2 --no-cache --no-report

With `--scheduler local:N` the Dask client and its scheduler run in this process and the N
workers in processes of their own: the figure printed (`resource.getrusage(RUSAGE_SELF)`, the
workers not included) is what the client holds at its peak. Run it from the checkout's root
(or with the checkout first on PYTHONPATH).
"""

from __future__ import annotations

import atexit
import resource
import sys
import time

if __name__ == "__main__":  # the workers import this module again: nothing runs there
    start = time.perf_counter()

    def report() -> None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        seconds = time.perf_counter() - start
        print(f"client peak RSS {peak:.1f} MiB, {seconds:.1f} s", file=sys.stderr)

    atexit.register(report)
    from fsdp_trace.cli import main

    sys.argv = ["fsdp-trace", *sys.argv[1:]]
    main()
