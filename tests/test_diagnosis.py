"""Diagnosis: each rule fires on a trace that shows its problem and stays silent on a healthy
one (real captures in sample_traces/, and synthetic FSDP2 steps from tests/fsdp_sim.py whose
numbers are chosen here); causes come first, costliest first, with the symptoms they explain
folded under them; costs are checked against computations made in the test."""

from __future__ import annotations

import json
import shutil
from functools import cache

import numpy as np
import pytest

from fsdp_trace import analyze
from fsdp_trace.diagnose import RULES
from fsdp_trace.diagnose.rules import communication, host, settings
from tests.conftest import SAMPLES
from tests.fsdp_sim import Sim

DIAG = SAMPLES / "diagnosis"


@cache
def run(path: str):
    return analyze(SAMPLES / path).only


def found(path: str) -> set[str]:
    return run(path).diagnosis.rules()


def get(path: str, rule: str):
    finding = run(path).diagnosis.get(rule)
    assert finding is not None, f"{rule} silent on {path}"
    return finding


def simulate(tmp_path, sim: Sim, run_json: dict | None = None, name: str = "sim"):
    sim.write(tmp_path / name, run_json)
    target = tmp_path / name if run_json is not None else sorted((tmp_path / name).glob("*.json"))
    return analyze(target, cache=False).only


def healthy() -> Sim:
    """A well-overlapped step: gathers much shorter than the compute that hides them, a small
    last reduce-scatter, no host gaps."""
    return Sim(blocks=6, bwd_us=3000.0, ag_us=200.0, rs_us=60.0, root_rs_us=60.0, root_ag_us=100.0)


# rule, a trace that shows the problem, traces where it must stay silent
CASES = [
    ("host-bound", "diagnosis/host-bound", ["diagnosis/gpt-1.3b-b4-2gpu"]),
    ("straggler", "diagnosis/straggler", ["diagnosis/gpt-1.3b-b4-2gpu"]),
    ("profiler-distortion", "gpt-small-2gpu", ["gpt-small-2gpu-fullac"]),
    (
        "first-allgather-exposed",
        "diagnosis/p2p-disabled",
        ["diagnosis/tuned-b16", "gpt-small-2gpu"],
    ),
    ("last-unit-regathered", "diagnosis/p2p-disabled", ["diagnosis/tuned-b16", "gpt-small-2gpu"]),
    ("reduction-tail", "diagnosis/p2p-disabled", ["diagnosis/tuned-b16", "gpt-small-2gpu"]),
    (
        "communication-bound",
        "diagnosis/comm-bound",
        ["gpt-small-2gpu", "diagnosis/gpt-1.3b-b4-2gpu"],
    ),
    ("low-bus-bandwidth", "diagnosis/p2p-disabled", ["gpt-small-2gpu"]),
    ("gradient-accumulation", "diagnosis/grad-accum", ["gpt-small-2gpu"]),
    ("max-connections-1", "diagnosis/max-connections-1", ["gpt-small-2gpu"]),
    ("ac-over-applied", "gpt-small-2gpu-fullac", ["gpt-small-2gpu"]),
    (
        "overlap-tax",
        "diagnosis/gpt-1.3b-b4-2gpu",
        ["diagnosis/max-connections-1", "gpt-small-2gpu"],
    ),
    ("root-resharded", "cpu-root-reshard", ["cpu-gloo-2proc", "gpt-small-2gpu"]),
    # set-ups fsdp-trace did not capture itself (tests/test_setups.py has more)
    ("one-unit", "foreign-2gpu/fsdp2-root-only", ["foreign-2gpu/fsdp2", "gpt-small-2gpu"]),
    ("cpu-offload", "foreign-2gpu/fsdp2-offload", ["foreign-2gpu/fsdp2", "gpt-small-2gpu"]),
    ("float8-uncompiled", "foreign-2gpu/float8", ["foreign-2gpu/fsdp2", "gpt-small-2gpu"]),
    ("ddp-allreduce", "foreign-2gpu/ddp", ["foreign-2gpu/fsdp2", "gpt-small-2gpu"]),
    ("fsdp1", "foreign-2gpu/fsdp1", ["foreign-2gpu/fsdp2", "foreign-2gpu/ddp"]),
]
# Rules shown on synthetic steps only (no shipped capture has the problem): the test named.
SYNTHETIC = {
    "redundant-collectives": "test_redundant_gathers_fire_only_beyond_the_configuration",
    "shard-group-crosses-nodes": "test_a_shard_group_larger_than_a_node",
    "hsdp-allreduce": "test_a_costly_symptom_never_hides_under_a_minor_cause",
}


