"""report.html: self-contained, and its figures and cards carry the analysis' own numbers."""

from __future__ import annotations

import base64
import html
import itertools
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fsdp_trace import atomic
from fsdp_trace.analyze import analyze
from fsdp_trace.render import report
from fsdp_trace.render.report import write_report
from tests.conftest import SAMPLES
from tests.synth import AUTOGRAD, TraceBuilder

GPU_RUN = SAMPLES / "gpt-small-2gpu"
PAYLOAD = re.compile(r'<script type="application/json" id="fsdp-figures">(.*?)</script>', re.DOTALL)


# --- helpers (also used by test_report_browser.py) ---------------------------------------------


def gloo_run(folder: Path) -> Path:
    """Two CPU (gloo) rank traces: collectives on gloo's thread, no kernels."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank in (0, 1):
        b = TraceBuilder(rank=rank)
        for step, t0 in ((1, 0), (2, 10_000)):
            b.step(step, t0, 9_000)
            b.label("FSDP::pre_forward (layers.0)", t0 + 10, 300)
            b.label("FSDP::all_gather (layers.0)", t0 + 20, 100)
            b.cpu("c10d::_allgather_base_", t0 + 30, 50)
            b.label("gloo:all_gather", t0 + 40, 400 + 100 * rank, tid=999)
            b.label("FSDP::pre_forward (layers.1)", t0 + 1000, 300)
            b.label("FSDP::all_gather (layers.1)", t0 + 1010, 100)
            b.cpu("c10d::_allgather_base_", t0 + 1020, 50)
            b.label("gloo:all_gather", t0 + 1030, 300, tid=999)
            b.cpu("autograd::engine::evaluate_function: XBackward", t0 + 5000, 2000, tid=AUTOGRAD)
            b.label("FSDP::post_backward_reduce (layers.1)", t0 + 5100, 500, tid=AUTOGRAD)
            b.cpu("c10d::_reduce_scatter_base_", t0 + 5200, 50, tid=AUTOGRAD)
            b.label("gloo:reduce_scatter", t0 + 5300, 800, tid=999)
        b.write(folder / f"rank{rank}.json")
    return folder


def single_gpu_trace(path: Path) -> Path:
    """One GPU, no collectives."""
    b = TraceBuilder(world_size=1)
    b.step(1, 0, 1000)
    b.step(2, 1000, 1000)
    b.kernel("gemm", 100, 300, launch_ts=5)
    b.kernel("Memset (Device)", 420, 5, launch_ts=6, stream=9, cat="gpu_memset")
    b.kernel("gemm", 1100, 1400, launch_ts=1005)  # step 2 is the longer: step 1 is drawn
    return b.write(path)


def gpu_run(folder: Path, block: str = "layers.0", ranks: int = 2, skew: float = 0.0) -> Path:
    """GPU ranks, two steps: a forward AllGather partly hidden (longer on higher ranks, and
    starting `skew` µs earlier per rank), a backward ReduceScatter fully exposed."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(ranks):
        b = TraceBuilder(rank=rank, world_size=ranks)
        for step, t0 in ((1, 0), (2, 2000)):
            b.step(step, t0, 1900)
            b.label(f"FSDP::pre_forward ({block})", t0 + 10, 60)
            b.label(f"FSDP::all_gather ({block})", t0 + 20, 40)
            b.nccl("AllGather", t0 + 100 - skew * rank, 200 + 50 * rank, launch_ts=t0 + 30)
            b.kernel("gemm_fwd", t0 + 200, 400, launch_ts=t0 + 80)
            b.cpu("autograd::engine::evaluate_function: MmBackward0", t0 + 700, 600, tid=AUTOGRAD)
            b.kernel("gemm_bwd", t0 + 800, 300, launch_ts=t0 + 710, launch_tid=AUTOGRAD)
            b.label(f"FSDP::post_backward_reduce ({block})", t0 + 1000, 100, tid=AUTOGRAD)
            b.nccl(
                "ReduceScatter", t0 + 1150, 250, launch_ts=t0 + 1010, stream=21, launch_tid=AUTOGRAD
            )
        b.write(folder / f"rank{rank}.json")
    return folder


