"""Make a large Kineto trace out of a real capture by replicating its steps.

    python benchmarks/make_large_trace.py --size 1GB --out /tmp/big           # rank0.json, ~1 GB
    python benchmarks/make_large_trace.py --size 1GB --ranks 8 --out /tmp/big8  # 8 ranks, 1 GB each
    python benchmarks/make_large_trace.py --replicas 3 --out /tmp/small \
        --source sample_traces/gpt-small-2gpu/rank0.detailed.json.gz

Every replica of the source's events is a copy of the real capture, shifted in time by the
source's span (plus a gap; with several ranks, the longest rank's span, the same for all, so the
ranks stay aligned step by step as captured and all have the same steps), with correlation
ids, External ids, flow ids, Python ids, autograd sequence numbers and `ProfilerStep#N`
numbers renumbered, so every kernel still links to its launch and the steps stay distinct:
N replicas of a trace with S steps hold N×S steps, and their analysis has N× the kernels,
collectives and steps of the source's.

The source's text is kept as written (Kineto's layout and its exact decimal timestamps): each
event is parsed once into a template of literal text and numeric slots, and a replica is one
string join over the slots' shifted values. Output is streamed replica by replica, never held
whole in memory. Metadata events (`ph: M`), global instants and the `Trace` span appear once.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import math
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE = REPO / "sample_traces" / "gpt-small-2gpu"

# Numeric fields renumbered per replica. "ts" shifts by the period (its integer part only: the
# fraction stays as written, so timestamps stay exact), ids by a stride, steps by the step count.
_SLOT = re.compile(
    r'"(?P<key>ts|id|correlation|External id|Python id|Python parent id|Sequence number|Seq)"'
    r"(?P<sep>\s*:\s*)(?P<num>-?\d+)"
    r'|"ProfilerStep#(?P<step>\d+)"'
)
TS, ID, STEP = 0, 1, 2
_REPLICATED_PHASES = {"X", "s", "f", "t", "B", "E", "b", "e", "n", "C"}


def _parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*([\d.]+)\s*([kmgt]?i?b?)?\s*", text, re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (e.g. 1GB, 300MB)")
    unit = (match.group(2) or "").lower().rstrip("b").rstrip("i")
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[unit]
    return int(float(match.group(1)) * scale)


def read_text(path: Path) -> str:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return data.decode("utf-8")


@dataclass
class Source:
    """A source trace split into its header, its events (object and exact text), its footer."""

    header: str  # up to and including the '[' of traceEvents
    events: list[tuple[dict, str]]
    separator: str  # the text between two events, as the source writes it
    footer: str  # from the ']' closing traceEvents to the end

    @classmethod
    def read(cls, path: Path) -> Source:
        text = read_text(path)
        opening = re.search(r'(?<!\\)"traceEvents"\s*:\s*\[', text)
        if opening is None:
            raise SystemExit(f"{path}: no traceEvents array")
        decoder = json.JSONDecoder()
        space = re.compile(r"\s*")
        pos = space.match(text, opening.end()).end()
        events: list[tuple[dict, str]] = []
        separator = ",\n  "
        while text[pos] != "]":
            obj, end = decoder.raw_decode(text, pos)
            events.append((obj, text[pos:end]))
            nxt = space.match(text, end).end()
            if text[nxt] == ",":
                after = space.match(text, nxt + 1).end()
                if len(events) == 1:
                    separator = text[end:after]
                pos = after
            else:
                pos = nxt
        return cls(text[: opening.end()], events, separator, text[pos:])


@dataclass
class Template:
    """The replicated events as one text with numeric slots: literal, slot, literal, ..."""

    literals: list[str]  # len(slots) + 1
    kinds: np.ndarray  # TS / ID / STEP per slot
    base: np.ndarray  # the source's value per slot
    shifts: np.ndarray  # whether the slot shifts (negative ids mean "absent": kept)
    period_us: int
    id_stride: int
    step_stride: int
    n_steps: int
    n_events: int

    @classmethod
    def build(cls, events: list[tuple[dict, str]], separator: str, gap_us: int) -> Template:
        """The template of `events`; its period is their span plus `gap_us` (see `aligned`)."""
        literals: list[str] = []
        kinds: list[int] = []
        base: list[int] = []
        pending = []  # text since the last slot
        t_min, t_max = math.inf, -math.inf
        for i, (obj, text) in enumerate(events):
            if i:
                pending.append(separator)
            ts, dur = obj.get("ts"), obj.get("dur") or 0
            if isinstance(ts, int | float):
                t_min, t_max = min(t_min, ts), max(t_max, ts + dur)
            last = 0
            for m in _SLOT.finditer(text):
                if m.group("step") is not None:
                    start, end, kind, value = m.start("step"), m.end("step"), STEP, m["step"]
                else:
                    start, end, value = m.start("num"), m.end("num"), m["num"]
                    kind = TS if m["key"] == "ts" else ID
                pending.append(text[last:start])
                literals.append("".join(pending))
                pending = []
                kinds.append(kind)
                base.append(int(value))
                last = end
            pending.append(text[last:])
        literals.append("".join(pending))
        kinds_a = np.array(kinds, dtype=np.int8)
        base_a = np.array(base, dtype=np.int64)
        ids = base_a[kinds_a == ID]
        steps = base_a[kinds_a == STEP]
        n_steps = int(steps.max() - steps.min() + 1) if steps.size else 0
        return cls(
            literals=literals,
            kinds=kinds_a,
            base=base_a,
            shifts=(kinds_a != ID) | (base_a >= 0),
            period_us=math.ceil(t_max - t_min) + gap_us if t_min < math.inf else 0,
            id_stride=int(ids.max()) + 1 if ids.size else 0,
            step_stride=n_steps,
            n_steps=n_steps,
            n_events=len(events),
        )

    def aligned(self, period_us: int) -> Template:
        """This template with another period (at least its own: replicas must not overlap).
        Ranks given one period stay as aligned in every replica as in the capture; each
        rank's own span would let them drift apart by the spans' difference per replica."""
        if period_us < self.period_us:
            raise ValueError(f"period {period_us} µs is shorter than the span {self.period_us}")
        return dataclasses.replace(self, period_us=period_us)

    def replica(self, k: int) -> str:
        """The text of replica k (0 is the source as written)."""
        offsets = np.array([k * self.period_us, k * self.id_stride, k * self.step_stride])
        values = self.base + np.where(self.shifts, offsets[self.kinds], 0)
        parts: list[str | None] = [None] * (2 * len(self.literals) - 1)
        parts[0::2] = self.literals
        parts[1::2] = map(str, values.tolist())
        return "".join(parts)  # type: ignore[arg-type]


def _once(obj: dict) -> bool:
    """Events written once, not per replica: metadata, global instants, the Trace span."""
    return obj.get("ph") not in _REPLICATED_PHASES or obj.get("cat") == "Trace"


def _stretch_trace_span(obj: dict, text: str, extra_us: float) -> str:
    if obj.get("cat") != "Trace" or not isinstance(obj.get("dur"), int | float):
        return text
    return re.sub(r'("dur"\s*:\s*)[-\d.eE+]+', lambda m: f"{m[1]}{obj['dur'] + extra_us:.3f}", text)


def _set_rank(header: str, rank: int, world_size: int) -> str:
    info = re.search(r'"distributedInfo"\s*:\s*\{', header)
    if info is None:
        return header
    head, tail = header[: info.end()], header[info.end() :]
    tail = re.sub(r'("rank"\s*:\s*)-?\d+', lambda m: f"{m[1]}{rank}", tail, count=1)
    tail = re.sub(r'("world_size"\s*:\s*)\d+', lambda m: f"{m[1]}{world_size}", tail, count=1)
    return head + tail


def source_files(source: Path) -> list[Path]:
    """Per-rank source traces: a file, or the timing traces of a capture run directory."""
    if source.is_file():
        return [source]
    run = source / "run.json"
    if run.exists():
        files = json.loads(run.read_text()).get("files", {}).get("timing", [])
        if files:
            return [source / f for f in files]
    found = sorted(p for p in source.iterdir() if p.name.endswith((".json", ".json.gz")))
    if not found:
        raise SystemExit(f"{source}: no traces")
    return found


def template_of(src: Source, gap_us: int = 1000) -> Template:
    """The template of the source's replicated events (all but `_once` ones)."""
    return Template.build([(o, t) for o, t in src.events if not _once(o)], src.separator, gap_us)


