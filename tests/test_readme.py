"""The README's generated parts are current: the diagnosis tables are written from the code
by scripts/rules_table.py, never kept by hand."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO


def test_rules_tables_are_written_from_the_code():
    """(Through the test run's cache, which conftest keeps out of the user's: the shipped
    samples the other tests parsed are read back, not parsed again.)"""
    done = subprocess.run(
        [sys.executable, "scripts/rules_table.py", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={"FSDP_TRACE_CACHE_DIR": os.environ["FSDP_TRACE_CACHE_DIR"], "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
