"""The compiled reader (`fsdp_trace/analysis/read/_fastread.c`) against the msgspec path it
stands in for: on every shipped trace, on the hostile corpus, on random events and on random
damage to them, it gives exactly what the msgspec path gives (the loaded `Trace`, the same
one-line error), or declines the piece (which then goes to msgspec). It never takes text that
msgspec refuses."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import random
import struct
import threading
import time
from pathlib import Path

import msgspec
import pandas as pd
import pytest
from pandas.testing import assert_frame_equal

from fsdp_trace.analysis.read import columns as columns_mod
from fsdp_trace.analysis.read import loader
from fsdp_trace.analysis.read.columns import READER_ENV, Columns
from fsdp_trace.analysis.read.events import LIST_DECODER
from fsdp_trace.errors import UserError
from tests import test_hostile
from tests.conftest import REPO, SAMPLES

BUILT = columns_mod._CompiledReader is not None
needs_it = pytest.mark.skipif(not BUILT, reason="the compiled reader is not built here")


@pytest.mark.skipif(
    os.environ.get("FSDP_TRACE_REQUIRE_COMPILED") != "1",
    reason="FSDP_TRACE_REQUIRE_COMPILED unset (.ci/run sets it where a C compiler is)",
)
def test_the_compiled_reader_is_built_where_a_compiler_is():
    assert BUILT, "the compiled reader is not built (or not of this version): see setup.py"


# --- whole traces through the loader ------------------------------------------------------


def _load(path: Path, reader: str, monkeypatch) -> object:
    """The loaded Trace, or the error's text."""
    monkeypatch.setenv(READER_ENV, reader)
    try:
        return loader.load_trace(path, cache=False, progress=False, parallel=False)
    except UserError as exc:
        return str(exc)


def _assert_same(a: object, b: object, where: str) -> None:
    if isinstance(a, str) or isinstance(b, str):
        assert a == b, where
        return
    for field in dataclasses.fields(a):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, pd.DataFrame):
            assert_frame_equal(x, y, check_exact=True, obj=f"{where}: {field.name}")
            assert list(x.dtypes) == list(y.dtypes), where
        else:
            assert x == y, f"{where}: {field.name}"


def _shipped() -> list[Path]:
    roots = (SAMPLES, REPO / "tests" / "data", REPO / "benchmarks" / "traces")
    return sorted(
        p for root in roots for p in root.rglob("*") if p.name.endswith((".json", ".json.gz"))
    )


@needs_it
def test_every_shipped_trace_loads_alike(monkeypatch):
    paths = _shipped()
    assert len(paths) > 40
    taken = 0
    for path in paths:
        compiled = _load(path, "", monkeypatch)
        _assert_same(_load(path, "python", monkeypatch), compiled, str(path))
        taken += not isinstance(compiled, str)
    assert taken > 40


@needs_it
def test_kinetos_own_traces_never_go_to_msgspec(monkeypatch):
    """The shipped traces (Kineto's output) are the compiled reader's plain case: every piece
    of them is taken by it, none declined to `Columns.add`."""
    calls = {"add": 0, "take": 0}
    add, take = Columns.add, Columns.take

    def counted(name, method):
        def call(self, *args):
            calls[name] += 1
            return method(self, *args)

        return call

    monkeypatch.setattr(Columns, "add", counted("add", add))
    monkeypatch.setattr(Columns, "take", counted("take", take))
    monkeypatch.delenv(READER_ENV, raising=False)
    for path in sorted(SAMPLES.rglob("*.json.gz")):
        loader.load_trace(path, cache=False, progress=False, parallel=False)
    assert calls["add"] == 0 and calls["take"] > 100


