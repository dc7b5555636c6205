"""The facade: `fsdp_trace.analyze` owns the pipeline and returns one typed result; the
configuration it infers from traces alone; the terminal, the JSON and the HTML report say the
same headline numbers; the package's import structure."""

from __future__ import annotations

import ast
import html
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import fsdp_trace
from fsdp_trace.present.configuration import config_lines
from fsdp_trace.present.view import run_view
from fsdp_trace.result import SeveralRuns
from tests.conftest import REPO, SAMPLES, run_cli
from tests.synth import TraceBuilder


def timing_files(path: str) -> list[Path]:
    return sorted((SAMPLES / path).glob("rank*.timing.json.gz"))


# --- the configuration inferred from the trace --------------------------------------------------

# sample → what its traces alone say (its run.json says the same: the capture's own knobs)
INFERRED = {
    "cpu-hsdp-2x2": {"mesh": "HSDP, 2 replicas × 2 shards", "micro": 1, "ckpt": [], "root": False},
    "cpu-fullac": {
        "mesh": "FSDP over 2 ranks",
        "micro": 1,
        "ckpt": ["layers.0", "layers.1", "layers.2", "layers.3"],
        "root": False,
    },
    "cpu-grad-accum": {"mesh": "FSDP over 2 ranks", "micro": 2, "ckpt": [], "root": False},
    "cpu-root-reshard": {"mesh": "FSDP over 2 ranks", "micro": 1, "ckpt": [], "root": True},
    "gpt-small-2gpu-fullac": {
        "mesh": "FSDP over 2 ranks",
        "micro": 1,
        "ckpt": [f"layers.{i}" for i in range(8)],
        "root": False,
    },
}


@pytest.mark.parametrize("path", list(INFERRED))
def test_configuration_from_the_traces_alone_matches_the_capture(path):
    want = INFERRED[path]
    bare = fsdp_trace.analyze(timing_files(path)).only
    config = bare.config
    assert bare.run is None
    assert config.mesh.value.describe() == want["mesh"] and config.mesh.source == "trace"
    assert config.micro_batches.value == want["micro"] and config.micro_batches.source == "trace"
    assert config.checkpointed.value == want["ckpt"] and config.checkpointed.source == "trace"
    assert config.reshards("root") is want["root"]
    assert all(config.reshards(b) is True for b in config.blocks)  # capture's default
    assert config.forward_prefetch.value == 0 and config.backward_prefetch.value == 1
    assert config.compiled.value is False
    # With run.json: the same values, from run.json, and no disagreement.
    full = fsdp_trace.analyze(SAMPLES / path).only
    assert full.config.micro_batches.value == want["micro"]
    assert full.config.micro_batches.source == "run.json"
    assert full.config.checkpointed.value == want["ckpt"]
    assert full.config.reshards("root") is want["root"]
    assert full.config.notices == []


def test_the_world_and_run_json_say_the_same_mesh():
    run = fsdp_trace.analyze(SAMPLES / "cpu-hsdp-2x2").only
    mesh = run.config.mesh.value
    assert (mesh.kind, mesh.replicate, mesh.shard) == ("hsdp", 2, 2)
    assert run.run.parallel.mesh.kind == "hsdp"
    assert run.diagnosis.verdict  # a verdict is always there
    lines = dict((label, value) for label, value, _ in config_lines(run.config))
    assert lines["mesh"] == "HSDP, 2 replicas × 2 shards"


def test_a_disagreement_with_run_json_is_a_notice():
    """The Accelerate-like run wraps its blocks in checkpoint_wrapper inside its own factory,
    so run.json records no activation checkpointing; the traces show every block
    recomputing. Recompute is a fact: both count, and the notice says they differ."""
    run = fsdp_trace.analyze(SAMPLES / "cpu-accelerate-like").only
    assert run.config.checkpointed.value == [f"model.layers.{i}" for i in range(4)]
    assert run.config.checkpointed.source == "run.json + trace"
    (notice,) = run.config.notices
    assert "recompute run.json does not record: model.layers.0" in notice
    assert notice in run_view(run).notices
    bare = fsdp_trace.analyze(timing_files("cpu-accelerate-like")).only
    assert len(bare.config.checkpointed.value) == 4


def test_traces_without_fsdp_labels_say_attribution_failed(tmp_path):
    """FSDP1 (or labels lost): every collective is unattributed; a notice says why."""
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.kernel("gemm", 100, 200, launch_ts=5)
    b.nccl("AllGather", 150, 100, launch_ts=6)
    run = fsdp_trace.analyze(b.write(tmp_path / "rank0.json"), cache=False).only
    assert (run.collectives["block"] == "unattributed").all()
    assert any("no FSDP2 labels in the traces" in n for n in run.notices)
    assert run.config.labels is False


