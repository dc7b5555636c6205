"""Input resolution (`fsdp_trace.analysis.read.inputs`): one walk and one run reader over local
folders and folders behind fsspec URLs. The same layout gives the same runs and files whether
it is named by a path, a `file://` URL or a `memory://` URL, and a run.json is refused the
same way for both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fsdp_trace.analysis.read.inputs import SEARCH_DEPTH, resolve
from fsdp_trace.errors import UserError

TRACE = b'{"traceEvents": []}'


def _layout(top: Path) -> None:
    """A folder of everything the walk tells apart: a run (with a detailed trace deleted),
    loose traces out of rank order beside files no reader takes and fsdp-trace's own records,
    a folder whose traces stop the descent, a hidden folder, one too deep to search."""
    files = {
        "run/run.json": json.dumps(
            {
                "files": {
                    "timing": ["rank0.timing.json", "rank1.timing.json"],
                    "detailed": ["rank0.detailed.json", "gone.detailed.json"],
                }
            }
        ),
        "run/rank0.timing.json": TRACE,
        "run/rank1.timing.json": TRACE,
        "run/rank0.detailed.json": TRACE,
        "loose/rank10.json": TRACE,
        "loose/rank2.json.gz": TRACE,
        "loose/trace.json": TRACE,
        "loose/notes.txt": b"not a trace",
        "loose/analysis.json": b"{}",
        "loose/below/rank0.json": TRACE,  # not searched: its parent has traces
        ".hidden/rank0.json": TRACE,
        "a/b/c/d/rank0.json": TRACE,  # deeper than SEARCH_DEPTH
        "a/b/rank3.json": TRACE,
    }
    for name, data in files.items():
        path = top / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)


def _described(inputs, prefix: str) -> dict:
    """What a resolution found, names relative to the top folder (`prefix` cut off)."""

    def rel(where) -> str:
        text = str(where)
        assert text.startswith(prefix), (text, prefix)
        return text[len(prefix) :]

    return {
        "runs": [
            (r.name, rel(r.run_dir), [(rel(t.path), t.source) for t in r.traces])
            for r in inputs.runs
        ],
        "loose": [rel(f) for f in inputs.loose],
        "skipped": inputs.skipped,
    }


EXPECTED = {
    "runs": [
        (
            "run",
            "/run",
            [
                ("/run/rank0.timing.json", "timing"),
                ("/run/rank1.timing.json", "timing"),
                ("/run/rank0.detailed.json", "detailed"),
            ],
        )
    ],
    "loose": ["/a/b/rank3.json", "/loose/rank2.json.gz", "/loose/rank10.json", "/loose/trace.json"],
    "skipped": [],
}


def test_a_layout_gives_the_same_runs_and_files_locally_and_through_file_urls(tmp_path):
    pytest.importorskip("fsspec")
    top = tmp_path / "top"
    _layout(top)
    assert SEARCH_DEPTH == 3  # a/b/c/d is one folder too deep
    local = resolve(top)
    url = resolve(f"file://{top}")
    assert _described(local, str(top)) == EXPECTED
    assert _described(url, f"file://{top}") == EXPECTED
    assert set(local.sources.values()) == {str(top)}
    assert set(url.sources.values()) == {f"file://{top}"}
    # a URL trace carries the size its listing gave
    assert [f.size for f in url.loose] == [len(TRACE)] * 4


def test_a_layout_in_memory_gives_the_same_runs_and_files(tmp_path):
    fsspec = pytest.importorskip("fsspec")
    top = tmp_path / "top"
    _layout(top)
    fs = fsspec.filesystem("memory")
    for path in top.rglob("*"):
        if path.is_file():
            fs.pipe(f"/fsdp-trace-inputs/{path.relative_to(top)}", path.read_bytes())
    try:
        found = resolve("memory://fsdp-trace-inputs")
    finally:
        fs.rm("/fsdp-trace-inputs", recursive=True)
    assert _described(found, "memory:///fsdp-trace-inputs") == EXPECTED


def _run_naming(folder: Path, timing: list[str]) -> None:
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"files": {"timing": timing}}))
    (folder / "rank0.json").write_bytes(TRACE)


def _error(paths) -> str:
    with pytest.raises(UserError) as caught:
        resolve(paths)
    return caught.value.message


@pytest.mark.parametrize("name", ["../x.json", "/etc/x.json", "a/../../x.json"])
def test_a_run_json_naming_a_trace_outside_its_folder_is_refused_alike(tmp_path, name):
    pytest.importorskip("fsspec")
    run = tmp_path / "run"
    _run_naming(run, ["rank0.json", name])
    refusal = (
        f": lists the trace {name!r}, which is outside the run directory: refused (a run.json "
        "names its traces relative to its own folder)"
    )
    assert _error(run) == f"{run / 'run.json'}{refusal}"
    assert _error(f"file://{run}") == f"file://{run}/run.json{refusal}"


def test_a_run_with_traces_missing_is_said_alike(tmp_path):
    pytest.importorskip("fsspec")
    some = tmp_path / "some"
    _run_naming(some, ["rank0.json", "rank1.json"])
    said = ": run.json lists timing traces that are missing: "
    assert _error(some) == f"{some}{said}{some / 'rank1.json'}"
    assert _error(f"file://{some}") == f"file://{some}{said}file://{some}/rank1.json"
    every = tmp_path / "every"
    _run_naming(every, ["rank5.json"])
    left = ": traces left out (run.json lists 1, all missing; only rank0.json, run.json here)"
    assert _error(every) == f"{every}{left}: nothing to analyze"
    assert _error(f"file://{every}") == f"file://{every}{left}: nothing to analyze"


def test_a_run_below_the_given_folder_that_cannot_be_read_is_skipped_alike(tmp_path):
    pytest.importorskip("fsspec")
    top = tmp_path / "top"
    _run_naming(top / "bad", ["../x.json"])
    _run_naming(top / "good", ["rank0.json"])
    for given, prefix in ((top, str(top)), (f"file://{top}", f"file://{top}")):
        found = resolve(given)
        assert [r.name for r in found.runs] == ["good"]
        (line,) = found.skipped
        assert line.startswith(f"{prefix}/bad/run.json: lists the trace '../x.json'")


def test_one_file_named_twice_is_read_once(tmp_path):
    top = tmp_path / "top"
    _layout(top)
    (tmp_path / "link").symlink_to(top / "loose")
    found = resolve([top / "loose" / "trace.json", tmp_path / "link", top / "loose"])
    assert [f.name for f in found.loose] == ["trace.json", "rank2.json.gz", "rank10.json"]
    assert found.sources[found.loose[1]] == str(tmp_path / "link")