@needs_it
def test_the_hostile_corpus_loads_alike(tmp_path, monkeypatch):
    """Every file of the hostile corpus: the same Trace, or the same one-line error."""
    base = test_hostile._small_document()
    compared = 0
    for name, case in test_hostile.CORPUS.items():
        if "bomb" in name or "fifo" in name or "dev_null" in name:
            continue  # not a text the reader sees (refused before, or gigabytes of it)
        folder = tmp_path / name
        folder.mkdir()
        try:
            paths = case.make(folder, copy.deepcopy(base))
        except OSError:
            continue
        for path in map(Path, paths):
            if not path.is_file() or path.suffix == ".html":
                continue
            _assert_same(_load(path, "python", monkeypatch), _load(path, "", monkeypatch), name)
            compared += 1
    assert compared > 60


# --- pieces of random events --------------------------------------------------------------

NAMES = [
    "aten::mm",
    "ncclDevKernel_AllGather_RING_LL",
    "gloo:all_reduce",
    "café",
    'a"b',
    "x\\y",
    "tab\tname",
    "\U0001f600 emoji",
    "",
    "FSDP::all_gather (layers.3)",
    "thread_name",
    "process_name",
]
CATS = ["cpu_op", "kernel", "python_function", "Trace", "gpu_memcpy", "user_annotation", "ac2g"]


def _number(rng: random.Random):
    return rng.choice(
        [
            lambda: round(rng.uniform(0, 1e13), rng.randint(0, 3)),
            lambda: rng.uniform(-1e3, 1e3),
            lambda: rng.randint(0, 2**60),
            lambda: 0,
            lambda: -0.0,
            lambda: 1e-7 * rng.random(),
        ]
    )()


def _event(rng: random.Random, plain: bool) -> dict:
    """One event. `plain`: of the kinds Kineto writes (the compiled reader's own case);
    else with odd values too (string pids, integers beyond int64, missing times)."""
    odd = 0.0 if plain else 0.08
    e: dict = {}
    if rng.random() < 0.97:
        e["ph"] = rng.choice(["X"] * 8 + ["M", "i", "s", "f"])
    if rng.random() < 0.95:
        e["cat"] = rng.choice(CATS)
    if rng.random() < 0.95:
        e["name"] = rng.choice(NAMES)
    for key in ("pid", "tid"):
        e[key] = rng.randint(0, 10**6)
        if rng.random() < odd:
            e[key] = rng.choice(["Spans", "GPU 0", "123", 2**64 + 5])
    e["ts"], e["dur"] = _number(rng), _number(rng)
    for key in ("ts", "dur"):
        if rng.random() < odd:
            e[key] = rng.choice([None, 2**65])
    if rng.random() < 0.1:
        e["args"] = None
    elif rng.random() < 0.9:
        args: dict = {}
        for key in ("correlation", "External id", "Sequence number", "stream"):
            if rng.random() < 0.5:
                args[key] = rng.choice([rng.randint(-1, 1000), None, 2**63 - 1, -(2**63)])
                if rng.random() < odd:
                    args[key] = rng.choice([2**63, 1.5, "7"])
        if rng.random() < 0.3:
            args["Collective name"] = rng.choice(["allgather", "reduce_scatter", None])
            args["dtype"] = rng.choice(["BFloat16", "Float", None])
            for key in ("In msg nelems", "Out msg nelems", "Group size", "Seq"):
                args[key] = rng.choice([rng.randint(0, 10**9), None])
            args["Process Group Name"] = rng.choice(["0", "1", None])
            args["Process Group Ranks"] = rng.choice(["[0, 1]", "[0, 1, 2, 3]"])
            args["Process Group Description"] = "default_pg"
        if rng.random() < 0.4:
            args["grid"] = rng.choice([[216, 1, 1], [1, 2, 3], None, "x", {"a": [1]}])
        if rng.random() < 0.4:
            args["block"] = [128, 1, 1]
        if rng.random() < 0.2:
            args["Input Dims"] = rng.choice([[[4, 5]], [], [[1]], None])
        if rng.random() < 0.2:
            args["Input type"] = rng.choice([["float"], ["c10::BFloat16"], []])
        if rng.random() < 0.2:
            args["name"] = rng.choice(["python", "stream 7", None])
        if rng.random() < 0.1:
            args["nested"] = {"x": [1, {"y": [None, True, False, 1.5e3, "z"]}]}
        e["args"] = args
    if rng.random() < 0.1:
        e["id"], e["bp"] = rng.randint(0, 10**6), "e"
    return e


