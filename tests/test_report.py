"""report.html: self-contained; it lays out the view model (verdict, per-rank cards, the
inferred configuration, findings, notices, tables: the same text the terminal shows) and its
figures carry the analysis' own numbers."""

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
from plotly.offline import get_plotlyjs

import fsdp_trace
from fsdp_trace import atomic
from fsdp_trace.present.view import STACK_ORDER, run_view
from fsdp_trace.render import plotlyjs, report
from fsdp_trace.render.report import figures as figs
from fsdp_trace.render.report import panels, style, timeline, write_report
from fsdp_trace.render.report.page import static
from fsdp_trace.result import Result, RunAnalysis
from tests.conftest import SAMPLES, run_cli
from tests.synth import AUTOGRAD, TraceBuilder

GPU_RUN = SAMPLES / "gpt-small-2gpu"
PAYLOAD_ID = "fsdp-figures"  # the packed element holding every figure's JSON


# --- helpers (also used by test_report_browser.py) ---------------------------------------------


def analyze(path, **options) -> Result:
    """(Through the test run's cache, never the user's: tests/conftest.py.)"""
    return fsdp_trace.analyze(path, **options)


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
    try:
        return json.loads(plotlyjs.unpack_element(text, PAYLOAD_ID))
    except KeyError:
        raise AssertionError("no figure payload in the page") from None


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


def table_rows(text: str, key: str, start: int = 0) -> list[list[str]]:
    """The body cells of the first table `key` at or after `start`."""
    table = text[text.index(f'data-table="{key}"', start) :]
    table = table[: table.index("</table>")]
    body = table[table.index("<tbody>") :]
    return [
        [
            html.unescape(re.sub(r"<[^>]+>", "", c))  # a cell's text (numbers come in pieces)
            for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row)
        ]
        for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body)
    ]


def notices_on_page(text: str, scope: str = "run") -> list[str]:
    found = re.search(rf'<div class="notices" data-notices="{scope}">.*?<ul>(.*?)</ul>', text)
    if not found:
        return []
    return [html.unescape(n) for n in re.findall(r"<li>(.*?)</li>", found.group(1))]


def section(text: str, key: str) -> str:
    start = text.index(f'<section class="panel" id="{key}"')
    return text[start : text.index("</section>", start)]


# --- the shipped 2-GPU sample -------------------------------------------------------------------


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    result = analyze(GPU_RUN)
    path = tmp_path_factory.mktemp("report") / "report.html"
    write_report(result, path)
    return result.only, path, path.read_text(encoding="utf-8")


def test_page_is_self_contained_with_plotly_once(sample):
    _, path, text = sample
    assert text.startswith("<!DOCTYPE html>")
    assert not re.search(r"<script[^>]*\bsrc\s*=", text, re.IGNORECASE)
    assert not re.search(r"""<link[^>]*href\s*=\s*["']?(https?:)?//""", text, re.IGNORECASE)
    assert not re.search(r"@import|url\(\s*['\"]?https?:", text.split("<script")[0])
    # plotly.js once, packed (its licence line kept in the clear), never inlined as is.
    assert len(re.findall(r"\* plotly\.js v\d+\.\d+\.\d+", text)) == 1
    assert text.count('id="fsdp-plotlyjs"') == 1
    assert plotlyjs.unpack_element(text, "fsdp-plotlyjs") == get_plotlyjs().encode("utf-8")
    assert get_plotlyjs()[1000:1200] not in text
    assert text.count("Plotly.newPlot(") == 1  # our one call site (plotly.js is packed)
    # The stylesheet and scripts are the package's static files, inlined; plotly.js is
    # unpacked and evaluated before the script that draws the figures.
    assert static("report.css") in text and static("report.js") in text
    assert text.index(static("unpack.js")) < text.index(static("report.js"))
    # Written by rename: no temporary file left beside it, readable by others.
    assert [p.name for p in path.parent.iterdir()] == ["report.html"]
    assert path.stat().st_mode & 0o044 == 0o044


