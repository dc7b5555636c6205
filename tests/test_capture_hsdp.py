"""`--hsdp R` and `--root-reshard-after-forward` end to end on CPU/gloo: real captures, checked
by reading the trace JSON directly (gzip + json, no analysis code)."""

from __future__ import annotations

import gzip
import json
import shlex
from pathlib import Path

import pytest

from fsdp_trace.capture.config import CaptureConfig, hsdp_shape, parse_root_reshard
from fsdp_trace.capture.parallelize import mesh_record
from fsdp_trace.errors import UserError
from tests.conftest import run_cli

BLOCKS = [f"layers.{i}" for i in range(4)]
FAST = ("--warmup-steps", "1", "--timing-steps", "2", "--timed-steps", "2")
# init_device_mesh("cpu", (2, 2)) lays ranks out row-major: [[0, 1], [2, 3]].
SHARD_GROUPS = {0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3]}
REPLICATE_GROUPS = {0: [0, 2], 1: [1, 3], 2: [0, 2], 3: [1, 3]}


def load(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def spans(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"]


def inside(event: dict, outer: dict) -> bool:
    """`event` lies within `outer` on the same thread."""
    return (
        event["tid"] == outer["tid"]
        and outer["ts"] <= event["ts"]
        and event["ts"] + event["dur"] <= outer["ts"] + outer["dur"]
    )


def enclosing(event: dict, events: list[dict], prefix: str) -> list[str]:
    """Names of the spans starting with `prefix` that enclose `event` (itself excluded)."""
    return [
        e["name"]
        for e in events
        if e is not event and e["name"].startswith(prefix) and inside(event, e)
    ]


def capture(out: Path, *args: str) -> Path:
    done = run_cli("capture", "--model", "tiny", "--out", str(out), *FAST, *args)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def hsdp_run(tmp_path_factory) -> Path:
    """4 CPU processes, 2 replicas x 2 shards; the root keeps FSDP2's default reshard."""
    out = tmp_path_factory.mktemp("hsdp") / "run"
    return capture(out, "--nproc-per-node", "4", "--hsdp", "2")


@pytest.fixture(scope="module")
def root_reshard_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("root") / "run"
    return capture(out, "--nproc-per-node", "2", "--root-reshard-after-forward", "true")


# --- HSDP -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_hsdp_run_json_records_the_mesh(hsdp_run):
    run = json.loads((hsdp_run / "run.json").read_text())
    assert run["config"]["hsdp"] == 2
    assert run["parallel"]["mesh"] == {
        "kind": "hsdp",
        "replicate": 2,
        "shard": 2,
        "dim_names": ["replicate", "shard"],
    }
    assert run["world"]["world_size"] == 4
    assert run["parallel"]["reshard_after_forward"]["root"] == "default"
    assert run["command"] == shlex.join(
        [
            *("fsdp-trace", "capture", "--model", "tiny", "--nproc-per-node", "4"),
            *("--out", str(hsdp_run), "--hsdp", "2"),
            *("--warmup-steps", "1", "--timing-steps", "2", "--timed-steps", "2"),
        ]
    )
    assert run["files"]["timing"] == [f"rank{r}.timing.json.gz" for r in range(4)]


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1, 2, 3])
def test_hsdp_process_groups_in_distributed_info(hsdp_run, rank):
    info = load(hsdp_run / f"rank{rank}.timing.json.gz")["distributedInfo"]
    assert (info["rank"], info["world_size"], info["backend"]) == (rank, 4, "gloo")
    groups = {g["pg_desc"]: g for g in info["pg_config"]}
    # Each rank lists only the groups it belongs to: the world, its shard and replicate groups.
    assert set(groups) == {"default_pg", "mesh_shard", "mesh_replicate"}
    assert groups["default_pg"]["ranks"] == [0, 1, 2, 3]
    assert groups["mesh_shard"]["pg_size"] == 2
    assert groups["mesh_shard"]["ranks"] == SHARD_GROUPS[rank]
    assert groups["mesh_replicate"]["pg_size"] == 2
    assert groups["mesh_replicate"]["ranks"] == REPLICATE_GROUPS[rank]


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 3])
def test_hsdp_all_gathers_in_fsdp_all_gather_labels(hsdp_run, rank):
    events = spans(load(hsdp_run / f"rank{rank}.timing.json.gz"))
    calls = [e for e in events if e["name"] == "c10d::_allgather_base_"]
    # Every unit twice per step (forward, backward) except the root (forward only): 4*2+1.
    assert len(calls) == 2 * (2 * len(BLOCKS) + 1)
    for call in calls:
        assert enclosing(call, events, "FSDP::all_gather"), call
    labels = {e["name"] for e in events}
    for block in BLOCKS:
        assert f"FSDP::all_gather ({block})" in labels
    gathers = [e for e in events if e["name"] == "gloo:all_gather"]
    assert len(gathers) == len(calls)


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 3])
def test_hsdp_all_reduce_in_post_backward_reduce(hsdp_run, rank):
    events = spans(load(hsdp_run / f"rank{rank}.timing.json.gz"))
    reduces = [e for e in events if e["name"] == "c10d::allreduce_"]
    scatters = [e for e in events if e["name"] == "c10d::_reduce_scatter_base_"]
    # One all-reduce (replicate group) after each reduce-scatter (shard group): every unit,
    # root included, once per step.
    assert len(reduces) == len(scatters) == 2 * (len(BLOCKS) + 1)
    for call in [*reduces, *scatters]:
        assert enclosing(call, events, "FSDP::post_backward_reduce"), call
    labels = [n for e in reduces for n in enclosing(e, events, "FSDP::post_backward_reduce")]
    assert {f"FSDP::post_backward_reduce ({b})" for b in BLOCKS} <= set(labels)
    # On gloo the collectives run on each process group's own `pt_gloo_runloop` threads, and a
    # reduce-scatter runs as gloo:all_reduce: the replicate group's threads are those that run
    # no all-gather, and exactly the all-reduces run there.
    gloo = [e for e in events if e["name"].startswith("gloo:")]
    shard_threads = {e["tid"] for e in gloo if e["name"] == "gloo:all_gather"}
    replicate = sorted(e["ts"] for e in gloo if e["tid"] not in shard_threads)
    assert {e["name"] for e in gloo if e["tid"] not in shard_threads} == {"gloo:all_reduce"}
    assert len(replicate) == len(reduces)
    # Each gloo op starts after its c10d call: the k-th to start, after the k-th call.
    issued = sorted(e["ts"] for e in reduces)
    assert all(run >= call for run, call in zip(replicate, issued, strict=True))
    on_shard = [e for e in gloo if e["tid"] in shard_threads and e["name"] == "gloo:all_reduce"]
    assert len(on_shard) == len(scatters)


