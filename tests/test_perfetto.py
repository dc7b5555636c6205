"""The annotated Perfetto view (`write_perfetto`) and the server behind `fsdp-trace view`.

Written traces are decoded back with perfetto's own protos and checked as trace processor
would read them: descriptors before use, balanced and ordered slices per track, interning."""

from __future__ import annotations

import itertools
import socket
import threading
import urllib.error
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pytest
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TracePacket, TrackEvent

from fsdp_trace import analyze
from fsdp_trace.analysis import classify
from fsdp_trace.analysis.read.loader import load_trace
from fsdp_trace.errors import UserError
from fsdp_trace.render.perfetto import ranks as pf
from fsdp_trace.render.perfetto import write_perfetto
from fsdp_trace.render.perfetto.wire import to_ns
from fsdp_trace.view import UI_ORIGIN, TraceServer, port_warning, serve, ui_url
from tests.conftest import free_port
from tests.synth import AUTOGRAD, TraceBuilder

SAMPLE = Path(__file__).resolve().parent.parent / "sample_traces" / "gpt-small-2gpu"


@dataclass
class Slice:
    track: int
    name: str
    category: str
    ts: int
    end: int
    depth: int
    args: dict[str, Any]
    flows: list[int]
    terminating: list[int]


@dataclass
class Decoded:
    tracks: dict[int, Any] = field(default_factory=dict)  # uuid -> TrackDescriptor
    slices: list[Slice] = field(default_factory=list)
    counters: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    backwards: int = 0  # events whose timestamp is below an earlier event's, file-wide

    def process_of(self, uuid: int) -> str:
        """Name of the process track above `uuid`."""
        d = self.tracks[uuid]
        while not d.HasField("process"):
            d = self.tracks[d.parent_uuid]
        return d.process.process_name

    def by_process(self, category: str) -> dict[str, list[Slice]]:
        out: dict[str, list[Slice]] = defaultdict(list)
        for s in self.slices:
            if s.category == category:
                out[self.process_of(s.track)].append(s)
        return out

    def track_names(self, process: str) -> list[str]:
        return [
            d.name
            for u, d in self.tracks.items()
            if not d.HasField("process") and self.process_of(u) == process
        ]