def test_every_figure_is_in_the_payload(sample):
    _, _, text = sample
    figures = payload(text)["figures"]
    assert [f["id"] for f in figures] == [
        "fig-whatif",
        "fig-breakdown",
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
    assert payload(text)["attribute"] == report.RENDERED_ATTRIBUTE


def test_breakdown_figure_is_one_bar_per_rank_adding_up_to_its_median_step(sample):
    run, _, text = sample
    fig = figure(text, "breakdown")
    bars = [t for t in fig["data"] if t["type"] == "bar"]
    assert [t["meta"]["part"] for t in bars] == [
        p for p in STACK_ORDER if p in {t["meta"]["part"] for t in bars}
    ]
    traces = run.ranks + run.detailed
    labels = [f"rank {r.rank}" + (" (detailed)" if r in run.detailed else "") for r in traces]
    assert bars[0]["meta"]["ranks"] == labels  # one bar per rank (and per detailed trace)
    for i, r in enumerate(traces):
        want = run.rank_breakdown(r)
        parts = {t["meta"]["part"]: array(t["x"])[i] for t in bars}
        assert sum(parts.values()) == pytest.approx(want["step_us"] / 1e3, abs=1e-3)
        for part in STACK_ORDER:
            expected = (want[part] or 0.0) / 1e3
            assert parts.get(part, 0.0) == pytest.approx(expected, abs=1e-4), (r.rank, part)
        assert f"{want['step_us'] / 1e3:.2f} ms" in fig["data"][-1]["text"][i]
    # The hover carries the table's own ms and share of the step.
    view = run_view(run)
    transfer = next(t for t in bars if t["meta"]["part"] == "exposed_transfer_us")
    assert view.bars[0].text["exposed_transfer_us"] in transfer["hovertext"][0]  # 1.91 ms (3.6 %)
    assert view.breakdown.rows[0][6] == "1.91 (3.6 %)"  # the table says the same
    assert "(3.6 %)" in transfer["hovertext"][0]
    # Fixed colours; transfer and waiting are told apart at a glance.
    colors = {t["meta"]["part"]: t["marker"]["color"] for t in bars}
    assert colors == {p: style.PART_COLORS[p] for p in colors}
    assert {"exposed_transfer_us", "exposed_wait_us"} <= set(colors)

    def rgb(c: str) -> np.ndarray:
        return np.array([int(c[i : i + 2], 16) for i in (1, 3, 5)], dtype=float)

    for a, b in itertools.combinations(style.PART_COLORS.values(), 2):
        assert np.abs(rgb(a) - rgb(b)).max() > 40, (a, b)
    assert np.abs(rgb(colors["exposed_transfer_us"]) - rgb(colors["exposed_wait_us"])).max() > 100


def test_headline_cards_are_per_rank_never_pooled(sample):
    run, _, text = sample
    view = run_view(run)
    shown = cards(text)
    assert shown == {c.key: c.value for c in view.run_figures + view.cards}
    figures = run.run.figures
    assert shown["tokens_per_s_per_gpu"] == f"{figures.tokens_per_s_per_gpu:,.0f}"
    assert shown["mfu"] == f"{100 * figures.mfu:.1f} %"
    assert shown["scaling_efficiency"] == f"{100 * figures.scaling_efficiency:.1f} %"
    assert shown["peak_memory"] == f"{figures.peak_allocated_gib:.2f} GiB"
    # The median pooled over both ranks' steps (11.1 %) is no rank's figure: no card says it.
    timing = run.steps[run.steps["source"] == "timing"]
    pooled = f"{timing['exposed_pct'].median():.1f} %"
    assert pooled == "11.1 %"
    assert pooled not in shown.values()
    # Per rank: rank 0 is exposed 3.6 % (nearly all transfer), rank 1 21.9 % (mostly waiting
    # for rank 0); the cards show the worst rank's transfer and the worst rank's waiting.
    per_rank = timing.groupby("rank")["exposed_pct"].median()
    assert [f"{v:.1f}" for v in per_rank] == ["3.6", "21.9"]
    share = (
        timing.assign(
            transfer=100 * timing["exposed_transfer_us"] / timing["step_us"],
            wait=100 * timing["exposed_wait_us"] / timing["step_us"],
        )
        .groupby("rank")[["transfer", "wait"]]
        .median()
    )
    assert shown["exposed_transfer_pct"] == f"{share['transfer'].max():.1f} %" == "3.6 %"
    assert shown["exposed_wait_pct"] == f"{share['wait'].max():.1f} %" == "18.9 %"
    step = timing.groupby("rank")["step_us"].median().max()
    assert shown["step_ms"] == f"{step / 1e3:.2f} ms"
    ranks = {row[0]: row for row in table_rows(text, "ranks")}
    assert ranks["rank 0"][3].startswith("3.6 ") and ranks["rank 1"][3].startswith("21.9 ")


def test_verdict_and_inferred_configuration_are_on_the_page(sample):
    run, _, text = sample
    view = run_view(run)
    verdict = re.search(r'<div class="verdict (\w+)" data-verdict="\w+">(.*?)</div>', text)
    assert verdict and verdict.group(1) == ("good" if view.healthy else "bad")
    assert html.escape(view.verdict) in verdict.group(2)
    assert text.index('class="verdict') < text.index('data-cards="ranks"')  # verdict first
    assert view.verdict.startswith("healthy")  # host-bound under the profiler only: a note
    rows = table_rows(text, "config")
    assert [tuple(r) for r in rows] == [tuple(line) for line in view.config]
    assert any(r[0] == "mesh" and r[1] == "FSDP over 2 ranks" for r in rows)


def test_notices_are_exactly_the_views(sample):
    run, _, text = sample
    shown = notices_on_page(text)
    assert shown == run_view(run).notices
    assert shown and all(n.startswith("rank") for n in shown)
    assert text.count('class="notices"') == 1  # the result itself has none


def test_findings_panel_numbers_causes_with_their_change(sample):
    run, _, text = sample
    view = run_view(run)
    panel = section(text, "diagnosis")
    assert panel.count('<li class="finding') == len(view.findings) >= 2
    for f in view.findings:
        item = panel[panel.rindex("<li", 0, panel.index(f'data-rule="{f.rule}"')) :]
        item = item[: item.index("</li>")]
        assert f">{f.number}.</span> {html.escape(f.title)}" in item
        for part in (f.cause, f.evidence, f.why, f.change, f.where):
            assert html.escape(part) in item
        assert f'class="basis {f.basis}"' in item
        if f.cli:
            assert f"fsdp-trace capture … {html.escape(f.cli)}" in item
        if f.code:
            assert f"<code>{html.escape(f.code)}</code>" in item
        if f.cost:
            assert html.escape(f.cost) in item and "finding cause" in item
        else:
            assert "about the measurement" in item and "finding measurement" in item
        for symptom in f.symptoms:  # folded under its cause
            assert f"explains: {html.escape(symptom.title)}" in item
    host = next(f for f in view.findings if f.rule == "host-bound")
    assert [s.rule for s in host.symptoms] == ["straggler"]
    assert ("Healthy" in panel) == view.healthy


def test_block_bars_equal_the_analysis_blocks(sample):
    run, _, text = sample
    blocks = run.blocks[run.blocks["source"] == "timing"]
    fig = figure(text, "blocks")
    by_part = {
        (t["meta"]["category"], t["meta"]["part"]): dict(zip(t["y"], array(t["x"]), strict=True))
        for t in fig["data"]
    }
    assert set(by_part) == {(c, p) for c in style.BLOCK_CATEGORIES for p in ("exposed", "hidden")}
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
    # The per-block table under it is the view's, every row.
    view = run_view(run, top=None)
    assert table_rows(text, "blocks") == view.blocks.rows


def test_timeline_is_one_trace_per_rank_and_kind_relative_to_the_step(sample):
    run, _, text = sample
    fig = figure(text, "timeline")
    steps = timeline.representative_steps(run.ranks)
    numbers = {int(s["step"]) for s in steps.values()}
    assert len(numbers) == 1  # the same step on both ranks
    timing = run.steps[run.steps["source"] == "timing"]
    mean = timing.groupby("step")["step_us"].mean().sort_values()
    assert numbers == {int(mean.index[(len(mean) - 1) // 2])}

    axes = sorted({t.get("yaxis", "y") for t in fig["data"]})
    assert len(axes) == len(run.ranks)
    for axis, r in zip(axes, run.ranks, strict=True):
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
    run, _, text = sample
    coll = run.collectives[run.collectives["source"] == "timing"]
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
    blocks = run.blocks[run.blocks["source"] == "timing"]
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


def test_cross_rank_table_waiting_and_transfer_bandwidth(sample):
    run, _, text = sample
    coll = run.collectives[run.collectives["source"] == "timing"]
    pairs = matched_pairs(coll)
    steps = run.steps[run.steps["source"] == "timing"]
    rows = table_rows(text, "crossrank")
    assert [r[0] for r in rows] == ["rank 0", "rank 1"]
    for row, rank in zip(rows, (0, 1), strict=True):
        assert int(row[1].replace(",", "")) == len(pairs)
        # Waiting (fsdp_trace.analysis.job.crossrank): per step, the union of [start, start +
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


def test_tables_are_the_views(sample):
    run, _, text = sample
    view = run_view(run)
    for table in (view.breakdown, view.ranks, view.distortion, view.crossrank, view.transfer):
        assert table_rows(text, table.key) == table.rows, table.key
        # its title, less the panel heading it would repeat ("Per rank" / "Per rank (...)")
        table_tag = f'<div class="scroll"><table class="data" data-table="{table.key}"'
        caption = re.search(rf'<p class="caption">([^<]*)</p>{re.escape(table_tag)}', text)
        assert caption, table.key
        shown = html.unescape(caption.group(1))
        assert shown.lower() in table.title.lower() and len(shown) > 20, (shown, table.title)
    for item in run.distortion():
        assert f"{item['slowdown_pct']:+.1f}" in table_rows(text, "distortion")[item["rank"]]
    assert "ms" in figure(text, "blocks")["layout"]["xaxis"]["title"]["text"]
    assert "ms" in json.dumps(figure(text, "timeline")["layout"])
    assert 'data-table="hta"' not in text  # not asked for


def test_block_palette_tells_the_categories_apart():
    """The three categories, solid (exposed) and at the hidden parts' opacity on white, are
    far apart in colour (no two greens)."""

    def rgb(color: str, alpha: float = 1.0) -> np.ndarray:
        solid = np.array([int(color[i : i + 2], 16) for i in (1, 3, 5)], dtype=float)
        return alpha * solid + (1 - alpha) * 255.0

    for alpha in (1.0, 0.45):
        colors = [rgb(report.COLORS[c], alpha) for c in style.BLOCK_CATEGORIES]
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
    big = analyze(SAMPLES / "diagnosis" / "gpt-1.3b-b4-2gpu", detailed=False).only
    heat = figs.heatmap_figure(big).to_plotly_json()["data"][0]
    assert len(heat["x"]) == 25 and figs.heatmap_wide(big)
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
    # Wide: bandwidth and heatmap each take a row of their own.
    built = {p.key: p for p in panels.build(big, run_view(big))}
    assert not built["heatmap"].half and not built["bandwidth"].half
    # 40 blocks: cells too narrow for text; no outlier: no cap.
    many = analyze(many_blocks_run(tmp_path / "many", 40)).only
    heat = figs.heatmap_figure(many).to_plotly_json()["data"][0]
    assert len(heat["x"]) == 40 and heat.get("texttemplate") is None
    assert heat.get("zmax") is None
    # 9 units (the small sample), half width: text.
    small = analyze(GPU_RUN, detailed=False).only
    heat = figs.heatmap_figure(small).to_plotly_json()["data"][0]
    assert not figs.heatmap_wide(small) and heat["texttemplate"]
    layout = figs.heatmap_figure(small).to_plotly_json()["layout"]
    assert layout["margin"]["t"] >= 40  # room for plotly's toolbar above the first row


# --- the panel registry -------------------------------------------------------------------------


def test_a_panel_is_one_registered_function(sample, tmp_path, monkeypatch):
    run, _, _ = sample
    monkeypatch.setattr(panels, "PANELS", list(panels.PANELS))

    @panels.panel
    def steps_drawn(run: RunAnalysis, view) -> panels.Panel:
        return panels.Panel("extra", "An extra panel", "its caption", body="<p>extra body</p>")

    path = tmp_path / "r.html"
    write_report(run, path)
    text = path.read_text(encoding="utf-8")
    extra = section(text, "extra")
    assert "An extra panel" in extra and "extra body" in extra
    assert text.index('id="hta"' if 'id="hta"' in text else 'id="distortion"') < text.index(
        'id="extra"'
    )  # registered last: shown last


# --- other shapes of input ----------------------------------------------------------------------


def test_several_runs_side_by_side_then_one_section_each(tmp_path):
    result = analyze([GPU_RUN, SAMPLES / "gpt-small-1gpu"])
    assert len(result.runs) == 2
    path = tmp_path / "r.html"
    write_report(result, path)
    text = path.read_text(encoding="utf-8")
    rows = table_rows(text, "runs")
    assert [r[0] for r in rows] == [run.name for run in result.runs]
    assert text.index('data-table="runs"') < text.index('<section class="run"')
    ids = re.findall(r'\bid="([^"]+)"', text)
    assert len(ids) == len(set(ids)), [i for i in ids if ids.count(i) > 1]
    drawn = [f["id"] for f in payload(text)["figures"]]
    assert "fig-breakdown-1" in drawn and "fig-breakdown-2" in drawn
    for i, run in enumerate(result.runs, start=1):
        view = run_view(run)
        start = text.index(f'<section class="run" id="run-{i}"')
        assert html.escape(view.verdict) in text[start:]
        assert notices_on_page(text[start:]) == view.notices
        assert table_rows(text, "config", start) == [list(line) for line in view.config]


def test_hta_table_when_present(tmp_path):
    run = analyze(gpu_run(tmp_path / "run")).only
    run.hta = pd.DataFrame(
        {
            "rank": [0, 1],
            "path": ["a", "b"],
            "hta_pct": [12.345, 23.456],
            "ours_hta_rules_pct": [12.35, 23.46],
            "ours_steps_pct": [11.0, float("nan")],
        }
    )
    path = tmp_path / "r.html"
    write_report(run, path)  # one RunAnalysis is accepted as well as a Result
    text = path.read_text(encoding="utf-8")
    rows = table_rows(text, "hta")
    assert rows == run_view(run).hta.rows
    flat = [c for row in rows for c in row]
    for value in ("12.35", "23.46", "11.00", "—"):
        assert value in flat


def test_synthetic_gpu_run_numbers(tmp_path):
    result = analyze(gpu_run(tmp_path / "run"))
    path = tmp_path / "r.html"
    write_report(result, path)
    text = path.read_text(encoding="utf-8")
    view = run_view(result.only)
    shown = cards(text)
    assert shown == {c.key: c.value for c in view.cards}
    assert "tokens_per_s_per_gpu" not in shown  # no run.json
    assert 'data-cards="run"' not in text
    fig = figure(text, "blocks")
    parts = {(t["meta"]["category"], t["meta"]["part"]): array(t["x"])[0] for t in fig["data"]}
    # ReduceScatter: 250 µs, nothing beside it; AllGather: 200/250 µs, 100 µs before compute.
    assert parts[("ReduceScatter", "exposed")] == pytest.approx(0.25)
    assert parts[("ReduceScatter", "hidden")] == pytest.approx(0.0)
    assert parts[("AllGather forward", "exposed")] == pytest.approx(0.1)
    assert parts[("AllGather forward", "hidden")] == pytest.approx((0.1 + 0.15) / 2)


def test_cpu_gloo_analysis_shows_collectives_only(tmp_path):
    result = analyze(gloo_run(tmp_path / "gloo"))
    assert all(r.device == "cpu" for r in result.ranks)
    path = tmp_path / "cpu.html"
    write_report(result, path)
    text = path.read_text(encoding="utf-8")
    timeline_fig = figure(text, "timeline")
    kinds = {t["meta"]["kind"] for t in timeline_fig["data"]}
    assert kinds == {"AllGather", "ReduceScatter"}
    assert any("gloo thread" in str(t["y"]) for t in timeline_fig["data"])
    blocks = figure(text, "blocks")
    assert {t["meta"]["part"] for t in blocks["data"]} == {"time"}
    assert "fig-heatmap" in text
    assert cards(text)["exposed_pct"] == "—"
    assert "CPU (gloo) trace" in text
    assert notices_on_page(text) == run_view(result.only).notices


def test_single_gpu_analysis_has_no_communication_figures(tmp_path):
    result = analyze(single_gpu_trace(tmp_path / "one.json"))
    path = tmp_path / "one.html"
    write_report(result, path)
    text = path.read_text(encoding="utf-8")
    ids = [f["id"] for f in payload(text)["figures"]]
    assert ids == ["fig-whatif", "fig-breakdown", "fig-timeline"]  # what if: host-bound
    kinds = {t["meta"]["kind"] for t in figure(text, "timeline")["data"]}
    assert kinds == {"phase", "compute", "memory"}
    assert "No collectives" in text
    assert cards(text)["exposed_pct"] == "0.0 %"
    assert "overlap_pct" not in cards(text)  # nothing to overlap


def busy_gpu_trace(path: Path) -> Path:
    """One GPU kept busy: nothing for the diagnosis to find."""
    b = TraceBuilder(world_size=1)
    for step, t0 in ((1, 0), (2, 1000), (3, 2000)):
        b.step(step, t0, 1000)
        b.kernel("gemm", t0 + 10, 985, launch_ts=t0 + 5)
    return b.write(path)


def test_healthy_run_says_so_plainly(tmp_path):
    run = analyze(busy_gpu_trace(tmp_path / "busy.json")).only
    view = run_view(run)
    assert view.healthy and not view.findings and not view.minor
    path = tmp_path / "busy.html"
    write_report(run, path)
    text = path.read_text(encoding="utf-8")
    panel = section(text, "diagnosis")
    assert 'data-healthy="true"' in panel and "Healthy" in panel
    assert '<li class="finding' not in panel
    assert 'data-verdict="good"' in text and html.escape(view.verdict) in text


def test_names_cannot_break_out_of_the_page(tmp_path):
    block = "layers.</script><img src=x onerror=alert(1)>"
    run = analyze(gpu_run(tmp_path / "run", block=block)).only
    assert block in set(run.blocks["block"])
    run.own_notices.append("<b>notice</b> & </script>")
    path = tmp_path / "r.html"
    write_report(run, path)
    text = path.read_text(encoding="utf-8")
    assert "<img src=x" not in text
    assert text.count("</script>") == text.count("<script")
    assert "&lt;b&gt;notice&lt;/b&gt; &amp; &lt;/script&gt;" in text
    fig = figure(text, "blocks")  # the payload still parses, the name intact
    assert block in fig["data"][0]["y"]


def test_write_replaces_atomically_and_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    result = analyze(single_gpu_trace(tmp_path / "one.json"))
    path = tmp_path / "out" / "report.html"
    path.parent.mkdir()
    path.write_text("old")
    write_report(result, path)
    assert path.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")

    path.write_text("old")

    def boom(*_args):
        raise RuntimeError("boom")

    with monkeypatch.context() as patch:
        patch.setattr(report, "render_html", boom)
        with pytest.raises(RuntimeError):
            write_report(result, path)
    assert path.read_text() == "old"
    with monkeypatch.context() as patch:  # fails after the page is written, before the rename
        patch.setattr(atomic.os, "replace", boom)
        with pytest.raises(RuntimeError):
            write_report(result, path)
    assert path.read_text() == "old"
    assert [p.name for p in path.parent.iterdir()] == ["report.html"]


def test_many_ranks_show_the_most_and_least_exposed_on_the_timeline(tmp_path):
    run = analyze(gpu_run(tmp_path / "run", ranks=12, skew=5)).only
    exposed = run.steps.groupby("rank")["exposed_pct"].median()
    assert exposed.is_monotonic_increasing and exposed.is_unique
    chosen = [r.rank for r in timeline.timeline_ranks(run)]
    assert chosen == [0, 1, 2, 3, 8, 9, 10, 11]
    path = tmp_path / "r.html"
    write_report(run, path)
    text = path.read_text(encoding="utf-8")
    timeline_fig = figure(text, "timeline")
    assert len({t.get("yaxis", "y") for t in timeline_fig["data"]}) == 8
    assert "Showing 8 of 12 ranks" in text
    heat = figure(text, "heatmap")["data"][0]
    assert len(heat["y"]) == 12
    assert len(figure(text, "breakdown")["data"][0]["y"]) == 12  # every rank has its bar


def test_cli_analyze_writes_the_report(tmp_path):
    out = tmp_path / "report.html"
    done = run_cli("analyze", str(GPU_RUN), "--report", str(out))
    assert done.returncode == 0, done.stderr
    text = out.read_text(encoding="utf-8")
    ids = [entry["id"] for entry in payload(text)["figures"]]
    assert sorted(ids) == [
        "fig-bandwidth",
        "fig-blocks",
        "fig-breakdown",
        "fig-heatmap",
        "fig-timeline",
        "fig-whatif",
    ]
    assert "Host-bound" in text and 'data-table="config"' in text


def test_the_whatif_panel_shows_the_ranked_predictions(sample):
    """Each candidate's predicted step (for the measured step's tokens) is the replay's."""
    from fsdp_trace.whatif import rank_candidates

    run, _, text = sample
    fig = figure(text, "whatif")
    ranked = rank_candidates(run)
    assert fig["data"][0]["y"] == [p.knobs.describe() for p, _ in ranked]
    expected = [p.predicted_step_us / 1e3 / p.tokens_scale for p, _ in ranked]
    assert array(fig["data"][0]["x"]) == pytest.approx(expected)
