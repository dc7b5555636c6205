"""Python's cyclic garbage collector while a run's results are held.

A run of many ranks holds ~550 tracked objects per rank's result (frames, their indexes and
blocks, dicts of figures) for as long as it is analyzed and rendered. Each full pass of the
collector (its oldest generation) walks every one of them, and the run level, which replaces
each rank's tables with wider ones, sets off a full pass every ~140,000 objects it keeps:
at a thousand ranks, four or five passes of ~0.5 s each during the run level alone (2.2 s
of its ~9 s), more while the report renders. The results hold no reference cycles (what they
hold is freed by reference counting when they go), and what a run makes and drops while the
passes are deferred is short-lived: the young generations, still collected as usual, free
it. Worker processes forked meanwhile (`--jobs`, the two-process decode) start with the
passes deferred too; they hold no results, and a rank's analysis leaves no cycles behind.

The thresholds are the process's: while a run is analyzed through the API, other threads'
full passes wait too. Under Python's incremental collector (3.14.0 to 3.14.4) the third
threshold means nothing and this changes nothing."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# Passes of the middle generation before a full pass (the default: 10): each comes after
# ~10 passes of the youngest, each after ~700-2,000 allocations, so a run never gets there;
# not infinite, so a process that never leaves the block still makes full passes now and then.
DEFERRED = 100_000

_lock = threading.Lock()
_depth = 0  # blocks entered and not left, in every thread
_given_back = 0  # the third threshold found on the first entry


@contextmanager
def full_passes_deferred() -> Iterator[None]:
    """Within it (a `with` block, or a function it decorates), the collector makes no full
    pass (none before some hundreds of millions of allocations). Blocks nest and may overlap
    across threads: the first one in raises the third threshold, the last one out puts back
    what it found, unless something else set it meanwhile (then that stays)."""
    global _depth, _given_back
    with _lock:
        if _depth == 0:
            first, second, third = gc.get_threshold()
            _given_back = third
            gc.set_threshold(first, second, max(third, DEFERRED))
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                first, second, third = gc.get_threshold()
                if third == max(_given_back, DEFERRED):  # still ours: given back
                    gc.set_threshold(first, second, _given_back)