@pytest.mark.parametrize(("rule", "shows", "silent"), CASES, ids=[c[0] for c in CASES])
def test_rule_fires_where_the_problem_is_and_only_there(rule, shows, silent):
    finding = get(shows, rule)
    for other in silent:
        assert rule not in found(other), f"{rule} fired on {other}"
    assert any(ch.isdigit() for ch in finding.evidence)  # what it saw, with numbers
    assert finding.cause and finding.why and finding.change.text
    assert finding.kind != "cause" or finding.cost_us >= 0


def test_every_rule_is_shown_its_problem_somewhere():
    assert {c[0] for c in CASES} | set(SYNTHETIC) == set(RULES)


def test_a_healthy_step_says_so(tmp_path):
    result = simulate(tmp_path, healthy())
    assert result.diagnosis.healthy and result.diagnosis.findings == []
    assert result.diagnosis.verdict.startswith("healthy")


# --- the order: causes first, each with the symptoms it explains -------------------------------

ORDER = {
    # rule ids in output order, and what each top-level cause folds under it
    "gpt-small-2gpu": [("host-bound", {"straggler"}), ("profiler-distortion", set())],
    "diagnosis/p2p-disabled": [
        (
            "low-bus-bandwidth",
            {
                "reduction-tail",
                "first-allgather-exposed",
                "communication-bound",
                "last-unit-regathered",
            },
        ),
        ("host-bound", {"straggler"}),
    ],
    # the host idles under the profiler only (run.json's un-profiled step): a note
    "gpt-small-2gpu-fullac": [("ac-over-applied", set()), ("host-bound", {"straggler"})],
    # no-sync's saving is within this noisy run's spread: minor
    "diagnosis/grad-accum": [("host-bound", {"straggler"})],
    "diagnosis/max-connections-1": [("host-bound", {"straggler"}), ("max-connections-1", set())],
    "diagnosis/gpt-1.3b-b4-2gpu": [("overlap-tax", set())],
}


@pytest.mark.parametrize("path", list(ORDER))
def test_findings_come_in_the_order_to_act_on_them(path):
    findings = run(path).diagnosis.findings
    assert [(f.rule, {s.rule for s in f.symptoms}) for f in findings] == ORDER[path]
    assert [f.number for f in findings] == list(range(1, len(findings) + 1))
    causes = [f for f in findings if f.kind == "cause"]
    assert [f.cost_us for f in causes] == sorted((f.cost_us for f in causes), reverse=True)
    assert all(f.cost_pct >= 1.0 for f in causes)  # below 1 % of the step: minor
    for f in run(path).diagnosis.minor:
        assert f.cost_pct < 1.0 or (f.saving is not None and f.saving.within_noise)


