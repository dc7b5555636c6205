"""Hostile input: a corpus of malformed traces, run directories and odd files made from the
shipped samples, each run through `fsdp-trace analyze` with a timeout. Every one ends in a
one-line error with exit 2 (no output written, inputs byte-identical) or in exit 0 with sane
numbers (strict JSON, nothing negative, no percentage over 100); never a traceback, a hang or
a partial output. Then one focused test per defect the reliability probe found."""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import gzip
import hashlib
import json
import math
import os
import stat
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import fsdp_trace
from tests.conftest import REPO, SAMPLES, run_cli

SAMPLE = SAMPLES / "gpt-small-2gpu" / "rank0.timing.json.gz"
TIMEOUT_S = 60
INT64_PLUS = 2**70  # beyond int64 either way
ERROR_PREFIX = "fsdp-trace analyze: error: "


# --- the base inputs: the first two steps of a shipped sample ------------------------------


def _small_document() -> dict:
    """rank 0 of the 2-GPU sample, cut after its second ProfilerStep (~3 MB of JSON)."""
    document = json.loads(gzip.decompress(SAMPLE.read_bytes()))
    steps = sorted(
        e["ts"] + e["dur"]
        for e in document["traceEvents"]
        if e.get("cat") == "user_annotation" and e.get("name", "").startswith("ProfilerStep#")
    )
    cut = steps[1]
    document["traceEvents"] = [
        e for e in document["traceEvents"] if e.get("ph") == "M" or e.get("ts", 0) < cut
    ]
    return document


@pytest.fixture(scope="module")
def base() -> dict:
    return _small_document()


def _dump(document) -> bytes:
    return json.dumps(document).encode()


def _events(document: dict, predicate=lambda e: True) -> list[dict]:
    return [e for e in document["traceEvents"] if predicate(e)]


def _is_nccl(e: dict) -> bool:
    return e.get("cat") == "kernel" and e.get("name", "").startswith("ncclDevKernel")


def _is_gpu(e: dict) -> bool:
    return e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")


def _first_arg(document: dict, key: str) -> dict:
    return next(e for e in document["traceEvents"] if key in (e.get("args") or {}))


def _bomb(char: bytes, gib: float = 2.0) -> bytes:
    """A gzip file (one member) of `gib` GiB of one character, 1/1000 of that on disk. Built
    from one compressed 16 MiB block repeated (a full flush makes every copy identical)."""
    block = char * (16 << 20)
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    chunk = packer.compress(block) + packer.flush(zlib.Z_FULL_FLUSH)
    copies = max(1, int(gib * 64))
    crc = 0
    for _ in range(copies):
        crc = zlib.crc32(block, crc)
    size = (len(block) * copies) & 0xFFFFFFFF
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    return header + chunk * copies + packer.flush() + struct.pack("<II", crc, size)


# --- the corpus ----------------------------------------------------------------------------
# Each case writes its input(s) into `folder` and returns the CLI arguments; its expectation
# is "ok" (exit 0, sane numbers) or the fragment the one-line error must hold.


@dataclass(frozen=True)
class Case:
    make: object  # (folder: Path, base: dict) -> list[str]  (the paths to analyze)
    expect: str  # "ok", or a fragment of the one-line error


def _file(name: str, data_fn):
    def make(folder: Path, base: dict) -> list[str]:
        path = folder / name
        path.write_bytes(data_fn(copy.deepcopy(base)) if callable(data_fn) else data_fn)
        return [str(path)]

    return make


def _gz(data_fn):
    return lambda b: gzip.compress(data_fn(b), mtime=0)


def _mutated(mutate):
    """The base document changed in place by `mutate`, as JSON."""

    def data(document: dict) -> bytes:
        mutate(document)
        return _dump(document)

    return data


def _cut(fraction: float, gz: bool):
    def data(document: dict) -> bytes:
        raw = _dump(document)
        blob = gzip.compress(raw, mtime=0) if gz else raw
        return blob[: max(1, int(len(blob) * fraction))]

    return data


def _cut_end(minus: int, gz: bool):
    def data(document: dict) -> bytes:
        raw = _dump(document)
        blob = gzip.compress(raw, mtime=0) if gz else raw
        return blob[:-minus]

    return data


def _flip(where: float):
    """One byte of the deflate stream changed."""

    def data(document: dict) -> bytes:
        blob = bytearray(gzip.compress(_dump(document), mtime=0))
        i = int(len(blob) * where)
        blob[i] ^= 0x55
        return bytes(blob)

    return data


def _trailer(offset: int):
    """A byte of the gzip trailer (CRC32 at -8, ISIZE at -4) changed."""

    def data(document: dict) -> bytes:
        blob = bytearray(gzip.compress(_dump(document), mtime=0))
        blob[offset] ^= 0xFF
        return bytes(blob)

    return data


def _insert(anchor: bytes, junk: bytes, after: int = 1):
    """`junk` inserted `after` bytes into the first occurrence of `anchor`."""

    def data(document: dict) -> bytes:
        raw = _dump(document)
        i = raw.index(anchor) + after
        return raw[:i] + junk + raw[i:]

    return data


def _set_arg(key: str, value, every: bool = False):
    def mutate(document: dict) -> None:
        for e in document["traceEvents"]:
            args = e.get("args") or {}
            if key in args:
                args[key] = value
                if not every:
                    return

    return mutate


def _set_event(index: int, **fields):
    def mutate(document: dict) -> None:
        _events(document, lambda e: e.get("ph") == "X")[index].update(fields)

    return mutate


def _nccl_duration(dur: float):
    def mutate(document: dict) -> None:
        next(e for e in document["traceEvents"] if _is_nccl(e))["dur"] = dur

    return mutate


def _gpu_durations(dur: float):
    def mutate(document: dict) -> None:
        for e in _events(document, _is_gpu):
            e["dur"] = dur

    return mutate


def _all(field: str, value):
    def mutate(document: dict) -> None:
        for e in document["traceEvents"]:
            if field in e:
                e[field] = value

    return mutate


def _duplicated(document: dict) -> None:
    document["traceEvents"] = [x for e in document["traceEvents"] for x in (e, e)]


def _second_events_key(document: dict) -> bytes:
    raw = _dump(document)
    other = json.dumps(document["traceEvents"][:200]).encode()
    return raw[:-1] + b', "traceEvents": ' + other + b"}"


def _distributed(**fields):
    def mutate(document: dict) -> None:
        document["distributedInfo"].update(fields)

    return mutate


def _deep_args(depth: int):
    def data(document: dict) -> bytes:
        raw = _dump(document)
        i = raw.index(b'"args": {') + len(b'"args": {')
        return raw[:i] + b'"deep": ' + b"[" * depth + b"]" * depth + b", " + raw[i:]

    return data


def _fifo(name: str):
    def make(folder: Path, base: dict) -> list[str]:
        os.mkfifo(folder / name)
        return [str(folder / name)]

    return make


def _folder_with(*files: tuple[str, object]):
    """A trace folder holding the given entries: bytes, "fifo", "dir", or a callable on base."""

    def make(folder: Path, base: dict) -> list[str]:
        run = folder / "traces"
        run.mkdir()
        for name, content in files:
            path = run / name
            if content == "fifo":
                os.mkfifo(path)
            elif content == "dir":
                path.mkdir()
            else:
                path.write_bytes(content(copy.deepcopy(base)) if callable(content) else content)
        return [str(run)]

    return make


def _run_dir(run_json, fifo_trace: bool = False):
    """A capture run directory: rank0.timing.json (the base) and the given run.json (bytes,
    "fifo", or a dict)."""

    def make(folder: Path, base: dict) -> list[str]:
        run = folder / "run"
        run.mkdir()
        if fifo_trace:
            os.mkfifo(run / "rank0.timing.json")
        else:
            (run / "rank0.timing.json").write_bytes(_dump(base))
        if run_json == "fifo":
            os.mkfifo(run / "run.json")
        else:
            text = run_json if isinstance(run_json, bytes) else json.dumps(run_json).encode()
            (run / "run.json").write_bytes(text)
        return [str(run)]

    return make


def _symlink_loop(folder: Path, base: dict) -> list[str]:
    (folder / "a.json").symlink_to(folder / "b.json")
    (folder / "b.json").symlink_to(folder / "a.json")
    return [str(folder / "a.json")]


def _dir_named_json(folder: Path, base: dict) -> list[str]:
    (folder / "x.json").mkdir()
    return [str(folder / "x.json")]


def _bomb_file(char: bytes):
    def make(folder: Path, base: dict) -> list[str]:
        path = folder / "bomb.json.gz"
        path.write_bytes(_bomb(char, gib=0.25))
        return [str(path)]

    return make


RUN_OK = {"files": {"timing": ["rank0.timing.json"], "detailed": []}}


def _dev_null_named_json(folder: Path, base: dict) -> list[str]:
    (folder / "null.json").symlink_to("/dev/null")
    return [str(folder / "null.json")]


