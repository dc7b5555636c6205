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


def test_the_readme_pictures_are_what_the_code_makes():
    """docs/images/terminal.svg holds, line by line, what `fsdp-trace analyze` prints on the
    sample now; report.png says (in its text chunk) the verdict, cards, findings and panels
    of the report made now. Stale pictures (an old diagnosis, no verdict, no what-if panel)
    fail: `python scripts/readme_images.py` makes them again."""
    done = subprocess.run(
        [sys.executable, "scripts/readme_images.py", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={"FSDP_TRACE_CACHE_DIR": os.environ["FSDP_TRACE_CACHE_DIR"], "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_picture_check_reads_the_svg_it_checks(tmp_path):
    """The check's reading of a rich SVG gives back the printed lines, columns included (a
    check that read nothing would pass any picture)."""
    import importlib.util
    import io

    from rich.console import Console
    from rich.text import Text

    spec = importlib.util.spec_from_file_location(
        "readme_images", REPO / "scripts/readme_images.py"
    )
    images = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(images)
    printed = "\x1b[1mVerdict:\x1b[0m healthy  \x1b[31m52.76\x1b[0m ms\n\n  ┃ rank 0 │   4 │\nend\n"
    console = Console(record=True, width=40, file=io.StringIO(), force_terminal=True)
    console.print(Text.from_ansi(printed), end="", soft_wrap=True)
    console.save_svg(str(tmp_path / "t.svg"))
    lines = images.svg_lines((tmp_path / "t.svg").read_text(encoding="utf-8"))
    assert lines == images.printed_lines(Text.from_ansi(printed).plain)
    assert lines == ["Verdict: healthy  52.76 ms", "", "  ┃ rank 0 │   4 │", "end"]