def replicas_for(template: Template, src: Source, size: int) -> int:
    """Replicas that make about `size` bytes of raw JSON."""
    replica_bytes = len(template.replica(0).encode()) + len(src.separator)
    return max(1, round(size / replica_bytes))


def write_trace(
    src: Source,
    out: Path,
    *,
    replicas: int | None = None,
    size: int | None = None,
    gap_us: int = 1000,
    rank: int | None = None,
    world_size: int | None = None,
    compress: bool = False,
    template: Template | None = None,
) -> dict:
    """Write one replicated trace; returns what was written (replicas, steps, bytes).
    `template`: the source's (with the period shared by all ranks), else built here."""
    once = [(o, t) for o, t in src.events if _once(o)]
    template = template or template_of(src, gap_us)
    if replicas is None:
        replicas = replicas_for(template, src, size) if size else 1
    header = src.header
    if rank is not None:
        header = _set_rank(header, rank, world_size or rank + 1)
    extra = (replicas - 1) * template.period_us
    tail = [_stretch_trace_span(o, t, extra) for o, t in once]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with gzip.open(tmp, "wb", compresslevel=1) if compress else open(tmp, "wb") as fh:
        fh.write(header.encode())
        lead = re.search(r"\s*$", src.separator)
        fh.write(("\n  " if lead is None else src.separator[lead.start() :]).encode())
        for k in range(replicas):
            if k:
                fh.write(src.separator.encode())
            fh.write(template.replica(k).encode())
        for text in tail:
            fh.write((src.separator + text).encode())
        fh.write(("\n  " + src.footer).encode())
    tmp.replace(out)
    return {
        "path": str(out),
        "replicas": replicas,
        "steps": replicas * template.n_steps,
        "events": replicas * template.n_events + len(once),
        "bytes": out.stat().st_size,
        "period_us": template.period_us,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--source",
        type=Path,
        default=DEFAULT_SOURCE,
        help="a trace file, or a run/trace directory (one source per rank, cycled); "
        "default: the shipped gpt-small-2gpu timing traces",
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--size", type=_parse_size, help="target raw JSON size per rank (1GB)")
    group.add_argument("--replicas", type=int, help="exact number of copies of the source")
    parser.add_argument("--ranks", type=int, default=1, help="rank files to write")
    parser.add_argument("--gap-us", type=int, default=1000, help="idle time between replicas")
    parser.add_argument("--gzip", action="store_true", help="write .json.gz (level 1)")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    args = parser.parse_args(argv)
    if args.size is None and args.replicas is None:
        args.size = _parse_size("1GB")
    sources = source_files(args.source)
    used = list(dict.fromkeys(sources[r % len(sources)] for r in range(args.ranks)))
    parsed = {path: Source.read(path) for path in used}
    templates = {path: template_of(parsed[path], args.gap_us) for path in used}
    # One period and one replica count for every rank: replica k of each rank is its source
    # shifted by the same k·period, so the ranks stay aligned step by step as captured, and
    # every rank has the same steps.
    period = max(t.period_us for t in templates.values())
    templates = {path: t.aligned(period) for path, t in templates.items()}
    replicas = args.replicas or replicas_for(templates[used[0]], parsed[used[0]], args.size)
    for r in range(args.ranks):
        path = sources[r % len(sources)]
        start = time.perf_counter()
        name = f"rank{r}.json" + (".gz" if args.gzip else "")
        info = write_trace(
            parsed[path],
            args.out / name,
            replicas=replicas,
            gap_us=args.gap_us,
            rank=r if args.ranks > 1 else None,
            world_size=args.ranks if args.ranks > 1 else None,
            compress=args.gzip,
            template=templates[path],
        )
        info["seconds"] = round(time.perf_counter() - start, 2)
        info["source"] = str(path)
        print(json.dumps(info), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