CORPUS: dict[str, Case] = {
    # truncations at many offsets, gzip and plain
    **{
        f"gz_cut_{int(f * 1000):03d}": Case(_file("t.json.gz", _cut(f, True)), "gzip")
        for f in (0.001, 0.1, 0.5, 0.9, 0.999)
    },
    "gz_cut_trailer": Case(_file("t.json.gz", _cut_end(4, True)), "gzip"),
    "gz_magic_only": Case(_file("t.json.gz", b"\x1f\x8b"), "gzip"),
    "gz_first_byte_only": Case(_file("t.json.gz", b"\x1f"), "not valid JSON"),
    **{
        f"json_cut_{int(f * 1000):03d}": Case(_file("t.json", _cut(f, False)), "not valid JSON")
        for f in (0.0001, 0.5)
    },
    "json_cut_last_byte": Case(_file("t.json", _cut_end(1, False)), "not valid JSON"),
    # gzip damage
    "gz_flipped_middle": Case(_file("t.json.gz", _flip(0.5)), "gzip"),
    "gz_bad_crc": Case(_file("t.json.gz", _trailer(-8)), "gzip"),
    "gz_bad_isize": Case(_file("t.json.gz", _trailer(-2)), "gzip"),
    "gz_bad_header_method": Case(
        _file("t.json.gz", lambda b: b"\x1f\x8b\x07" + gzip.compress(_dump(b))[3:]), "gzip"
    ),
    "gz_trailing_garbage": Case(
        _file("t.json.gz", lambda b: gzip.compress(_dump(b)) + b"garbage!"), "gzip"
    ),
    "gz_two_members": Case(
        _file("t.json.gz", lambda b: gzip.compress(_dump(b)) * 2), "not valid JSON"
    ),
    "gz_of_nothing": Case(_file("t.json.gz", gzip.compress(b"")), "empty file"),
    "zero_length_gz": Case(_file("t.json.gz", b""), "empty file"),
    # encodings
    "utf16_le_bom": Case(_file("t.json", lambda b: _dump(b).decode().encode("utf-16")), "UTF-16"),
    "utf16_be_no_bom": Case(
        _file("t.json", lambda b: _dump(b).decode().encode("utf-16-be")), "UTF-16"
    ),
    "utf32": Case(_file("t.json", lambda b: _dump(b).decode().encode("utf-32")), "UTF-32"),
    "utf8_bom": Case(_file("rank0.json", lambda b: b"\xef\xbb\xbf" + _dump(b)), "ok"),
    "bad_utf8_in_unread_key": Case(
        _file("t.json", _insert(b'"External id"', b"\xc3\x28")), "UTF-8"
    ),
    "surrogate_in_header": Case(
        _file("t.json", _insert(b'"trace_id": "', b"\xed\xa0\x80", 13)), "UTF-8"
    ),
    "latin1_name": Case(
        _file("t.json", _insert(b'"name": "aten::', "é".encode("latin-1"), 9)), "UTF-8"
    ),
    "overlong_utf8": Case(_file("t.json", _insert(b'"name": "aten::', b"\xc0\xaf", 9)), "UTF-8"),
    "bad_utf8_gzip": Case(
        _file("t.json.gz", _gz(_insert(b'"name": "aten::', b"\xff", 9))), "UTF-8"
    ),
    # hostile values
    "big_correlation": Case(_file("t.json", _mutated(_set_arg("correlation", INT64_PLUS))), "ok"),
    "big_in_nelems": Case(_file("t.json", _mutated(_set_arg("In msg nelems", INT64_PLUS))), "ok"),
    "big_stream_everywhere": Case(
        _file("t.json", _mutated(_set_arg("stream", -INT64_PLUS, every=True))), "ok"
    ),
    "big_pid": Case(_file("t.json", _mutated(_set_event(3, pid=INT64_PLUS))), "ok"),
    "negative_nelems": Case(_file("t.json", _mutated(_set_arg("In msg nelems", -5))), "ok"),
    "zero_group_size": Case(_file("t.json", _mutated(_set_arg("Group size", 0, True))), "ok"),
    "deep_args_gz": Case(_file("t.json.gz", _gz(_deep_args(100_000))), "nested"),
    "deep_top_level": Case(_file("t.json", b"[" * 100_000 + b"]" * 100_000), "layout"),
    "rank_is_text": Case(_file("rank0.json", _mutated(_distributed(rank="zero"))), "ok"),
    "rank_is_list": Case(_file("rank0.json", _mutated(_distributed(rank=[0]))), "ok"),
    "rank_is_huge": Case(_file("rank0.json", _mutated(_distributed(rank=INT64_PLUS))), "ok"),
    "world_size_text": Case(_file("t.json", _mutated(_distributed(world_size="2"))), "ok"),
    "pg_config_garbage": Case(
        _file(
            "t.json",
            _mutated(_distributed(pg_config=[5, {"pg_name": "0", "ranks": "ab", "pg_size": "x"}])),
        ),
        "ok",
    ),
    "distributed_info_list": Case(
        _file("t.json", _mutated(lambda d: d.update(distributedInfo=[1]))), "layout"
    ),
    "base_time_huge": Case(
        _file("t.json", _mutated(lambda d: d.update(baseTimeNanoseconds=INT64_PLUS))), "ok"
    ),
    "nccl_1e300_us": Case(_file("t.json", _mutated(_nccl_duration(1e300))), "ok"),
    "nccl_1e999_us": Case(
        _file("t.json", lambda b: _dump(b).replace(b'"dur": 1', b'"dur": 1e999', 1)),
        "out of range",
    ),
    "gpu_durations_negative": Case(_file("t.json", _mutated(_gpu_durations(-5000))), "impossible"),
    "one_negative_nccl": Case(_file("t.json", _mutated(_nccl_duration(-1.0))), "ok"),
    "one_ts_1e20": Case(_file("t.json", _mutated(_set_event(5, ts=1e20))), "ok"),
    "one_ts_far_away": Case(_file("t.json", _mutated(_set_event(5, ts=1e15))), "ok"),
    "one_ts_negative_huge": Case(_file("t.json", _mutated(_set_event(5, ts=-1e300))), "ok"),
    "correlation_all_same": Case(
        _file("t.json", _mutated(_set_arg("correlation", 7, every=True))), "correlation"
    ),
    "timestamps_all_zero": Case(_file("t.json", _mutated(_all("ts", 0))), "same time"),
    "every_event_twice": Case(_file("t.json", _mutated(_duplicated)), "ok"),
    "second_events_key": Case(_file("t.json", _second_events_key), "two 'traceEvents'"),
    # other layouts
    "events_null": Case(_file("t.json", b'{"traceEvents": null}'), "no 'traceEvents'"),
    "events_numbers": Case(_file("t.json", b'{"traceEvents": [1, 2, 3]}'), "layout"),
    "pid_float": Case(_file("t.json", _mutated(_set_event(2, pid=1.5))), "layout"),
    "top_level_null": Case(_file("t.json", b"null"), "layout"),
    "empty_object": Case(_file("t.json", b"{}"), "no 'traceEvents'"),
    "empty_list": Case(_file("t.json", b"[]"), "empty"),
    "not_json_text": Case(_file("t.json", b"hello, world\n" * 1000), "not valid JSON"),
    "nul_bytes": Case(_file("t.json", b"\0" * 4096), "not valid JSON"),
    "blank_file": Case(_file("t.json", b" \n\t" * 1000), "empty file"),
    "bare_list_of_events": Case(_file("rank0.json", lambda b: _dump(b["traceEvents"])), "ok"),
    "bomb_blank": Case(_bomb_file(b" "), "no JSON"),
    "bomb_brackets": Case(_bomb_file(b"["), "layout"),
    "bomb_braces": Case(_bomb_file(b"{"), "traceEvents"),
    # odd files
    "fifo_input": Case(_fifo("x.json"), "not a regular file"),
    "dev_null": Case(lambda folder, base: ["/dev/null"], "not a regular file"),
    "dev_null_named_json": Case(_dev_null_named_json, "not a regular file"),
    "dir_named_json": Case(_dir_named_json, "no .json/.json.gz traces"),
    "symlink_loop": Case(_symlink_loop, "no such file"),
    "empty_file": Case(_file("t.json", b""), "empty file"),
    "folder_with_fifo_and_trace": Case(
        _folder_with(("rank0.json", "fifo"), ("rank1.json", _dump)), "ok"
    ),
    "folder_with_dir_named_json": Case(
        _folder_with(("rank0.json", "dir"), ("rank1.json", _dump)), "ok"
    ),
    "run_json_fifo": Case(_run_dir("fifo"), "run.json"),
    "run_json_list": Case(_run_dir([1, 2]), "array"),
    "run_json_figures_text": Case(
        _run_dir({**RUN_OK, "figures": {"step_time_ms": {"median": "fast"}}}),
        "figures.step_time_ms.median is a string",
    ),
    "run_json_huge_number": Case(
        _run_dir(
            b'{"files": {"timing": ["rank0.timing.json"]}, "figures": {"mfu": 1'
            + b"0" * 400
            + b"}}"
        ),
        "figures.mfu",
    ),
    "run_lists_fifo_trace": Case(_run_dir(RUN_OK, fifo_trace=True), "missing"),
}


def _tree_digest(paths: list[str]) -> dict[str, str]:
    """Content hash of every regular file at or below the given paths (FIFOs are not read)."""
    out: dict[str, str] = {}
    for raw in paths:
        root = Path(raw)
        items = [root] if not root.is_dir() else sorted(root.rglob("*"))
        for item in items:
            try:
                mode = item.lstat().st_mode
            except OSError:
                continue
            if stat.S_ISREG(mode):
                out[str(item)] = hashlib.sha256(item.read_bytes()).hexdigest()
            else:
                out[str(item)] = f"mode {stat.S_IFMT(mode):o}"
    return out


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    outputs: list[str]  # what the output folder holds afterwards
    payload: str | None  # the --json file's text
    inputs_before: dict[str, str]
    inputs_after: dict[str, str]


def _run_case(name: str, case: Case, root: Path, base: dict, env: dict) -> Outcome:
    folder = root / name
    folder.mkdir()
    paths = case.make(folder, base)
    out = root / f"{name}.out"
    out.mkdir()
    before = _tree_digest(paths)
    started = time.monotonic()
    try:
        done = run_cli(
            "analyze",
            *paths,
            "--json",
            str(out / "out.json"),
            "--report",
            str(out / "r.html"),
            timeout=TIMEOUT_S,
            env=env,
        )
        code, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        code, stdout, stderr = -999, str(exc.stdout), f"HANG: no answer in {TIMEOUT_S} s"
    seconds = time.monotonic() - started
    listing = sorted(p.name for p in out.iterdir())
    payload = (out / "out.json").read_text() if (out / "out.json").is_file() else None
    return Outcome(code, stdout, stderr, seconds, listing, payload, before, _tree_digest(paths))


@pytest.fixture(scope="module")
def corpus_results(tmp_path_factory, base) -> dict[str, Outcome]:
    """Every corpus case made and run once, a few at a time."""
    root = tmp_path_factory.mktemp("hostile")
    env = {"FSDP_TRACE_CACHE_DIR": str(root / ".cache"), "FSDP_TRACE_CACHE": "1"}
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        futures = {
            name: pool.submit(_run_case, name, case, root, base, env)
            for name, case in CORPUS.items()
        }
        return {name: future.result() for name, future in futures.items()}


def _reject_constant(token: str):
    raise ValueError(f"non-standard JSON token {token}")


NEGATIVE_OK = {"clock_offset_us", "start_us", "end_us", "slowdown_pct"}


def insane_numbers(payload: str) -> list[str]:
    """What is wrong with the numbers of a --json payload (strict JSON required)."""
    data = json.loads(payload, parse_constant=_reject_constant)
    problems: list[str] = []

    def walk(value, key: str, where: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, str(k), f"{where}.{k}")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, key, f"{where}[{i}]")
        elif isinstance(value, int | float) and not isinstance(value, bool):
            if not math.isfinite(value):
                problems.append(f"{where} = {value}")
            elif key in NEGATIVE_OK:
                return
            elif key.endswith(("_us", "_pct", "_gbps", "bytes", "_per_step")) and value < 0:
                problems.append(f"{where} = {value} < 0")
            elif key.endswith("_pct") and value > 100 + 1e-9:
                problems.append(f"{where} = {value} > 100 %")
            elif key == "step_us" and value > 1e9:
                problems.append(f"{where} = {value}: a step of over 16 minutes")

    walk(data, "", "$")
    return problems


@pytest.mark.slow  # ~80 processes: CI runs it (-m slow); the focused tests below run always
@pytest.mark.parametrize("name", list(CORPUS))
def test_corpus_case(corpus_results, name):
    case, got = CORPUS[name], corpus_results[name]
    both = got.stdout + got.stderr
    assert got.returncode != -999, f"{name}: hang ({got.stderr})"
    assert "Traceback" not in both, both[-3000:]
    assert got.inputs_after == got.inputs_before, "an input was changed"
    assert got.seconds < TIMEOUT_S
    if case.expect == "ok":
        assert got.returncode == 0, both[-2000:]
        assert got.outputs == ["out.json", "r.html"], got.outputs
        assert got.payload is not None
        assert insane_numbers(got.payload) == [], insane_numbers(got.payload)[:5]
    else:
        assert got.returncode == 2, both[-2000:]
        lines = got.stderr.strip().splitlines()
        assert len(lines) == 1, got.stderr
        assert lines[0].startswith(ERROR_PREFIX), lines[0]
        assert case.expect in lines[0], lines[0]
        assert got.outputs == [], f"outputs left behind: {got.outputs}"


def test_corpus_is_large_and_varied():
    assert len(CORPUS) >= 40
    assert sum(c.expect == "ok" for c in CORPUS.values()) >= 10


# --- focused tests: one per defect -------------------------------------------------------------