def test_group_size_never_falls_back_to_the_world(tmp_path):
    """A kernel without `Group size` whose process group is in pg_config gets that group's
    size; one whose group is unknown gets no bus bandwidth and a notice."""
    b = TraceBuilder(world_size=8)
    b.step(1, 0, 1000)
    b.label("FSDP::all_gather (layers.0)", 5, 5)
    b.nccl("AllGather", 150, 100, launch_ts=6)
    b.label("FSDP::all_gather (layers.1)", 15, 5)
    b.nccl("AllGather", 350, 100, launch_ts=16)
    doc = b.document()
    kernels = [e for e in doc["traceEvents"] if "Collective name" in e["args"]]
    for kernel, group in zip(kernels, ("shard", "mystery"), strict=True):
        del kernel["args"]["Group size"]
        kernel["args"]["Process Group Name"] = group
    doc["distributedInfo"]["pg_config"] = [{"pg_name": "shard", "pg_size": 2, "ranks": [0, 1]}]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(doc))
    run = fsdp_trace.analyze(path, cache=False).only
    c = run.collectives.set_index("block")
    assert c.loc["layers.0", "group_size"] == 2 and c.loc["layers.0", "busbw_gbps"] > 0
    assert c.loc["layers.1", "group_size"] != c.loc["layers.1", "group_size"]  # NaN
    assert c.loc["layers.1", "busbw_gbps"] != c.loc["layers.1", "busbw_gbps"]
    assert any("bus bandwidth is left empty" in n for n in run_view(run).notices)


# --- one result, several runs -------------------------------------------------------------------


def test_two_runs_passed_together_stay_two_runs():
    """gpt-small-2gpu and its 1-GPU baseline: two runs, each with its own cross-rank view and
    its own detailed-vs-timing comparison (+62 %, not one run's detailed step against the
    other's timing steps)."""
    result = fsdp_trace.analyze([SAMPLES / "gpt-small-2gpu", SAMPLES / "gpt-small-1gpu"])
    assert [r.name for r in result.runs] == ["gpt-small-2gpu", "gpt-small-1gpu"]
    two, one = result.runs
    assert not two.crossrank.empty and one.crossrank.empty
    assert max(d["slowdown_pct"] for d in two.distortion()) == pytest.approx(62.1, abs=0.2)
    assert result.grouping.startswith("6 files → 2 runs: gpt-small-2gpu (capture run")
    with pytest.raises(SeveralRuns, match=r"pick one from result\.runs"):
        _ = result.findings
    payload = result.to_json()
    assert [r["name"] for r in payload["runs"]] == ["gpt-small-2gpu", "gpt-small-1gpu"]


# --- every front end says the same -----------------------------------------------------------


def test_facade_json_terminal_and_report_agree(tmp_path):
    """One analysis, three renderings: the verdict, the per-rank cards, the breakdown, the
    findings, the inferred configuration and the notices are the same numbers everywhere."""
    result = fsdp_trace.analyze(SAMPLES / "gpt-small-2gpu")
    run = result.only
    view = run_view(run)
    done = run_cli(
        "analyze",
        str(SAMPLES / "gpt-small-2gpu"),
        "--json",
        str(tmp_path / "a.json"),
        "--report",
        str(tmp_path / "r.html"),
    )
    assert done.returncode == 0, done.stderr
    data = json.loads((tmp_path / "a.json").read_text())
    # (the page's cells come in pieces: a number's may break before its parenthesis)
    page = html.unescape(
        re.sub(r'<span class="nw">|</span>', "", (tmp_path / "r.html").read_text())
    )
    terminal = done.stdout
    # The verdict.
    assert data["verdict"] == run.diagnosis.verdict
    assert run.diagnosis.verdict in page and run.diagnosis.verdict in terminal
    # Per-rank breakdown: the facade's numbers in the JSON, and the view's text on the page.
    for r, entry in zip(run.ranks, data["ranks"], strict=True):
        assert entry["breakdown"] == pytest.approx(run.rank_breakdown(r))
    for row in view.breakdown.rows:
        for cell in row[2:]:
            assert cell in page
    for bar in view.bars:
        for text in bar.text.values():
            assert text.replace(" ms", "") in terminal
    # The cards: per rank, never one median pooled over ranks.
    for card in view.cards:
        assert card.value in page and card.value in terminal
    assert "11.1 %" not in page and "11.1 %" not in terminal
    # Findings: the same causes, costs and order.
    assert [f["rule"] for f in data["findings"]] == [f.rule for f in run.findings]
    for f, entry in zip(run.findings, data["findings"], strict=True):
        assert entry["cost_us"] == pytest.approx(f.cost_us)
        assert f.title in page and f.title in terminal
    for fv in view.findings:
        if fv.cost:
            assert fv.cost in page and fv.cost in terminal
    # The inferred configuration.
    assert data["config"]["mesh"]["value"]["description"] == run.config.mesh.value.describe()
    for _label, value, _source in view.config:
        assert value in page
    # Notices: the same list in all three.
    assert data["notices"] == view.notices
    for notice in view.notices:
        assert notice in page
        assert re.sub(r"\s+", " ", notice)[:60] in re.sub(r"\s+", " ", terminal)