def _text(rng: random.Random, events: list[dict]) -> bytes:
    """The events as JSON, in the spellings Kineto and other writers use (pretty or compact,
    escaped or raw UTF-8), separated by commas."""
    parts = [
        json.dumps(e, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, None, 1]))
        for e in events
    ]
    return rng.choice([",", ", ", ",\n  "]).join(parts).encode()


INSERTS = [b'"', b"\\", b"1e400", b"-0", b"00", b"\\u0041", b"\\ud800", b",", b"{}", b"\x01"]
INSERTS += [b'"ts":1,', b'"dur":null,', b"\xff", b"\xc3"]


def _damaged(rng: random.Random, text: bytes) -> bytes:
    data = bytearray(text)
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(data)) if data else 0
        what = rng.random()
        if what < 0.3 and data:
            data[i] = rng.choice(b'{}[]",:0123456789-.eE\\ntfu ')
        elif what < 0.5 and data:
            del data[i : i + rng.randint(1, 5)]
        elif what < 0.8:
            data[i:i] = rng.choice(INSERTS)
        else:
            del data[i:]
    return bytes(data)


def _state(columns: Columns):
    frame = columns.frame() if len(columns) else None
    return frame, {
        "raw_count": columns.raw_count,
        "python_events": columns.python_events,
        "input_dims": columns.input_dims,
        "too_big": columns.too_big,
        "thread_names": columns.thread_names,
        "process_names": columns.process_names,
        "metadata": columns.metadata,
        "string_ids": columns.ids.ids,
        "cats": list(columns.cats),
        "names": list(columns.names),
        "has_collective": columns.has_collective,
        "gloo": columns.gloo,
    }


def _assert_same_columns(a: Columns, b: Columns, text: bytes) -> None:
    frame_a, state_a = _state(a)
    frame_b, state_b = _state(b)
    assert state_a == state_b, text[:400]
    assert (frame_a is None) == (frame_b is None), text[:400]
    if frame_a is not None:
        assert_frame_equal(frame_a, frame_b, check_exact=True)


def _by_msgspec(text: bytes, defer: bool) -> Columns | None:
    columns = Columns(defer_metadata=defer)
    columns.reader = None
    try:
        columns.add(LIST_DECODER.decode(b"[" + text + b"]"))
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return None
    return columns


@needs_it
@pytest.mark.parametrize("plain", [True, False])
def test_random_pieces_read_alike_or_are_declined(plain):
    rng = random.Random(23 + plain)
    taken = declined = 0
    for _ in range(1500):
        text = _text(rng, [_event(rng, plain) for _ in range(rng.randint(1, 10))])
        defer = rng.random() < 0.3
        expected = _by_msgspec(text, defer)
        compiled = Columns(defer_metadata=defer)
        if compiled.add_text(text, 0, len(text)):
            taken += 1
            assert expected is not None, text[:400]
            _assert_same_columns(expected, compiled, text)
        else:
            declined += 1
            assert not len(compiled) and not compiled.raw_count  # nothing half-taken
    if plain:
        assert declined == 0  # Kineto's own kinds of events are all taken
    else:
        assert taken > 300 and declined > 300


@needs_it
def test_damaged_pieces_are_read_alike_or_declined():
    """Random damage (cut, flipped, inserted bytes): text msgspec refuses is always declined;
    text it takes is read alike."""
    rng = random.Random(5)
    taken = 0
    for _ in range(3000):
        text = _damaged(rng, _text(rng, [_event(rng, True) for _ in range(rng.randint(1, 6))]))
        compiled = Columns()
        if not text.strip() or not compiled.add_text(text, 0, len(text)):
            continue
        expected = _by_msgspec(text, False)
        assert expected is not None, text[:400]
        _assert_same_columns(expected, compiled, text)
        taken += 1
    assert taken > 100