def test_the_host_bound_rank_explains_its_peers_waiting():
    """gpt-small-2gpu: rank 0's GPU idles 25 % of the profiled step and rank 1 waits for it
    inside NCCL kernels; the un-profiled step (run.json) is shorter by more than that idle
    can lose to the threshold: host-bound only under the profiler, a note, with the
    straggler (rank 1's waiting, the same host seen from its peer) folded under it; the run
    is healthy. On diagnosis/straggler (a host sleeping 15 ms a step) it stays a cause,
    costed at the host time rank 1 takes beyond rank 0's (tests/test_hostside.py checks it
    against the ProfilerStep spans), within the idle the un-profiled step keeps."""
    result = run("gpt-small-2gpu")
    first = result.findings[0]
    assert first.rule == "host-bound" and first.ranks == [0] and first.kind == "measurement"
    idle = result.ranks[0].steps["idle_us"].median()
    assert first.metrics["idle_us"] == pytest.approx(idle)
    unprofiled = result.run.figures.step_time_ms.median * 1e3
    profiled = float(np.median([r.steps["step_us"].median() for r in result.ranks]))
    assert idle - (profiled - unprofiled) < host.HOST_IDLE * unprofiled
    (symptom,) = first.symptoms
    assert symptom.rule == "straggler" and symptom.ranks == [0]
    assert result.diagnosis.healthy and result.diagnosis.verdict.startswith("healthy")
    sleeping = run("diagnosis/straggler")
    cause = sleeping.findings[0]
    assert cause.rule == "host-bound" and cause.kind == "cause" and cause.ranks == [1]
    idle = sleeping.rank_breakdown(sleeping.ranks[1])["idle_us"]
    stats = sleeping.run.figures.step_time_ms.median * 1e3
    extra = float(np.median([r.steps["step_us"].median() for r in sleeping.ranks])) - stats
    hosts = {int(r.rank): r.host_time.host_us for r in sleeping.ranks}
    assert cause.cost_us == pytest.approx(min(hosts[1] - hosts[0], idle - min(extra, idle)))
    assert "spends 13." in cause.evidence and "than its peers' (median) on Python" in cause.evidence


def test_a_slow_gpu_is_a_straggler_of_its_own(tmp_path):
    """Rank 1 computes 30 % longer than rank 0 (its GPU, not its host: no idle): it arrives
    last, rank 0 waits; the straggler is the cause, named as a slow GPU."""
    sim = healthy()
    sim.slow[1] = 1.3
    result = simulate(tmp_path, sim)
    first = result.findings[0]
    assert first.rule == "straggler" and first.ranks == [1] and first.metrics["slow_gpu"]
    assert "host-bound" not in result.diagnosis.rules()
    assert "computes 30% (" in first.cause and first.title == "Slow GPU: rank 1"
    # The kernels that account for it: each name's compute per step, rank 1 minus rank 0.
    per = {
        r.rank: r.kernels[r.kernels["kind"] == "compute"].groupby("name")["dur"].sum()
        / len(r.steps)
        for r in result.ranks
    }
    extra = (per[1] - per[0].reindex(per[1].index, fill_value=0)).sort_values(ascending=False)
    top = extra.index[0]
    assert f"{top[:60]} +{extra.iloc[0] / 1e3:.2f} ms" in first.evidence
    # Its cost: what the step would lose if rank 1's GPU were as fast as rank 0's — the same
    # simulation without the slow GPU — more than rank 0's exposed waiting alone.
    unslowed = simulate(tmp_path / "unslowed", healthy(), name="unslowed")
    saved = float(
        np.median([r.steps["step_us"].median() for r in result.ranks])
        - np.median([r.steps["step_us"].median() for r in unslowed.ranks])
    )
    wait = result.ranks[0].steps["exposed_wait_us"].median()
    assert first.cost_us == pytest.approx(saved, rel=0.05) and first.cost_us > wait
    assert not unslowed.findings or unslowed.findings[0].rule != "straggler"


def test_a_slow_gpu_whose_peers_hide_their_waiting():
    """Real 2× H200 captures (benchmarks/gpu_runs_foreign.sh with the GPU-bound EXTRA): rank 1
    runs 6 extra matmuls per block. Its peer's waiting is hidden behind compute (exposed 3 %),
    yet every step is longer, by the straggler's extra kernel time: the slow GPU leads, costed
    by that time, which the same set-up without the extra work measures as the step saved.
    The set-up without it stays silent on stragglers."""
    slow = run("foreign-2gpu-big/slow-gpu")
    first = slow.findings[0]
    assert first.rule == "straggler" and first.ranks == [1] and first.metrics["slow_gpu"]
    assert first.metrics["wait_us_per_step"] < host.STRAGGLER_WAIT * first.step_us
    per = {
        r.rank: r.load_kernels().query("kind == 'compute'").groupby("name")["dur"].sum()
        / len(r.steps)
        for r in slow.ranks
    }
    extra = (per[1] - per[0].reindex(per[1].index, fill_value=0)).clip(lower=0)
    # (a rank keeps its 50 costliest kernel names: a name beyond rank 0's 50 counts 0 there)
    kept = extra.index.isin(list(slow.ranks[1].kernel_time))
    assert first.cost_us == pytest.approx(extra[kept].sum(), rel=1e-3)
    healthy_run = run("foreign-2gpu-big/fsdp2")
    step = {
        name: float(np.median([r.steps["step_us"].median() for r in res.ranks]))
        for name, res in (("slow", slow), ("healthy", healthy_run))
    }
    assert first.cost_us == pytest.approx(step["slow"] - step["healthy"], rel=0.2)
    assert "straggler" not in healthy_run.diagnosis.rules()


