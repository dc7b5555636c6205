"""plotly.js in a self-contained page, packed: the one place report.html, compare.html and
efficiency.html get it from.

plotly.js (taken at run time from the installed plotly package, `get_plotlyjs()`; nothing of
it is kept in this repository) is 4.8 MB as of plotly 7. Inlined as is, every page was ~5 MB.
Deflate (what browsers' `DecompressionStream` decodes) brings it to 1.47 MB, 1.96 MB in
base64: still over the 1.5 MB a page may weigh. So it is packed with LZMA (1.11 MB) and written
7 bits a character (1.27 MB), in an inert `<script type="application/x-fsdp-packed">` element;
`static/unpack.js` (fsdp-trace's own ~200 lines) decodes it synchronously and evaluates it
where plotly.js used to be inlined, so every script after it finds `Plotly` defined as before.
The page still opens offline, from disk, in any browser of the last years (it needs
`TextDecoder` and typed arrays, nothing newer). `pack` also packs other page data (the
report's figures). Packing plotly.js takes ~2 s: done once per process, and kept in the cache
folder (`fsdp_trace.analysis.read.cache.directory()/plotlyjs/`, keyed by plotly.js' content) so that
the next process reads it back: read only under the cache's trust rules (a regular file of
one's own that no one else can write, whose checksum matches and which names the full
digest of the plotly.js it packs), also under `--no-cache` (it depends on no input: without
it every `--no-cache` report packed anew, ~2 s), never with FSDP_TRACE_CACHE=0 (packed in
memory then), deleted by `fsdp-trace cache clear`. A cache folder that cannot be written (or
read) only means packing anew: the page is the same.
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import lzma
import re
from functools import cache
from pathlib import Path

import numpy as np

# lc, lp, pb of the LZMA1 stream: 3 literal context bits, byte-aligned text (no position bits).
LZMA_PROPS = (3, 0, 0)
# 7-bit groups written as a pair with the next one (one character from U+0100): NUL, LF and CR
# (which HTML parsing and line-ending conversions change) and "<" (which could end the script).
ESCAPED = (0, 10, 13, 60)
PACK_FORMAT = 2  # the cached packed plotly.js of another format is not read
PACKED_TYPE = "application/x-fsdp-packed"
PLOTLY_ID = "fsdp-plotlyjs"
UNPACK_JS = Path(__file__).parent / "report" / "static" / "unpack.js"


def _lzma_filters() -> list[dict]:
    lc, lp, pb = LZMA_PROPS
    return [{"id": lzma.FILTER_LZMA1, "preset": 6, "lc": lc, "lp": lp, "pb": pb}]


def _to_text(data: bytes) -> str:
    """Bytes as text, 7 bits a character (see ESCAPED)."""
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8))
    bits = np.concatenate([bits, np.zeros(-len(bits) % 7, dtype=np.uint8)])
    groups = (bits.reshape(-1, 7) << np.arange(6, -1, -1, dtype=np.uint8)).sum(axis=1)
    groups = groups.astype(np.uint32)
    escaped = np.isin(groups, ESCAPED)
    index = np.arange(len(groups))
    # In a run of escaped groups, every other one (from the first) opens a pair; a pair's
    # second group is written within it, whatever its value.
    last_plain = np.maximum.accumulate(np.where(escaped, -1, index))
    opens = escaped & ((index - last_plain - 1) % 2 == 0)
    inside = np.zeros_like(opens)
    inside[1:] = opens[:-1]
    following = np.append(groups[1:], np.uint32(0))  # a pair at the very end pads with 0
    slot = np.searchsorted(np.array(ESCAPED, dtype=np.uint32), groups)
    codes = np.where(opens, 0x100 + (slot.astype(np.uint32) << 7 | following), groups)
    codes = codes[~inside].astype("<u4")
    return codes.tobytes().decode("utf-32-le")


def _from_text(text: str, length: int) -> bytes:
    """The inverse of `_to_text`: the first `length` bytes."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype="<u4").astype(np.int64)
    pair = codes >= 0x100
    first = np.where(pair, np.array(ESCAPED)[(np.where(pair, codes - 0x100, 0) >> 7)], codes)
    second = (codes - 0x100) & 127
    groups = np.column_stack([first, second]).ravel()[
        np.column_stack([np.ones_like(pair), pair]).ravel()
    ]
    bits = ((groups[:, None] >> np.arange(6, -1, -1)) & 1).astype(np.uint8).ravel()
    data = np.packbits(bits[: len(bits) - len(bits) % 8]).tobytes()
    if len(data) < length:
        raise ValueError("packed data is truncated")
    return data[:length]


def pack(data: bytes) -> tuple[str, int]:
    """`data` LZMA-compressed and written as text: (text, compressed length in bytes)."""
    packed = lzma.compress(data, format=lzma.FORMAT_RAW, filters=_lzma_filters())
    return _to_text(packed), len(packed)


def unpack(text: str, packed_length: int) -> bytes:
    """What `pack` packed (for tests and tools; the page unpacks with static/unpack.js)."""
    packed = _from_text(text, packed_length)
    return lzma.decompress(packed, format=lzma.FORMAT_RAW, filters=_lzma_filters())