@needs_it
def test_pieces_mixed_between_the_two_readers_make_one_set_of_columns():
    """Strings first seen in a piece msgspec decoded keep their codes when the compiled
    reader meets them later, and the other way round."""
    rng = random.Random(11)
    for _ in range(300):
        pieces = [
            _text(rng, [_event(rng, True) for _ in range(rng.randint(1, 8))])
            for _ in range(rng.randint(2, 6))
        ]
        defer = rng.random() < 0.3
        expected = Columns(defer_metadata=defer)
        expected.reader = None
        mixed = Columns(defer_metadata=defer)
        for text in pieces:
            events = LIST_DECODER.decode(b"[" + text + b"]")
            expected.add(events)
            if rng.random() < 0.5 or not mixed.add_text(text, 0, len(text)):
                mixed.add(events)
        _assert_same_columns(expected, mixed, pieces[0])


def test_columns_made_into_a_frame_take_nothing_more():
    """The frame holds the columns without a copy: a piece given after it is refused, and
    the frame stays as made."""
    rng = random.Random(5)
    text = _text(rng, [_event(rng, True) for _ in range(6)])
    events = LIST_DECODER.decode(b"[" + text + b"]")
    columns = Columns()
    if not columns.add_text(text, 0, len(text)):
        columns.add(events)
    frame = columns.frame()
    before = frame.copy()
    with pytest.raises(RuntimeError, match="made into a frame"):
        columns.add(events)
    if columns.reader is not None:
        with pytest.raises(RuntimeError, match="made into a frame"):
            columns.add_text(text, 0, len(text))
    with pytest.raises(RuntimeError, match="made into a frame"):
        columns.frame()
    pd.testing.assert_frame_equal(frame, before)


@needs_it
def test_the_last_piece_stops_at_the_closing_bracket():
    rng = random.Random(3)
    events = [_event(rng, True) for _ in range(20)]
    text = _text(rng, events)
    columns = Columns()
    tail = text + b' \n] , "traceName": "x"}'
    closed, got = columns.read_last(tail)
    assert closed == len(text) + 2  # where the bracket is
    columns.take(got)
    _assert_same_columns(_by_msgspec(text, False), columns, text)
    for unclosed in (text, text + b",", text + b"}"):
        assert Columns().read_last(unclosed) is None


@pytest.mark.parametrize("events", [1, 40_000])  # one piece; several (the last read apart)
@pytest.mark.parametrize(
    "layout",
    [
        b'{"traceEvents":0,"traceEvents":[EVENTS]}',  # refused by the type check first
        b'{"traceEvents":null,"traceEvents":[EVENTS]}',  # typed alike: the key search's
        b'{"traceEvents":[EVENTS],"x":1,"traceEvents":[]}',
        b'{"traceEvents":[EVENTS],"traceEvents":{"traceEvents":1}}',
        b'{"a":"traceEvents","traceEvents":[EVENTS],"b":{"traceEvents":[]}}',  # one: kept
    ],
)
@needs_it
def test_a_second_top_level_events_key_is_refused_by_either_reader(
    tmp_path, monkeypatch, layout, events
):
    """The compiled reader searches for a second `traceEvents` key only outside the events
    it read (the header, the keys after the bracket): both readers refuse it alike, and
    keep a file whose other `traceEvents` are not top-level keys."""
    event = b'{"ph":"X","cat":"cpu_op","name":"traceEvents","pid":1,"tid":1,"ts":1,"dur":1}'
    path = tmp_path / "t.json"
    path.write_bytes(layout.replace(b"EVENTS", b",".join([event] * events)))
    python, compiled = _load(path, "python", monkeypatch), _load(path, "", monkeypatch)
    _assert_same(python, compiled, str(layout))
    refused = isinstance(compiled, str) and "two 'traceEvents'" in compiled
    assert refused == (not layout.startswith(b'{"a"')), compiled