def test_one_late_host_is_host_bound_not_a_straggler(tmp_path):
    sim = healthy()
    sim.delay[1] = 8000.0  # rank 1's host starts each step 8 ms late
    result = simulate(tmp_path, sim)
    first = result.findings[0]
    assert first.rule == "host-bound" and first.ranks == [1]
    # Rank 0 waits for it at the step's first collective: the waiting is this cause's.
    wait = result.ranks[0].steps["exposed_wait_us"].median()
    assert wait > 7000 and first.metrics["peers_wait_us"] == pytest.approx(wait)
    assert "straggler" not in [f.rule for f in result.findings]


# --- rules and their defects, one by one -------------------------------------------------------


def test_root_resharded_is_the_setting_not_a_redundancy(tmp_path):
    """A root gathered in forward and again in backward: reshard_after_forward=True on the
    root (from the trace or run.json), costed at the backward gather's exposed transfer, with
    FSDP2's default for the root as the change; never 'redundant all-gathers'."""
    for path in ("cpu-root-reshard",):
        assert "root-resharded" in found(path) and "redundant-collectives" not in found(path)
    sim = healthy()
    sim.root_reshard = True
    sim.root_ag_us = 900.0  # a large root (embeddings and head)
    result = simulate(tmp_path, sim)
    finding = result.diagnosis.get("root-resharded")
    assert "redundant-collectives" not in result.diagnosis.rules()
    assert finding.change.code == "fully_shard(model, reshard_after_forward=False)"
    assert finding.change.cli == "--root-reshard-after-forward false"
    c = result.ranks[0].collectives
    again = c[
        (c["block"] == "root") & (c["phase"] == "backward") & (c["collective"] == "AllGather")
    ]
    assert finding.measured_us == pytest.approx(again["exposed_transfer_us"].sum() / 3)  # 3 steps
    assert finding.measured_us > 0.5 * 900.0  # at the start of backward nothing hides it
    assert result.config.reshards("root") is True
    assert result.config.unit("root").reshard_after_forward.source == "trace"


def test_redundant_gathers_fire_only_beyond_the_configuration(tmp_path):
    """Three gathers of every block per step where the reshard setting implies two (as
    reentrant checkpointing gives): redundant. Gradient accumulation is not redundancy: two
    micro-batches gather each block four times, which the configuration implies."""
    sim = healthy()
    sim.micro_batches = 2
    accum = simulate(tmp_path, sim, name="accum")
    assert accum.config.micro_batches.value == 2 and accum.config.micro_batches.source == "trace"
    assert "redundant-collectives" not in accum.diagnosis.rules()
    blocks = accum.ranks[0].blocks
    ag = blocks[(blocks["collective"] == "AllGather") & (blocks["block"] == "layers.0")]
    assert (ag["unit_count_per_step"] == 4).all() and (ag["expected_per_step"] == 4).all()
    # A third gather per micro-batch: the synthetic step issues layers.1's twice in backward.
    paths = healthy().write(tmp_path / "extra")
    for path in paths:
        doc = json.loads(path.read_text())
        events = doc["traceEvents"]
        gathers = [
            e for e in events if e["name"] == "FSDP::all_gather (layers.1)" and e["tid"] != 100
        ]
        kernels = {e["args"].get("correlation"): e for e in events if e.get("cat") == "kernel"}
        launches = [e for e in events if e.get("cat") == "cuda_runtime"]
        for label in gathers:  # copy each backward gather of layers.1 (label, launch, kernel)
            launch = next(
                x for x in launches if label["ts"] <= x["ts"] <= label["ts"] + label["dur"]
            )
            kernel = kernels[launch["args"]["correlation"]]
            corr = 10_000_000 + launch["args"]["correlation"]
            events.append({**label, "ts": label["ts"] + 10})
            events.append({**launch, "ts": launch["ts"] + 10, "args": {"correlation": corr}})
            events.append(
                {**kernel, "ts": kernel["ts"] + 5, "args": {**kernel["args"], "correlation": corr}}
            )
        path.write_text(json.dumps(doc))
    extra = analyze(paths, cache=False).only
    finding = extra.diagnosis.get("redundant-collectives")
    assert finding is not None and finding.blocks == ["layers.1"]
    assert finding.metrics["count"] == 3 and finding.metrics["expected"] == 2