def _cli_error(done, *fragments: str, command: str = "analyze") -> str:
    """The one-line error of a refused input (exit 2, no traceback); returns the line."""
    both = done.stdout + done.stderr
    assert "Traceback" not in both, both[-3000:]
    assert done.returncode == 2, both[-2000:]
    lines = done.stderr.strip().splitlines()
    prefix = f"fsdp-trace {command}: error: "
    assert len(lines) == 1 and lines[0].startswith(prefix), done.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def _analyze_json(tmp_path, *paths) -> dict:
    """`analyze` in this process (the corpus runs the command line), as its --json payload,
    checked for sane numbers."""
    from fsdp_trace import analyze
    from fsdp_trace.render import export

    out = tmp_path / "out.json"
    export.write_json(analyze([str(p) for p in paths], cache=False), out)
    payload = out.read_text()
    assert insane_numbers(payload) == []
    return json.loads(payload)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "where",
    ["kernel name", "unread key", "header", "near the end", "gzip"],
)
def test_invalid_utf8_anywhere_is_one_line(tmp_path, base, where):
    from fsdp_trace.analysis.read.loader import load_trace
    from fsdp_trace.errors import UserError

    raw = _dump(base)
    at = {
        "kernel name": raw.index(b'"name": "ncclDevKernel') + 9,
        "unread key": raw.index(b'"External id"') + 1,
        "header": raw.index(b'"trace_id": "') + 13,
        "near the end": len(raw) - 30,
        "gzip": raw.index(b'"name": "aten::') + 9,
    }[where]
    data = raw[:at] + b"\xff" + raw[at:]
    path = tmp_path / ("t.json.gz" if where == "gzip" else "t.json")
    _write(path, gzip.compress(data) if where == "gzip" else data)
    with pytest.raises(UserError, match=rf"not UTF-8 .*byte 0xff at byte {at}\b"):
        load_trace(path, cache=False)
    if where == "near the end":
        _cli_error(run_cli("analyze", str(path), "--no-report"), "UTF-8")


def _synthetic(tmp_path, name="rank0.json", **kernel_args) -> Path:
    from tests.synth import TraceBuilder

    b = TraceBuilder()
    b.step(1, 0, 1000)
    b.kernel("gemm", 100, 100, launch_ts=5)
    b.nccl("AllGather", 150, 100, launch_ts=6)
    b.nccl("ReduceScatter", 300, 100, launch_ts=7)
    b.kernel("gemm", 450, 100, launch_ts=8)
    document = b.document()
    for event in document["traceEvents"]:
        if "Collective name" in event["args"]:
            event["args"].update(kernel_args)
            break
    return _write(tmp_path / name, _dump(document))


@pytest.mark.parametrize(
    ("key", "column"),
    [
        ("correlation", "correlation"),
        ("External id", "external_id"),
        ("In msg nelems", "in_nelems"),
        ("Sequence number", "sequence_number"),
        ("Group size", "group_size"),
    ],
)
@pytest.mark.parametrize("value", [INT64_PLUS, -INT64_PLUS, 2**63])
def test_integers_beyond_int64_are_absent_with_a_notice(tmp_path, key, column, value):
    from fsdp_trace.analysis.read.loader import load_trace
    from fsdp_trace.analysis.read.trace import MISSING

    path = _synthetic(tmp_path, **{key: value})
    trace = load_trace(path, cache=False)
    nccl = trace.events[trace.events["name"].astype(str).str.startswith("ncclDevKernel")]
    assert nccl[column].iloc[0] == MISSING
    (notice,) = [n for n in trace.notices if "int64" in n]
    assert f"{key} ×1" in notice, notice
    _analyze_json(tmp_path, path)


def test_pid_and_tid_beyond_int64_stay_distinct_threads(tmp_path):
    from fsdp_trace.analysis.read.loader import load_trace

    document = json.loads(_synthetic(tmp_path).read_bytes())
    for event in document["traceEvents"]:
        if event["cat"] == "cuda_runtime":
            event["tid"] = INT64_PLUS
    path = _write(tmp_path / "rank0.json", _dump(document))
    trace = load_trace(path, cache=False)
    launches = trace.events[trace.events["cat"] == "cuda_runtime"]
    assert launches["tid"].nunique() == 1 and launches["tid"].iloc[0] < 0  # a string-like id
    _analyze_json(tmp_path, path)


def test_deep_nesting_in_args_is_one_line(tmp_path, base):
    from fsdp_trace.analysis.read.loader import load_trace
    from fsdp_trace.errors import UserError

    path = _write(tmp_path / "t.json", _deep_args(100_000)(copy.deepcopy(base)))
    with pytest.raises(UserError, match="nested"):
        load_trace(path, cache=False)
    _cli_error(run_cli("analyze", str(path), "--no-report", timeout=TIMEOUT_S), "nested")


