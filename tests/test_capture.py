"""`fsdp-trace capture` end to end on CPU/gloo (2 processes), its knobs, and its failures."""

from __future__ import annotations

import gzip
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, left_in, run_cli, scratch_of

BLOCKS = [f"layers.{i}" for i in range(4)]


def load(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def names(doc: dict) -> set[str]:
    return {e.get("name", "") for e in doc["traceEvents"]}


def test_both_traces_per_rank_exist_and_parse(cpu_run):
    for rank in (0, 1):
        detailed = load(cpu_run / f"rank{rank}.detailed.json.gz")
        timing = load(cpu_run / f"rank{rank}.timing.json.gz")
        assert detailed["distributedInfo"]["rank"] == rank
        assert detailed["distributedInfo"]["backend"] == "gloo"
        steps_d = sorted(n for n in names(detailed) if n.startswith("ProfilerStep#"))
        steps_t = sorted(n for n in names(timing) if n.startswith("ProfilerStep#"))
        assert steps_d == ["ProfilerStep#1"]  # one detailed step after the profiler warmup
        assert steps_t == [f"ProfilerStep#{i}" for i in range(1, 6)]  # five lean steps
        # Detailed = record_shapes + with_stack; timing = neither.
        cats_d = {e.get("cat") for e in detailed["traceEvents"]}
        cats_t = {e.get("cat") for e in timing["traceEvents"]}
        assert "python_function" in cats_d and "python_function" not in cats_t
        assert any("Input Dims" in e.get("args", {}) for e in detailed["traceEvents"])
        assert not any("Input Dims" in e.get("args", {}) for e in timing["traceEvents"])


@pytest.mark.parametrize("phase", ["detailed", "timing"])
@pytest.mark.parametrize("rank", [0, 1])
def test_traces_carry_the_fsdp2_labels_of_every_block(cpu_run, rank, phase):
    labels = names(load(cpu_run / f"rank{rank}.{phase}.json.gz"))
    for block in BLOCKS:
        for label in (
            "pre_forward",
            "post_forward",
            "all_gather",
            "pre_backward",
            "post_backward_reduce",
        ):
            assert f"FSDP::{label} ({block})" in labels, (rank, phase, block, label)
    assert "FSDP::all_gather" in labels  # the root unit carries no path
    assert "c10d::_allgather_base_" in labels and "c10d::_reduce_scatter_base_" in labels


def test_run_json_holds_the_knobs_and_figures(cpu_run):
    run = json.loads((cpu_run / "run.json").read_text())
    assert run["config"]["ac_coverage"] == 0.5
    assert run["config"]["prefetch_forward"] == 1
    assert run["parallel"]["ac_blocks"] == ["layers.1", "layers.3"]
    assert run["parallel"]["units"] == BLOCKS
    assert run["parallel"]["forward_prefetch"] == {
        "layers.0": ["layers.1"],
        "layers.1": ["layers.2"],
        "layers.2": ["layers.3"],
    }
    assert run["parallel"]["backward_prefetch"]["layers.3"] == ["layers.2", "layers.1"]
    assert run["parallel"]["reshard_after_forward"]["layers.0"] is True
    assert run["parallel"]["mixed_precision"] == {"param_dtype": "bf16", "reduce_dtype": "fp32"}
    assert run["world"] == {
        "world_size": 2,
        "local_world_size": 2,
        "nnodes": 1,
        "backend": "gloo",
        "device": "cpu",
    }
    assert run["model"]["n_blocks"] == 4 and run["model"]["params_total"] > 0
    figures = run["figures"]
    assert figures["step_time_ms"]["n"] == 3 and figures["step_time_ms"]["median"] > 0
    tokens = run["model"]["batch_size"] * run["model"]["seq_len"]
    assert figures["tokens_per_s_per_gpu"] == pytest.approx(
        tokens / (figures["step_time_ms"]["median"] / 1e3)
    )
    assert figures["mfu"] is None and any("MFU omitted" in n for n in figures["notices"])
    assert run["environment"]["torch"]
    assert run["files"]["timing"] == ["rank0.timing.json.gz", "rank1.timing.json.gz"]
    # The equivalent command, rebuilt from the resolved config: every non-default knob.
    assert run["command"] == shlex.join(
        [
            *("fsdp-trace", "capture", "--model", "tiny", "--nproc-per-node", "2"),
            *("--out", str(cpu_run), "--prefetch-forward", "1", "--prefetch-backward", "2"),
            *("--ac-coverage", "0.5", "--warmup-steps", "1", "--timed-steps", "3"),
        ]
    )
    assert run["argv"][1:3] == ["capture", "--model"]  # the command line as typed
    assert "extra" not in run["config"]
    # The preset's real shape, though the options were left at their defaults.
    assert (run["config"]["batch_size"], run["model"]["batch_size"]) == (None, 2)
    assert run["model"]["seq_len"] == 64


@pytest.mark.slow
def test_under_torchrun_too(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node=2",
            "--standalone",
            "-m",
            "fsdp_trace",
            "capture",
            "--model",
            "tiny",
            "--out",
            str(out),
            "--warmup-steps",
            "0",
            "--timed-steps",
            "1",
            "--timing-steps",
            "1",
            "--reshard-after-forward",
            "false",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "FSDP_TRACE_QUIET": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    run = json.loads((out / "run.json").read_text())
    assert run["parallel"]["reshard_after_forward"]["layers.0"] is False
    assert run["command"] == shlex.join(
        [
            *("fsdp-trace", "capture", "--model", "tiny", "--nproc-per-node", "2"),
            *("--out", str(out), "--reshard-after-forward", "false", "--warmup-steps", "0"),
            *("--timing-steps", "1", "--timed-steps", "1"),
        ]
    )
    assert run["argv"][:4] == ["torchrun", "--nproc-per-node=2", "-m", "fsdp_trace"]
    # reshard_after_forward=False: one all-gather per block and step (none in backward).
    timing = [
        e
        for e in load(out / "rank0.timing.json.gz")["traceEvents"]
        if e.get("name") == "FSDP::all_gather (layers.0)"
    ]
    assert len(timing) == 1


@pytest.mark.slow
def test_a_user_model_factory(tmp_path):
    out = tmp_path / "run"
    done = run_cli(
        "capture",
        "--model",
        "tests.models_for_tests:two_layer_spec",
        "--nproc-per-node",
        "2",
        "--out",
        str(out),
        "--batch-size",
        "4",
        "--seq-len",
        "3",
        "--warmup-steps",
        "0",
        "--timed-steps",
        "1",
        "--timing-steps",
        "1",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    run = json.loads((out / "run.json").read_text())
    assert run["parallel"]["units"] == ["blocks.0", "blocks.1"]
    assert run["model"]["flops_per_token"] == 1234.0
    assert (run["model"]["batch_size"], run["model"]["seq_len"]) == (4, 3)
    step_s = run["figures"]["step_time_ms"]["median"] / 1e3
    assert run["figures"]["tokens_per_s_per_gpu"] == pytest.approx(4 * 3 / step_s)
    assert "FSDP::all_gather (blocks.1)" in names(load(out / "rank1.timing.json.gz"))


def test_existing_output_directory_is_refused(tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    done = run_cli("capture", "--out", str(out), "--nproc-per-node", "1")
    assert done.returncode == 2
    assert "already exists" in done.stderr and "--overwrite" in done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]


def test_a_capture_leaves_nothing_in_the_temporary_folder(cpu_run):
    """torchrun's agent makes a log folder per run (/tmp/torchelastic_*) unless told where;
    the launcher's errors folder is removed too."""
    assert left_in(scratch_of(cpu_run)) == []


@pytest.mark.slow
def test_a_failing_rank_ends_the_job_with_its_error(tmp_path):
    out = tmp_path / "run"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    start = time.monotonic()
    done = run_cli(
        "capture",
        "--model",
        "tests.models_for_tests:fails_on_rank_1",
        *("--batch-size", "2", "--seq-len", "1"),
        "--nproc-per-node",
        "2",
        "--out",
        str(out),
        "--timeout-s",
        "60",
        "--warmup-steps",
        "1",
        env={"TMPDIR": str(scratch)},
    )
    assert time.monotonic() - start < 120  # no hang waiting for the dead rank
    assert done.returncode == 1
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("fsdp-trace")]
    assert lines == [
        "fsdp-trace capture: error: rank 1: RuntimeError: data loader crashed on purpose"
    ]
    assert "Traceback" not in done.stderr
    assert not out.exists()  # no half-written output
    assert left_in(scratch) == []


@pytest.mark.slow
def test_out_of_memory_names_the_knobs_to_lower(tmp_path):
    out = tmp_path / "run"
    done = run_cli(
        "capture",
        "--model",
        "tests.models_for_tests:runs_out_of_memory",
        "--nproc-per-node",
        "1",
        "--out",
        str(out),
        "--batch-size",
        "8",
        "--seq-len",
        "1",
    )
    assert done.returncode == 2
    assert "out of memory on CPU with batch 8 x seq 1" in done.stderr
    for knob in ("--batch-size", "--seq-len", "--ac-coverage"):
        assert knob in done.stderr
    assert "Traceback" not in done.stderr
    assert not out.exists()


@pytest.mark.slow
def test_out_of_memory_while_building_names_the_knobs_too(tmp_path):
    """init_weights after to_empty runs out of memory: the same one message, real sizes."""
    out = tmp_path / "run"
    done = run_cli(
        "capture",
        *("--model", "tests.models_for_tests:oom_in_init_weights", "--nproc-per-node", "1"),
        *("--out", str(out), "--batch-size", "6", "--seq-len", "5"),
    )
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("fsdp-trace")]
    assert len(lines) == 1
    assert lines[0].startswith(
        "fsdp-trace capture: error: rank 0: out of memory on CPU with batch 6 x seq 5: "
        "lower --batch-size or --seq-len"
    )
    assert "Traceback" not in done.stderr
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "nosuchpreset"], "neither a preset"),
        (
            ["--model", "tests.models_for_tests:not_a_spec", "--batch-size", "1", "--seq-len", "1"],
            "must return a ModelSpec",
        ),
        (["--ac-coverage", "1.5"], "--ac-coverage must be a fraction"),
        (["--reshard-after-forward", "maybe"], "--reshard-after-forward must be"),
        (["--dtype", "fp8"], "--dtype must be one of"),
        (["--nproc-per-node", "-1"], "--nproc-per-node must be at least 1, not -1"),
        (["--nproc-per-node", "0"], "--nproc-per-node must be at least 1, not 0"),
        (["--nnodes", "abc"], "--nnodes must be a node count like 2 or a range MIN:MAX"),
        (["--nnodes", "3:2"], "--nnodes 3:2: need 1 <= MIN <= MAX"),
        (["--nnodes", "2", "--node-rank", "2"], "--node-rank must be in [0, 2), not 2"),
        (["--timeout-s", "0"], "--timeout-s must be at least 1 second, not 0"),
        (["--model", "tests.models_for_tests:two_layer"], "pass --batch-size and --seq-len"),
        (
            ["--model", "tests.models_for_tests:two_layer", "--batch-size", "2"],
            "your own factory: pass --seq-len (",
        ),
    ],
)
def test_bad_knobs_get_one_line(tmp_path, args, message):
    done = run_cli("capture", "--out", str(tmp_path / "run"), "--nproc-per-node", "1", *args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("fsdp-trace capture: error: ")
    assert not (tmp_path / "run").exists()


def test_version():
    done = run_cli("--version")
    assert done.returncode == 0 and done.stdout.startswith("fsdp-trace ")


@pytest.mark.slow
def test_capture_output_is_the_phase_bars_and_the_files_written_never_usdt(tmp_path):
    """With the progress bars on (piped: each bar's last state), stderr holds one bar per
    phase with its own count, the line naming what was written, and none of PyTorch's
    `USDT: ... profiler_start` lines (torch 2.13 writes one at every profiler start/stop)."""
    out = tmp_path / "run"
    done = run_cli(
        "capture",
        "--nproc-per-node",
        "2",
        "--out",
        str(out),
        "--warmup-steps",
        "2",
        "--timing-steps",
        "3",
        "--timed-steps",
        "4",
        env={"FSDP_TRACE_QUIET": "0"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "USDT" not in done.stderr and "profiler_st" not in done.stderr
    bars = {line.split()[0]: line.split()[2] for line in done.stderr.splitlines() if "━" in line}
    assert bars == {"warmup": "2/2", "detailed": "1/1", "timing": "3/3", "timed": "4/4"}
    assert "after 1 profiler warmup step" in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"fsdp-trace capture: wrote {out} (run.json and 4 traces)"
    )
    # rank 0's summary of a CPU run: no scaling figure, and why its timing means little
    assert "not meaningful for scaling" in done.stdout