def test_gradient_accumulation_without_run_json(tmp_path):
    """grad-accum's traces alone: the micro-batches come from the trace (root forwards per
    step), and the finding is gradient accumulation's, not redundant all-gathers."""
    folder = tmp_path / "bare"
    folder.mkdir()
    for trace in (DIAG / "grad-accum").glob("rank*.timing.json.gz"):
        shutil.copy(trace, folder / trace.name)
    result = analyze(folder).only
    assert result.config.micro_batches.value == 2 and result.config.micro_batches.source == "trace"
    rules = result.diagnosis.rules()
    assert "gradient-accumulation" in rules and "redundant-collectives" not in rules
    finding = result.diagnosis.get("gradient-accumulation")
    assert finding.metrics["gathers_per_step"] == 4 and finding.metrics["reductions_per_step"] == 2
    assert finding.change.cli == "--accum-no-sync"
    assert "set_requires_gradient_sync" in finding.change.code


def test_gradient_accumulation_with_no_sync_does_not_suggest_it_again():
    finding = get("diagnosis/grad-accum", "gradient-accumulation")
    assert finding.change.cli == "--accum-no-sync"
    assert "gradient sync is already limited" not in finding.cause


def test_communication_bound_counts_recompute_as_compute(tmp_path):
    """Backward gathers hide behind the unit's backward compute and its recomputation; a run
    that already checkpoints every bound block is not advised to checkpoint."""
    sim = Sim(blocks=6, fwd_us=200.0, bwd_us=350.0, ag_us=500.0, rs_us=60.0, root_rs_us=60.0)
    plain = simulate(tmp_path, sim, name="plain")
    finding = plain.diagnosis.get("communication-bound")
    assert finding is not None and "--ac-coverage" in finding.change.cli
    sim.checkpointed = set(range(6))
    ckpt = simulate(tmp_path, sim, name="ckpt")
    blocks = ckpt.ranks[0].blocks
    back = blocks[(blocks["phase"] == "backward") & (blocks["collective"] == "AllGather")]
    assert (back["recompute_us_per_step"] == 200.0).all()  # counted beside the compute
    bound = ckpt.diagnosis.get("communication-bound")
    if bound is not None:  # forward gathers stay bound; advice must not repeat AC
        assert "--ac-coverage" not in bound.change.cli
        assert "backward" not in {b for b in bound.metrics["worst"].split()}