def decode(path: Path) -> Decoded:
    """Parse a written trace and check the rules trace processor relies on."""
    trace = Trace.FromString(path.read_bytes())
    out = Decoded()
    tables: dict[str, dict[int, str]] = defaultdict(dict)
    stacks: dict[int, list[tuple[int, Any]]] = defaultdict(list)
    last_ts: dict[int, int] = {}
    last_event_ts = 0
    out.backwards = 0
    seq = None
    for i, p in enumerate(trace.packet):
        assert p.trusted_packet_sequence_id != 0
        seq = seq or p.trusted_packet_sequence_id
        assert p.trusted_packet_sequence_id == seq, "one writer, one sequence"
        if i == 0:
            assert p.sequence_flags & TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
        if p.HasField("interned_data"):
            for table in ("event_names", "event_categories", "debug_annotation_names"):
                for entry in getattr(p.interned_data, table):
                    assert entry.iid not in tables[table], f"iid {entry.iid} reused in {table}"
                    tables[table][entry.iid] = entry.name
            for entry in p.interned_data.debug_annotation_string_values:
                assert entry.iid not in tables["strings"]
                tables["strings"][entry.iid] = entry.str.decode()
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            assert d.uuid != 0 and d.uuid not in out.tracks, f"track uuid {d.uuid} not unique"
            assert not d.HasField("parent_uuid") or d.parent_uuid in out.tracks
            out.tracks[d.uuid] = d
            continue
        if not p.HasField("track_event"):
            continue
        e = p.track_event
        assert e.track_uuid in out.tracks, f"packet {i}: track {e.track_uuid} used before declared"
        assert p.timestamp >= last_ts.get(e.track_uuid, 0), f"packet {i}: time goes back"
        last_ts[e.track_uuid] = p.timestamp
        out.backwards += p.timestamp < last_event_ts  # across the whole file (counted)
        last_event_ts = max(last_event_ts, p.timestamp)
        if e.type == TrackEvent.TYPE_SLICE_BEGIN:
            assert p.sequence_flags & TracePacket.SEQ_NEEDS_INCREMENTAL_STATE  # uses iids
            assert e.name_iid in tables["event_names"], f"packet {i}: name used before interned"
            assert all(c in tables["event_categories"] for c in e.category_iids)
            for a in e.debug_annotations:
                assert a.name_iid in tables["debug_annotation_names"]
                if a.WhichOneof("value") == "string_value_iid":
                    assert a.string_value_iid in tables["strings"]
            stacks[e.track_uuid].append((p.timestamp, e))
        elif e.type == TrackEvent.TYPE_SLICE_END:
            assert stacks[e.track_uuid], f"packet {i}: END without BEGIN"
            ts, b = stacks[e.track_uuid].pop()
            args = {}
            for a in b.debug_annotations:
                kind = a.WhichOneof("value")
                value = getattr(a, kind)
                args[tables["debug_annotation_names"][a.name_iid]] = (
                    tables["strings"][value] if kind == "string_value_iid" else value
                )
            out.slices.append(
                Slice(
                    track=e.track_uuid,
                    name=tables["event_names"][b.name_iid],
                    category=tables["event_categories"][b.category_iids[0]],
                    ts=ts,
                    end=p.timestamp,
                    depth=len(stacks[e.track_uuid]),
                    args=args,
                    flows=list(b.flow_ids),
                    terminating=list(b.terminating_flow_ids),
                )
            )
        elif e.type == TrackEvent.TYPE_COUNTER:
            assert out.tracks[e.track_uuid].HasField("counter"), "counter on a slice track"
            out.counters.setdefault(e.track_uuid, []).append((p.timestamp, e.double_counter_value))
        else:
            raise AssertionError(f"unexpected event type {e.type}")
    assert not any(stacks.values()), "unbalanced slices"
    return out


def check_flows(decoded: Decoded, n_expected: int) -> list[tuple[Slice, Slice]]:
    """Each flow: from one all-gather slice to one compute kernel of the same block, later."""
    sources = {f: s for s in decoded.slices for f in s.flows}
    targets = defaultdict(list)
    for s in decoded.slices:
        for f in s.terminating:
            targets[f].append(s)
    assert len(sources) == n_expected
    assert set(targets) == set(sources)
    pairs = []
    for f, src in sources.items():
        assert len(targets[f]) == 1
        dst = targets[f][0]
        assert src.category == pf.CAT_COLLECTIVE and src.name.startswith("AG ")
        assert dst.category == "kernel" and dst.args["kind"] == "compute"
        assert dst.args["block"] == src.args["block"]
        assert dst.ts >= src.ts
        assert decoded.process_of(src.track) == decoded.process_of(dst.track)
        pairs.append((src, dst))
    return pairs


@pytest.fixture(scope="module")
def sample():
    return analyze(SAMPLE, detailed=False)


@pytest.fixture(scope="module")
def sample_written(sample, tmp_path_factory):
    out = tmp_path_factory.mktemp("perfetto") / "sample.pftrace"
    summary = write_perfetto(sample, out)
    return out, summary, decode(out)