def _in_subprocess(code: str, timeout: float = 20) -> subprocess.CompletedProcess:
    """`code` run by a fresh interpreter (a hang shows as TimeoutExpired, not a stuck suite)."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "FSDP_TRACE_QUIET": "1"},
    )


def test_fifo_and_dev_null_are_refused_not_read(tmp_path):
    fifo = tmp_path / "x.json"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/null")):
        _cli_error(run_cli("analyze", str(path), "--no-report", timeout=20), "not a regular file")
        done = _in_subprocess(
            "from fsdp_trace.analysis.read.loader import load_trace\n"
            "from fsdp_trace.errors import UserError\n"
            f"try:\n    load_trace({str(path)!r}, cache=True)\n"
            "except UserError as exc:\n    print(exc.message)\n"
        )
        assert "not a regular file" in done.stdout, done.stdout + done.stderr


def test_fifos_in_a_run_directory_are_never_opened(tmp_path, base):
    """A FIFO as run.json, as a listed trace, or as a trace in a folder: no hang."""
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "run.json")
    (run / "rank0.timing.json").write_bytes(_dump(base))
    _cli_error(run_cli("analyze", str(run), "--no-report", timeout=20), "run.json")
    from fsdp_trace.errors import UserError
    from fsdp_trace.runrecord import read_run

    with pytest.raises(UserError, match="not a regular file"):
        read_run(run)
    folder = tmp_path / "traces"
    folder.mkdir()
    os.mkfifo(folder / "rank1.json")
    (folder / "rank0.json").write_bytes(_dump(base))
    assert _analyze_json(tmp_path, folder)["ranks"][0]["rank"] == 0


def test_fifo_named_like_a_cache_entry_is_skipped(tmp_path, monkeypatch):
    """The cache never opens anything but a regular file of its own: a FIFO where an entry
    would be is left alone (no hang) and the trace is parsed."""
    from fsdp_trace.analysis.read import cache

    monkeypatch.setenv("FSDP_TRACE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FSDP_TRACE_CACHE", raising=False)
    path = _synthetic(tmp_path)
    entry = cache.TraceEntry.for_file(path)
    entry.file.parent.mkdir(parents=True)
    os.mkfifo(entry.file)
    done = _in_subprocess(
        "from fsdp_trace.analysis.read.loader import load_trace\n"
        f"print(len(load_trace({str(path)!r}).events))\n"
    )
    assert done.returncode == 0 and int(done.stdout) > 0, done.stderr


def _without_dac_override(*args: str) -> list[str]:
    """Run as root without the capability to ignore file permissions (so mode 000 bites)."""
    if os.geteuid() != 0:
        return list(args)
    caps = "-dac_override,-dac_read_search"
    return ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}", *args]


def test_unreadable_directory_is_one_line(tmp_path, base):
    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / "rank0.json").write_bytes(_dump(base))
    folder.chmod(0)
    try:
        done = subprocess.run(
            _without_dac_override(
                sys.executable, "-m", "fsdp_trace", "analyze", str(folder), "--no-report"
            ),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env={**os.environ, "FSDP_TRACE_QUIET": "1", "FSDP_TRACE_CACHE": "0"},
        )
    finally:
        folder.chmod(0o755)
    _cli_error(done, "Permission denied")


def test_unreadable_trace_and_run_json_are_one_line(tmp_path, base):
    trace = tmp_path / "rank0.json"
    trace.write_bytes(_dump(base))
    trace.chmod(0)
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps(RUN_OK))
    (run / "run.json").chmod(0)
    for path in (trace, run):
        done = subprocess.run(
            _without_dac_override(
                sys.executable, "-m", "fsdp_trace", "analyze", str(path), "--no-report"
            ),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env={**os.environ, "FSDP_TRACE_QUIET": "1", "FSDP_TRACE_CACHE": "0"},
        )
        _cli_error(done, "Permission denied")


@pytest.mark.parametrize(
    ("run_json", "fragment"),
    [
        (b"[1, 2]", "a JSON array, not an object"),
        (json.dumps({**RUN_OK, "figures": {"mfu": "0.4"}}).encode(), "figures.mfu is a string"),
        (
            json.dumps({**RUN_OK, "figures": {"step_time_ms": {"median": "9"}}}).encode(),
            "figures.step_time_ms.median is a string",
        ),
        (json.dumps({**RUN_OK, "figures": [1]}).encode(), "figures is an array"),
        (b'{"figures": {"mfu": 1' + b"0" * 400 + b"}}", "figures.mfu"),
        (json.dumps({**RUN_OK, "world": {"world_size": 2**70}}).encode(), "world.world_size"),
        (b'{"figures": {"mfu": NaN}}', "figures.mfu"),
        (b'{"command": "\xff"}', "run.json"),
        (b"{" * 100_000, "run.json"),
    ],
)
def test_bad_run_json_is_one_line(tmp_path, run_json, fragment):
    """(The corpus runs such run directories through the command line.)"""
    from fsdp_trace.errors import UserError
    from fsdp_trace.runrecord import read_run

    (tmp_path / "run.json").write_bytes(run_json)
    with pytest.raises(UserError) as caught:
        read_run(tmp_path)
    assert fragment in caught.value.message and "\n" not in caught.value.message


@pytest.mark.parametrize("rank", ["zero", [0], True, INT64_PLUS, -3, 0.5, None])
def test_distributed_rank_that_is_not_a_rank_number(tmp_path, base, rank):
    from fsdp_trace.analysis.read.loader import load_trace

    document = copy.deepcopy(base)
    document["distributedInfo"]["rank"] = rank
    path = _write(tmp_path / "rank5.json", _dump(document))
    trace = load_trace(path, cache=False)
    assert trace.rank == 5  # from the file name
    if rank is not None:
        assert any("distributedInfo.rank" in n for n in trace.notices), trace.notices
    assert _analyze_json(tmp_path, path)["ranks"][0]["rank"] == 5


def test_bad_process_groups_are_dropped_with_a_notice(tmp_path, base):
    from fsdp_trace.analysis.read.loader import load_trace

    document = copy.deepcopy(base)
    good = document["distributedInfo"]["pg_config"][0]
    document["distributedInfo"]["world_size"] = "2"
    document["distributedInfo"]["pg_config"] = [
        5,
        {"pg_name": "1", "ranks": "ab", "pg_size": "x"},
        {"pg_name": "2", "ranks": ["a", 1]},
        good,
    ]
    trace = load_trace(_write(tmp_path / "rank0.json", _dump(document)), cache=False)
    assert trace.distributed["pg_config"] == [good]
    assert trace.world_size is None and "world_size" not in trace.distributed
    assert any("pg_config" in n for n in trace.notices)
    assert any("world_size" in n for n in trace.notices)
    _analyze_json(tmp_path, tmp_path / "rank0.json")


@pytest.mark.parametrize(
    "ranks",
    [
        [],
        list(range(1000)),
        [0, 1, (1 << 31) - 1],
        [0, 1 << 31],  # beyond a rank number
        [3, -1],
        [0, True],  # a bool is not a rank
        [0, 1.0],
        [0, "1"],
        [0, None],
        [(1 << 63) - 1],
        [-(1 << 63)],
        [1 << 63],  # beyond int64: not plain JSON
        [-(1 << 63) - 1],
    ],
)
def test_process_group_members_are_checked_one_by_one(ranks):
    """A group's member list is read in one pass where every member is an int (thousands at a
    thousand ranks): the same verdict as checking each member."""
    from fsdp_trace.analysis.read import validate

    def plain(v):
        if isinstance(v, bool) or v is None or isinstance(v, str):
            return True
        if isinstance(v, int):
            return -(1 << 63) <= v < 1 << 63
        return isinstance(v, float) and math.isfinite(v)

    def member(v):
        return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < validate.RANK_LIMIT

    group = {"pg_name": "0", "ranks": ranks}
    assert validate.plain(ranks) == all(map(plain, ranks))
    assert validate._good_group(group) == (all(map(plain, ranks)) and all(map(member, ranks)))
    for levels in (31, 32, 33):  # plain JSON nests under 32 levels, lists of ints too
        nested = ranks
        for _ in range(levels - 1):
            nested = [nested]
        assert validate.plain(nested) == (all(map(plain, ranks)) and (levels <= 32 or not ranks))


@pytest.mark.parametrize("seed", range(6))
def test_duplicated_events_are_found_as_a_row_by_row_comparison(seed):
    """`validate.duplicates` (candidates by shared start, then digests, then every column)
    marks what comparing every row with every earlier one marks: copies anywhere in the
    file, NaN starts, -0.0 against 0.0, rows that differ in one column only."""
    import numpy as np
    import pandas as pd

    from fsdp_trace.analysis.read import validate

    rng = np.random.default_rng(seed)
    n = 400
    frame = pd.DataFrame(
        {
            "ts": np.sort(rng.integers(0, 300, n)).astype(float) + rng.random(n).round(1),
            "dur": rng.integers(0, 3, n).astype(float),
            "pid": rng.integers(0, 2, n),
            "tid": rng.integers(0, 2, n),
            "name": pd.Categorical(rng.choice(["gemm", "nccl", "copy"], n)),
            "correlation": rng.integers(-1, 3, n),
            "external_id": rng.integers(-1, 2, n),
            "stream": rng.integers(-1, 2, n),
        }
    )
    copies = rng.choice(n, 60)
    frame.loc[copies[:5], "ts"] = np.nan  # copies of events whose start is NaN
    frame = pd.concat([frame, frame.iloc[copies]], ignore_index=True)
    frame.loc[rng.choice(len(frame), 15), "ts"] = np.nan
    frame.loc[rng.choice(len(frame), 10), "ts"] = 0.0
    frame.loc[rng.choice(len(frame), 10), "ts"] = -0.0
    frame = frame.iloc[rng.permutation(len(frame))].reset_index(drop=True)
    frame["end"] = frame["ts"] + frame["dur"]
    bits = frame.drop(columns="end").assign(
        ts=frame["ts"].to_numpy().view(np.int64), dur=frame["dur"].to_numpy().view(np.int64)
    )
    rows = [tuple(r) for r in bits.itertuples(index=False)]
    seen: set = set()
    want = []
    for row in rows:
        want.append(row in seen)
        seen.add(row)
    got = validate.duplicates(frame)
    assert got.tolist() == want and sum(want) >= 20


def test_perfetto_with_timestamps_out_of_its_range_is_one_line(tmp_path, base):
    document = copy.deepcopy(base)
    for event in document["traceEvents"]:  # the whole trace before 1970: negative ns
        if "ts" in event:
            event["ts"] -= 1e13
    path = _write(tmp_path / "rank0.json", _dump(document))
    view = tmp_path / "v.pftrace"
    out = tmp_path / "out.json"
    done = run_cli(
        "analyze",
        str(path),
        "--perfetto",
        str(view),
        "--json",
        str(out),
        "--no-report",
        timeout=TIMEOUT_S,
    )
    _cli_error(done, "--perfetto")
    assert not view.exists() and not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.json"]


def test_perfetto_to_ns_refuses_what_int64_ns_cannot_hold():
    import numpy as np

    from fsdp_trace.errors import UserError
    from fsdp_trace.render.perfetto.wire import to_ns

    assert to_ns(np.array([1.5, 2e15])).tolist() == [1500, 2 * 10**18]
    for bad in (1e300, -1.0, float("nan"), float("inf"), 9.3e15):
        with pytest.raises(UserError, match="--perfetto"):
            to_ns(np.array([1.0, bad]))


# --- corrupt but parseable events -----------------------------------------------------------


def _load(tmp_path, document, name="rank0.json"):
    from fsdp_trace.analysis.read.loader import load_trace

    return load_trace(_write(tmp_path / name, _dump(document)), cache=False)


def _baseline(tmp_path, base) -> dict:
    """The --json payload of the unchanged base trace."""
    folder = tmp_path / "clean"
    folder.mkdir()
    return _analyze_json(folder, _write(folder / "rank0.json", _dump(base)))


def test_a_1e300_us_nccl_kernel_is_dropped_with_a_notice(tmp_path, base):
    clean = _baseline(tmp_path, base)
    document = copy.deepcopy(base)
    next(e for e in document["traceEvents"] if _is_nccl(e))["dur"] = 1e300
    trace = _load(tmp_path, document)
    (notice,) = [n for n in trace.notices if "impossible" in n]
    assert "1 " in notice and "ncclDevKernel" in notice, notice
    got = _analyze_json(tmp_path, tmp_path / "rank0.json")
    step = got["ranks"][0]["step_us"]["median"]
    assert got["ranks"][0]["comm_us"]["median"] < step / 2
    assert step == pytest.approx(clean["ranks"][0]["step_us"]["median"], rel=0.01)


def test_negative_durations_are_dropped(tmp_path, base):
    document = copy.deepcopy(base)
    gpu = _events(document, _is_gpu)
    for event in gpu[:10]:
        event["dur"] = -5000
    trace = _load(tmp_path, document)
    assert (trace.events["dur"] >= 0).all()
    assert any("10 " in n and "negative duration" in n for n in trace.notices), trace.notices
    got = _analyze_json(tmp_path, tmp_path / "rank0.json")
    assert got["ranks"][0]["comm_us"]["min"] >= 0


def test_most_gpu_events_impossible_refuses_the_file(tmp_path, base):
    from fsdp_trace.errors import UserError

    document = copy.deepcopy(base)
    for event in _events(document, _is_gpu):
        event["dur"] = -1
    with pytest.raises(UserError, match=r"GPU events are impossible"):
        _load(tmp_path, document)
    _cli_error(run_cli("analyze", str(tmp_path / "rank0.json"), "--no-report"), "impossible")


def test_every_correlation_id_the_same_is_refused(tmp_path, base):
    from fsdp_trace.errors import UserError

    document = copy.deepcopy(base)
    _set_arg("correlation", 7, every=True)(document)
    with pytest.raises(UserError, match="correlation"):
        _load(tmp_path, document)


def test_a_few_shared_correlation_ids_are_unlinked_with_a_notice(tmp_path, base):
    document = copy.deepcopy(base)
    launches = [
        e
        for e in document["traceEvents"]
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    ]
    launches[1]["args"]["correlation"] = launches[0]["args"]["correlation"]
    trace = _load(tmp_path, document)
    assert any("share" in n and "correlation" in n for n in trace.notices), trace.notices
    _analyze_json(tmp_path, tmp_path / "rank0.json")


def test_all_timestamps_zero_is_refused(tmp_path, base):
    from fsdp_trace.errors import UserError

    document = copy.deepcopy(base)
    _all("ts", 0)(document)
    with pytest.raises(UserError, match="same time"):
        _load(tmp_path, document)


def test_every_event_duplicated_gives_the_same_numbers_and_a_notice(tmp_path, base):
    clean = _baseline(tmp_path, base)
    document = copy.deepcopy(base)
    _duplicated(document)
    trace = _load(tmp_path, document)
    assert any("duplicate" in n for n in trace.notices), trace.notices
    got = _analyze_json(tmp_path, tmp_path / "rank0.json")
    for key in ("step_us", "comm_us", "exposed_pct"):
        assert got["ranks"][0][key] == clean["ranks"][0][key]
    assert len(got["collectives"]) == len(clean["collectives"])


def test_a_second_trace_events_key_is_refused(tmp_path, base):
    from fsdp_trace.analysis.read.loader import load_trace
    from fsdp_trace.errors import UserError

    path = _write(tmp_path / "t.json", _second_events_key(copy.deepcopy(base)))
    with pytest.raises(UserError, match="two 'traceEvents'"):
        load_trace(path, cache=False)
    small = _write(tmp_path / "s.json", b'{"traceEvents": [], "traceEvents": []}')
    with pytest.raises(UserError, match="two 'traceEvents'"):
        load_trace(small, cache=False)


def test_validation_leaves_the_shipped_samples_alone():
    """No notice and no dropped event on real traces: the thresholds have room."""
    from fsdp_trace.analysis.read.loader import load_trace

    for path in sorted(SAMPLES.glob("*/rank*.json.gz")):
        trace = load_trace(path)  # parsed here, or by another test (the run's cache)
        assert trace.notices == [], (path, trace.notices)


# --- memory: a gzip bomb ----------------------------------------------------------------------

PEAK_RSS_LIMIT = 400 * 1024**2

_MEASURE = """
import subprocess, sys, time, psutil
child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
proc = psutil.Process(child.pid)
peak = 0
while child.poll() is None:
    try:
        tree = [proc, *proc.children(recursive=True)]
        peak = max(peak, sum(p.memory_info().rss for p in tree))
    except psutil.Error:
        pass
    time.sleep(0.005)
print(peak, child.returncode)
print(child.stderr.read().decode(), end="")
"""


def peak_rss(*args: str, timeout: float = TIMEOUT_S) -> tuple[int, int, str]:
    """(peak RSS of the process tree, exit code, stderr) of `python -m fsdp_trace ARGS`."""
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, sys.executable, "-m", "fsdp_trace", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "FSDP_TRACE_QUIET": "1", "FSDP_TRACE_CACHE": "0"},
    )
    first, _, rest = done.stdout.partition("\n")
    peak, code = map(int, first.split())
    return peak, code, rest


@pytest.mark.parametrize("char", [b" ", b"[", b"{", b"a", b"0"])
def test_gzip_bomb_is_refused_in_bounded_memory(tmp_path, char):
    """2 MB on disk, 2 GiB of one character inside: refused in one line, well under 400 MB."""
    bomb = _write(tmp_path / "bomb.json.gz", _bomb(char, gib=2.0))
    assert bomb.stat().st_size < 3 * 1024**2
    peak, code, stderr = peak_rss("analyze", str(bomb), "--no-report")
    assert code == 2, stderr
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr, stderr
    assert peak < PEAK_RSS_LIMIT, f"peak RSS {peak / 1024**2:.0f} MB"


# --- the cache ----------------------------------------------------------------------------------

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files away")
NOBODY = 65534


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    from fsdp_trace.analysis.read import cache

    folder = tmp_path / "cache"
    monkeypatch.setenv("FSDP_TRACE_CACHE_DIR", str(folder))
    monkeypatch.delenv("FSDP_TRACE_CACHE", raising=False)
    cache.code_version.cache_clear()
    yield folder
    cache.code_version.cache_clear()


def _two_traces(tmp_path) -> tuple[Path, Path]:
    from tests.synth import TraceBuilder

    paths = []
    for i, dur in enumerate((100, 300)):
        b = TraceBuilder()
        b.step(1, 0, 1000)
        b.kernel("gemm", 100, dur, launch_ts=5)
        b.nccl("AllGather", 150, 100, launch_ts=6)
        folder = tmp_path / f"t{i}"
        folder.mkdir()
        paths.append(b.write(folder / "rank0.json"))
    return paths[0], paths[1]


def test_a_renamed_cache_entry_cannot_answer_for_another_trace(cache_dir, tmp_path):
    """Each entry holds its key: one copied over another trace's name is not read (before,
    the checksum matched and trace B got trace A's columns)."""
    from fsdp_trace.analysis.job import perrank
    from fsdp_trace.analysis.read import cache
    from fsdp_trace.analysis.read.loader import load_trace

    a, b = _two_traces(tmp_path)
    load_trace(a)
    entry_a = cache.TraceEntry.for_file(a).file
    entry_b = cache.TraceEntry.for_file(b).file
    entry_a.parent.joinpath(entry_b.name).write_bytes(entry_a.read_bytes())
    got = load_trace(b)
    gemm = got.events["name"].astype(str) == "gemm"
    assert got.events.loc[gemm, "dur"].tolist() == [300]  # b's own columns, parsed again
    perrank.analyze_file(a)
    params = {"source": "trace", "rank_from_name": 0}
    analysis_a = cache.AnalysisEntry.for_file(a, params).file
    analysis_b = cache.AnalysisEntry.for_file(b, params).file
    analysis_b.write_bytes(analysis_a.read_bytes())
    assert perrank.analyze_file(b).steps["compute_us"].iloc[0] == 300