def test_ac_over_applied_and_its_silence_where_recompute_hides_gathers(tmp_path):
    """fullac: every block recomputes ~1 ms while its 2.3 ms of backward compute alone hides
    the 0.3 ms gather it overlaps: the recompute is pure cost, named per block. A run whose
    backward gathers need the recompute to hide behind stays silent."""
    finding = get("gpt-small-2gpu-fullac", "ac-over-applied")
    result = run("gpt-small-2gpu-fullac")
    per_rank = []
    for r in result.ranks:
        b = r.blocks[(r.blocks["phase"] == "backward")].drop_duplicates("block")
        per_rank.append(b.set_index("block")["recompute_us_per_step"].dropna())
    expected = sum(np.median([p[u] for p in per_rank]) for u in finding.blocks)
    assert finding.measured_us == pytest.approx(expected)
    assert len(finding.blocks) == 8 and finding.change.cli == "--ac-coverage 0.00"
    assert "peak memory 7.4 of 140 GiB" in finding.evidence  # run.json's memory headroom
    # Backward compute (0.4 ms) shorter than the gather it overlaps (0.9 ms): the recompute
    # is what hides it, so those blocks are not named. layers.0, backward's last block, has
    # no gather left to hide: its recompute is pure cost even here.
    sim = Sim(blocks=6, fwd_us=800.0, bwd_us=400.0, ag_us=900.0, rs_us=60.0, root_rs_us=60.0)
    sim.checkpointed = set(range(6))
    needed = simulate(tmp_path, sim)
    assert needed.diagnosis.get("ac-over-applied").blocks == ["layers.0"]
    sim.checkpointed = set(range(1, 6))
    assert "ac-over-applied" not in simulate(tmp_path, sim, name="rest").diagnosis.rules()


def test_reduction_tail_includes_hsdp_all_reduce(tmp_path):
    """HSDP: after each unit's reduce-scatter, an all-reduce across the replicas. The tail at
    the end of backward is measured over both; the verdict names the mesh."""
    sim = Sim(ranks=4, blocks=4, bwd_us=2000.0, rs_us=60.0, root_rs_us=60.0, ar_us=1500.0)
    sim.hsdp_replicas = 2
    result = simulate(tmp_path, sim)
    assert result.config.mesh.value.describe() == "HSDP, 2 replicas × 2 shards"
    tail = result.diagnosis.get("reduction-tail")
    assert tail is not None and tail.metrics["all_reduce_us"] > 1000
    assert "HSDP's all-reduce across the 2 replicas" in tail.evidence
    c = result.ranks[0].collectives
    ar = c[c["collective"] == "AllReduce"]
    assert (ar["group_size"] == 2).all() and (
        c.loc[c["collective"] == "AllGather", "group_size"] == 2
    ).all()
    assert (ar["phase"] == "backward").all() and ar["block"].notna().all()


def test_a_shard_group_larger_than_a_node(tmp_path):
    """run.json says 1 GPU per node, the gathers run over 2 ranks: every block's traffic
    crosses nodes; the change is HSDP with the shard group inside a node."""
    sim = healthy()
    sim.ag_us = 2500.0
    record = {"world": {"world_size": 2, "local_world_size": 1, "nnodes": 2}}
    crossing = simulate(tmp_path, sim, record, name="two-nodes")
    finding = crossing.diagnosis.get("shard-group-crosses-nodes")
    assert finding is not None and finding.change.cli == "--hsdp 2"
    assert "init_device_mesh" in finding.change.code
    one_node = {"world": {"world_size": 2, "local_world_size": 2, "nnodes": 1}}
    assert (
        "shard-group-crosses-nodes"
        not in simulate(tmp_path, sim, one_node, name="one").diagnosis.rules()
    )


def test_low_bandwidth_assumes_nvlink_only_on_one_node(tmp_path):
    """Without run.json a known SXM part counts as NVLink only when the world fits the GPUs
    the trace lists; across nodes the floor for an unknown link applies."""
    sim = healthy()
    sim.ag_us = 3000.0  # 50 MB in 3 ms: ~8 GB/s busbw
    one = simulate(tmp_path, sim, name="one")
    low = one.diagnosis.get("low-bus-bandwidth")
    assert low is not None and low.metrics["assumed"] and low.metrics["topology"] == "nvlink"
    sim.world_size = 16  # these two ranks are part of a 16-rank job: not one node's GPUs
    many = simulate(tmp_path, sim, name="many")
    finding = many.diagnosis.get("low-bus-bandwidth")
    assert finding is None or finding.metrics["topology"] != "nvlink"
    assert communication.NVLINK_PARTS.search("NVIDIA H100 80GB HBM3")
    assert not communication.NVLINK_PARTS.search("NVIDIA H100 PCIe")


