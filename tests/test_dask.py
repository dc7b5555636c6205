"""Scaling out on Dask (`--scheduler`, `analyze(client=)`) and fsspec URL inputs: results
identical to `--jobs 1` on a LocalCluster of 2 worker processes and on `dask scheduler` +
2 `dask worker` processes (the report's timeline and what-if too, which read kernels again);
what a task sends back holds no per-event table; a corrupt trace and a worker killed mid-task
leave only their rank out, said in one line; nothing of Dask or fsspec is imported without
them."""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("distributed")
pytest.importorskip("fsspec")

import fsdp_trace
from fsdp_trace.analysis.job import cluster, perrank
from fsdp_trace.errors import UserError
from fsdp_trace.vocab import Source
from tests.conftest import REPO, SAMPLES, run_cli
from tests.dask_helpers import (
    DIES,
    DyingReader,
    cli_cluster,
    free_port,
    register_dying_reader,
    unregister_dying_reader,
)
from tests.test_rank_results import gpu_events, per_event_tables

HSDP = SAMPLES / "cpu-hsdp-2x2"
GPT = SAMPLES / "gpt-small-2gpu"


@pytest.fixture(scope="module")
def client():
    """A LocalCluster of 2 worker processes (one thread each) and its client; workers read
    `*.die.json` with a reader that ends their process."""
    import dask
    from distributed import Client, LocalCluster

    register_dying_reader()
    with dask.config.set({cluster.TRIM_KEY: None}):  # as local:N: this process's env untouched
        local = LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            silence_logs=logging.CRITICAL,
        )
    try:
        with Client(local) as c:
            c.register_plugin(DyingReader())
            yield c
    finally:
        local.close(timeout=10)
        unregister_dying_reader()


def cli_json(tmp_path: Path, name: str, *args: str, env: dict | None = None) -> dict:
    out = tmp_path / f"{name}.json"
    done = run_cli("analyze", *args, "--no-report", "--json", str(out), timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return json.loads(out.read_text())


def without_file_scheme(document: dict) -> dict:
    return json.loads(json.dumps(document).replace("file://", ""))


# --- nothing of Dask without --scheduler ----------------------------------------------------


def test_a_normal_analyze_imports_nothing_of_dask_or_fsspec(tmp_path):
    code = (
        "import sys\n"
        "from fsdp_trace import cli\n"
        f"sys.argv = ['fsdp-trace', 'analyze', {str(GPT)!r}, '--no-report', '--json', "
        f"{str(tmp_path / 'a.json')!r}]\n"
        "try:\n    cli.main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "import fsdp_trace\nfsdp_trace.analyze(sys.argv[2], cache=False)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('dask', 'distributed', 'fsspec', 'tornado', 'cloudpickle'))\n"
        "print('LOADED', bad)\n"
    )
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "LOADED []" in done.stdout, done.stdout[-500:]


# --- a LocalCluster of 2 worker processes -----------------------------------------------------


def test_scheduler_local_gives_the_json_of_jobs_1(tmp_path):
    env = {"FSDP_TRACE_CACHE": "0"}
    one = cli_json(tmp_path, "one", str(HSDP), "--jobs", "1", env=env)
    dask = cli_json(tmp_path, "dask", str(HSDP), "--scheduler", "local:2", env=env)
    assert dask == one
    assert len(one["ranks"]) == 4 and not any("missing" in n for n in one["notices"])