def test_sample_counts_match_the_analysis(sample, sample_written):
    out, summary, decoded = sample_written
    assert len(sample.ranks) == 2
    assert summary["ranks"] == 2 and summary["bytes"] == out.stat().st_size
    assert summary["tracks"] == len(decoded.tracks)
    collectives = decoded.by_process(pf.CAT_COLLECTIVE)
    exposed = decoded.by_process(pf.CAT_EXPOSED)
    for rank in sample.ranks:
        title = f"rank {rank.rank}"
        assert len(collectives[title]) == len(rank.collectives) > 0
        assert len(exposed[title]) == len(rank.exposed) > 0
        gpu = [
            s
            for s in decoded.slices
            if s.category in ("kernel", "gpu_memcpy", "gpu_memset")
            and decoded.process_of(s.track) == title
        ]
        assert len(gpu) == len(rank.kernels)
        # Exact ns timestamps, in analysis order.
        assert sorted(s.ts for s in collectives[title]) == sorted(
            to_ns(rank.collectives["start_us"].to_numpy()).tolist()
        )
        assert sorted(s.end for s in exposed[title]) == sorted(
            to_ns(rank.exposed["end_us"].to_numpy()).tolist()
        )
        # One counter value per step: the step's exposed µs, at the step's start.
        (counter,) = [
            u
            for u, d in decoded.tracks.items()
            if d.name == pf.COUNTER_TRACK and decoded.process_of(u) == title
        ]
        values = decoded.counters[counter]
        assert [ts for ts, _ in values] == to_ns(rank.steps["start_us"].to_numpy()).tolist()
        assert [v for _, v in values] == pytest.approx(rank.steps["exposed_us"].tolist())
        # Streams carry their role; CPU threads keep their Kineto names.
        names = decoded.track_names(title)
        for stream, role in rank.streams.items():
            assert f"stream {stream} ({role})" in names
        trace = load_trace(rank.path)
        kinds = classify.event_kinds(trace.events)
        is_cpu = np.isin(kinds, (classify.CPU_OP, classify.ANNOTATION))
        n_cpu = int(is_cpu.sum())
        threads = set(zip(trace.events["pid"][is_cpu], trace.events["tid"][is_cpu], strict=True))
        assert len(threads) >= 2  # the main thread and autograd's
        assert {trace.thread_names[t] for t in threads} <= set(names)
        cpu = [s for s in decoded.slices if s.category in ("cpu_op", "user_annotation")]
        assert sum(decoded.process_of(s.track) == title for s in cpu) == n_cpu
        assert summary["per_rank"][sample.ranks.index(rank)]["slices"]["cpu"] == n_cpu
    n_slices = {
        "gpu": sum(len(r.kernels) for r in sample.ranks),
        "collective": sum(len(r.collectives) for r in sample.ranks),
        "exposed": sum(len(r.exposed) for r in sample.ranks),
    }
    assert {k: summary["slices"][k] for k in n_slices} == n_slices
    assert sum(summary["slices"].values()) == len(decoded.slices)
    assert summary["counters"] == sum(len(r.steps) for r in sample.ranks)
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temp left


def test_sample_collective_slices_are_annotated(sample, sample_written):
    _, _, decoded = sample_written
    rank = sample.ranks[0]
    row = rank.collectives[rank.collectives["collective"] == "AllGather"].iloc[3]
    (s,) = [
        s for s in decoded.by_process(pf.CAT_COLLECTIVE)["rank 0"] if s.ts == to_ns(row["start_us"])
    ]
    check_collective_name(s.name, row)
    assert s.args["block"] == row["block"] and s.args["phase"] == row["phase"]
    assert s.args["bytes"] == int(row["bytes"])
    assert s.args["algbw_GBps"] == pytest.approx(row["algbw_gbps"])
    assert s.args["busbw_GBps"] == pytest.approx(row["busbw_gbps"])
    assert s.args["exposed_us"] == pytest.approx(row["exposed_us"])
    assert s.args["issued_by"] == row["issued_by"]
    assert s.args["prefetched"] is bool(row["prefetched"])
    rs = [s for s in decoded.by_process(pf.CAT_COLLECTIVE)["rank 0"] if s.name.startswith("RS ")]
    assert len(rs) == (rank.collectives["collective"] == "ReduceScatter").sum()
    # Every collective slice's name carries its figures, the hidden ones included.
    by_start = {int(to_ns(r["start_us"])): r for r in rank.collectives.to_dict("records")}
    slices = decoded.by_process(pf.CAT_COLLECTIVE)["rank 0"]
    for s in slices:
        check_collective_name(s.name, by_start[s.ts])
    assert any(s.name.endswith(" · hidden") for s in slices)
    assert any(s.name.endswith(" exposed") for s in slices)


