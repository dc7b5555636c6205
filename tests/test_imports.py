"""What each command imports, in a fresh process: the command line starts light and each
command imports only what it uses (the heavy libraries inside the commands, capture's generated
options only for capture). A test of what is imported, not of how long it takes: the timings
are benchmarks/speed_targets.py's (section 3, imports)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, SAMPLES

# Run `python -m fsdp_trace ARGS` and write the modules loaded by its end to a file.
PROBE = """
import atexit, json, runpy, sys
out, sys.argv = sys.argv[1], ["fsdp-trace", *sys.argv[2:]]
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
runpy.run_module("fsdp_trace", run_name="__main__", alter_sys=True)
"""
LIST_MODULES = "import json, sys, fsdp_trace.cli; print(json.dumps(list(sys.modules)))"
# Never imported by the command line itself, by --help or by a plain analyze.
ELSEWHERE = ("plotly", "perfetto", "torch", "pydantic", "dask", "distributed", "fsspec", "hta")
ANALYSIS = ("pandas", "numpy", "msgspec", "xxhash")
# What only `capture` (its options, its launcher) or an option of analyze uses.
OTHER_COMMANDS = (
    "fsdp_trace.capture",
    "fsdp_trace.render.report",
    "fsdp_trace.render.perfetto",
    "fsdp_trace.analysis.job.cluster",
    "fsdp_trace.whatif",
    "fsdp_trace.sweep",
    "fsdp_trace.tune",
)


def probed(probe: str, out: Path, *args: str, env: dict | None = None) -> object:
    """What `probe` (given `out` and ARGS) wrote to `out` once `fsdp-trace ARGS` exited
    (successfully); `env`: the process's environment (default: this one's)."""
    done = subprocess.run(
        [sys.executable, "-c", probe, str(out), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**(os.environ if env is None else env), "FSDP_TRACE_QUIET": "1", "COLUMNS": "100"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(out.read_text())


def loaded(tmp_path: Path, *args: str) -> set[str]:
    """The modules `fsdp-trace ARGS` had loaded when it exited (successfully)."""
    return set(probed(PROBE, tmp_path / "modules.json", *args))


def among(modules: set[str], packages: tuple[str, ...]) -> list[str]:
    """The modules that are one of `packages` or inside one."""
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in packages))


def test_importing_the_command_line_imports_no_library_of_a_command():
    done = subprocess.run(
        [sys.executable, "-c", LIST_MODULES],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    modules = set(json.loads(done.stdout))
    assert not among(modules, (*ELSEWHERE, *ANALYSIS, "rich", *OTHER_COMMANDS))


@pytest.mark.parametrize("command", ["", "analyze", "cache"])
def test_help_builds_nothing_of_capture_and_imports_no_analysis(tmp_path, command):
    """The command list shows capture's help without building its options (they are parsed
    from its config classes' source)."""
    modules = loaded(tmp_path, *command.split(), "--help")
    assert not among(modules, (*ELSEWHERE, *ANALYSIS, *OTHER_COMMANDS))


def test_capture_help_builds_its_options_from_the_config_classes(tmp_path):
    modules = loaded(tmp_path, "capture", "--help")
    assert {"fsdp_trace.capture.config", "fsdp_trace.capture.launcher"} <= modules
    assert not among(modules, (*ELSEWHERE, *ANALYSIS))


def test_analyze_imports_only_what_it_uses(tmp_path):
    """No report, Perfetto, HTA or cluster without their options; no capture; none of typer's
    rich help and tracebacks (typer.rich_utils imports rich.markdown, rich.traceback)."""
    modules = loaded(
        tmp_path, "analyze", str(SAMPLES / "gpt-small-1gpu"), "--no-report", "--no-cache"
    )
    assert {"pandas", "fsdp_trace.pipeline", "rich.console"} <= modules  # the probe works
    unused = (*ELSEWHERE, *OTHER_COMMANDS, "typer.rich_utils", "rich.markdown", "rich.traceback")
    assert not among(modules, unused)


def test_cache_clear_imports_no_analysis(tmp_path):
    """Deleting the cache's files needs the folder's policy alone (`cachefolder`)."""
    modules = loaded(tmp_path, "cache", "clear")
    assert "fsdp_trace.analysis.read.cachefolder" in modules  # the probe works
    assert not among(modules, ANALYSIS)


# Run `python -m fsdp_trace ARGS`; write how numpy found the process when it was imported.
AT_NUMPY = """
import atexit, gc, json, os, runpy, sys
out, sys.argv = sys.argv[1], ["fsdp-trace", *sys.argv[2:]]
seen = {}
class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" and not seen:
            seen.update(collector=gc.isenabled(), blas=os.environ.get("OPENBLAS_NUM_THREADS"))
atexit.register(lambda: open(out, "w").write(json.dumps(seen)))
sys.meta_path.insert(0, Watch())
runpy.run_module("fsdp_trace", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("no_cache", [["--no-cache"], []])
@pytest.mark.parametrize(
    "users, blas",
    [({}, "1"), ({"OPENBLAS_NUM_THREADS": "3"}, "3"), ({"OMP_NUM_THREADS": "2"}, None)],
)
def test_numpy_is_imported_with_the_collector_paused_and_one_blas_thread(
    tmp_path, no_cache, users, blas
):
    """`--no-cache` switched the cache off through the cache's module, which imported numpy and
    pandas before the command paused the collector. A number of threads the user chose
    (OpenBLAS reads OMP_NUM_THREADS too) is kept."""
    chosen = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
    env = {k: v for k, v in os.environ.items() if k not in chosen} | users
    args = ["analyze", str(SAMPLES / "gpt-small-1gpu"), "--no-report", *no_cache]
    seen = probed(AT_NUMPY, tmp_path / "seen.json", *args, env=env)
    assert seen == {"collector": False, "blas": blas}


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_pause_of_the_imports_leaves_the_collector_as_it_found_it(enabled):
    from fsdp_trace.cli.common import importing_libraries

    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        with importing_libraries():
            assert not gc.isenabled()
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
        gc.unfreeze()
