"""HTML fragments of the view model (`fsdp_trace.present.view`): tables, cards, the verdict,
the inferred configuration, findings and notices. Text comes formatted from the view; this
module only escapes it and lays it out."""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Sequence

from fsdp_trace.present.view import FindingView, RunView, Table


def esc(text: object) -> str:
    return html.escape(str(text))


# A cell that reads as a number: "52.76", "3.6 (3.5–3.9)", "+62.1", "113 (87 %)", "—".
NUMERIC = re.compile(r"^[\d\s.,+\-–—%()/]*$")


def _numeric_columns(view: Table) -> set[int]:
    """Columns from `numeric_from` on whose every cell reads as a number (right-aligned);
    a text column there (a verdict, a mesh) stays left-aligned and may wrap."""
    return {
        i
        for i in range(view.numeric_from, len(view.headers))
        if all(NUMERIC.match(row[i]) for row in view.rows if i < len(row))
    }


# Where a number's cell may break: before its parenthesis ("52.76 (51.56–55.38)"), never inside
# a piece, so that a narrow window wraps a column instead of scrolling it away.
PIECE = re.compile(r" (?=\()")


def number(text: str) -> str:
    """A number's cell: its pieces, each kept on one line."""
    return " ".join(f'<span class="nw">{esc(p)}</span>' for p in PIECE.split(text))


def name(text: str) -> str:
    """A name's cell ("gpt-small-1gpu (differs: AC coverage)"): the name on one line (never
    broken at its hyphens), what follows it free to wrap."""
    first, *rest = PIECE.split(text, maxsplit=1)
    return f'<span class="nw">{esc(first)}</span>' + "".join(f" {esc(r)}" for r in rest)


def untitled(title: str, heading: str) -> str:
    """A table's title without the panel heading it would repeat: "Per rank (median and
    min–max …)" under "Per rank" is "Median and min–max …"."""
    if not heading or not title.lower().startswith(heading.lower()):
        return title
    rest = title[len(heading) :].strip()
    if rest.startswith("(") and rest.endswith(")"):
        rest = rest[1:-1]
    rest = rest.lstrip(":;,— ").strip()
    if rest.split(" ", 1)[0].isalpha():  # a word, not a name (get_comm_comp_overlap)
        rest = rest[:1].upper() + rest[1:]
    return rest


def table(view: Table, *, caption: bool = True, heading: str = "") -> str:
    """A view Table: its title as a caption (less the panel `heading` it would repeat),
    headers, rows (highlighted rows flagged)."""
    numeric = _numeric_columns(view)

    def cls(i: int) -> str:
        return ' class="num"' if i in numeric else ""

    def cell(i: int, text: str) -> str:
        return number(text) if i in numeric else name(text) if i in view.names else esc(text)

    head = "".join(f"<th{cls(i)}>{esc(h)}</th>" for i, h in enumerate(view.headers))
    flags = view.highlight or [False] * len(view.rows)
    body = "".join(
        ('<tr class="flag">' if flag else "<tr>")
        + "".join(f"<td{cls(i)}>{cell(i, c)}</td>" for i, c in enumerate(row))
        + "</tr>"
        for row, flag in zip(view.rows, flags, strict=True)
    )
    shown = untitled(view.title, heading)
    title = f'<p class="caption">{esc(shown)}</p>' if caption and shown else ""
    return (
        f'{title}<div class="scroll"><table class="data" data-table="{esc(view.key)}">'
        f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
    )


def cards(items: Iterable, group: str, heading: str) -> str:
    """A row of cards (view Cards or headline Figures: key, label, value, sub, tone)."""
    items = list(items)
    if not items:
        return ""
    inner = "".join(
        f'<div class="card {esc(c.tone)}" data-key="{esc(c.key)}"><div class="label">'
        f'{esc(c.label)}</div><div class="value">{esc(c.value)}</div>'
        f'<div class="sub">{esc(c.sub)}</div></div>'
        for c in items
    )
    return (
        f'<div class="card-group" data-cards="{esc(group)}"><div class="group-label">'
        f'{esc(heading)}</div><div class="cards">{inner}</div></div>'
    )