def check_collective_name(name: str, row: dict) -> None:
    """'AG layers.2 fwd · 25.2 MB · 186 GB/s · 68 µs exposed' against the analysis' row."""
    short = {"AllGather": "AG", "ReduceScatter": "RS"}[row["collective"]]
    phase = {"forward": "fwd", "backward": "bwd"}.get(row["phase"], row["phase"])
    head, size, bandwidth, exposed = name.split(" · ")
    assert head == f"{short} {row['block']} {phase}"
    assert size.endswith(" MB") and float(size[:-3].replace(",", "")) == pytest.approx(
        row["bytes"] / 1e6, abs=0.05
    )
    assert bandwidth.endswith(" GB/s")
    assert float(bandwidth[:-5].replace(",", "")) == pytest.approx(row["busbw_gbps"], abs=0.5)
    if exposed == "hidden":
        assert row["exposed_us"] <= 0.05
        return
    value, unit, word = exposed.split(" ")
    assert word == "exposed"
    got_us = float(value) * (1e3 if unit == "ms" else 1.0)
    assert unit in ("ms", "µs")
    assert got_us == pytest.approx(row["exposed_us"], abs=5.0 if unit == "ms" else 0.5)


def test_events_are_in_timestamp_order_across_the_whole_file(sample_written):
    """Not only per track: the file's events never go back in time, although its tracks (and
    its two ranks) overlap in time, so a track-by-track file would."""
    _, _, decoded = sample_written
    assert decoded.backwards == 0
    spans: dict[int, tuple[int, int]] = {}
    for s in decoded.slices:
        lo, hi = spans.get(s.track, (s.ts, s.end))
        spans[s.track] = (min(lo, s.ts), max(hi, s.end))
    ordered = sorted(spans.values())
    overlapping = sum(b[0] < a[1] for a, b in itertools.pairwise(ordered))
    assert overlapping > 10  # written track by track, time would go back at least that often
    processes = {decoded.process_of(u) for u in spans}
    assert processes == {"rank 0", "rank 1"}


def test_sample_flows_link_all_gathers_to_their_compute(sample, sample_written):
    _, summary, decoded = sample_written
    pairs = check_flows(decoded, summary["flows"])
    n_ag = sum(int((r.collectives["collective"] == "AllGather").sum()) for r in sample.ranks)
    assert 0 < summary["flows"] <= n_ag
    # Each target is the first compute kernel of that block and phase after the all-gather.
    rank = sample.ranks[0]
    k = rank.kernels
    for src, dst in pairs:
        if decoded.process_of(src.track) != "rank 0":
            continue
        phases = pf.CONSUMER_PHASES[src.args["phase"]]
        later = k[
            (k["kind"] == "compute")
            & (k["block"] == src.args["block"])
            & k["phase"].isin(phases)
            & (k["ts"] * 1000 >= src.ts - 0.5)
        ]
        assert to_ns(later["ts"].min()) == dst.ts


def test_activation_checkpointing_links_backward_all_gathers_to_recompute(tmp_path):
    run = SAMPLE.parent / "gpt-small-2gpu-fullac"
    if not run.exists():
        pytest.skip("no full-AC sample")
    result = analyze(run, detailed=False)
    summary = write_perfetto(result, tmp_path / "ac.pftrace")
    pairs = check_flows(decode(tmp_path / "ac.pftrace"), summary["flows"])
    phases = {(src.args["phase"], dst.args["phase"]) for src, dst in pairs}
    assert phases == {("forward", "forward"), ("backward", "recompute")}