def _parse_spy(monkeypatch) -> list:
    from fsdp_trace.analysis.read import loader

    calls: list = []
    real = loader._parse

    def spy(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(loader, "_parse", spy)
    return calls


@needs_root
def test_cache_folder_of_another_user_is_refused(cache_dir, tmp_path, monkeypatch):
    from fsdp_trace.analysis.read import cache
    from fsdp_trace.analysis.read.loader import load_trace

    a, _ = _two_traces(tmp_path)
    cache_dir.mkdir(mode=0o700)
    os.chown(cache_dir, NOBODY, NOBODY)
    calls = _parse_spy(monkeypatch)
    load_trace(a)
    load_trace(a)
    assert len(calls) == 2 and list(cache_dir.iterdir()) == []  # neither read nor written
    reason = cache.refused()
    assert reason is not None and f"owned by uid {NOBODY}" in reason
    assert not cache.enabled()
    assert "off" in cache.info().lines()[0] and f"uid {NOBODY}" in cache.info().lines()[0]
    done = run_cli("analyze", str(a), "--no-report", env={"FSDP_TRACE_CACHE_DIR": str(cache_dir)})
    assert done.returncode == 0, done.stderr
    warnings = [ln for ln in done.stderr.splitlines() if "cache" in ln]
    assert len(warnings) == 1 and warnings[0].startswith("fsdp-trace: warning: cache off: ")
    shown = run_cli("cache", "info", env={"FSDP_TRACE_CACHE_DIR": str(cache_dir)})
    assert shown.returncode == 0 and f"owned by uid {NOBODY}" in shown.stdout, shown.stdout
    cleared = run_cli("cache", "clear", env={"FSDP_TRACE_CACHE_DIR": str(cache_dir)})
    assert cleared.returncode == 2 and "Traceback" not in cleared.stderr


def test_cache_folder_writable_by_others_is_refused(cache_dir, tmp_path, monkeypatch):
    from fsdp_trace.analysis.read import cache
    from fsdp_trace.analysis.read.loader import load_trace

    a, _ = _two_traces(tmp_path)
    cache_dir.mkdir()
    for mode in (0o777, 0o775):
        cache_dir.chmod(mode)
        assert cache.refused() is not None and "writable by" in cache.refused()
        calls = _parse_spy(monkeypatch)
        load_trace(a)
        assert calls and list(cache_dir.iterdir()) == []
    cache_dir.chmod(0o755)
    assert cache.refused() is None


@needs_root
def test_sticky_shared_cache_folder_reads_only_our_entries(cache_dir, tmp_path, monkeypatch):
    from fsdp_trace.analysis.read import cache
    from fsdp_trace.analysis.read.loader import load_trace

    a, _ = _two_traces(tmp_path)
    cache_dir.mkdir()
    cache_dir.chmod(0o1777)
    assert cache.refused() is None
    load_trace(a)
    (entry,) = cache_dir.glob("trace-*")
    os.chown(entry, NOBODY, NOBODY)  # now another user's file
    calls = _parse_spy(monkeypatch)
    load_trace(a)
    assert len(calls) == 1  # not read: parsed again


def test_cache_info_tells_when_the_cache_is_off(cache_dir, monkeypatch):
    monkeypatch.setenv("FSDP_TRACE_CACHE", "0")
    shown = run_cli(
        "cache", "info", env={"FSDP_TRACE_CACHE_DIR": str(cache_dir), "FSDP_TRACE_CACHE": "0"}
    )
    assert shown.returncode == 0
    assert "(off: FSDP_TRACE_CACHE=0)" in shown.stdout.splitlines()[0], shown.stdout
    shown = run_cli(
        "cache", "info", env={"FSDP_TRACE_CACHE_DIR": str(cache_dir), "FSDP_TRACE_CACHE": "1"}
    )
    assert "(on)" in shown.stdout.splitlines()[0], shown.stdout


# --- what needs a change outside the loader (see the hardening report) ----------------------


def test_gpu_trace_that_names_no_rank_is_analyzed(tmp_path, base):
    document = copy.deepcopy(base)
    del document["distributedInfo"]
    _analyze_json(tmp_path, _write(tmp_path / "t.json", _dump(document)))


def test_loader_notices_reach_the_output(tmp_path, base):
    document = copy.deepcopy(base)
    _duplicated(document)
    got = _analyze_json(tmp_path, _write(tmp_path / "rank0.json", _dump(document)))
    assert "duplicated events" in json.dumps(got["notices"])


# --- issue 21: a newcomer's pass and a second hostile corpus --------------------------------


def _sim_run(tmp_path, name: str = "run", **sim) -> Path:
    from tests.fsdp_sim import Sim

    folder = tmp_path / name
    Sim(host_speed=4.0, **sim).write(folder)
    return folder


def _edit_traces(folder: Path, edit) -> None:
    """`edit(document, rank)` applied to every rank{R}.json in `folder`."""
    for path in sorted(folder.glob("rank*.json")):
        document = json.loads(path.read_text())
        edit(document, document["distributedInfo"]["rank"])
        path.write_text(json.dumps(document))


def _memsets_sharing_correlation(document: dict, rank: int) -> None:
    """A memset beside each compute kernel, under the kernel's correlation id: what a Triton
    kernel's launch writes (HTA's public a100_16rank trace has hundreds)."""
    extra = []
    for e in document["traceEvents"]:
        if e.get("cat") == "kernel" and not e["name"].startswith("nccl"):
            memset = {**e, "cat": "gpu_memset", "name": "Memset (Device)", "dur": 1.0}
            memset["ts"] = e["ts"] - 2.0
            memset["args"] = dict(e["args"])
            extra.append(memset)
    document["traceEvents"].extend(extra)


def test_gpu_events_sharing_a_correlation_id_are_replayed(tmp_path):
    """issue 21 (1): `whatif` and the report's what-if panel on kernels that share their
    correlation id with a memset: a prediction, not pandas' InvalidIndexError."""
    run = _sim_run(tmp_path)
    _edit_traces(run, _memsets_sharing_correlation)
    done = run_cli("whatif", str(run), "--set", "ac_coverage=1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    report = tmp_path / "r.html"
    done = run_cli("analyze", str(run), "--report", str(report))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert 'data-panel="whatif"' in report.read_text()


def _without_fsdp_labels(document: dict, rank: int) -> None:
    document["traceEvents"] = [
        e for e in document["traceEvents"] if not e.get("name", "").startswith("FSDP::")
    ]


def test_whatif_on_traces_without_fsdp2_labels_refuses_in_one_line(tmp_path):
    """issue 21 (1): HTA's a100_16rank trace has no FSDP2 labels (pipeline SendRecv): the
    replay of FSDP2's schedule has nothing to model. `whatif` says so in one line, exit 2;
    the report's what-if panel says it in the panel and the report is written."""
    run = _sim_run(tmp_path)
    _edit_traces(run, _without_fsdp_labels)
    done = run_cli("whatif", str(run))
    _cli_error(done, "no FSDP2 labels", "fully_shard", command="whatif")
    report = tmp_path / "r.html"
    done = run_cli("analyze", str(run), "--report", str(report))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "No prediction: " in report.read_text() and "no FSDP2 labels" in report.read_text()


def test_a_report_panel_that_fails_says_why_and_the_report_is_written(tmp_path, monkeypatch):
    """issue 21 (1): a panel that cannot be computed says why in the panel; the other panels
    and the report stand."""
    from fsdp_trace.present import whatif as present_whatif
    from fsdp_trace.render.report import render_html

    def broken(run, peers):
        raise KeyError("no such column")

    monkeypatch.setattr(present_whatif, "panel_view", broken)
    page = render_html(fsdp_trace.analyze(_sim_run(tmp_path), detailed=False))
    assert 'data-panel="whatif"' in page and 'data-panel="diagnosis"' in page
    assert "This panel could not be computed (KeyError: &#x27;no such column&#x27;)" in page


HTA_PUBLIC = REPO.parent / "shared" / "traces" / "hta"  # HTA's public test traces, beside the repo


@pytest.mark.skipif(not HTA_PUBLIC.is_dir(), reason="HTA's public traces are not beside the repo")
def test_htas_public_traces_analyze_with_a_report_and_whatif_refuses(tmp_path):
    """issue 21 (1), on the files themselves: the folder and the 16-rank file alone analyze
    with their report written; `whatif` on the file (a DDP run) refuses in one line."""
    import shutil

    folder = shutil.copytree(HTA_PUBLIC, tmp_path / "hta")
    done = run_cli("analyze", str(folder))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert (folder / "report.html").is_file()
    one = folder / "a100_16rank_rank0_pt20.json.gz"
    done = run_cli("analyze", str(one), "--no-detailed")
    assert done.returncode == 0, done.stderr[-3000:]
    # the trace is DDP (DistributedDataParallel.forward labels): the replay models FSDP2 only
    why = "models FSDP2 (fully_shard) steps only"
    assert why in (folder / "a100_16rank_rank0_pt20.report.html").read_text()
    _cli_error(run_cli("whatif", str(one)), why, command="whatif")


def _left_out_point(folder: Path) -> Path:
    """A sweep point whose traces were left out: run.json (listing them) and analysis.json."""
    folder.mkdir(parents=True)
    files = {"timing": ["rank0.timing.json.gz"], "detailed": ["rank0.detailed.json.gz"]}
    (folder / "run.json").write_text(json.dumps({"files": files}))
    (folder / "analysis.json").write_text(json.dumps({"format": 1}))
    return folder


def test_a_folder_of_many_runs_analyzes_those_it_can_and_names_the_rest(tmp_path):
    """issue 21 (4): `analyze sample_traces` stopped at the first sweep point whose traces
    were left out. Every run that can be analyzed is; each other one is named in one notice
    line (a point without its traces as "traces left out", not an error); the tool's own
    records (tune.json) beside runs are not read as traces."""
    runs = tmp_path / "runs"
    _sim_run(runs, "good")
    _left_out_point(runs / "sweep" / "ac0.00-1gpu")
    broken = runs / "broken"
    broken.mkdir()
    (broken / "run.json").write_text(json.dumps({"files": {"timing": "rank0.json"}}))
    tune = runs / "tune"
    _sim_run(tune, "eager")
    (tune / "tune.json").write_text(json.dumps({"trials": []}))
    out = tmp_path / "o.json"
    before = _tree_digest([str(runs)])
    done = run_cli("analyze", str(runs), "--json", str(out), "--no-report")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "error" not in done.stderr and "Traceback" not in done.stderr
    got = json.loads(out.read_text())
    assert len(got["runs"]) == 2  # good and tune/eager
    skipped = [n for n in got["notices"] if n.startswith("not analyzed: ")]
    assert len(skipped) == 2, got["notices"]
    left, bad = sorted(skipped, key=lambda n: "left out" not in n)
    assert f"{runs / 'sweep' / 'ac0.00-1gpu'}: traces left out" in left and "\n" not in left
    assert str(broken) in bad and "run.json" in bad
    printed = [ln for ln in done.stdout.splitlines() if ln.startswith("notice: not analyzed")]
    assert len(printed) == 2
    assert "2 runs not analyzed" in got["grouping"]
    assert _tree_digest([str(runs)]) == before


def test_a_run_whose_traces_were_left_out_named_itself_is_one_line(tmp_path):
    """Pointed at directly, a point without its traces is a one-line error that says so."""
    point = _left_out_point(tmp_path / "ac0.00-1gpu")
    line = _cli_error(run_cli("analyze", str(point)), "traces left out", "analysis.json")
    assert "plot" in line


def test_the_records_fsdp_trace_writes_are_never_read_as_traces():
    from fsdp_trace.analysis.read.inputs import OWN_RECORDS
    from fsdp_trace.runrecord import RUN_FILE
    from fsdp_trace.sweep import SUMMARY_FILE
    from fsdp_trace.tune import TUNE_FILE

    assert {RUN_FILE, SUMMARY_FILE, TUNE_FILE} == OWN_RECORDS


@pytest.mark.slow  # every shipped sample: ~20 s
def test_analyze_sample_traces_as_one_folder(tmp_path):
    """issue 21 (4), as the user typed it."""
    out = tmp_path / "o.json"
    done = run_cli("analyze", "sample_traces", "--json", str(out), "--no-report", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(out.read_text())
    assert len(got["runs"]) > 20
    assert all("traces left out" in n for n in got["notices"] if n.startswith("not analyzed"))


def _rename_steps(names: dict[int, str], ranks=(0, 1)):
    """ProfilerStep#N renamed to names[N] on the given ranks."""

    def edit(document: dict, rank: int) -> None:
        if rank not in ranks:
            return
        for e in document["traceEvents"]:
            name = e.get("name", "")
            if name.startswith("ProfilerStep#") and int(name[13:]) in names:
                e["name"] = names[int(name[13:])]

    return edit


def _rank_notices(result) -> str:
    return " ".join(n for r in result.only.ranks for n in r.notices)


@pytest.mark.parametrize(
    ("edit", "notice", "steps"),
    [
        (_rename_steps({3: "ProfilerStep#2"}), "ProfilerStep numbers repeat (#2)", [1, 2]),
        (_rename_steps({3: f"ProfilerStep#{2**70}"}), "past int64", [1, 2]),
    ],
    ids=["repeated", "beyond-int64"],
)
def test_profiler_step_numbers_that_cannot_be_keys(tmp_path, edit, notice, steps):
    """issue 21 (9): two ProfilerSteps with one number (TypeError in the report's what-if
    panel) and a number past int64 (OverflowError): the window is left out with a notice;
    analyze, its report and whatif all answer."""
    run = _sim_run(tmp_path)
    _edit_traces(run, edit)
    result = fsdp_trace.analyze(run, detailed=False)
    assert notice in _rank_notices(result)
    assert sorted(set(result.steps["step"])) == steps
    report = tmp_path / "r.html"
    done = run_cli("analyze", str(run), "--report", str(report))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "could not be computed" not in report.read_text()
    done = run_cli("whatif", str(run), "--set", "ac_coverage=1")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]


def test_overlapping_profiler_step_windows_get_a_notice(tmp_path):
    """issue 21 (9): a ProfilerStep that starts before the one before it ends."""

    def overlap(document: dict, rank: int) -> None:
        step = {
            e["name"]: e
            for e in document["traceEvents"]
            if e.get("name", "")[:13] == "ProfilerStep#"
        }
        step["ProfilerStep#2"]["dur"] += step["ProfilerStep#3"]["dur"] / 2

    run = _sim_run(tmp_path)
    plain = fsdp_trace.analyze(run, detailed=False, cache=False).steps["step_us"].tolist()
    _edit_traces(run, overlap)
    result = fsdp_trace.analyze(run, detailed=False)
    assert "ProfilerStep windows overlap the next one (1 of 3: #3 starts before #2 ends)" in (
        _rank_notices(result)
    )
    assert result.steps["step_us"].tolist() == plain


def test_ranks_without_a_common_step_number(tmp_path):
    """issue 21 (9): rank 1 profiled other steps than rank 0 (IndexError in whatif): one line
    from whatif, the reason in the report's what-if panel."""
    run = _sim_run(tmp_path)
    _edit_traces(run, _rename_steps({n: f"ProfilerStep#{n + 10}" for n in (1, 2, 3)}, ranks=(1,)))
    _cli_error(run_cli("whatif", str(run)), "share no ProfilerStep number", command="whatif")
    report = tmp_path / "r.html"
    done = run_cli("analyze", str(run), "--report", str(report))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "No prediction: run: the ranks&#x27; traces share no ProfilerStep" in report.read_text()


def test_a_trace_file_name_that_is_not_utf8_reaches_the_json(tmp_path):
    """issue 21 (9): msgspec.DecodeError writing --json for a file named with a byte that is
    not UTF-8: the JSON is written, valid for strict readers, the byte as "?"."""
    import msgspec

    run = _sim_run(tmp_path)
    folder = tmp_path / "named"
    folder.mkdir()
    try:
        target = os.fsencode(folder) + b"/rank0\xff.json"
        os.rename(run / "rank0.json", target)
    except OSError:
        pytest.skip("this filesystem takes only UTF-8 names")
    out = tmp_path / "o.json"
    done = run_cli("analyze", str(folder), "--json", str(out), "--no-report")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "rank0?.json" in json.dumps(msgspec.json.decode(out.read_bytes()))


def test_an_output_name_too_long_for_the_filesystem_is_one_line(tmp_path):
    """issue 21 (9): a 300-character --json name was an OSError (ENAMETOOLONG)."""
    run = _sim_run(tmp_path)
    long = tmp_path / ("a" * 300 + ".json")
    line = _cli_error(run_cli("analyze", str(run), "--json", str(long), "--no-report"))
    assert "File name too long" in line and "give another path" in line


def _cli_with_stdout(
    stdout, *args: str, env: dict | None = None, stderr=subprocess.PIPE
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fsdp_trace", *args],
        cwd=REPO,
        stdout=stdout,
        stderr=stderr,
        text=True,
        timeout=120,
        env={**os.environ, "FSDP_TRACE_QUIET": "1", **(env or {})},
    )


@contextlib.contextmanager
def _closed_pipe() -> Iterator[int]:
    """The writing end of a pipe whose reader is gone before the first line (`| head -1`:
    every write meets a closed pipe)."""
    read, write = os.pipe()
    os.close(read)
    try:
        yield write
    finally:
        os.close(write)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
def test_stdout_that_cannot_be_written_is_one_line(tmp_path):
    """issue 21 (9): `> /dev/full` was an OSError traceback; nothing else is written."""
    run = _sim_run(tmp_path)
    out = tmp_path / "o.json"
    with open("/dev/full", "w") as full:
        done = _cli_with_stdout(full, "analyze", str(run), "--json", str(out), "--no-report")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines() == [
        "fsdp-trace analyze: error: cannot write to standard output (No space left on device): "
        "the output stops here, nothing else written"
    ]
    assert not out.exists()


def _with_closed(
    fd: int, *args: str, program: tuple[str, ...] = ("-m", "fsdp_trace")
) -> subprocess.CompletedProcess:
    """`fsdp-trace ARGS` (`python PROGRAM ARGS`) started with `fd` closed (1: `>&-`, 2:
    `2>&-`); the other stream captured."""
    return subprocess.run(
        [sys.executable, *program, *args],
        cwd=REPO,
        stdout=subprocess.PIPE if fd == 2 else None,
        stderr=subprocess.PIPE if fd == 1 else None,
        text=True,
        timeout=120,
        env={**os.environ, "FSDP_TRACE_QUIET": "1"},
        preexec_fn=lambda: os.close(fd),
    )


def test_a_closed_stdout_is_one_line(tmp_path):
    """`>&-`: Python starts with sys.stdout None, which was an AttributeError traceback; it is
    a stdout that cannot be written, as `> /dev/full` is."""
    run = _sim_run(tmp_path)
    out = tmp_path / "o.json"
    done = _with_closed(1, "analyze", str(run), "--json", str(out), "--no-report")
    assert done.returncode == 2 and done.stderr.splitlines() == [
        "fsdp-trace analyze: error: cannot write to standard output (it is closed): the output "
        "stops here, nothing else written"
    ], done.stderr
    assert not out.exists()


# `fsdp-trace ARGS` with the descriptor numbers of the files it opens in a folder recorded.
OPENED = """
import builtins, io, json, os, sys
out, folder, sys.argv = sys.argv[1], sys.argv[2], ["fsdp-trace", *sys.argv[3:]]
numbers, os_open, io_open = [], os.open, io.open
def record(path, fd):
    if str(path).startswith(folder):
        numbers.append(fd)
    return fd
os.open = lambda path, *a, **k: record(path, os_open(path, *a, **k))
def opened(file, *a, **k):
    f = io_open(file, *a, **k)
    if not isinstance(file, int):
        record(file, f.fileno())
    return f
builtins.open = io.open = opened
from fsdp_trace.cli import main
try:
    main()
except SystemExit:
    pass
io_open(out, "w").write(json.dumps(numbers))
"""


def test_a_closed_stderr_is_never_an_output_files_number(tmp_path):
    """With descriptor 2 closed, the next file opened took the number 2 (the staged JSON),
    where a library's C code or a child process writing to its stderr writes into it."""
    run, out, seen = _sim_run(tmp_path), tmp_path / "o.json", tmp_path / "fds.json"
    args = ["analyze", str(run), "--json", str(out), "--no-report"]
    done = _with_closed(2, *args, program=("-c", OPENED, str(seen), str(tmp_path)))
    assert done.returncode == 0 and "Verdict:" in done.stdout
    numbers = json.loads(seen.read_text())
    assert numbers and min(numbers) > 2, numbers
    assert json.loads(out.read_text())["verdict"]


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["analyze", "--help"]])
def test_a_closed_stdout_before_any_command_is_one_line(args):
    """typer prints --version and --help before a command's own error handling runs: a
    closed stdout there was a UserError traceback."""
    done = _with_closed(1, *args)
    assert done.returncode == 2 and done.stderr.splitlines() == [
        "fsdp-trace: error: cannot write to standard output (it is closed): the output stops "
        "here, nothing else written"
    ], done.stderr