def _outputs(tmp_path: Path, name: str, *args: str) -> tuple[str, dict[str, bytes], str]:
    out = tmp_path / name
    done = run_cli(
        "analyze", *args, "--out-dir", str(out), "--json", str(out / "a.json"),
        "--csv", str(out / "csv"), "--fail-on", "exposed_pct>0", timeout=120,
        env={"FSDP_TRACE_CACHE": "0"},
    )  # fmt: skip
    assert done.returncode in (0, 1) and "Traceback" not in done.stderr, done.stderr
    files = {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    # The report's footer says when it was made, to the minute: two runs may straddle one.
    made = rb"<footer>fsdp-trace \S+ \xc2\xb7 [^<]*? \xc2\xb7 "
    files["report.html"], found = re.subn(made, b"<footer>MADE", files["report.html"], count=1)
    assert found == 1
    return done.stdout, files, done.stderr.replace(str(out), "OUT") + str(done.returncode)


def test_scheduler_local_writes_what_jobs_1_writes(tmp_path):
    """`--scheduler` assembles the run and makes its outputs on a worker
    (`cluster.analyze_and_produce`): the terminal's text, every file (JSON, CSV, the
    report) and the gate's verdict and exit code are byte for byte a local run's."""
    one = _outputs(tmp_path, "one", str(GPT), "--jobs", "1")
    dask = _outputs(tmp_path, "dask", str(GPT), "--scheduler", "local:2")
    assert dask == one
    assert sorted(one[1]) == [
        "a.json", *(f"csv/{n}.csv" for n in ("blocks", "breakdown", "collectives", "steps")),
        "report.html",
    ]  # fmt: skip
    assert one[0].startswith("fsdp-trace analyze") and one[2].endswith("1")  # the gate held
    assert "fail-on: exposed_pct" in one[2]


def test_the_cli_on_a_cluster_never_gathers_the_ranks_results(monkeypatch):
    """`fsdp-trace analyze --scheduler` takes the assembling path, not `analyze_all`'s
    gathering one (`--perfetto` and `--hta`, which read every rank's results here, do)."""
    from typer.testing import CliRunner

    from fsdp_trace import cli

    def refused(*args, **kwargs):
        raise AssertionError("the ranks' results were brought to the client")

    monkeypatch.setattr(cluster, "analyze_all", refused)
    monkeypatch.setenv("FSDP_TRACE_QUIET", "1")
    done = CliRunner().invoke(
        cli.app, ["analyze", str(GPT), "--scheduler", "local:2", "--no-cache", "--no-report"]
    )
    assert done.exit_code == 0, done.output
    assert done.output.startswith("fsdp-trace analyze")


def _where(result) -> tuple[int, dict]:
    """Made on the worker that assembled the run: its process, and the Result's JSON."""
    import os

    return os.getpid(), result.to_json()


def test_the_run_is_assembled_where_the_ranks_results_are(client, tmp_path, monkeypatch):
    """The client never brings a rank's result over: the per-rank tasks' results stay on
    their workers, a task on a worker assembles the run (`pipeline.assemble`) and makes the
    outputs; a trace that fails there is left out of its run as `analyze(client=)` leaves
    it."""
    import os

    from fsdp_trace.pipeline import analyze_on_cluster

    gathered = []
    outcome = cluster._outcome
    monkeypatch.setattr(cluster, "_outcome", lambda f, t: gathered.append(t) or outcome(f, t))
    run = tmp_path / "run"
    shutil.copytree(HSDP, run)
    good = (run / "rank2.timing.json.gz").read_bytes()
    (run / "rank2.timing.json.gz").write_bytes(good[: len(good) // 3])
    pid, document = analyze_on_cluster(run, client, _where, cache=False)
    assert pid != os.getpid()
    assert gathered == []  # the corrupt trace's Failure too went to the assembling worker
    here = fsdp_trace.analyze(run, client=client, cache=False).to_json()
    assert json.dumps(document, sort_keys=True) == json.dumps(here, sort_keys=True)
    assert [r["rank"] for r in document["ranks"]] == [0, 1, 3]
    assert any("rank 2 missing" in n for n in document["notices"])


def test_workers_of_other_code_do_not_assemble_a_run(client, monkeypatch):
    """The worker that assembles a run runs the diagnosis and the renderers too: a worker
    whose code differs anywhere (not only in the analysis) is refused for it, in one line;
    for the per-rank map alone (the API) the analysis code is what must agree."""
    from fsdp_trace.analysis.read import cache
    from fsdp_trace.pipeline import analyze_on_cluster

    real = cache.code_version
    monkeypatch.setattr(cache, "code_version", lambda k: "edited" if k == "all" else real(k))
    with pytest.raises(UserError, match=r"run other fsdp-trace \S+ code than this client"):
        analyze_on_cluster(GPT, client, _where, cache=False)
    assert [r.rank for r in fsdp_trace.analyze(GPT, client=client, cache=False).ranks] == [0, 1]


def test_outputs_come_back_packed_and_are_written_a_piece_at_a_time(tmp_path, monkeypatch):
    """A file made on the worker travels compressed and is inflated into place in pieces of
    `produced.PIECE` bytes: the same bytes, whatever the pieces."""
    import random

    from fsdp_trace.render import produced

    rng = random.Random(4)
    data = b"".join(rng.choice([b"rank,step,exposed_us\n", rng.randbytes(97)]) for _ in range(5000))
    for piece in (1, 7, 4096, 1 << 20):
        monkeypatch.setattr(produced, "PIECE", piece)
        produced.write(produced._packed(data), tmp_path / "out.csv")
        assert (tmp_path / "out.csv").read_bytes() == data
    produced.write(produced._packed(b""), tmp_path / "empty.csv")
    assert (tmp_path / "empty.csv").read_bytes() == b""


def test_the_assembly_waits_for_a_worker_only_so_long(monkeypatch):
    """A cluster left with no worker while the run's assembly waits is one line after
    FSDP_TRACE_DASK_WAIT_S, never a hang."""
    import distributed

    class Pending:
        def result(self, timeout):
            raise distributed.TimeoutError

    monkeypatch.setenv("FSDP_TRACE_DASK_WAIT_S", "1")
    monkeypatch.setattr(cluster, "_CHECK_S", 0.05)
    monkeypatch.setattr(cluster, "_workers", lambda client: 0)
    with pytest.raises(UserError, match=r"assembly: no Dask worker left on the cluster for 1 s"):
        cluster._result(None, Pending())


def test_client_facade_gives_the_result_of_jobs_1(client):
    alone = fsdp_trace.analyze(GPT, cache=False)
    spread = fsdp_trace.analyze(GPT, client=client, cache=False)
    assert json.dumps(spread.to_json(), sort_keys=True) == json.dumps(
        alone.to_json(), sort_keys=True
    )
    assert [r.rank for r in spread.ranks] == [0, 1] and len(spread.detailed) == 2


@pytest.mark.parametrize("workers_in", ["another folder", "the caller's folder"])
def test_relative_paths_reach_workers_wherever_they_started(
    client, tmp_path, monkeypatch, workers_in
):
    """Workers on other machines start in folders of their own: there a local path is sent
    joined to the caller's working folder (the result that of the whole path here); workers
    started where the caller is get the names as given (the result that of `--jobs 1`)."""
    monkeypatch.chdir(GPT.parent)
    elsewhere = workers_in == "another folder"
    alone = fsdp_trace.analyze(str(GPT) if elsewhere else GPT.name, cache=False)
    before = client.run(os.getcwd)
    client.run(os.chdir, str(tmp_path) if elsewhere else str(GPT.parent))
    try:
        assert cluster.workers_elsewhere(client) is elsewhere
        spread = fsdp_trace.analyze(GPT.name, client=client, cache=False)
    finally:
        for worker, folder in before.items():
            client.run(os.chdir, folder, workers=[worker])
    assert json.dumps(spread.to_json(), sort_keys=True) == json.dumps(
        alone.to_json(), sort_keys=True
    )


def test_what_a_task_sends_back_holds_no_per_event_table(client):
    """Issue 12: only per-rank results travel back, the client never holds a rank's events.
    What a task sends (its future's result, pickled over the wire) and what the client keeps
    of a run hold no table with as many rows as half of a trace's GPU events, counted from the
    trace's JSON; the analysis with its kernels does (the check sees them), and is several
    times the size of what travels."""
    trace = GPT / "rank1.timing.json.gz"
    task = cluster.analyze_task
    back = client.submit(task, perrank.TraceInput(trace, Source.TIMING), False, pure=False)
    back = back.result()
    events = gpu_events(trace)
    assert back.kernel_table is None and per_event_tables(back, events) == {}
    assert 0.9 * events < back.n_kernels <= events  # what the kernels were: counted there
    full = perrank.analyze_file(trace, Source.TIMING, cache=False)
    assert per_event_tables(full, events) == {"kernel_table": full.n_kernels}
    assert 3 * len(pickle.dumps(back)) < len(pickle.dumps(full))
    run = fsdp_trace.analyze(GPT, client=client, cache=False)
    for r in run.ranks + run.detailed:
        assert r.kernel_table is None
        assert per_event_tables(r, gpu_events(Path(r.path))) == {}


def test_the_report_and_whatif_of_a_cluster_run_equal_jobs_1(client, tmp_path):
    """The views that read kernels again on the client (the report's step timeline, what-if's
    replay) give what they give on a `--jobs 1` run; the diagnosis is in the report."""
    from fsdp_trace.render.report import write_report
    from fsdp_trace.whatif import rank_candidates
    from tests.test_report import payload

    alone = fsdp_trace.analyze(GPT, cache=False)
    spread = fsdp_trace.analyze(GPT, client=client, cache=False)
    pages = []
    for name, result in (("alone", alone), ("spread", spread)):
        write_report(result, tmp_path / f"{name}.html")
        pages.append(payload((tmp_path / f"{name}.html").read_text(encoding="utf-8")))
    assert pages[0] == pages[1]
    timeline = next(f["figure"] for f in pages[1]["figures"] if f["id"] == "fig-timeline")
    names = {t.get("name") for t in timeline["data"]}
    assert {"compute kernels", "AllGather", "ReduceScatter"} <= names
    assert spread.only.findings  # the diagnosis ran on the client, without the kernels
    ranked = [
        [(p.predicted_step_us, p.uncertainty_us, rule) for p, rule in rank_candidates(r.only)]
        for r in (alone, spread)
    ]
    assert ranked[0] == ranked[1] and ranked[0]


def test_a_corrupt_trace_on_the_cluster_leaves_out_its_rank_in_one_line(client, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(HSDP, run)
    good = (run / "rank2.timing.json.gz").read_bytes()
    (run / "rank2.timing.json.gz").write_bytes(good[: len(good) // 3])
    result = fsdp_trace.analyze(run, client=client, cache=False)
    assert [r.rank for r in result.ranks] == [0, 1, 3]
    assert len(result.detailed) == 4
    lines = [n for n in result.runs[0].notices if "missing" in n]
    assert lines == [
        f"rank 2 missing: {run}/rank2.timing.json.gz: truncated or corrupt gzip: re-copy or "
        "re-export the trace"
    ]
    assert result.grouping.endswith("; 1 failed (left out)")
    # the same input without the cluster stops at that trace, in one line (as before)
    with pytest.raises(UserError, match=r"rank2\.timing\.json\.gz: truncated or corrupt gzip"):
        fsdp_trace.analyze(run, cache=False)


def test_a_worker_killed_mid_task_leaves_out_its_rank_and_the_rest_finishes(client, tmp_path):
    folder = tmp_path / "traces"
    folder.mkdir()
    for rank in (0, 1, 3):
        shutil.copy(HSDP / f"rank{rank}.timing.json.gz", folder)
    (folder / f"rank2.timing{DIES}").write_text("{}")  # its reader ends the worker process
    result = fsdp_trace.analyze(folder, client=client, cache=False)
    assert [r.rank for r in result.ranks] == [0, 1, 3]
    lines = [n for n in result.runs[0].notices if "missing" in n]
    assert len(lines) == 1 and lines[0].startswith(
        f"rank 2 missing: {folder}/rank2.timing{DIES}: the Dask worker analyzing it died"
    )
    # the workers came back (the nanny restarts them): the cluster still analyzes
    again = fsdp_trace.analyze(GPT, client=client, cache=False)
    assert [r.rank for r in again.ranks] == [0, 1]


def test_every_trace_failing_is_one_error(client, tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    for rank in (0, 1):
        (folder / f"rank{rank}.json").write_text('{"traceEvents": [')
    with pytest.raises(UserError, match=r"rank\d\.json: .* \(and 1 more traces failed\)"):
        fsdp_trace.analyze(folder, client=client, cache=False)


def test_a_cluster_without_workers_is_one_error_not_a_hang(monkeypatch):
    from distributed import Client, LocalCluster

    monkeypatch.setenv("FSDP_TRACE_DASK_WAIT_S", "1")
    with (
        LocalCluster(
            n_workers=0, processes=False, dashboard_address=":0", silence_logs=logging.CRITICAL
        ) as empty,
        Client(empty) as c,
        pytest.raises(UserError, match=r"no Dask worker joined .* in 1 s: start some"),
    ):
        fsdp_trace.analyze(GPT, client=c, cache=False)


def test_a_scheduler_file_is_waited_for_then_joined(client, tmp_path, monkeypatch):
    import threading

    monkeypatch.setenv("FSDP_TRACE_DASK_WAIT_S", "1")
    with (
        pytest.raises(UserError, match=r"no scheduler file there after 1 s: start `dask sched"),
        cluster.connect(str(tmp_path / "none.json")),
    ):
        pass
    monkeypatch.setenv("FSDP_TRACE_DASK_WAIT_S", "30")
    later = tmp_path / "scheduler.json"
    writer = threading.Timer(0.5, client.write_scheduler_file, args=(str(later),))
    writer.start()
    try:
        with cluster.connect(str(later)) as joined:
            result = fsdp_trace.analyze(HSDP / "rank0.timing.json.gz", client=joined, cache=False)
    finally:
        writer.join()
    assert [r.rank for r in result.ranks] == [0]


def test_workers_of_another_fsdp_trace_version_are_refused(client, monkeypatch):
    monkeypatch.setattr(fsdp_trace, "__version__", "0.0.0-client")
    with pytest.raises(UserError, match=r"run fsdp-trace \S+, this client 0.0.0-client: install"):
        fsdp_trace.analyze(GPT, client=client, cache=False)


def test_workers_of_other_analysis_code_are_refused(client, monkeypatch):
    """Workers of this version but another checkout (its analysis code's hash differs) are
    refused in one line: their results could differ from a local run's."""
    from fsdp_trace.analysis.read import cache

    monkeypatch.setattr(cache, "code_version", lambda kind: f"{kind}-edited-here")
    with pytest.raises(UserError, match=r"run other fsdp-trace \S+ code than this client"):
        fsdp_trace.analyze(GPT, client=client, cache=False)


def test_a_cluster_run_for_every_ranks_kernels_brings_them_back(client):
    """`whatif` and `--perfetto` read every rank's kernels: asked to keep them
    (`keep_kernels`), each timing rank's come back from its worker, equal to a fresh
    analysis's; detailed traces' do not."""
    run = fsdp_trace.analyze(GPT, client=client, cache=False, keep_kernels=True)
    for r in run.ranks:
        fresh = perrank.analyze_file(r.path, r.source, cache=False).kernel_table
        assert r.kernel_table is not None
        assert r.kernel_table.equals(fresh)
    assert all(r.kernel_table is None for r in run.detailed)


# --- dask scheduler + 2 dask worker processes --------------------------------------------------


def test_dask_scheduler_and_workers_give_the_json_of_jobs_1_and_cache_on_the_workers(tmp_path):
    worker_cache = tmp_path / "worker-cache"
    client_cache = tmp_path / "client-cache"
    one = cli_json(tmp_path, "one", str(GPT), env={"FSDP_TRACE_CACHE": "0"})
    with cli_cluster(tmp_path, env={"FSDP_TRACE_CACHE_DIR": str(worker_cache)}) as address:
        env = {"FSDP_TRACE_CACHE_DIR": str(client_cache)}
        plain = cli_json(tmp_path, "plain", str(GPT), "--scheduler", address, env=env)
        assert plain == one
        url = cli_json(tmp_path, "url", f"file://{GPT}", "--scheduler", address, env=env)
        assert without_file_scheme(url) == one
    # the analyses were cached where they ran (local paths by content, URLs by what fsspec
    # reports); the client parsed nothing, so cached nothing
    entries = sorted(p.name for p in worker_cache.glob("analysis-*.fsdptrace"))
    assert len([e for e in entries if "-url-" in e]) == 4
    assert len([e for e in entries if "-url-" not in e]) == 4
    assert not list(client_cache.glob("*.fsdptrace"))


# --- fsspec URLs ---------------------------------------------------------------------------


def test_memory_urls_are_copied_analyzed_and_cached_by_what_fsspec_reports(monkeypatch):
    import fsspec

    from fsdp_trace.analysis.read import loader

    fs = fsspec.filesystem("memory")
    for trace in GPT.glob("rank*.timing.json.gz"):
        fs.pipe(f"/fsdp-trace-test/run/{trace.name}", trace.read_bytes())
    local = fsdp_trace.analyze(sorted(GPT.glob("rank*.timing.json.gz")), cache=False)
    first = fsdp_trace.analyze("memory://fsdp-trace-test/run")
    assert [r.path for r in first.ranks] == [
        f"memory:///fsdp-trace-test/run/rank{i}.timing.json.gz" for i in (0, 1)
    ]
    assert first.ranks[0].steps.equals(local.ranks[0].steps)
    assert first.findings[0].cause == local.findings[0].cause

    def no_parse(*args, **kwargs):
        raise AssertionError("parsed again")

    monkeypatch.setattr(loader, "load_trace", no_parse)
    cached = fsdp_trace.analyze("memory://fsdp-trace-test/run")
    assert cached.ranks[0].steps.equals(first.ranks[0].steps)
    # a changed object is another entry: parsed again
    rank0 = (GPT / "rank0.timing.json.gz").read_bytes()
    fs.pipe("/fsdp-trace-test/run/rank1.timing.json.gz", rank0)
    with pytest.raises(AssertionError, match="parsed again"):
        fsdp_trace.analyze("memory://fsdp-trace-test/run")
    fs.rm("/fsdp-trace-test", recursive=True)


def test_a_url_whose_backend_reports_no_version_is_cached_by_its_content(monkeypatch):
    import fsspec

    from fsdp_trace.analysis.read import loader, remote

    monkeypatch.setattr(remote, "_VERSION_KEYS", ())
    fs = fsspec.filesystem("memory")
    fs.pipe("/fsdp-trace-test2/rank0.json.gz", (HSDP / "rank0.timing.json.gz").read_bytes())
    url = "memory://fsdp-trace-test2/rank0.json.gz"
    first = fsdp_trace.analyze(url)
    parse = loader.load_trace
    calls = []
    monkeypatch.setattr(loader, "load_trace", lambda *a, **k: calls.append(a) or parse(*a, **k))
    fs.pipe("/fsdp-trace-test2/rank0.json.gz", (HSDP / "rank0.timing.json.gz").read_bytes())
    again = fsdp_trace.analyze(url)  # rewritten, same bytes: downloaded, not parsed
    assert not calls and again.ranks[0].steps.equals(first.ranks[0].steps)
    fs.pipe("/fsdp-trace-test2/rank0.json.gz", (HSDP / "rank1.timing.json.gz").read_bytes())
    fsdp_trace.analyze(url)
    assert len(calls) == 1
    fs.rm("/fsdp-trace-test2", recursive=True)


def test_url_problems_are_one_line_exit_2():
    unknown = run_cli("analyze", "nosuchproto://bucket/run", "--no-report")
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == (
        "fsdp-trace analyze: error: nosuchproto://bucket/run: Protocol not known: nosuchproto: "
        "give a path or an fsspec URL"
    )
    missing = run_cli("analyze", f"file://{GPT}/nope", "--no-report")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "nope: no such file or folder" in missing.stderr
    perfetto = run_cli("analyze", f"file://{GPT}", "--perfetto", "x.pftrace")
    assert perfetto.returncode == 2 and "--perfetto reads every event" in perfetto.stderr


def test_a_url_without_fsspec_installed_is_one_line_exit_2():
    code = (
        "import sys\nsys.modules['fsspec'] = None\nsys.modules['fsspec.core'] = None\n"
        "from fsdp_trace import cli\n"
        "sys.argv = ['fsdp-trace', 'analyze', 's3://bucket/run', '--no-report']\ncli.main()\n"
    )
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "fsdp-trace analyze: error: s3://bucket/run: reading a URL needs fsspec: pip install "
        "'fsdp-trace[dask]' (and the backend of its protocol, e.g. s3fs for s3://), or give a "
        "local path"
    )


# --- --scheduler refused in one line -----------------------------------------------------------


@pytest.mark.parametrize(
    ("scheduler", "message"),
    [
        ("bogus", "--scheduler bogus: give tcp://HOST:PORT, a scheduler file (.json), or local:N"),
        ("local:0", "--scheduler local:0: give local:N with N worker processes, 1 or more"),
        ("local:x", "--scheduler local:x: give local:N with N worker processes, 1 or more"),
    ],
)
def test_bad_scheduler_values(scheduler, message):
    with pytest.raises(UserError) as caught, cluster.connect(scheduler):
        pass
    assert caught.value.message == message


def test_an_unreachable_scheduler_is_one_line_exit_2():
    done = run_cli(
        "analyze",
        str(GPT),
        "--no-report",
        "--scheduler",
        f"tcp://127.0.0.1:{free_port()}",
        env={"FSDP_TRACE_DASK_WAIT_S": "1"},
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "cannot reach the Dask scheduler" in done.stderr
    both = run_cli("analyze", str(GPT), "--no-report", "--jobs", "2", "--scheduler", "local:2")
    assert both.returncode == 2
    assert both.stderr.strip().endswith("--jobs 2 and --scheduler: give one of them")


def test_scheduler_without_distributed_installed_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)
    wanted = r"needs Dask's distributed: pip install 'fsdp-trace\[dask\]'"
    with pytest.raises(UserError, match=wanted), cluster.connect("local:2"):
        pass


# In a process of its own: the test's main thread, and signals left as they were.
CTRL_C_OF_WORKERS = """
import json, signal
from fsdp_trace.analysis.job import cluster
with cluster.connect("local:1") as client:
    workers = client.run(lambda: signal.getsignal(signal.SIGINT) == signal.SIG_IGN)
    here = signal.getsignal(signal.SIGINT) is signal.default_int_handler
print(json.dumps([list(workers.values()), here]))
"""


def test_local_workers_ignore_the_terminals_ctrl_c_and_the_command_does_not():
    """A terminal's Ctrl-C reaches every process of its group: the workers printed a traceback
    each before the command's one line (`cluster._workers_ignore_ctrl_c`)."""
    done = subprocess.run(
        [sys.executable, "-c", CTRL_C_OF_WORKERS],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == [[True], True]