@pytest.mark.parametrize(
    "document",
    [
        # a nested `traceEvents` before the top-level one: the header's search finds it first
        b'{"meta":{"traceEvents":[EVENT]},"traceEvents":[EVENT]}',
        b'{"meta":{"traceEvents":[EVENT]}}',
        b'{"meta":{"traceEvents":[EVENT, EVENT]},"traceEvents":[]}',
        b'{"meta":{"traceEvents":[EVENT]},"traceEvents":[{"ph":"X"}]}',
        # an error in the header, named at its place in the file
        b'{"schemaVersion":tru,"traceEvents":[EVENT]}',
        b'{"traceEvents":[EVENT] "x": 1}',
        b"[EVENT, EVENT]",
        b'{"traceEvents":[EVENT]}  ]',
    ],
)
@needs_it
def test_the_end_of_the_file_is_read_alike(tmp_path, monkeypatch, document):
    event = b'{"ph":"X","cat":"cpu_op","name":"a","pid":1,"tid":1,"ts":1,"dur":1}'
    path = tmp_path / "t.json"
    path.write_bytes(document.replace(b"EVENT", event))
    _assert_same(_load(path, "python", monkeypatch), _load(path, "", monkeypatch), str(document))


@needs_it
def test_integers_msgspec_refuses_are_declined():
    """Past int64 (where msgspec's limit on long integers applies), or exponents past its
    four digits: never taken."""
    for text in (
        b'{"ph":"i","pid":' + b"9" * 4301 + b"}",
        b'{"ph":"M","name":"process_name","pid":' + b"9" * 4301 + b',"args":{"name":"p"}}',
        b'{"ph":"X","cat":"python_function","tid":-' + b"9" * 30 + b',"ts":1,"dur":1}',
        b'{"ph":"X","ts":1' + b"0" * 200 + b'e-200,"dur":1}',
        b'{"ph":"X","ts":1e10000,"dur":1}',
    ):
        assert not Columns().add_text(text, 0, len(text)), text[:60]


def _spelled(rng: random.Random) -> str:
    """A JSON number in any spelling: long mantissas, exponents, leading zeros of fractions."""
    digits = "".join(rng.choice("0123456789") for _ in range(rng.choice([0, 5, 15, 17, 19, 25])))
    text = rng.choice(["", "-"]) + (rng.choice("123456789") + digits if rng.random() < 0.9 else "0")
    if rng.random() < 0.6:
        text += "." + "".join(rng.choice("0123456789") for _ in range(rng.choice([1, 3, 17, 25])))
    if rng.random() < 0.3:
        text += rng.choice("eE") + rng.choice(["", "+", "-"]) + str(rng.choice([0, 5, 22, 23, 308]))
    return text


@needs_it
def test_numbers_are_read_to_the_bit_as_msgspec_reads_them():
    rng = random.Random(7)
    taken = 0
    for _ in range(20000):
        ts, dur = _spelled(rng), _spelled(rng)
        correlation = rng.choice(["0", "-0", str(2**63 - 1), str(-(2**63)), str(2**63), "12"])
        text = f'{{"ph":"X","ts":{ts},"dur":{dur},"args":{{"correlation":{correlation}}}}}'
        compiled = Columns()
        if not compiled.add_text(text.encode(), 0, len(text)):
            continue
        expected = _by_msgspec(text.encode(), False)
        assert expected is not None, text
        compiled._flush()
        got = (compiled.ts[0], compiled.dur[0], compiled.dense["correlation"][0])
        want = (expected.ts[0], expected.dur[0], expected.dense["correlation"][0])
        assert struct.pack("ddq", *got) == struct.pack("ddq", *want), text
        taken += 1
    assert taken > 5000


