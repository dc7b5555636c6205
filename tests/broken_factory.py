"""A `--model tests.broken_factory:build` whose module raises on import (a user's typo, a
missing dependency): capture must fail before any rank starts.

Each import appends who imported it (the rank, or "parent" outside torchrun) to the file named
by FSDP_TRACE_TEST_IMPORT_LOG, so a test can tell whether ranks were started."""

from __future__ import annotations

import os

_log = os.environ.get("FSDP_TRACE_TEST_IMPORT_LOG")
if _log:
    with open(_log, "a") as handle:
        handle.write(os.environ.get("RANK", "parent") + "\n")

raise RuntimeError("broken on purpose at import")


def build(ctx):  # never reached
    raise AssertionError("unreachable")
