"""Traces as users have them, grouped right: torchtitan's profile folders, tensorboard_trace_
handler / Hugging Face Accelerate names (the rank only inside the trace), timing_/detailed_
names, a folder of several run folders, plain export_chrome_trace files, two runs passed
together. Files are copies of the shipped captures under other names and folders."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

import fsdp_trace
from tests.conftest import SAMPLES, run_cli

SMALL = SAMPLES / "gpt-small-2gpu"
STRAGGLER = SAMPLES / "diagnosis" / "straggler"
MAXCONN = SAMPLES / "diagnosis" / "max-connections-1"


def copy(src: Path, dst: Path, unzip: bool = False) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if unzip:
        dst.write_bytes(gzip.decompress(src.read_bytes()))
    else:
        shutil.copy(src, dst)
    return dst


def shape(result) -> list[tuple[str, list, list]]:
    return [
        (
            run.name,
            [(r.rank, r.source) for r in run.ranks],
            [(r.rank, r.source) for r in run.detailed],
        )
        for run in result.runs
    ]


def test_torchtitan_profile_folders(tmp_path):
    """profile_traces/iteration_N/rankK_trace.json: each iteration a run of its own (other
    steps of the same job), each with its own cross-rank view."""
    root = tmp_path / "profile_traces"
    for it, src in (("iteration_10", STRAGGLER), ("iteration_20", MAXCONN)):
        for rank in (0, 1):
            copy(src / f"rank{rank}.timing.json.gz", root / it / f"rank{rank}_trace.json", True)
    result = fsdp_trace.analyze(root, cache=False)
    assert shape(result) == [
        ("iteration_10", [(0, "trace"), (1, "trace")], []),
        ("iteration_20", [(0, "trace"), (1, "trace")], []),
    ]
    assert all(not run.crossrank.empty for run in result.runs)
    assert result.grouping.startswith("4 files → 2 runs: iteration_10 (traces, ranks 0–1")


def test_tensorboard_names_carry_no_rank(tmp_path):
    """host_pid.<n>.pt.trace.json.gz: the rank comes from distributedInfo; the detailed
    traces (record_shapes + with_stack) pair with the lean ones of the same ranks."""
    folder = tmp_path / "tb"
    names = {}
    for i, (phase, rank) in enumerate(
        [("timing", 0), ("timing", 1), ("detailed", 0), ("detailed", 1)]
    ):
        name = f"node{rank}_{4000 + 7 * i}.{1700000000000 + i}.pt.trace.json.gz"
        names[name] = (phase, rank)
        copy(SMALL / f"rank{rank}.{phase}.json.gz", folder / name)
    result = fsdp_trace.analyze(folder, cache=False)
    assert shape(result) == [
        ("tb", [(0, "trace"), (1, "trace")], [(0, "detailed"), (1, "detailed")]),
    ]
    run = result.only
    # The detailed step is compared with its own run's timing steps: +62 % on rank 0.
    assert max(d["slowdown_pct"] for d in run.distortion()) == pytest.approx(62.1, abs=0.2)


def test_timing_and_detailed_names(tmp_path):
    folder = tmp_path / "mine"
    for rank in (0, 1):
        copy(SMALL / f"rank{rank}.timing.json.gz", folder / f"timing_rank{rank}.json.gz")
        copy(SMALL / f"rank{rank}.detailed.json.gz", folder / f"detailed_rank{rank}.json.gz")
    assert shape(fsdp_trace.analyze(folder, cache=False)) == [
        ("mine", [(0, "trace"), (1, "trace")], [(0, "detailed"), (1, "detailed")]),
    ]


def test_a_folder_of_run_folders(tmp_path):
    """A parent of several capture runs (each with run.json), and a run without run.json."""
    parent = tmp_path / "experiments"
    for name, src in (("a", SMALL), ("b", SAMPLES / "gpt-small-1gpu")):
        shutil.copytree(src, parent / name)
    for rank in (0, 1):
        copy(STRAGGLER / f"rank{rank}.timing.json.gz", parent / "c" / f"rank{rank}.json.gz")
    result = fsdp_trace.analyze(parent, cache=False)
    assert [r.name for r in result.runs] == ["a", "b", "c"]
    assert [r.run is not None for r in result.runs] == [True, True, False]
    assert [len(r.ranks) for r in result.runs] == [2, 1, 2]


def test_plain_export_chrome_trace_files(tmp_path):
    """export_chrome_trace(path): any name, one file per rank, passed one by one."""
    files = [
        copy(SMALL / f"rank{rank}.timing.json.gz", tmp_path / f"trace-{rank}.json", True)
        for rank in (1, 0)
    ]
    result = fsdp_trace.analyze(files, cache=False)
    assert shape(result) == [(tmp_path.name, [(0, "trace"), (1, "trace")], [])]


def test_two_runs_in_one_folder_are_two_runs(tmp_path):
    """Two jobs' traces side by side in one folder, under names that say nothing: told apart
    by time, each rank once per run."""
    folder = tmp_path / "mixed"
    for i, (src, rank) in enumerate([(STRAGGLER, 0), (MAXCONN, 1), (MAXCONN, 0), (STRAGGLER, 1)]):
        copy(src / f"rank{rank}.timing.json.gz", folder / f"t{i}.json.gz")
    result = fsdp_trace.analyze(folder, cache=False)
    assert len(result.runs) == 2 and all(len(r.ranks) == 2 for r in result.runs)
    paths = [sorted(Path(r.path).name for r in run.ranks) for run in result.runs]
    assert paths == [["t0.json.gz", "t3.json.gz"], ["t1.json.gz", "t2.json.gz"]]
    assert all(not run.crossrank.empty for run in result.runs)
    done = run_cli("analyze", str(folder), "--no-cache", "--no-report")
    assert done.returncode == 0, done.stderr
    assert "4 files → 2 runs" in done.stdout and "Runs side by side" in done.stdout


def test_different_jobs_never_mix(tmp_path):
    """The 2-rank run and a 1-rank run given together, as files: two runs, even though both
    have a rank 0."""
    files = [SMALL / "rank0.timing.json.gz", SMALL / "rank1.timing.json.gz"]
    files.append(SAMPLES / "gpt-small-1gpu" / "rank0.timing.json.gz")
    result = fsdp_trace.analyze(files, cache=False)
    assert [len(r.ranks) for r in result.runs] == [2, 1]
    assert result.runs[1].config.mesh.value.kind == "single"


def test_unit_names_drop_wrapper_segments_and_keep_the_raw_path():
    """Accelerate's units are `model.layers.N._checkpoint_wrapped_module`: shown as
    `model.layers.N` everywhere, raw in the JSON's configuration."""
    run = fsdp_trace.analyze(SAMPLES / "cpu-accelerate-like", cache=False).only
    assert set(run.collectives["block"]) == {"root", *(f"model.layers.{i}" for i in range(4))}
    units = {u.name: u.raw for u in run.config.units}
    assert units["model.layers.0"] == "model.layers.0._checkpoint_wrapped_module"
    payload = run.to_json()
    assert payload["config"]["units"][0]["raw"] == "model.layers.0._checkpoint_wrapped_module"
    from fsdp_trace.analysis.rank.context import display_name

    assert display_name("module._orig_mod.layers.3") == "layers.3"
    assert display_name("_fsdp_wrapped_module.layers.3, norm") == "layers.3, norm"
    assert display_name("module") == "module"