def test_a_closed_stderr_leaves_the_exit_code_and_the_output(tmp_path):
    """`2>&-`: the one-line error has nowhere to go; the exit code still says it, and a run
    that goes well prints as usual."""
    missing = _with_closed(2, "analyze", str(tmp_path / "missing.json"))
    assert missing.returncode == 2 and missing.stdout == ""
    fine = _with_closed(2, "analyze", str(_sim_run(tmp_path)), "--no-report")
    assert fine.returncode == 0 and "Verdict:" in fine.stdout


def test_a_terminal_encoding_that_cannot_show_the_text(tmp_path):
    """issue 21 (9): PYTHONIOENCODING=ascii was a UnicodeEncodeError."""
    run = _sim_run(tmp_path)
    done = _cli_with_stdout(
        subprocess.PIPE, "analyze", str(run), "--no-report", env={"PYTHONIOENCODING": "ascii"}
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "Verdict:" in done.stdout


def test_a_reader_that_stops_early_does_not_stop_the_command(tmp_path):
    """issue 21 (9): `--json o.json | head -1` exited 1 with no message and no JSON. The
    printing stops with the reader (here one gone before the first line: every write meets
    a closed pipe); the files are written and the command ends as usual."""
    run = _sim_run(tmp_path)
    out = tmp_path / "o.json"
    with _closed_pipe() as write:
        done = _cli_with_stdout(write, "analyze", str(run), "--json", str(out))
    assert done.returncode == 0 and done.stderr.strip().splitlines() == [
        f"fsdp-trace: wrote {out}",
        f"fsdp-trace: wrote {run / 'report.html'}",
    ], done.stderr
    assert json.loads(out.read_text())["verdict"]


def test_a_reader_of_both_streams_that_stops_early_does_not_stop_the_command(tmp_path):
    """`2>&1 | head -1` exited 1 after writing its files: the last line on stderr ("wrote
    ...") met the closed pipe and click ends an EPIPE with 1. stderr stops with its reader as
    stdout does; the files are written and the exit is the command's own."""
    run = _sim_run(tmp_path)
    out = tmp_path / "o.json"
    with _closed_pipe() as write:
        done = _cli_with_stdout(write, "analyze", str(run), "--json", str(out), stderr=write)
    assert done.returncode == 0
    assert json.loads(out.read_text())["verdict"]
    assert (run / "report.html").stat().st_size > 0


def test_bad_input_into_a_closed_pipe_still_exits_2(tmp_path):
    """The one-line error has nowhere to go; the exit code still says what happened."""
    missing = tmp_path / "missing.json"
    with _closed_pipe() as write:
        done = _cli_with_stdout(write, "analyze", str(missing), "--no-report", stderr=write)
    assert done.returncode == 2


def test_a_trace_in_nanoseconds_says_so(tmp_path):
    """issue 21 (9): `displayTimeUnit: "ns"` traces (ts and dur in ns, as Perfetto reads
    them) were read as µs: 1000× longer steps and a false bandwidth finding."""
    run = _sim_run(tmp_path)
    plain = fsdp_trace.analyze(run, detailed=False, cache=False)

    def in_ns(document: dict, rank: int) -> None:
        document["displayTimeUnit"] = "ns"
        for e in document["traceEvents"]:
            for key in ("ts", "dur"):
                if key in e:
                    e[key] = e[key] * 1000

    _edit_traces(run, in_ns)
    result = fsdp_trace.analyze(run, detailed=False)
    assert result.steps["step_us"].tolist() == pytest.approx(plain.steps["step_us"].tolist())
    assert [f.rule for f in result.findings] == [f.rule for f in plain.findings]
    assert 'displayTimeUnit "ns"' in _rank_notices(result)


def _as_detailed(document: dict, rank: int) -> None:
    """What record_shapes and with_stack add: shapes on the ops, Python frames."""
    extra = []
    for e in document["traceEvents"]:
        if e.get("cat") == "cpu_op":
            e["args"]["Input Dims"] = [[8, 1024]]
            frame = {**e, "cat": "python_function", "name": "train.py(12): step", "args": {}}
            extra.append(frame)
    document["traceEvents"].extend(extra)


def _run_with_detailed_listed_as_timing(tmp_path, swap_names: bool) -> tuple[Path, list]:
    """A capture run whose lean traces say the host keeps up and whose detailed ones (the
    profiler's record_shapes/with_stack slow the host: a gap between launches) say it does
    not; run.json lists the detailed ones as its timing traces, or (swap_names) the files'
    names say so."""
    run = tmp_path / "run"
    lean = _sim_run(tmp_path, "lean")
    slow = _sim_run(tmp_path, "slow", gap_us=600.0)
    _edit_traces(slow, _as_detailed)
    run.mkdir()
    for r in (0, 1):
        os.rename(lean / f"rank{r}.json", run / f"rank{r}.timing.json")
        os.rename(slow / f"rank{r}.json", run / f"rank{r}.detailed.json")
    plain = fsdp_trace.analyze([run / "rank0.timing.json", run / "rank1.timing.json"]).only
    timing = [f"rank{r}.{'timing' if swap_names else 'detailed'}.json" for r in (0, 1)]
    detailed = [f"rank{r}.{'detailed' if swap_names else 'timing'}.json" for r in (0, 1)]
    if swap_names:  # the file names lie: the detailed content under the timing name
        for r in (0, 1):
            os.rename(run / f"rank{r}.timing.json", run / "x")
            os.rename(run / f"rank{r}.detailed.json", run / f"rank{r}.timing.json")
            os.rename(run / "x", run / f"rank{r}.detailed.json")
    record = {"files": {"timing": timing, "detailed": detailed}}
    (run / "run.json").write_text(json.dumps(record))
    return run, plain.steps["step_us"].tolist()


@pytest.mark.parametrize("swap_names", [False, True], ids=["listed", "named"])
def test_detailed_traces_are_never_the_timing_when_lean_ones_exist(tmp_path, swap_names):
    """issue 21 (9): detailed traces named or listed as the timing traces were used for the
    timing figures (host-bound 53 % instead of 25 %). Told apart by their content (shapes,
    Python frames): the lean traces time the run, the detailed ones stay detailed, and a
    notice says so."""
    run, lean_steps = _run_with_detailed_listed_as_timing(tmp_path, swap_names)
    result = fsdp_trace.analyze(run).only
    timing = result.steps[result.steps["source"] == "timing"]
    assert timing["step_us"].tolist() == pytest.approx(lean_steps)
    assert [r.source for r in result.ranks] == ["timing", "timing"]
    assert [r.source for r in result.detailed] == ["detailed", "detailed"]
    lean = "detailed" if swap_names else "timing"  # the lean content's file name
    assert [Path(r.path).name for r in result.ranks] == [f"rank{r}.{lean}.json" for r in (0, 1)]
    notice = next(n for n in result.notices if "record_shapes/with_stack" in n)
    assert "used as the run's detailed traces, not for its timing" in notice


def test_only_detailed_traces_time_the_run_with_a_notice(tmp_path):
    """Without lean traces the detailed ones are all there is: used, and said."""
    slow = _sim_run(tmp_path, "slow")
    _edit_traces(slow, _as_detailed)
    (slow / "run.json").write_text(
        json.dumps({"files": {"timing": ["rank0.json", "rank1.json"], "detailed": []}})
    )
    result = fsdp_trace.analyze(slow).only
    assert len(result.ranks) == 2
    assert any("the profiler slows their host side" in n for n in result.notices), result.notices


def _with_run_json(tmp_path, change) -> Path:
    """The 2-rank simulated run beside the shipped 1-GPU sample's run.json (8 blocks, a world
    of 1), changed by `change`."""
    run = _sim_run(tmp_path, blocks=8)
    record = json.loads((SAMPLES / "gpt-small-1gpu" / "run.json").read_text())
    record["files"] = {"timing": ["rank0.json", "rank1.json"], "detailed": []}
    change(record)
    (run / "run.json").write_text(json.dumps(record))
    return run


def _world(n: int):
    def change(record: dict) -> None:
        record["world"].update(world_size=n, local_world_size=n)

    return change


def _blocks(n: int):
    def change(record: dict) -> None:
        _world(2)(record)
        record["model"]["n_blocks"] = n

    return change


@pytest.mark.parametrize(
    ("change", "notice"),
    [
        (lambda record: None, "run.json records a world of 1, the traces one of 2"),
        (_world(8), "run.json records a world of 8, the traces one of 2"),
        (_blocks(24), "run.json records 24 transformer blocks, the traces' FSDP2 labels show 8"),
    ],
    ids=["1-gpu-run.json", "world-8", "24-blocks"],
)
def test_a_run_json_that_contradicts_the_traces_is_not_used(tmp_path, change, notice):
    """issue 21 (9): run.json contradicting its traces (a 1-GPU run's beside 2-GPU traces,
    a world of 8 beside 2, 24 blocks beside 8) was used silently (a false shard-group
    finding). A notice says so, and the traces' own configuration is used."""
    result = fsdp_trace.analyze(_with_run_json(tmp_path, change), detailed=False).only
    said = [n for n in result.notices if n.startswith(notice)]
    assert said and "run.json describes another run" in said[0], result.notices
    assert result.run is None
    assert result.config.world_size.value == 2 and result.config.mesh.source == "trace"
    assert "shard-group-crosses-nodes" not in [f.rule for f in result.findings]


def test_a_run_json_that_agrees_with_the_traces_is_used(tmp_path):
    result = fsdp_trace.analyze(_with_run_json(tmp_path, _world(2)), detailed=False).only
    assert result.run is not None and result.config.world_size.source == "run.json"
    assert not [n for n in result.notices if "describes another run" in n]


def _group_size_arg(size: int):
    def edit(document: dict, rank: int) -> None:
        for e in document["traceEvents"]:
            if "Group size" in (e.get("args") or {}):
                e["args"]["Group size"] = size

    return edit


def test_a_group_size_the_process_groups_contradict(tmp_path):
    """issue 21 (9): kernels saying `Group size` 8 in a 2-rank world whose pg_config lists
    the group's 2 ranks gave "FSDP over 8 ranks" and an 8-rank busbw factor. The group's
    member list wins, with a notice."""
    run = _sim_run(tmp_path)
    plain = fsdp_trace.analyze(run, detailed=False, cache=False).only
    _edit_traces(run, _group_size_arg(8))
    result = fsdp_trace.analyze(run, detailed=False).only
    assert result.config.mesh.value.describe() == "FSDP over 2 ranks"
    assert set(result.collectives["group_size"]) == {2}
    assert result.collectives["busbw_gbps"].tolist() == pytest.approx(
        plain.collectives["busbw_gbps"].tolist(), nan_ok=True
    )
    assert "`Group size` 8 where the trace's pg_config lists 2 ranks" in _rank_notices(
        fsdp_trace.analyze(run, detailed=False)
    )


def test_a_group_size_beyond_the_world_without_process_groups(tmp_path):
    """Without pg_config to tell: a group larger than the world is left unknown, said."""

    def no_pg_config(document: dict, rank: int) -> None:
        del document["distributedInfo"]["pg_config"]

    run = _sim_run(tmp_path)
    _edit_traces(run, _group_size_arg(8))
    _edit_traces(run, no_pg_config)
    result = fsdp_trace.analyze(run, detailed=False)
    assert result.only.collectives["group_size"].isna().all()
    assert "`Group size` 8, more than the world of 2: left unknown" in _rank_notices(result)


def test_one_trace_copied_as_two_ranks_is_said(tmp_path):
    """issue 21 (9): one rank's trace copied as another's (identical but for the rank) gave
    zero waiting and no warning. A notice names the copy, which is left out of the
    cross-rank match (no waiting measured from it)."""
    run = _sim_run(tmp_path, delay={1: 800.0})
    document = json.loads((run / "rank0.json").read_text())
    document["distributedInfo"]["rank"] = 1
    (run / "rank1.json").write_text(json.dumps(document))
    result = fsdp_trace.analyze(run, detailed=False).only
    said = [n for n in result.notices if "rank 1's trace is rank 0's" in n]
    assert said and "left out of the cross-rank match" in said[0], result.notices
    assert result.crossrank.empty


def test_a_symbolic_link_loop_finds_each_run_once(tmp_path):
    """issue 21 (9): a link from a folder to itself made the walk find one run four times
    (one per folder level it searches). Each folder and file is read once, however named."""
    top = tmp_path / "top"
    _sim_run(top, "run")
    (top / "loop").symlink_to(top)
    (top / "again").symlink_to(top / "run")
    result = fsdp_trace.analyze(top, detailed=False)
    assert len(result.runs) == 1 and len(result.only.ranks) == 2


def test_sigterm_while_writing_leaves_nothing(tmp_path):
    """issue 21 (9): SIGTERM while the outputs were written left `.NAME.staged-PID` files and
    `.csv.XXXX/` folders (Ctrl-C cleaned up). Here the command sends itself SIGTERM once the
    CSV folder is staged: one line, exit 143, and no output or staged file left."""
    run = _sim_run(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    code = (
        "import os, signal\n"
        "from fsdp_trace.render import export\n"
        "write = export.write_csv_files\n"
        "def dying(result, folder):\n"
        "    write(result, folder)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "export.write_csv_files = dying\n"
        "from fsdp_trace.cli import main; main()\n"
    )
    args = ["analyze", str(run), "--json", str(out / "o.json"), "--csv", str(out / "csv")]
    done = subprocess.run(
        [sys.executable, "-c", code, *args, "--report", str(out / "r.html")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "FSDP_TRACE_QUIET": "1"},
    )
    assert done.returncode == 143, done.stderr[-3000:]
    assert done.stderr.splitlines() == [
        "fsdp-trace analyze: error: terminated (SIGTERM): nothing written"
    ]
    assert list(out.iterdir()) == []


def _bomb_of_events(gib: float) -> bytes:
    """A gzip file of valid Kineto JSON: one CPU event repeated to `gib` GiB, ~1/300 of that
    on disk (16 MiB of events compressed once and repeated: a full flush makes every copy
    identical)."""
    event = (
        b'{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 5, "dur": 1},'
    )
    header, tail = b'{"traceEvents": [', event[:-1] + b"]}"
    block = event * ((16 << 20) // len(event))
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = packer.compress(header) + packer.flush(zlib.Z_FULL_FLUSH)
    chunk = packer.compress(block) + packer.flush(zlib.Z_FULL_FLUSH)
    end = packer.compress(tail) + packer.flush()
    copies = max(1, int(gib * (1 << 30) / len(block)))
    crc = zlib.crc32(header)
    for _ in range(copies):
        crc = zlib.crc32(block, crc)
    crc = zlib.crc32(tail, crc)
    size = (len(header) + len(block) * copies + len(tail)) & 0xFFFFFFFF
    gz_header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    return gz_header + head + chunk * copies + end + struct.pack("<II", crc, size)


def test_gzip_bomb_of_valid_events_is_refused_in_bounded_memory(tmp_path):
    """issue 21 (9): 5 MB of gzip holding 1.5 GB of valid events peaked at 3.4 GB of RSS.
    Kineto JSON compresses 8-20x; a file that expands over 100x is refused in one line once
    the ratio shows, in bounded memory."""
    bomb = _write(tmp_path / "bomb.json.gz", _bomb_of_events(1.5))
    assert bomb.stat().st_size < 8 * 1024**2
    peak, code, stderr = peak_rss("analyze", str(bomb), "--no-report")
    assert code == 2, stderr
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr, stderr
    assert "expands" in stderr and "gzip bomb" in stderr
    assert peak < PEAK_RSS_LIMIT, f"peak RSS {peak / 1024**2:.0f} MB"


def _zip_with(tmp_path, name: str, data: bytes) -> Path:
    import zipfile

    archive = tmp_path / "traces.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr(name, data)
    return archive


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b" " * (80 << 20), "expands to over 100x"),
        (b"PK not a trace at all" * 1000, "not a trace (it starts"),
    ],
    ids=["zip-bomb", "not-json"],
)
def test_a_zip_member_is_refused_before_it_is_copied(tmp_path, data, fragment):
    """issue 21 (9): a `zip://` member was copied whole (2.15 GB) to TMPDIR before the loader
    refused it. Its sizes and first bytes are checked first: one line, nothing copied."""
    pytest.importorskip("fsspec")
    archive = _zip_with(tmp_path, "rank0.json", data)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = {"TMPDIR": str(tmpdir)}
    code = (
        "import contextlib, sys\n"
        "from fsdp_trace.analysis.read import remote\n"
        "get = remote.local_copy\n"
        "@contextlib.contextmanager\n"
        "def spy(url):\n"
        "    with get(url) as local:\n"
        "        print('copied', local.stat().st_size, file=sys.stderr)\n"
        "        yield local\n"
        "remote.local_copy = spy\n"
        "from fsdp_trace.cli import main; main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "analyze", f"zip://rank0.json::{archive}", "--no-report"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "FSDP_TRACE_QUIET": "1", **env},
    )
    seen = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(seen) == 1, done.stderr[-2000:]
    assert (
        seen[0].startswith("fsdp-trace analyze: error: zip://rank0.json::") and fragment in seen[0]
    )
    assert list(tmpdir.iterdir()) == []