# --- the root's reshard_after_forward ---------------------------------------------------------


def root_gathers_per_step(run: Path, rank: int) -> list[list[str]]:
    """Per ProfilerStep, the FSDP label right around each of the root's all-gathers (the root's
    path is "", so its labels carry no suffix)."""
    events = spans(load(run / f"rank{rank}.timing.json.gz"))
    steps = sorted(
        (e for e in events if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"]
    )
    result = []
    for step in steps:
        gathers = [e for e in events if e["name"] == "FSDP::all_gather" and inside(e, step)]
        result.append(
            sorted(
                n
                for g in gathers
                for n in enclosing(g, events, "FSDP::pre_")
                if n in ("FSDP::pre_forward", "FSDP::pre_backward")
            )
        )
    return result


@pytest.mark.slow
@pytest.mark.parametrize("rank", [0, 1])
def test_root_reshard_true_gathers_the_root_twice_per_step(root_reshard_run, rank):
    per_step = root_gathers_per_step(root_reshard_run, rank)
    assert len(per_step) == 2
    assert per_step == [["FSDP::pre_backward", "FSDP::pre_forward"]] * 2
    run = json.loads((root_reshard_run / "run.json").read_text())
    assert run["config"]["root_reshard_after_forward"] is True
    assert run["parallel"]["reshard_after_forward"]["root"] is True
    assert run["parallel"]["mesh"] == {"kind": "fsdp", "shard": 2}
    assert "--root-reshard-after-forward true" in run["command"]


@pytest.mark.slow
def test_root_default_gathers_the_root_once_per_step(hsdp_run):
    assert root_gathers_per_step(hsdp_run, 0) == [["FSDP::pre_forward"]] * 2


# --- bad values -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--hsdp", "0"), "--hsdp must be a replica count of at least 1, not 0"),
        (
            ("--hsdp", "3"),
            "--hsdp 3 does not divide the world size 2: pass --hsdp 1 or 2",
        ),
        (
            ("--root-reshard-after-forward", "maybe"),
            "--root-reshard-after-forward must be default, true or false, not 'maybe'",
        ),
    ],
)
def test_bad_values_fail_in_one_line(tmp_path, args, expected):
    out = tmp_path / "run"
    done = run_cli("capture", "--model", "tiny", "--nproc-per-node", "2", "--out", str(out), *args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("fsdp-trace capture: error: ") and expected in lines[0]
    assert "Traceback" not in done.stderr
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_config_parsing_and_recorded_options():
    assert parse_root_reshard("default") == "default"
    assert parse_root_reshard("TRUE") is True and parse_root_reshard("false") is False
    with pytest.raises(UserError):
        parse_root_reshard("1")
    assert hsdp_shape(1, 8) == (1, 8) and hsdp_shape(2, 8) == (2, 4) and hsdp_shape(8, 8) == (8, 1)
    with pytest.raises(UserError, match="pass --hsdp 1, 2, 3 or 6"):
        hsdp_shape(4, 6)
    assert mesh_record(1, 4) == {"kind": "fsdp", "shard": 4}
    cfg = CaptureConfig(hsdp=2, root_reshard_after_forward="false").validate()
    assert cfg.changed_knobs() == ["--hsdp", "2", "--root-reshard-after-forward", "false"]
    args = cfg.to_cli_args()
    assert args[args.index("--hsdp") + 1] == "2"
    assert args[args.index("--root-reshard-after-forward") + 1] == "false"
    assert CaptureConfig().validate().changed_knobs() == []
    assert "default" in CaptureConfig().validate().to_cli_args()


def test_the_recorded_command_round_trips_through_the_cli(monkeypatch):
    """What the launcher replays to every rank, and run.json's command, rebuild the config."""
    from typer.testing import CliRunner

    import fsdp_trace.capture.launcher as launcher
    from fsdp_trace import cli

    cfg = CaptureConfig(hsdp=4, root_reshard_after_forward="true", out="r").validate()
    seen: dict = {}
    monkeypatch.setattr(launcher, "launch", lambda c, n, r: seen.setdefault("cfgs", []).append(c))
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    for args in (cfg.to_cli_args(), shlex.split(cfg.capture_command(8))[2:]):
        result = CliRunner().invoke(cli.app, ["capture", *args])
        assert result.exit_code == 0, result.output
    assert [c.to_dict() for c in seen["cfgs"]] == [cfg.to_dict()] * 2