def payload(text: str) -> dict:
    match = PAYLOAD.search(text)
    assert match, "no figure payload in the page"
    return json.loads(match.group(1))


def figure(text: str, key: str) -> dict:
    figures = {f["id"]: f["figure"] for f in payload(text)["figures"]}
    return figures[f"fig-{key}"]


def array(value) -> np.ndarray:
    """A plotly JSON array: a list, or {'dtype', 'bdata'} (base64 typed array)."""
    if isinstance(value, dict) and "bdata" in value:
        out = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        if "shape" in value:
            out = out.reshape([int(n) for n in str(value["shape"]).split(",")])
        return out.astype(np.float64)
    return np.asarray(value, dtype=np.float64)


def cards(text: str) -> dict[str, str]:
    found = re.findall(
        r'<div class="card[^"]*" data-key="([^"]+)">.*?<div class="value">(.*?)</div>', text
    )
    return {key: html.unescape(value) for key, value in found}


# --- the shipped 2-GPU sample -------------------------------------------------------------------


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    analysis = analyze(GPU_RUN)
    path = tmp_path_factory.mktemp("report") / "report.html"
    write_report(analysis, path)
    return analysis, path, path.read_text(encoding="utf-8")


def test_page_is_self_contained_with_plotly_once(sample):
    _, path, text = sample
    assert text.startswith("<!DOCTYPE html>")
    assert not re.search(r"<script[^>]*\bsrc\s*=", text, re.IGNORECASE)
    assert not re.search(r"""<link[^>]*href\s*=\s*["']?(https?:)?//""", text, re.IGNORECASE)
    assert not re.search(r"@import|url\(\s*['\"]?https?:", text.split("<script")[0])
    assert len(re.findall(r"\* plotly\.js v\d+\.\d+\.\d+", text)) == 1
    assert text.count("Plotly.newPlot(") == 1  # our one call site (plotly.js has none)
    # Written by rename: no temporary file left beside it, readable by others.
    assert [p.name for p in path.parent.iterdir()] == ["report.html"]
    assert path.stat().st_mode & 0o044 == 0o044


def test_every_figure_is_in_the_payload(sample):
    _, _, text = sample
    figures = payload(text)["figures"]
    assert [f["id"] for f in figures] == [
        "fig-timeline",
        "fig-blocks",
        "fig-bandwidth",
        "fig-heatmap",
    ]
    for f in figures:
        assert f'id="{f["id"]}"' in text
        assert "template" not in f["figure"]["layout"]  # one shared template
    assert f'data-fsdp-figures="{len(figures)}"' in text
    assert payload(text)["template"]["layout"]["font"]["family"]


def test_block_bars_equal_the_analysis_blocks(sample):
    analysis, _, text = sample
    blocks = analysis.blocks[analysis.blocks["source"] == "timing"]
    fig = figure(text, "blocks")
    by_part = {
        (t["meta"]["category"], t["meta"]["part"]): dict(zip(t["y"], array(t["x"]), strict=True))
        for t in fig["data"]
    }
    assert set(by_part) == {(c, p) for c in report.BLOCK_CATEGORIES for p in ("exposed", "hidden")}
    selections = {
        "AllGather forward": (blocks["collective"] == "AllGather") & (blocks["phase"] == "forward"),
        "AllGather backward": (blocks["collective"] == "AllGather")
        & (blocks["phase"] != "forward"),
        "ReduceScatter": blocks["collective"] == "ReduceScatter",
    }
    n_ranks = blocks["rank"].nunique()
    for category, mask in selections.items():
        rows = blocks[mask]
        time = rows.groupby(["rank", "block"])["time_us_per_step"].sum()
        exposed = rows.groupby(["rank", "block"])["exposed_us_per_step"].sum()
        for block in rows["block"].unique():
            want_time = time.xs(block, level="block").mean() / 1e3
            want_exposed = exposed.xs(block, level="block").mean() / 1e3
            got_exposed = by_part[(category, "exposed")][block]
            got_hidden = by_part[(category, "hidden")][block]
            assert got_exposed == pytest.approx(want_exposed, abs=1e-4)
            assert got_exposed + got_hidden == pytest.approx(want_time, abs=1e-4)
    # Worst exposed first.
    totals = blocks.groupby("block")["exposed_us_per_step"].sum() / n_ranks
    order = next(iter(fig["data"]))["y"]
    assert order[0] == totals.idxmax()
    assert [totals[b] for b in order] == sorted(totals, reverse=True)