def test_low_bandwidth_reads_the_topology_and_excludes_all_reduces():
    finding = get("diagnosis/p2p-disabled", "low-bus-bandwidth")
    assert "NCCL_P2P_DISABLE=1" in finding.cause and not finding.metrics["assumed"]
    assert finding.metrics["busbw_gbps"] == pytest.approx(24.5, abs=0.5)


def test_max_connections_needs_run_json():
    files = sorted((DIAG / "max-connections-1").glob("rank*.timing.json.gz"))
    assert "max-connections-1" not in analyze(files).only.diagnosis.rules()
    assert get("diagnosis/max-connections-1", "max-connections-1").change.code == (
        "unset CUDA_DEVICE_MAX_CONNECTIONS"
    )


def test_profiler_distortion_is_about_the_measurement():
    finding = get("gpt-small-2gpu", "profiler-distortion")
    assert finding.kind == "measurement" and finding.cost_us == 0.0
    assert finding.metrics["slowdown_pct"] == pytest.approx(62.1, abs=0.2)
    assert run("gpt-small-2gpu").findings[-1] is finding  # after the causes


def test_detailed_traces_never_feed_timing_rules(tmp_path):
    """Rules read the timing traces; the detailed ones (profiler overhead) only attribution
    and distortion. With only timing traces the same causes are found at the same cost."""
    full = run("gpt-small-2gpu")
    lean = analyze(SAMPLES / "gpt-small-2gpu", detailed=False).only
    causes = [(f.rule, f.cost_us) for f in full.findings if f.kind == "cause"]
    assert causes == [(f.rule, f.cost_us) for f in lean.findings if f.kind == "cause"]


def test_advice_never_names_a_knob_the_run_already_set(tmp_path):
    """tuned-b16 set --shard-embeddings and --keep-last-unsharded: no rule suggests them."""
    for f in run("diagnosis/tuned-b16").diagnosis.all():
        assert "--shard-embeddings" not in f.change.cli
        assert "--keep-last-unsharded" not in f.change.cli
    plain = get("foreign-2gpu/fsdp2", "host-bound")  # not compiled: its host's largest use
    largest = plain.metrics["largest"]
    assert largest == max(plain.metrics["host"], key=plain.metrics["host"].get)
    assert plain.change.text.startswith(host.HOST_ADVICE[largest][0])


def test_thresholds_are_named_where_the_rule_is():
    assert host.HOST_IDLE == 0.20 and communication.TAIL_EXPOSED == 0.02
    assert settings.AC_HIDES == 1.0


# --- what the review of the first version found -------------------------------------------------


def test_a_costly_symptom_never_hides_under_a_minor_cause(tmp_path):
    """HSDP, slow replicate all-reduce at the end of backward, a link only just below its
    floor: the all-reduce across replicas is the cause to act on (the reduction tail, mostly
    that all-reduce, folded under it), never under a minor bandwidth finding (which measures
    all-gathers and reduce-scatters, not the all-reduce). Silent without HSDP."""
    sim = Sim(ranks=4, blocks=4, bwd_us=2000.0, rs_us=60.0, root_rs_us=60.0, ar_us=4000.0)
    sim.hsdp_replicas = 2
    result = simulate(tmp_path, sim)
    assert not result.diagnosis.healthy
    first = result.findings[0]
    assert first.rule == "hsdp-allreduce"
    tail = next(s for s in first.symptoms if s.rule == "reduction-tail")
    assert tail.metrics["all_reduce_us"] > 3000
    c = result.ranks[0].collectives
    ar = c[(c["collective"] == "AllReduce") & (c["phase"] == "backward")]
    per_step = ar.groupby("step")["exposed_us"].sum()
    assert first.metrics["exposed_us"] <= float(per_step.median()) + 1e-6
    for f in result.diagnosis.minor:
        assert not f.symptoms
    plain = simulate(tmp_path, healthy(), name="plain")
    assert "hsdp-allreduce" not in plain.diagnosis.rules()