def synthetic(tmp_path: Path):
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.label("FSDP::pre_forward (layers.0)", 10, 50)
    b.label("FSDP::all_gather (layers.0)", 20, 30)
    b.nccl("AllGather", 100, 50, launch_ts=30)  # [100, 150]
    b.cpu("aten::mm", 65, 10)
    b.kernel("early_gemm", 60, 30, launch_ts=66)  # layers.0 forward, before the all-gather
    b.cpu("aten::mm", 80, 10)
    b.kernel("gemm", 160, 100, launch_ts=82)  # its consumer: [160, 260]
    b.kernel("overlapping", 250, 50, launch_ts=84)  # same stream, overlaps gemm: a 2nd lane
    b.label("FSDP::post_forward (layers.0)", 300, 10)
    b.cpu("aten::add", 400, 100)  # [400, 500]
    b.cpu("aten::mul", 450, 100)  # [450, 550]: does not nest, a 2nd lane
    b.label("FSDP::pre_backward (layers.1)", 590, 5, tid=AUTOGRAD)
    b.label("FSDP::all_gather (layers.1)", 591, 3, tid=AUTOGRAD)
    b.nccl("AllGather", 710, 60, launch_ts=592, launch_tid=AUTOGRAD)  # no consumer: no flow
    b.label("FSDP::post_backward_reduce (layers.0)", 600, 30, tid=AUTOGRAD)
    b.nccl("ReduceScatter", 700, 40, launch_ts=610, stream=21, launch_tid=AUTOGRAD)
    b.step(2, 1000, 500)
    b.kernel("gemm2", 1100, 100.0004, launch_ts=1010)
    return analyze(b.write(tmp_path / "rank0.json"))


def test_synthetic_lanes_flows_and_rounding(tmp_path):
    result = synthetic(tmp_path)
    rank = result.ranks[0]
    summary = write_perfetto(result, tmp_path / "out" / "syn.pftrace")
    decoded = decode(tmp_path / "out" / "syn.pftrace")
    assert summary["slices"] == {"gpu": 7, "collective": 3, "exposed": 2, "cpu": 12}
    names = decoded.track_names("rank 0")
    # Overlapping kernels (stream 7), CPU ops (main thread), collectives: one extra lane each.
    assert "stream 7 (compute) [2]" in names
    assert "thread 100 [2]" in names
    assert pf.COLLECTIVE_TRACK + " [2]" in names
    assert summary["lanes"] == 3
    (src, dst) = check_flows(decoded, 1)[0]
    assert src.name.startswith("AG layers.0 fwd · ")
    assert dst.name == "gemm" and dst.ts == 160_000
    unmatched = [s for s in decoded.slices if s.name.startswith("AG layers.1 bwd · ")]
    assert len(unmatched) == 1 and not unmatched[0].flows
    (gemm2,) = [s for s in decoded.slices if s.name == "gemm2"]
    assert (gemm2.ts, gemm2.end) == (1_100_000, 1_200_000)  # round(ts_us * 1000)
    exposed = sorted(s.name for s in decoded.slices if s.category == pf.CAT_EXPOSED)
    assert exposed == [
        "exposed AG layers.0 fwd",
        "exposed RS layers.0 bwd + AG layers.1 bwd",  # one interval, both running
    ]
    (counter,) = decoded.counters.values()
    assert [v for _, v in counter] == pytest.approx(rank.steps["exposed_us"].tolist())
    nested = [s for s in decoded.slices if s.name == "aten::mm"]
    assert [s.depth for s in nested] == [1, 1]  # inside ProfilerStep#1