@needs_it
def test_the_python_reader_can_be_chosen(monkeypatch):
    assert columns_mod._fastread.VERSION == columns_mod.COMPILED_VERSION
    monkeypatch.setenv(READER_ENV, "python")
    assert Columns().reader is None and not columns_mod.compiled_reader()
    monkeypatch.delenv(READER_ENV)
    assert Columns().reader is not None and columns_mod.compiled_reader()


# --- timestamps past Clinger's fast path, read without the GIL ---------------------------


def _timestamps(rng: random.Random) -> list[str]:
    """Microseconds with fractions whose digits pass 2**53 (a machine up over ~104 days,
    `ts` of 16-19 digits), and the exact halfway points between two doubles there (ties:
    rounded to the even one)."""
    out = []
    for _ in range(3000):
        digits = rng.randint(16, 19)
        k = rng.randint(1, 6)
        whole = str(rng.randrange(10 ** (digits - 1), 10**digits))
        out.append(whole[:-k] + "." + whole[-k:])
    for _ in range(1000):  # ulp 1 (2**52..2**53): halfway is n + 0.5; ulp 2: an odd integer
        n = rng.randrange(2**52, 2**53)
        out.append(f"{n}.5")
        out.append(f"{2 * rng.randrange(2**52, 2**53) + 1}.0")
        out.append(f"{n}.{'5' + '0' * rng.randint(0, 2)}{rng.choice(['', '1', '01'])}")
    return out


@needs_it
def test_long_timestamps_are_rounded_as_python_rounds_them():
    """The reader's integer division (no GIL) against Python's correctly rounded float(),
    to the bit, ties included."""
    rng = random.Random(17)
    texts = _timestamps(rng)
    for i in range(0, len(texts), 500):
        chunk = texts[i : i + 500]
        body = ",".join(
            f'{{"ph":"X","cat":"kernel","name":"k","pid":1,"tid":1,"ts":{t},"dur":-{t}}}'
            for t in chunk
        ).encode()
        columns = Columns()
        assert columns.add_text(body, 0, len(body))
        columns._flush()
        for text, ts, dur in zip(chunk, columns.ts, columns.dur, strict=True):
            assert struct.pack("d", ts) == struct.pack("d", float(text)), text
            assert struct.pack("d", dur) == struct.pack("d", -float(text)), text


# --- a second reader beside the first ------------------------------------------------------


@needs_it
def test_a_forgotten_piece_names_its_strings_again():
    """`Reader.forget`: a piece read but not taken (the caller cut the text anew) leaves
    its new names to be given by the next piece that uses them."""
    piece = b'{"ph":"X","cat":"kernel","name":"gemm","pid":1,"tid":1,"ts":1,"dur":1}'
    reader = columns_mod._CompiledReader()
    first = reader.parse(piece, 0, len(piece))
    assert [name for _, name in first["new_names"]] == ["gemm"]
    assert reader.parse(piece, 0, len(piece))["new_names"] == []  # handed over already
    reader.forget(first["new_cats"], first["new_names"])
    again = reader.parse(piece, 0, len(piece))
    assert again["new_names"] == first["new_names"] and again["new_cats"] == first["new_cats"]
    with pytest.raises(ValueError):  # checked whole first: the valid name stays handed over
        reader.forget([], [*again["new_names"], (99, "not one of its names")])
    assert reader.parse(piece, 0, len(piece))["new_names"] == []


