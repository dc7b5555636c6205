"""The README's generated parts are current: the diagnosis tables are written from the code
by scripts/rules_table.py, never kept by hand."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

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