def test_a_trace_in_a_zip_archive_is_read_by_its_member_name(tmp_path):
    """A chained URL is named by its member (`zip://rank0.json::x.zip` is rank0.json, not
    x.zip, which no reader takes): a trace in an archive is analyzed."""
    pytest.importorskip("fsspec")
    run = _sim_run(tmp_path)
    archive = _zip_with(tmp_path, "rank0.json", (run / "rank0.json").read_bytes())
    result = fsdp_trace.analyze(f"zip://rank0.json::{archive}", detailed=False)
    assert len(result.only.ranks) == 1


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ("batch_size=1e30", "batch_size takes a whole number from 1 to 1,000,000"),
        ("batch_scale=1e30", "a batch 1e+30x the measured one"),
        ("batch_scale=0.001", "from 1/64x to 64x"),
        ("prefetch_forward=1e30", "prefetch_forward takes a whole number from 0 to 1,000,000"),
    ],
)
def test_whatif_changes_beyond_what_the_replay_models_are_one_line(tmp_path, change, fragment):
    """issue 21 (9): `whatif --set batch_size=1e30` was accepted (a prediction for a batch
    of 10^30). The replay's range is said instead."""
    run = _sim_run(tmp_path)
    _cli_error(run_cli("whatif", str(run), "--set", change), fragment, command="whatif")