def verdict(view: RunView) -> str:
    tone = "unmeasured" if view.cpu else "good" if view.healthy else "bad"
    return (
        f'<div class="verdict {tone}" data-verdict="{tone}"><span class="tag">Verdict</span>'
        f"{esc(view.verdict)}</div>"
    )


def config(lines: Sequence[tuple[str, str, str]]) -> str:
    """The inferred configuration: one row per item, with where it came from."""
    rows = "".join(
        f'<tr><th scope="row">{esc(label)}</th><td>{esc(value)}</td>'
        f'<td class="source">{esc(source)}</td></tr>'
        for label, value, source in lines
    )
    return (
        '<table class="data config" data-table="config"><thead><tr><th>item</th><th>value</th>'
        f"<th>from</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def notices(items: Sequence[str], scope: str) -> str:
    if not items:
        return ""
    lines = "".join(f"<li>{esc(n)}</li>" for n in items)
    return (
        f'<div class="notices" data-notices="{esc(scope)}"><b>Notices</b> '
        f'<span class="count">({len(items)})</span><ul>{lines}</ul></div>'
    )


def _line(label: str, body: str, cls: str = "") -> str:
    return f'<div class="line {cls}"><b>{esc(label)}</b> {body}</div>'


def _symptom(s: FindingView) -> str:
    cost = f' <span class="cost">{esc(s.cost)}</span>' if s.cost else ""
    return (
        f'<div class="symptom" data-rule="{esc(s.rule)}"><div class="stitle">explains: '
        f"{esc(s.title)}{cost}</div>"
        f'<div class="line">{esc(s.evidence)}</div></div>'
    )


def finding(f: FindingView) -> str:
    """One numbered cause: what it costs, the cause, where, the evidence, why it matters, the
    change (and how to try it), its basis, and the symptoms it explains folded under it."""
    measurement = f.kind != "cause"  # a note: no cost of its own
    kind = f.kind
    badge = (
        '<span class="badge measurement">about the measurement</span>'
        if measurement
        else f'<span class="cost">{esc(f.cost)}</span>'
    )
    lines = [_line("cause:", esc(f.cause))]
    if f.where:
        lines.append(_line("where:", esc(f.where)))
    lines += [_line("evidence:", esc(f.evidence)), _line("why:", esc(f.why))]
    lines.append(_line("change:", esc(f.change), "change"))
    if f.cli:
        lines.append(_line("try:", f"<code>fsdp-trace capture … {esc(f.cli)}</code>", "change"))
    if f.code:
        lines.append(_line("in code:", f"<code>{esc(f.code)}</code>", "change"))
    symptoms = "".join(_symptom(s) for s in f.symptoms)
    return (
        f'<li class="finding {kind}" data-rule="{esc(f.rule)}" value="{f.number}">'
        f'<div class="title"><span class="number">{f.number}.</span> {esc(f.title)} {badge}'
        f'<span class="basis {esc(f.basis)}">{esc(f.basis)}</span></div>'
        + "".join(lines)
        + (f'<div class="symptoms">{symptoms}</div>' if symptoms else "")
        + "</li>"
    )


def findings(view: RunView) -> str:
    """The diagnosis: causes (costliest first), then notes about the measurement, then the
    minor findings apart; the view's heading line first (a plain healthy line when nothing)."""
    if not view.findings and not view.minor:
        return f'<p class="healthy" data-healthy="true">{esc(view.diagnosis_heading)}</p>'
    lead = view.diagnosis_heading
    out = f'<p class="caption">{esc(lead)}</p>'
    if view.findings:
        out += '<ol class="findings">' + "".join(finding(f) for f in view.findings) + "</ol>"
    if view.minor:
        out += (
            '<div class="minor"><b>Minor</b> (each below 1 % of the step, or its saving within '
            "the run&#39;s noise)<ul>"
            + "".join(
                f'<li data-rule="{esc(f.rule)}">{esc(f.title)} — {esc(f.cost)}: '
                f"{esc(f.evidence)}</li>"
                for f in view.minor
            )
            + "</ul></div>"
        )
    return out