def test_one_ranks_trace_alone_gives_upper_bounds(tmp_path):
    """Rank 1's trace without rank 0's: its NCCL kernels include waiting for rank 0 that
    nothing can tell apart, so communication costs are upper bounds (inferred), said so."""
    alone = analyze(SAMPLES / "gpt-small-2gpu" / "rank1.timing.json.gz").only
    comm = [f for f in alone.diagnosis.all() if RULES[f.rule].communication]
    assert comm and all(f.upper_bound and f.basis == "inferred" for f in comm)
    assert all("an upper bound" in f.evidence for f in comm)
    assert any("matched no other rank's trace" in n for n in alone.notices)
    if alone.findings and alone.findings[0].upper_bound:
        assert "up to" in alone.diagnosis.verdict


def test_cpu_findings_are_structural_not_costed():
    run_ = run("cpu-root-reshard")
    finding = run_.diagnosis.get("root-resharded")
    assert finding in run_.findings and not finding.costed  # shown, with its change
    assert finding.change.code == "fully_shard(model, reshard_after_forward=False)"
    from fsdp_trace.present.view import run_view

    view = run_view(run_)
    assert "(timing is not measured on CPU)" in view.diagnosis_heading
    shown = next(f for f in view.findings if f.rule == "root-resharded")
    assert shown.cost == "not costed (CPU trace: no GPU timing)"
    assert run_.diagnosis.verdict.startswith("not measured")


def test_one_rank_idling_far_more_than_its_peers_points_at_its_host():
    """straggler: rank 1's host sleeps 15 ms a step, its host taking longer than rank 0's on
    every step. The cause is rank 1's host (look there first), not launch overhead in
    general; the trace has no DataLoader events, so the advice names none. The tiny model
    (both hosts about as long) is a launch-bound step."""
    first = run("diagnosis/straggler").findings[0]
    assert first.rule == "host-bound" and first.ranks == [1] and first.metrics["imbalanced"]
    assert first.change.text.startswith("look at rank 1's host first")
    assert "DataLoader" not in first.change.text + first.change.code
    balanced = run("diagnosis/host-bound").findings[0]  # a tiny model: the host is the limit
    assert "look at rank" not in balanced.change.text and not balanced.metrics["imbalanced"]


def test_a_backward_all_reduce_that_is_not_hsdp(tmp_path):
    """All-reduces over 2 ranks in backward beside all-gathers over 2, in a job of 8 ranks:
    2 × 2 ≠ 8, so it is not HSDP (e.g. tensor parallelism); named, not taken for replicas."""
    sim = Sim(ranks=4, blocks=2, bwd_us=2000.0)
    sim.hsdp_replicas = 2
    sim.world_size = 8
    mesh = simulate(tmp_path, sim).config.mesh.value
    assert mesh.kind == "fsdp" and mesh.shard == 2
    assert any("all-reduce over 2 ranks" in g for g in mesh.other_groups)


def test_the_verdict_the_cards_and_the_table_say_one_number():
    """grad-accum rank 1: the finding's measured cost, the idle card and the breakdown table
    all read the rank's median step; the verdict's cost is what its change buys, the figure
    `fsdp-trace whatif --set` prints for it."""
    from fsdp_trace.present.view import run_view

    run_ = run("diagnosis/grad-accum")
    view = run_view(run_)
    first = run_.findings[0]
    worst = run_.ranks[first.metrics["rank"]]
    b = run_.rank_breakdown(worst)
    unprofiled = run_.run.figures.step_time_ms.median * 1e3
    profiled = float(np.median([r.steps["step_us"].median() for r in run_.ranks]))
    profiler = min(max(0.0, profiled - unprofiled), b["idle_us"])
    assert first.measured_us == pytest.approx(b["idle_us"] - profiler)
    card = next(c for c in view.cards if c.key == "idle_pct")
    assert card.value == f"{100 * b['idle_us'] / b['step_us']:.1f} %"
    assert f"{first.metrics['idle_pct']:.1f} %" in card.value
    assert first.saving is not None and first.saving.knobs in run_.diagnosis.verdict
    assert f"{first.cost_pct:.1f} %" in run_.diagnosis.verdict
