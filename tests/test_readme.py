"""The README's generated parts are current: the diagnosis tables are written from the code
by scripts/rules_table.py, the 2-GPU runs' figures from their run.json files by
scripts/gpu_tables.py, never kept by hand."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


def check(script: str) -> subprocess.CompletedProcess:
    """`python scripts/SCRIPT --check` from the repository root, through the test run's cache
    (conftest keeps it out of the user's: samples other tests parsed are read back)."""
    return subprocess.run(
        [sys.executable, f"scripts/{script}", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={"FSDP_TRACE_CACHE_DIR": os.environ["FSDP_TRACE_CACHE_DIR"], "PATH": "/usr/bin:/bin"},
    )


def test_rules_tables_are_written_from_the_code():
    """(Through the test run's cache, which conftest keeps out of the user's: the shipped
    samples the other tests parsed are read back, not parsed again.)"""
    done = check("rules_table.py")
    assert done.returncode == 0, done.stdout + done.stderr


def gpu_tables():
    """scripts/gpu_tables.py as a module (scripts/ is no package)."""
    spec = importlib.util.spec_from_file_location("gpu_tables", REPO / "scripts" / "gpu_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_tables_are_written_from_the_runs():
    """The sweep table and the H100 scaling figures in README.md, capture_scaling.md and
    sample_traces/README.md are what scripts/gpu_tables.py writes from the run.json files."""
    done = check("gpu_tables.py")
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_stale_gpu_table_is_caught(tmp_path, monkeypatch, capsys):
    tables = gpu_tables()
    readme = tmp_path / "README.md"
    text = tables.README.read_text()
    begin = text.index("<!-- sweep:begin -->")
    row = text.index("\n| 0.25 |", begin)  # one figure of the table changed
    readme.write_text(text[:row] + text[row:].replace("| 0.25 |", "| 0.26 |", 1))
    monkeypatch.setattr(tables, "README", readme)
    monkeypatch.setattr(sys, "argv", ["gpu_tables.py", "--check"])
    assert tables.main() == 1
    assert "README.md" in capsys.readouterr().out


def test_the_scaling_pairs_are_the_captured_ones():
    """Each 2-GPU scaling run is paired with the 1-GPU run its capture measured against
    (run.json's baseline_dir), so the table's efficiency is the captured one."""
    tables = gpu_tables()
    runs = tables.scaling_runs()
    assert sorted(runs) == [1, 4] and all(sorted(r) == [1, 2, 3] for r in runs.values())
    for batch, by_repeat in runs.items():
        for repeat, pair in by_repeat.items():
            two = pair[2]["figures"]
            assert Path(two["baseline_dir"]).name == f"b{batch}-r{repeat}-1gpu"
            ratio = two["tokens_per_s_per_gpu"] / pair[1]["figures"]["tokens_per_s_per_gpu"]
            assert ratio == pytest.approx(two["scaling_efficiency"])
    for row in tables.scaling_rows():
        captured = [runs[row["batch"]][r][2]["figures"]["scaling_efficiency"] for r in (1, 2, 3)]
        assert row["efficiency"] == pytest.approx(captured)


def test_quick_start_installs_the_cpu_build_of_torch():
    """issue 21 (8): a plain `pip install torch` gets the CUDA build on Linux; the Quick
    start's CPU install names PyTorch's CPU wheel index."""
    readme = (REPO / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    install = next(ln for ln in quick.splitlines() if ln.startswith("pip install torch"))
    assert "--index-url https://download.pytorch.org/whl/cpu" in install


def test_pyproject_metadata_gives_setuptools_no_warning():
    """issue 21 (8): `project.license` as a TOML table is deprecated (~40 warnings per CI
    run): the SPDX string, read without a warning by the setuptools the build requires."""
    import warnings

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    setuptools = pytest.importorskip("setuptools")
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["build-system"]["requires"] == ["setuptools>=77"]  # SPDX license: 77+
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} here predates SPDX licenses (77)")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dist = apply_configuration(Distribution(), REPO / "pyproject.toml")
    assert dist.metadata.license_expression == "MIT"


def test_the_readme_pictures_are_what_the_code_makes():
    """docs/images/terminal.svg holds, line by line, what `fsdp-trace analyze` prints on the
    sample now; report.png says (in its text chunk) the verdict, cards, findings and panels
    of the report made now. Stale pictures (an old diagnosis, no verdict, no what-if panel)
    fail: `python scripts/readme_images.py` makes them again."""
    done = check("readme_images.py")
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