def test_whatif_batch_size_far_from_the_runs_is_one_line(tmp_path):
    """A whole number the parser takes, but 500x the run's batch (run.json: 16)."""
    run = _with_run_json(tmp_path, _world(2))
    line = _cli_error(
        run_cli("whatif", str(run), "--set", "batch_size=8000"),
        "from 1/64x to 64x",
        command="whatif",
    )
    assert "500x the measured one" in line


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (None, "over 1 MB, not a scheduler file"),
        (b'{"type": "Scheduler"}', "not a scheduler file (JSON with the scheduler's address)"),
    ],
    ids=["64-MB", "no-address"],
)
def test_a_scheduler_file_that_is_not_one_is_one_line(tmp_path, content, fragment):
    """issue 21 (9): a 512 MB --scheduler file was read whole (by distributed). It is read
    here under a 1 MB bound, and one without an address is said to be no scheduler file."""
    pytest.importorskip("distributed")
    path = tmp_path / "scheduler.json"
    if content is None:
        with open(path, "wb") as handle:
            handle.truncate(64 << 20)  # sparse: 64 MB of NULs, nothing on disk
    else:
        path.write_bytes(content)
    run = _sim_run(tmp_path)
    done = run_cli("analyze", str(run), "--scheduler", str(path), "--no-report")
    _cli_error(done, f"--scheduler {path}: {fragment}")


def test_renamed_nccl_kernels_are_still_communication(tmp_path):
    """issue 21 (9): NCCL kernels under other names (a custom build, a wrapper library) gave
    "no NCCL kernels: a single-GPU trace". The collective arguments torch records on them
    (`Collective name`) tell them apart as well as the name does."""

    def renamed(document: dict, rank: int) -> None:
        for e in document["traceEvents"]:
            if e.get("cat") == "kernel" and e["name"].startswith("nccl"):
                e["name"] = "commLib::device_step<4096>(Args)"

    run = _sim_run(tmp_path)
    plain = fsdp_trace.analyze(run, detailed=False, cache=False).only
    _edit_traces(run, renamed)
    result = fsdp_trace.analyze(run, detailed=False).only
    assert "single-GPU" not in _rank_notices(fsdp_trace.analyze(run, detailed=False))
    assert len(result.collectives) == len(plain.collectives)
    assert result.collectives["collective"].tolist() == plain.collectives["collective"].tolist()
    assert result.steps["exposed_us"].tolist() == pytest.approx(plain.steps["exposed_us"].tolist())


OSC52 = "\x1b]52;c;SGVsbG8=\x07"  # writes the user's clipboard
TITLE = "\x1b]0;pwned\x07"  # sets the window title
CLEAR = "\x1b[2J"  # clears the screen


def _no_control(text: str) -> None:
    bad = sorted({c for c in text if (ord(c) < 32 and c not in "\n") or 0x7F <= ord(c) < 0xA0})
    assert not bad, [hex(ord(c)) for c in bad]


def test_control_characters_from_inputs_never_reach_the_terminal(tmp_path):
    """issue 21 (9): names inside a trace (units, kernels) and paths reached the terminal
    raw, escape sequences included (OSC 52 clipboard write, OSC 0 title, CSI 2J clear).
    Every input-derived string is shown with its control characters escaped: `\\x1b`."""

    def hostile_names(document: dict, rank: int) -> None:
        for e in document["traceEvents"]:
            e["name"] = e["name"].replace("layers.1", f"layers.1{OSC52}")
            if e.get("cat") == "kernel" and not e["name"].startswith("nccl"):
                e["name"] += CLEAR

    run = _sim_run(tmp_path, f"run{TITLE}")
    _edit_traces(run, hostile_names)
    out = tmp_path / f"o{CLEAR}.json"
    done = run_cli("analyze", str(run), "--json", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    _no_control(done.stdout + done.stderr)
    assert "layers.1\\x1b]52;c;SGVsbG8=\\x07" in done.stdout  # shown, escaped
    assert "run\\x1b]0;pwned\\x07" in done.stderr  # the report's path, named on stderr
    blocks = {b["block"] for b in json.loads(out.read_text())["blocks"]}
    assert f"layers.1{OSC52}" in blocks  # the data keeps the name as the trace has it
    for args in (
        ["analyze", str(tmp_path / f"missing{CLEAR}{TITLE}")],
        ["whatif", str(run), "--set", f"nonsense{OSC52}=1"],
        ["view", str(tmp_path / f"x{TITLE}.pftrace"), "--no-browser"],
    ):
        done = run_cli(*args)
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.strip().splitlines()
        _no_control(line)
        assert "\\x1b" in line, line


def test_printable_shows_each_control_character_as_its_escape():
    from fsdp_trace.printable import printable

    assert (
        printable("a\x1b[2Jb\x07\n\t\x9b\u202e\udcff") == "a\\x1b[2Jb\\x07\\n\\t\\x9b\\u202e\\xff"
    )
    assert printable("layers.0 → 2 ✓") == "layers.0 → 2 ✓"