def test_cards_show_the_run_figures_and_the_step_medians(sample):
    analysis, _, text = sample
    shown = cards(text)
    figures = analysis.run["figures"]
    assert shown["tokens_per_s_per_gpu"] == f"{figures['tokens_per_s_per_gpu']:,.0f}"
    assert shown["mfu"] == f"{100 * figures['mfu']:.1f} %"
    assert shown["scaling_efficiency"] == f"{100 * figures['scaling_efficiency']:.1f} %"
    assert shown["peak_memory"] == f"{figures['peak_allocated_gib']:.2f} GiB"
    steps = analysis.steps[analysis.steps["source"] == "timing"]
    assert shown["exposed_pct"] == f"{steps['exposed_pct'].median():.1f} %"
    assert shown["overlap_pct"] == f"{steps['overlap_pct'].median():.1f} %"
    assert shown["step_ms"] == f"{steps['step_us'].median() / 1e3:.2f} ms"
    for notice in analysis.ranks[0].notices:
        assert html.escape(notice) in text


def test_timeline_is_one_trace_per_rank_and_kind_relative_to_the_step(sample):
    analysis, _, text = sample
    fig = figure(text, "timeline")
    steps = report.representative_steps(analysis.ranks)
    numbers = {int(s["step"]) for s in steps.values()}
    assert len(numbers) == 1  # the same step on both ranks
    timing = analysis.steps[analysis.steps["source"] == "timing"]
    mean = timing.groupby("step")["step_us"].mean().sort_values()
    assert numbers == {int(mean.index[(len(mean) - 1) // 2])}

    axes = sorted({t.get("yaxis", "y") for t in fig["data"]})
    assert len(axes) == len(analysis.ranks)
    for axis, r in zip(axes, analysis.ranks, strict=True):
        traces = [t for t in fig["data"] if t.get("yaxis", "y") == axis]
        kinds = [t["meta"]["kind"] for t in traces]
        assert len(kinds) == len(set(kinds))
        assert {"compute", "AllGather", "ReduceScatter", "exposed"} <= set(kinds)
        step = steps[id(r)]
        k = r.kernels[r.kernels["step"] == step["step"]]
        by_kind = {t["meta"]["kind"]: t for t in traces}
        compute = by_kind["compute"]
        assert len(array(compute["x"])) == int((k["kind"] == "compute").sum())
        base = array(compute["base"])
        assert base.min() >= -1e-3  # ms from the step start
        assert base.max() <= step["step_us"] / 1e3
        ag = by_kind["AllGather"]
        n_ag = int(
            (
                (r.collectives["step"] == step["step"])
                & (r.collectives["collective"] == "AllGather")
            ).sum()
        )
        assert len(ag["hovertext"]) == n_ag
        assert all("busbw" in h and "MB" in h for h in ag["hovertext"])
        assert any("layers.3" in h for h in ag["hovertext"])
        exposed = r.exposed[r.exposed["step"] == step["step"]]
        assert array(by_kind["exposed"]["x"]).sum() == pytest.approx(
            (exposed["end_us"] - exposed["start_us"]).sum() / 1e3, rel=1e-4
        )


def test_bandwidth_and_heatmap_carry_the_collectives(sample):
    analysis, _, text = sample
    coll = analysis.collectives[analysis.collectives["source"] == "timing"]
    fig = figure(text, "bandwidth")
    assert fig["layout"]["xaxis"]["type"] == "log"
    assert "GB/s" in fig["layout"]["yaxis"]["title"]["text"]
    kernel_traces = [t for t in fig["data"] if t["meta"]["basis"] == "kernel"]
    assert {t["meta"]["kind"] for t in kernel_traces} == {"AllGather", "ReduceScatter"}
    for trace in kernel_traces:
        kind = trace["meta"]["kind"]
        part = coll[coll["collective"] == kind]
        assert sorted(array(trace["x"])) == pytest.approx(sorted(part["bytes"] / 1e6))
    # Transfer-based points: each collective matched across the two ranks (k-th of its step
    # on both), bandwidth over the shorter of the two durations.
    pairs = matched_pairs(coll)
    transfer_traces = [t for t in fig["data"] if t["meta"]["basis"] == "transfer"]
    assert {t["meta"]["kind"] for t in transfer_traces} == {"AllGather", "ReduceScatter"}
    for trace in transfer_traces:
        want = pairs[pairs["collective"] == trace["meta"]["kind"]]
        assert sorted(array(trace["x"])) == pytest.approx(sorted(want["bytes"] / 1e6))
        assert sorted(array(trace["y"])) == pytest.approx(sorted(want["busbw"]), rel=1e-4)
    heat = figure(text, "heatmap")["data"][0]
    z = array(heat["z"])
    assert z.shape == (2, len(heat["x"]))
    blocks = analysis.blocks[analysis.blocks["source"] == "timing"]
    want = blocks.groupby(["rank", "block"])["exposed_us_per_step"].sum() / 1e3
    for i, rank in enumerate((0, 1)):
        for j, block in enumerate(heat["x"]):
            assert z[i, j] == pytest.approx(want[(rank, block)], abs=1e-3)


def matched_pairs(coll: pd.DataFrame) -> pd.DataFrame:
    """Ranks 0 and 1's collectives paired by step and launch order; transfer = the shorter
    duration; bus bandwidth over it (AllGather / ReduceScatter of 2 ranks: × 1/2)."""
    sides = []
    for rank in (0, 1):
        mine = coll[coll["rank"] == rank].sort_values("correlation")
        mine = mine.assign(k=mine.groupby("step").cumcount())
        sides.append(mine[["step", "k", "collective", "bytes", "dur_us", "start_us"]])
    both = sides[0].merge(sides[1], on=["step", "k"], suffixes=("_0", "_1"))
    assert (both["collective_0"] == both["collective_1"]).all()
    transfer = np.minimum(both["dur_us_0"], both["dur_us_1"])
    return pd.DataFrame(
        {
            "collective": both["collective_0"],
            "bytes": both["bytes_0"],
            "busbw": both["bytes_0"] / transfer / 1e3 * 0.5,
            "wait_0": both["dur_us_0"] - transfer,
            "wait_1": both["dur_us_1"] - transfer,
            "start_0": both["start_us_0"],
            "start_1": both["start_us_1"],
            "step": both["step"],
        }
    )


def union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length covered by intervals [starts, ends) (sort and sweep)."""
    total, reach = 0.0, -np.inf
    for a, b in sorted(zip(starts.tolist(), ends.tolist(), strict=True)):
        if b <= reach:
            continue
        total += b - max(a, reach)
        reach = b
    return total


def table_rows(text: str, key: str) -> list[list[str]]:
    table = text[text.index(f'data-table="{key}"') :]
    table = table[: table.index("</table>")]
    body = table[table.index("<tbody>") :]
    return [
        [html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        for row in re.findall(r"<tr>(.*?)</tr>", body)
    ]


def test_cross_rank_table_waiting_and_transfer_bandwidth(sample):
    analysis, _, text = sample
    coll = analysis.collectives[analysis.collectives["source"] == "timing"]
    pairs = matched_pairs(coll)
    steps = analysis.steps[analysis.steps["source"] == "timing"]
    rows = table_rows(text, "crossrank")
    assert [r[0] for r in rows] == ["rank 0", "rank 1"]
    for row, rank in zip(rows, (0, 1), strict=True):
        assert int(row[1].replace(",", "")) == len(pairs)
        # Waiting (fsdp_trace.diagnose.crossrank): per step, the union of [start, start +
        # excess over the transfer] of the rank's kernels, clipped to the step; the median
        # over steps, in ms and as a share of that step.
        per_step = []
        for step in steps[steps["rank"] == rank].itertuples():
            mine = pairs[pairs["step"] == step.step]
            starts = mine[f"start_{rank}"].to_numpy()
            ends = np.clip(starts + mine[f"wait_{rank}"].to_numpy(), step.start_us, step.end_us)
            starts = np.clip(starts, step.start_us, step.end_us)
            per_step.append((union_length(starts, ends), step.step_us))
        waits = np.array(per_step)
        assert float(row[2]) == pytest.approx(np.median(waits[:, 0]) / 1e3, abs=0.006)
        assert float(row[3]) == pytest.approx(np.median(100 * waits[:, 0] / waits[:, 1]), abs=0.06)
    # Rank 1 waits ~22 ms a step in NCCL kernels for rank 0 (the host-bound rank).
    assert float(rows[1][2]) > 10 * float(rows[0][2])
    transfer = {r[0]: r for r in table_rows(text, "transfer")}
    for kind in ("AllGather", "ReduceScatter"):
        want = pairs[pairs["collective"] == kind]
        assert int(transfer[kind][1].replace(",", "")) == len(want)
        assert float(transfer[kind][4].replace(",", "")) == pytest.approx(
            want["busbw"].median(), abs=0.06
        )
        kernel = coll[coll["collective"] == kind]["busbw_gbps"].median()
        assert float(transfer[kind][3].replace(",", "")) == pytest.approx(kernel, abs=0.06)
        assert want["busbw"].median() > kernel  # waiting taken out: faster


def test_diagnosis_is_on_the_page_without_the_cli(sample):
    """write_report on a bare analyze() result still shows the findings."""
    from fsdp_trace.diagnose import diagnose

    analysis, _, text = sample
    assert analysis.crossrank is None  # the fixture did not diagnose
    findings, _ = diagnose(analysis)
    assert findings
    section = text[text.index('id="diagnosis"') :]
    for finding in findings:
        assert html.escape(f"{finding.number}. {finding.title}") in section


def test_block_palette_tells_the_categories_apart():
    """The three categories, solid (exposed) and at the hidden parts' opacity on white, are
    far apart in colour (no two greens)."""

    def rgb(color: str, alpha: float = 1.0) -> np.ndarray:
        solid = np.array([int(color[i : i + 2], 16) for i in (1, 3, 5)], dtype=float)
        return alpha * solid + (1 - alpha) * 255.0

    for alpha in (1.0, 0.45):
        colors = [rgb(report.COLORS[c], alpha) for c in report.BLOCK_CATEGORIES]
        for a, b in itertools.combinations(colors, 2):
            assert np.abs(a - b).max() > (80 if alpha == 1.0 else 35), (alpha, a, b)


def many_blocks_run(folder: Path, n_blocks: int) -> Path:
    """Two GPU ranks, one step, one exposed forward AllGather per block."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank in (0, 1):
        b = TraceBuilder(rank=rank, world_size=2)
        b.step(1, 0, 100 * n_blocks + 100)
        for i in range(n_blocks):
            t0 = 100 * i
            b.label(f"FSDP::pre_forward (layers.{i})", t0 + 1, 10)
            b.label(f"FSDP::all_gather (layers.{i})", t0 + 2, 5)
            b.nccl("AllGather", t0 + 20, 30 + i, launch_ts=t0 + 3)
            b.kernel("gemm", t0 + 60, 30, launch_ts=t0 + 12)
        b.write(folder / f"rank{rank}.json")
    return folder


def test_heatmap_text_only_when_legible_and_colour_capped(tmp_path):
    # 25 blocks + root (gpt-1.3b): the figure takes the full width; cells are wide enough.
    big = analyze(SAMPLES / "diagnosis" / "gpt-1.3b-b4-2gpu", detailed=False)
    heat = report.heatmap_figure(big).to_plotly_json()["data"][0]
    assert len(heat["x"]) == 25 and report.heatmap_wide(big)
    assert heat["texttemplate"] and heat["textfont"]["size"] >= 11
    # The root's first gather (~2.4 ms) dwarfs the blocks (~0.05 ms): colour capped at the
    # 95th percentile of the other cells, said on the colour bar.
    blocks = big.blocks[big.blocks["source"] == "timing"]
    grid = blocks.groupby(["rank", "block"])["exposed_us_per_step"].sum() / 1e3
    others = grid[grid.index.get_level_values("block") != "root"].round(4)
    cap = np.percentile(others, 95)
    assert grid.max() > 20 * cap
    assert heat["zmax"] == pytest.approx(cap, rel=1e-6)
    assert "capped" in heat["colorbar"]["title"]["text"] and "capped" in heat["hovertemplate"]
    # 40 blocks: cells too narrow for text; no outlier: no cap.
    many = analyze(many_blocks_run(tmp_path / "many", 40))
    heat = report.heatmap_figure(many).to_plotly_json()["data"][0]
    assert len(heat["x"]) == 40 and heat.get("texttemplate") is None
    assert heat.get("zmax") is None
    # 9 units (the small sample), half width: text.
    small = analyze(GPU_RUN, detailed=False)
    heat = report.heatmap_figure(small).to_plotly_json()["data"][0]
    assert not report.heatmap_wide(small) and heat["texttemplate"]
    layout = report.heatmap_figure(small).to_plotly_json()["layout"]
    assert layout["margin"]["t"] >= 40  # room for plotly's toolbar above the first row


def test_distortion_table_and_figure_titles(sample):
    analysis, _, text = sample
    assert 'data-table="distortion"' in text
    for item in analysis.distortion():
        assert f"{item['slowdown_pct']:+.1f}" in text
    blocks = figure(text, "blocks")["layout"]
    assert "ms" in blocks["xaxis"]["title"]["text"]
    timeline = figure(text, "timeline")["layout"]
    assert "ms" in json.dumps(timeline)
    assert 'data-table="hta"' not in text  # not asked for


# --- other shapes of input ----------------------------------------------------------------------


def test_hta_table_when_present(tmp_path):
    analysis = analyze(gpu_run(tmp_path / "run"))
    analysis.hta = pd.DataFrame(
        {
            "rank": [0, 1],
            "path": ["a", "b"],
            "hta_pct": [12.345, 23.456],
            "ours_hta_rules_pct": [12.35, 23.46],
            "ours_steps_pct": [11.0, float("nan")],
        }
    )
    path = tmp_path / "r.html"
    write_report(analysis, path)
    text = path.read_text(encoding="utf-8")
    table = text[text.index('data-table="hta"') :]
    table = table[: table.index("</table>")]
    for value in ("12.35", "23.46", "11.00", "—"):
        assert value in table


def test_synthetic_gpu_run_numbers(tmp_path):
    analysis = analyze(gpu_run(tmp_path / "run"))
    path = tmp_path / "r.html"
    write_report(analysis, path)
    text = path.read_text(encoding="utf-8")
    shown = cards(text)
    assert shown["exposed_pct"] == f"{analysis.steps['exposed_pct'].median():.1f} %"
    assert "tokens_per_s_per_gpu" not in shown  # no run.json
    fig = figure(text, "blocks")
    parts = {(t["meta"]["category"], t["meta"]["part"]): array(t["x"])[0] for t in fig["data"]}
    # ReduceScatter: 250 µs, nothing beside it; AllGather: 200/250 µs, 100 µs before compute.
    assert parts[("ReduceScatter", "exposed")] == pytest.approx(0.25)
    assert parts[("ReduceScatter", "hidden")] == pytest.approx(0.0)
    assert parts[("AllGather forward", "exposed")] == pytest.approx(0.1)
    assert parts[("AllGather forward", "hidden")] == pytest.approx((0.1 + 0.15) / 2)


def test_cpu_gloo_analysis_shows_collectives_only(tmp_path):
    analysis = analyze(gloo_run(tmp_path / "gloo"))
    assert all(r.device == "cpu" for r in analysis.ranks)
    path = tmp_path / "cpu.html"
    write_report(analysis, path)
    text = path.read_text(encoding="utf-8")
    timeline = figure(text, "timeline")
    kinds = {t["meta"]["kind"] for t in timeline["data"]}
    assert kinds == {"AllGather", "ReduceScatter"}
    assert any("gloo thread" in str(t["y"]) for t in timeline["data"])
    blocks = figure(text, "blocks")
    assert {t["meta"]["part"] for t in blocks["data"]} == {"time"}
    assert "fig-heatmap" in text
    assert cards(text)["exposed_pct"] == "—"
    assert "CPU (gloo) trace" in text


def test_single_gpu_analysis_has_no_communication_figures(tmp_path):
    analysis = analyze(single_gpu_trace(tmp_path / "one.json"))
    path = tmp_path / "one.html"
    write_report(analysis, path)
    text = path.read_text(encoding="utf-8")
    assert [f["id"] for f in payload(text)["figures"]] == ["fig-timeline"]
    kinds = {t["meta"]["kind"] for t in figure(text, "timeline")["data"]}
    assert kinds == {"phase", "compute", "memory"}
    assert "No collectives" in text
    assert cards(text)["exposed_pct"] == "0.0 %"
    assert cards(text)["overlap_pct"] == "—"


def test_names_cannot_break_out_of_the_page(tmp_path):
    block = "layers.</script><img src=x onerror=alert(1)>"
    analysis = analyze(gpu_run(tmp_path / "run", block=block))
    assert block in set(analysis.blocks["block"])
    analysis.notices.append("<b>notice</b> & </script>")
    path = tmp_path / "r.html"
    write_report(analysis, path)
    text = path.read_text(encoding="utf-8")
    assert "<img src=x" not in text
    assert text.count("</script>") == text.count("<script")
    assert "&lt;b&gt;notice&lt;/b&gt; &amp; &lt;/script&gt;" in text
    fig = figure(text, "blocks")  # the payload still parses, the name intact
    assert block in fig["data"][0]["y"]


def test_write_replaces_atomically_and_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    analysis = analyze(single_gpu_trace(tmp_path / "one.json"))
    path = tmp_path / "out" / "report.html"
    path.parent.mkdir()
    path.write_text("old")
    write_report(analysis, path)
    assert path.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")

    path.write_text("old")

    def boom(*_args):
        raise RuntimeError("boom")

    with monkeypatch.context() as patch:
        patch.setattr(report, "render_html", boom)
        with pytest.raises(RuntimeError):
            write_report(analysis, path)
    assert path.read_text() == "old"
    with monkeypatch.context() as patch:  # fails after the page is written, before the rename
        patch.setattr(atomic.os, "replace", boom)
        with pytest.raises(RuntimeError):
            write_report(analysis, path)
    assert path.read_text() == "old"
    assert [p.name for p in path.parent.iterdir()] == ["report.html"]


def test_many_ranks_show_the_most_and_least_exposed_on_the_timeline(tmp_path):
    analysis = analyze(gpu_run(tmp_path / "run", ranks=12, skew=5))
    exposed = analysis.steps.groupby("rank")["exposed_pct"].median()
    assert exposed.is_monotonic_increasing and exposed.is_unique
    chosen = [r.rank for r in report.timeline_ranks(analysis)]
    assert chosen == [0, 1, 2, 3, 8, 9, 10, 11]
    path = tmp_path / "r.html"
    write_report(analysis, path)
    text = path.read_text(encoding="utf-8")
    timeline = figure(text, "timeline")
    assert len({t.get("yaxis", "y") for t in timeline["data"]}) == 8
    assert "Showing 8 of 12 ranks" in text
    heat = figure(text, "heatmap")["data"][0]
    assert len(heat["y"]) == 12