# --- the package's structure ----------------------------------------------------------------


def _imports(path: Path) -> set[str]:
    """Modules a file imports, at the top or inside functions."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_analysis_never_imports_capture_and_has_no_cycles():
    package = REPO / "fsdp_trace"
    graph = {}
    for path in package.rglob("*.py"):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        graph[module] = {m for m in _imports(path) if m.startswith("fsdp_trace")}
    for module, deps in graph.items():
        if module.startswith("fsdp_trace.analysis"):
            assert not any(d.startswith("fsdp_trace.capture") for d in deps), module
    for a, b in (
        ("fsdp_trace.analysis.read.cache", "fsdp_trace.analysis.read.loader"),
        ("fsdp_trace.analysis.rank.analyze", "fsdp_trace.analysis.rank.cpu_collectives"),
    ):
        both = (b in graph[a] or any(d.startswith(b + ".") for d in graph[a])) and (
            a in graph[b] or any(d.startswith(a + ".") for d in graph[b])
        )
        assert not both, f"{a} and {b} import each other"


def test_capture_side_stays_importable_without_analysis_libraries():
    """capture's summary and the run record use the standard library only."""
    for name in ("runrecord.py", "present/headline.py", "fmt.py", "capture/summary.py"):
        heavy = {m.split(".")[0] for m in _imports(REPO / "fsdp_trace" / name)}
        assert not heavy & {"pandas", "numpy", "plotly", "msgspec", "perfetto"}, name


def test_the_suite_never_writes_into_the_users_cache():
    """conftest points the cache (and HOME) into the session's tmp folder for every test and
    every process a test starts."""
    import os

    from fsdp_trace.analysis.read import cache

    assert str(cache.directory()).startswith(os.environ["FSDP_TRACE_CACHE_DIR"])
    assert not str(cache.directory()).startswith(os.path.expanduser("~user"))
    assert "pytest" in os.environ["HOME"] or "tmp" in os.environ["HOME"]


@pytest.mark.parametrize("sample", ["cpu-root-reshard", "gpt-small-1gpu", "gpt-small-2gpu"])
def test_the_diagnosis_heading_counts_what_is_numbered_below_it(sample):
    """Causes and notes on the measurement are counted apart, and together they are the
    numbered findings."""
    import re

    from fsdp_trace.present.view import diagnosis_heading

    run = fsdp_trace.analyze(SAMPLES / sample).only
    heading = diagnosis_heading(run)
    counts = [int(n) for n in re.findall(r"(\d+) (?:cause|finding|note)", heading)]
    assert sum(counts) == len(run.diagnosis.findings), heading


# --- the API says what the views say --------------------------------------------------------


def test_the_api_notices_are_the_views_notices():
    """`result.notices` and `run.notices` hold every notice the terminal, the report and
    to_json() show (run.json's, the run's, each trace's), from one source: the API once
    returned [] where the CLI showed three."""
    result = fsdp_trace.analyze(SAMPLES / "gpt-small-2gpu")
    run = result.only
    shown = run_view(run).notices
    assert len(shown) >= 3 and any(n.startswith("rank 1: ") for n in shown), shown
    assert run.notices == shown
    assert result.notices == shown == result.to_json()["notices"]
    # Several runs: the result's own (about the inputs) apart, each run's with the run.
    both = fsdp_trace.analyze([SAMPLES / "gpt-small-2gpu", SAMPLES / "gpt-small-1gpu"])
    data = both.to_json()
    assert both.notices == data["notices"]
    for run, entry in zip(both.runs, data["runs"], strict=True):
        assert run.notices == entry["notices"] == run_view(run).notices


def test_a_runs_tables_are_joined_once_while_held_and_each_reader_gets_its_own_copy():
    run = fsdp_trace.analyze(SAMPLES / "gpt-small-2gpu").runs[0]
    expected = pd.concat([r.collectives for r in run.ranks + run.detailed], ignore_index=True)
    with run.tables_held():
        first = run.collectives
        pd.testing.assert_frame_equal(first, expected[first.columns], check_exact=True)
        first["dur_us"] = -1.0  # a reader changing its copy changes no one else's
        again = run.collectives
        assert again is not first and (again["dur_us"] >= 0).all()
        assert run._joined["collectives"][1] is not again  # joined once, copied per read
        rank = run.ranks[0]  # a trace's table replaced: the join follows it
        rank.collectives = rank.collectives.assign(dur_us=rank.collectives["dur_us"] * 2)
        doubled = run.collectives
        mine = (doubled["rank"] == rank.rank) & (doubled["source"] == rank.source)
        assert np.array_equal(
            doubled.loc[mine, "dur_us"].to_numpy(), rank.collectives["dur_us"].to_numpy()
        )
        assert len(run.steps) == sum(len(r.steps) for r in run.ranks + run.detailed)
    assert run._joined == {}  # nothing held after
    rank.collectives["dur_us"] = 0.0  # outside, a change in place shows at the next read
    assert (run.collectives.loc[mine, "dur_us"] == 0.0).all()
