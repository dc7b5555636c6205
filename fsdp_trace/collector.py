"""Python's cyclic garbage collector while a run's results are held.

A run of many ranks holds ~550 tracked objects per rank's result (frames, their indexes and
blocks, dicts of figures) for as long as it is analyzed and rendered. Each full pass of the
collector (its oldest generation) walks every one of them, and the run level, which replaces
each rank's tables with wider ones, sets off a full pass every ~140,000 objects it keeps:
at a thousand ranks, four or five passes of ~0.5 s each during the run level alone (2.2 s
of its ~9 s), more while the report renders. The results hold no reference cycles (what they
hold is freed by reference counting when they go), so deferring the full passes leaves
nothing uncollected that a pass would have freed; the young generations are still
collected as usual. The thresholds are the process's: while a run is analyzed through the
API, other threads' full passes wait too."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

# Passes of the middle generation before a full pass (the default: 10): each comes after
# ~10 passes of the youngest, each after ~700-2,000 allocations, so a run never gets there;
# not infinite, so a process that never leaves the block still makes full passes now and then.
DEFERRED = 100_000


@contextmanager
def full_passes_deferred() -> Iterator[None]:
    """Within it (a `with` block, or a function it decorates), the collector makes no full
    pass (none before some hundreds of millions of allocations); after it, its thresholds
    are what they were. Nests."""
    before = gc.get_threshold()
    gc.set_threshold(before[0], before[1], max(before[2], DEFERRED))
    try:
        yield
    finally:
        gc.set_threshold(*before)