def test_another_format_is_one_registered_reader(tmp_path, monkeypatch):
    """The reader registry: a reader for bzip2-compressed Kineto JSON (one function and one
    registration) makes `.json.bz2` files analyzable like any other."""
    import bz2

    from fsdp_trace.analysis.read import readers
    from fsdp_trace.analysis.read.loader import load_trace

    def bz2_reader(path, **options):
        plain = tmp_path / (Path(path).name.removesuffix(".bz2"))
        plain.write_bytes(bz2.decompress(Path(path).read_bytes()))
        trace = load_trace(plain, **options)
        trace.path = str(path)
        return trace

    monkeypatch.setattr(readers, "READERS", list(readers.READERS))
    readers.register(readers.Reader("bzip2 Kineto JSON", (".json.bz2",), bz2_reader))
    folder = tmp_path / "bz"
    folder.mkdir()
    for rank in (0, 1):
        raw = gzip.decompress((SMALL / f"rank{rank}.timing.json.gz").read_bytes())
        (folder / f"rank{rank}.json.bz2").write_bytes(bz2.compress(raw))
    run = fsdp_trace.analyze(folder, cache=False).only
    reference = fsdp_trace.analyze(
        sorted(SMALL.glob("rank*.timing.json.gz")), cache=False
    ).only  # the same traces, without run.json
    assert run.diagnosis.verdict == reference.diagnosis.verdict
    assert run.steps["exposed_us"].tolist() == reference.steps["exposed_us"].tolist()
