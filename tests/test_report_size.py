"""The pages stay small and self-contained: every shipped sample's report.html, a compare.html
and the committed sweep's efficiency.html weigh at most 1.5 MB, with plotly.js inlined once,
packed (fsdp_trace/render/plotlyjs.py), never as is. The packing itself round-trips; that the
browser unpacks it is tested in test_report_browser.py."""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path

import pytest
from plotly.offline import get_plotlyjs

import fsdp_trace
from fsdp_trace.render import plotlyjs
from fsdp_trace.render.report import render_html
from tests.conftest import SAMPLES, run_cli

LIMIT = 1_500_000  # bytes, per page
SWEEP = SAMPLES / "sweep-gpt-1.3b-b14"
REPEATS = sorted(p for p in SWEEP.iterdir() if p.is_dir())
# Every shipped run with traces (the sweep keeps only analysis.json per point).
RUNS = sorted({p.parent for p in SAMPLES.rglob("run.json") if any(p.parent.glob("rank*.json.gz"))})


def assert_small_with_plotly_packed(page: str, what: str) -> None:
    size = len(page.encode("utf-8"))
    assert size <= LIMIT, f"{what}: {size:,} bytes, over {LIMIT:,}"
    source = get_plotlyjs()
    # Not inlined as is: no stretch of plotly.js is in the page ...
    for start in range(0, len(source) - 200, len(source) // 16):
        assert source[start : start + 200] not in page, (what, start)
    # ... its licence line once, in the clear, above the unpacker; the packed copy is the one
    # tested below.
    assert len(re.findall(r"plotly\.js v\d+\.\d+\.\d+", page)) == 1, what
    assert plotlyjs.script() in page, what


def test_the_packed_plotly_js_is_plotly_js_byte_for_byte():
    markup = plotlyjs.script()
    assert plotlyjs.unpack_element(markup, plotlyjs.PLOTLY_ID) == get_plotlyjs().encode("utf-8")
    assert len(markup.encode("utf-8")) < 1_320_000  # what is left of 1.5 MB is the figures'


def test_the_shipped_samples_are_all_found():
    names = {str(r.relative_to(SAMPLES)) for r in RUNS}
    assert {"gpt-small-2gpu", "cpu-hsdp-2x2", "diagnosis/gpt-1.3b-b4-2gpu"} <= names
    assert len(RUNS) >= 18


@pytest.mark.parametrize("run", RUNS, ids=lambda r: str(r.relative_to(SAMPLES)))
def test_every_sample_report_is_small(run):
    page = render_html(fsdp_trace.analyze(run))
    assert_small_with_plotly_packed(page, str(run))
    figures = json.loads(plotlyjs.unpack_element(page, "fsdp-figures"))["figures"]
    assert figures and all(f["figure"]["data"] for f in figures)


def test_compare_page_is_small(tmp_path):
    page = tmp_path / "compare.html"
    runs = [SAMPLES / "gpt-small-1gpu", SAMPLES / "gpt-small-2gpu", SAMPLES / "diagnosis/tuned-b16"]
    done = run_cli("compare", *map(str, runs), "--no-traces", "--html", str(page))
    assert done.returncode == 0, done.stderr
    assert_small_with_plotly_packed(page.read_text(encoding="utf-8"), "compare.html")


def test_efficiency_page_is_small_regenerated_and_committed(tmp_path):
    page = tmp_path / "efficiency.html"
    done = run_cli("plot", *map(str, REPEATS), "--out", str(page))
    assert done.returncode == 0, done.stderr
    text = page.read_text(encoding="utf-8")
    assert_small_with_plotly_packed(text, "efficiency.html")
    # plotly.js is in <head>, before the figure's own script calls Plotly.newPlot.
    assert text.index(plotlyjs.PLOTLY_ID) < text.index("</head>") < text.index("Plotly.newPlot")
    # The committed page is the packed one too (regenerate: fsdp-trace plot SWEEP/r1 SWEEP/r2
    # SWEEP/r3 --no-traces --out SWEEP/efficiency.html).
    committed = (SWEEP / "efficiency.html").read_text(encoding="utf-8")
    assert len(committed.encode("utf-8")) <= LIMIT
    assert f'id="{plotlyjs.PLOTLY_ID}"' in committed
    assert get_plotlyjs()[2000:2200] not in committed


def fnv1a(data: bytes) -> int:
    """FNV-1a, 32 bits (the browser test computes the same over what the page unpacked)."""
    h = 0x811C9DC5
    for byte in data:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


def samples_to_pack() -> dict[str, bytes]:
    """Edge cases for the packing (and the page's unpacker): empty, one byte, incompressible
    bytes, long repeats, every escaped 7-bit group in a row, text beyond ASCII."""
    rng = random.Random(13)
    return {
        "empty": b"",
        "one": b"x",
        "random": bytes(rng.getrandbits(8) for _ in range(20_000)),
        "repeats": b"abcabcabd" * 50_000 + bytes(range(256)) * 40,
        "escaped": bytes([0, 10, 13, 60, 0x80, 0xFF]) * 3_000,
        "text": ("µs · Δ — 接続 </script><!-- \r\n\t\0 " * 500).encode("utf-8"),
        "json": json.dumps({"x": [i * 0.1 for i in range(5000)]}).encode(),
    }


@pytest.mark.parametrize("name", list(samples_to_pack()))
def test_pack_round_trips_and_is_safe_in_a_page(name):
    data = samples_to_pack()[name]
    text, packed_length = plotlyjs.pack(data)
    assert plotlyjs.unpack(text, packed_length) == data
    assert not set(text) & {"\0", "\n", "\r", "<"}  # nothing HTML parsing would change or end
    assert all(ord(c) < 0x80 or 0x100 <= ord(c) < 0x300 for c in text)
    assert len(text.encode("utf-8")) <= -(-8 * packed_length // 7) + 2  # 8 bits per 7 carried
    element = plotlyjs.packed_element(f"t-{name}", data)
    assert plotlyjs.unpack_element(f"<p>{element}</p>", f"t-{name}") == data


def test_packed_plotly_is_cached_in_the_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("FSDP_TRACE_CACHE_DIR", str(tmp_path))
    data = b"plotly.js stand-in " * 1000
    first = plotlyjs._pack_cached(data)
    (stored,) = (tmp_path / "plotlyjs").iterdir()
    assert plotlyjs._pack_cached(data) == first
    # A damaged copy is packed anew (and rewritten), never used.
    stored.write_text(stored.read_text(encoding="utf-8")[:-5] + "#####", encoding="utf-8")
    assert plotlyjs._pack_cached(data) == first
    assert plotlyjs.unpack(*first) == data
    monkeypatch.setenv("FSDP_TRACE_CACHE", "0")
    os.unlink(stored)
    assert plotlyjs._pack_cached(data) == first and not stored.exists()


def test_fnv1a_reference():
    assert fnv1a(b"") == 0x811C9DC5 and fnv1a(b"a") == 0xE40C292C


def page_of_packed(path: Path) -> Path:
    """A page that unpacks every `samples_to_pack()` element with the page's own unpacker and
    writes on <body> the length and FNV-1a hash of each (for the browser test)."""
    elements = "".join(plotlyjs.packed_element(k, v) for k, v in samples_to_pack().items())
    unpack_js = plotlyjs.UNPACK_JS.read_text(encoding="utf-8")
    check = """
    var out = {};
    document.querySelectorAll('script[type="application/x-fsdp-packed"]').forEach(function (e) {
      var b = fsdpUnpack.bytes(e), h = 0x811c9dc5;
      for (var i = 0; i < b.length; i++) h = Math.imul(h ^ b[i], 0x01000193) >>> 0;
      out[e.id] = [b.length, h];
    });
    document.body.setAttribute("data-unpacked", JSON.stringify(out));
    """
    path.write_text(
        f"<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>{elements}"
        f"<script>{unpack_js}{check}</script></body></html>",
        encoding="utf-8",
    )
    return path