@needs_it
def test_a_reader_busy_on_another_thread_refuses_a_second_call():
    """The scan runs without the GIL: a second thread's call on the same reader (whose
    tables it would change under the first) is refused, and the first reads on unharmed."""
    event = b'{"ph":"X","cat":"kernel","name":"gemm","pid":1,"tid":1,"ts":1.5,"dur":2}'
    big = b",".join([event] * 300_000)  # ~20 MB: long enough to be caught reading
    small = event
    reader = columns_mod._CompiledReader()
    results: list = []

    def read_big() -> None:
        while len(results) < 5:
            with contextlib.suppress(RuntimeError):  # the other thread's call had it
                results.append(reader.parse(big, 0, len(big)))

    thread = threading.Thread(target=read_big)
    refused = 0
    thread.start()
    while thread.is_alive():
        try:
            reader.parse(small, 0, len(small))
        except RuntimeError as exc:
            assert "another thread" in str(exc)
            refused += 1
        time.sleep(0.002)  # room for the other thread to start its next read
    thread.join()
    assert refused > 0
    assert [got["rows"] for got in results] == [300_000] * 5


def _beside_trace(rng: random.Random) -> str:
    """Events of the kinds the compiled reader takes, some it declines (a string pid: their
    pieces go to msgspec), with metadata, and args holding a
    list of objects (a `},{` inside an event: where a cut there falls, the piece is cut
    again larger, and the second reader's piece after it is not taken)."""
    events = []
    for i in range(4000):
        event = _event(rng, True)
        if rng.random() < 0.01:
            event["pid"] = "GPU 0"  # a string id: the compiled reader declines its piece
        if rng.random() < 0.3:  # names met for the first time all through the file
            event["name"] = f"op{rng.randrange(2000)}"
        if rng.random() < 0.02 and isinstance(event.get("args"), dict):
            event["args"]["shapes"] = [{"a": i}, {"b": [i, i]}] * rng.randint(1, 30)
        if rng.random() < 0.002 and isinstance(event.get("args"), dict):
            # Longer than a piece, of objects a reader takes for events: the piece cut inside
            # it is read (names and all) by the second reader, then not taken.
            event["args"]["inner"] = [
                {"ph": "X", "cat": "kernel", "name": f"op{rng.randrange(2000)}", "ts": 1, "dur": 1}
                for _ in range(300)
            ]
        events.append(event)
    for pid in range(3):
        events.insert(
            rng.randrange(len(events)),
            {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"rank {pid}"}},
        )
    return json.dumps({"traceEvents": events, "displayTimeUnit": "ms"})


@needs_it
def test_a_second_reader_beside_makes_the_same_trace(tmp_path, monkeypatch):
    """Large files are read by two threads (`Columns.read_beside`): every other piece by a
    second compiled reader, its strings coded in file order. Made small here (pieces of
    2-8 KB), the trace loads exactly as with one reader, its error (if any) the same."""
    from fsdp_trace.analysis.read import events as events_mod
    from fsdp_trace.analysis.read import parallel

    taken = {"beside": 0, "forgotten": 0}
    take_second, forget = Columns.take_second, columns_mod.SecondReader.forget

    def counted_take(self):
        got = take_second(self)
        taken["beside"] += got
        return got

    def counted_forget(self):
        taken["forgotten"] += 1
        forget(self)

    monkeypatch.setattr(Columns, "take_second", counted_take)
    monkeypatch.setattr(columns_mod.SecondReader, "forget", counted_forget)
    monkeypatch.setattr(parallel, "BESIDE_MIN_BYTES", 0)
    monkeypatch.setattr(parallel, "one_core", lambda: False)
    for seed in range(6):
        rng = random.Random(seed)
        monkeypatch.setattr(events_mod, "COMPILED_PIECE", rng.choice([2048, 4096, 8192]))
        path = tmp_path / f"rank{seed}.json"
        path.write_text(_beside_trace(rng))
        alone = _parse(path, parallel=False)
        threads = threading.active_count()
        beside = _parse(path, parallel=None)
        assert threading.active_count() == threads  # the second reader's thread ended
        assert not isinstance(alone, str), alone
        _assert_same(alone, beside, path.name)
    assert taken["beside"] > 100 and taken["forgotten"] > 0


def _parse(path: Path, parallel: bool | None) -> object:
    try:
        return loader.load_trace(path, cache=False, progress=False, parallel=parallel)
    except UserError as exc:
        return str(exc)