def _pack_cached(data: bytes) -> tuple[str, int]:
    """`pack(data)`, through the cache folder (a damaged, untrusted or unreadable copy is
    packed anew), `--no-cache` (`cache.off()`) included: it depends on no input; with
    FSDP_TRACE_CACHE=0 (or a refused folder), packed here and nothing is read or written."""
    from fsdp_trace.analysis.read import cache

    if not cache.enabled(assets=True):
        return pack(data)
    source = hashlib.sha256(data).hexdigest()
    name = f"{cache.PACKED_PREFIX}{PACK_FORMAT}-{source[:32]}.txt"
    try:
        path = cache.directory() / cache.PACKED_PLOTLYJS / name
    except RuntimeError:  # no home folder to put it in
        return pack(data)
    stored = cache.read_own(path)
    with contextlib.suppress(ValueError):
        header, text = (stored or b"").decode("utf-8").split("\n", 1)
        packed_length, digest, packs = header.split(" ")
        if packs == source and hashlib.sha256(text.encode("utf-8")).hexdigest() == digest:
            return text, int(packed_length)
    text, packed_length = pack(data)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    cache.write_own(path, f"{packed_length} {digest} {source}\n{text}".encode())
    return text, packed_length


def packed_element(element_id: str, data: bytes, cached: bool = False) -> str:
    """An inert element holding `data` packed, for `fsdpUnpack.text(element)` in the page
    (`cached`: through the cache folder, for data that recurs: plotly.js)."""
    text, packed_length = _pack_cached(data) if cached else pack(data)
    lc, lp, pb = LZMA_PROPS
    return (
        f'<script type="{PACKED_TYPE}" id="{html.escape(element_id)}" '
        f'data-packed="{packed_length}" data-size="{len(data)}" data-lzma="{lc},{lp},{pb}">'
        f"{text}</script>"
    )


_PACKED = re.compile(
    r'<script type="application/x-fsdp-packed" id="(?P<id>[^"]*)" data-packed="(?P<packed>\d+)"'
    r' data-size="(?P<size>\d+)" data-lzma="3,0,0">(?P<text>[^<]*)</script>'
)


def unpack_element(page: str, element_id: str) -> bytes:
    """The data of the packed element `element_id` of a page (for tests and tools)."""
    for match in _PACKED.finditer(page):
        if match["id"] == element_id:
            data = unpack(match["text"], int(match["packed"]))
            if len(data) != int(match["size"]):
                raise ValueError(f"{element_id}: unpacked {len(data)} bytes, not {match['size']}")
            return data
    raise KeyError(element_id)


def plotly_version(source: str) -> str:
    """plotly.js' version, from its licence header."""
    found = re.search(r"plotly\.js v(\d[\w.+-]*)", source[:500])
    return found.group(1) if found else "(unknown version)"


@cache
def script() -> str:
    """The markup that defines `Plotly` where it stands, as an inlined plotly.js would: the
    packed plotly.js, the unpacker (also `fsdpUnpack` for the page's own packed data), and the
    call that unpacks and evaluates it. If that fails (a damaged file), the page says so at its
    top and on <body> (`data-fsdp-plotly-error`), and the error reaches the console."""
    from plotly.offline import get_plotlyjs

    source = get_plotlyjs()
    version = plotly_version(source)
    loader = (
        f"/* plotly.js v{version} (MIT license, Copyright Plotly, Inc.; from the plotly Python "
        f"package), LZMA-packed above by fsdp-trace and evaluated here. */\n"
        f"{UNPACK_JS.read_text(encoding='utf-8')}"
        "(function () {\n"
        '  var element = document.getElementById("' + PLOTLY_ID + '");\n'
        "  try {\n"
        "    window.PlotlyConfig = {MathJaxConfig: 'local'};\n"
        "    (0, eval)(fsdpUnpack.text(element));\n"
        "    element.textContent = '';\n"
        "  } catch (err) {\n"
        "    var say = function () {\n"
        '      document.body.setAttribute("data-fsdp-plotly-error", String(err));\n'
        '      var note = document.createElement("p");\n'
        '      note.style.cssText = "color:#b00;font:bold 14px sans-serif;margin:12px";\n'
        '      note.textContent = "The figures cannot be drawn: plotly.js could not be '
        'unpacked (" + err + ").";\n'
        "      document.body.insertBefore(note, document.body.firstChild);\n"
        "    };\n"
        '    if (document.body) say(); else addEventListener("DOMContentLoaded", say);\n'
        "    throw err;\n"
        "  }\n"
        "})();\n"
    )
    assert not re.search(r"</script|<!--", loader, re.IGNORECASE), "the loader would end early"
    packed = packed_element(PLOTLY_ID, source.encode("utf-8"), cached=True)
    return packed + f"<script>{loader}</script>"


def to_html(fig, **options) -> str:
    """`fig.to_html(**options)` with the packed plotly.js instead of the inlined one (before
    the figure, or in <head> of a full page): one such figure a page. Once drawn, the figure
    adds one to `data-fsdp-rendered` on <body> (report.html sets it once all its figures are
    drawn), which the browser test waits for."""
    from fsdp_trace.render.report.style import RENDERED_ATTRIBUTE as DRAWN

    options.pop("include_plotlyjs", None)
    count = (
        f'var b = document.body; b.setAttribute("{DRAWN}", '
        f'String(Number(b.getAttribute("{DRAWN}") || 0) + 1));'
    )
    post = options.pop("post_script", None) or []
    post = [post] if isinstance(post, str) else list(post)
    markup = fig.to_html(include_plotlyjs=False, post_script=[*post, count], **options)
    if options.get("full_html", True):
        head = markup.index("</head>")
        return markup[:head] + script() + markup[head:]
    return script() + markup