def test_cpu_gloo_trace(tmp_path):
    """No GPU kernels: CPU threads and the CPU-side collectives, no streams, no NaN counters."""
    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.label("FSDP::pre_forward (layers.0)", 10, 50)
    b.label("FSDP::all_gather (layers.0)", 20, 30)
    b.cpu("c10d::_allgather_base_", 25, 5)
    b.label("gloo:all_gather", 26, 40, tid=300)
    b.cpu("aten::mm", 70, 100)
    result = analyze(b.write(tmp_path / "rank0.json"))
    assert result.ranks[0].device == "cpu"
    summary = write_perfetto(result, tmp_path / "cpu.pftrace")
    decoded = decode(tmp_path / "cpu.pftrace")
    assert summary["slices"] == {"gpu": 0, "cpu": 6, "collective": 1, "exposed": 0}
    # No size, bandwidth or exposure known for this synthetic gloo collective: name only.
    assert [s.name for s in decoded.slices if s.category == pf.CAT_COLLECTIVE] == [
        "AG layers.0 fwd"
    ]
    assert not any(name.startswith("stream") for name in decoded.track_names("rank 0"))
    assert summary["counters"] == 0 and summary["flows"] == 0


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    result = synthetic(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.pftrace").write_bytes(b"previous")

    def boom(self):
        raise RuntimeError("interrupted")

    monkeypatch.setattr(pf.RankWriter, "_cpu_threads", boom)
    with pytest.raises(RuntimeError):
        write_perfetto(result, out / "old.pftrace")
    assert [p.name for p in out.iterdir()] == ["old.pftrace"]
    assert (out / "old.pftrace").read_bytes() == b"previous"


# -- the server behind `fsdp-trace view` -------------------------------------------------------


def request(url: str, method: str = "GET"):
    req = urllib.request.Request(url, method=method, headers={"Origin": UI_ORIGIN})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


@pytest.fixture
def trace_file(tmp_path) -> Path:
    path = tmp_path / "my run.pftrace"
    path.write_bytes(bytes(range(256)) * 4099)
    return path


def test_view_warns_when_the_port_is_not_9001(trace_file, capsys):
    """The UI only fetches ?url= from 127.0.0.1:9001: another port gets a warning that says
    how to make it work; 9001 gets none."""
    assert port_warning(9001) is None
    port = free_port()
    text = port_warning(port)
    assert f"port {port}, will be refused" in text and f"ssh -L 9001:127.0.0.1:{port}" in text
    thread = threading.Thread(
        target=serve, args=(trace_file, port), kwargs={"open_browser": False}, daemon=True
    )
    thread.start()
    for _ in range(200):  # wait for the bind, then fetch once: serve() returns
        try:
            status = request(f"http://127.0.0.1:{port}/my%20run.pftrace")[0]
            break
        except urllib.error.URLError:
            threading.Event().wait(0.02)
    assert status == 200
    thread.join(10)
    captured = capsys.readouterr()
    assert f"fsdp-trace view: {text}" in captured.err
    assert ui_url(trace_file.name, port) in captured.out


def test_ui_url():
    assert ui_url("x.pftrace") == "https://ui.perfetto.dev/#!/?url=http://127.0.0.1:9001/x.pftrace"
    assert ui_url("a b.pftrace", 9002).endswith("127.0.0.1:9002/a%20b.pftrace")


def test_server_serves_the_file_and_nothing_else(trace_file):
    with TraceServer(trace_file, free_port()).start() as server:
        base = f"http://127.0.0.1:{server.port}"
        assert server.url == ui_url(trace_file.name, server.port)
        status, headers, body = request(server.file_url)
        assert status == 200
        assert headers["Access-Control-Allow-Origin"] == "https://ui.perfetto.dev"
        assert headers["Cache-Control"] == "no-cache"
        assert int(headers["Content-Length"]) == trace_file.stat().st_size
        assert body == trace_file.read_bytes()
        for _ in range(500):  # the count follows the last byte sent: the client may be first
            if server.served:
                break
            threading.Event().wait(0.01)
        assert server.served == 1
        status, headers, _ = request(base + "/status", method="POST")  # the UI's RPC probe
        assert status == 404 and headers["Access-Control-Allow-Origin"] == UI_ORIGIN
        for other in ("/", "/other.pftrace", "/../" + quote(trace_file.name), "/status"):
            assert request(base + other)[0] == 404
        assert server.served == 1


def test_port_in_use_is_a_user_error(trace_file):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(UserError, match=f"port {port} .* in use"):
            TraceServer(trace_file, port)


def test_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        TraceServer(tmp_path / "absent.pftrace", free_port())
    with pytest.raises(UserError, match="no such file"):
        serve(tmp_path / "absent.pftrace", free_port(), open_browser=False)


def test_serve_once_returns_after_the_fetch(trace_file, capsys):
    port = free_port()
    done = threading.Event()

    def run():
        serve(trace_file, port, open_browser=False, once=True)
        done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    for _ in range(200):  # wait for the bind
        try:
            status = request(base + "/status", method="POST")[0]
            break
        except urllib.error.URLError:
            done.wait(0.02)
    assert status == 404 and not done.is_set()  # a probe does not end it
    status, _, body = request(f"{base}/my%20run.pftrace")
    assert status == 200 and body == trace_file.read_bytes()
    thread.join(10)
    assert done.is_set()
    printed = capsys.readouterr().out
    assert ui_url(trace_file.name, port) in printed
