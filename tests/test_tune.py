"""`fsdp-trace tune`: the loop's decisions against an independent reading of the runs it
captured (a scripted capture over real sample traces, so every decision is known), and the
whole command on CPU with real captures."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from fsdp_trace import tune as tuning
from fsdp_trace.capture.config import CaptureConfig
from fsdp_trace.capture.launcher import CaptureFailed
from fsdp_trace.errors import UserError
from fsdp_trace.whatif.knobs import Knobs
from tests.conftest import SAMPLES, run_cli


class ScriptedCapture:
    """A capture that writes a sample's traces under `cfg.out` with a run.json whose config
    is the one asked for and whose figures are scripted: `speed(cfg, nproc, count)` is the
    tokens/s/GPU at the 10th-percentile step (what tune measures gains on), `median(...)`
    (default: the same) run.json's tokens/s/GPU over the median step. Scaling efficiency is
    written as the runner writes it (against `cfg.baseline`, whatever its batch). Records
    every config it was given. `sample`: one run folder, or one per process count."""

    def __init__(self, sample, speed, fail_on: str | None = None, median=None):
        self.samples = sample if isinstance(sample, dict) else None
        self.sample = None if isinstance(sample, dict) else sample
        self.speed, self.median, self.fail_on = speed, median or speed, fail_on
        self.calls: list[tuple[CaptureConfig, int]] = []

    def __call__(self, cfg: CaptureConfig, nproc: int) -> Path:
        self.calls.append((cfg, nproc))
        count = len(self.calls)
        if self.fail_on and Path(cfg.out).name.endswith(self.fail_on):
            raise CaptureFailed("rank 0: CUDA out of memory", 1)
        sample = self.samples[nproc] if self.samples else self.sample
        out = Path(cfg.out)
        out.mkdir(parents=True)
        record = json.loads((sample / "run.json").read_text())
        record["config"] = {**record["config"], **dataclasses.asdict(cfg)}
        if cfg.batch_size:
            record["model"]["batch_size"] = cfg.batch_size
        record["world"]["world_size"] = nproc
        tokens = record["model"]["batch_size"] * record["model"]["seq_len"]
        fast, median = self.speed(cfg, nproc, count), self.median(cfg, nproc, count)
        figures = record["figures"]
        figures["tokens_per_step_per_gpu"] = tokens
        figures["tokens_per_s_per_gpu"] = median
        stats = figures["step_time_ms"]
        stats["p10"], stats["median"] = 1e3 * tokens / fast, 1e3 * tokens / median
        stats["stdev"] = 0.0  # the noise is then the repeat's difference
        figures["scaling_efficiency"] = None
        if cfg.baseline and record["world"]["device"] != "cpu":
            base = json.loads((Path(cfg.baseline) / "run.json").read_text())
            figures["scaling_efficiency"] = median / base["figures"]["tokens_per_s_per_gpu"]
        (out / "run.json").write_text(json.dumps(record))
        for trace in sample.glob("rank*.json.gz"):
            (out / trace.name).symlink_to(trace.resolve())
        return out


GPU = {1: SAMPLES / "gpt-small-1gpu", 2: SAMPLES / "gpt-small-2gpu"}


def predicting(monkeypatch, gains: list[tuple[Knobs, float]]) -> None:
    """The what-if replay ranks these knobs with these gains (best first), every time."""
    from fsdp_trace import whatif

    def ranked(run, standard=False):
        return [
            (
                SimpleNamespace(
                    knobs=k, throughput_gain_pct=g, uncertainty_us=1.0, predicted_step_us=100.0
                ),
                "a test",
            )
            for k, g in sorted(gains, key=lambda kg: -kg[1])
        ]

    monkeypatch.setattr(whatif, "rank_candidates", ranked)


def cpu_base(tmp_path: Path) -> CaptureConfig:
    return CaptureConfig(model="tiny", device="cpu", out=str(tmp_path / "unused"))


def gpu_base(tmp_path: Path) -> CaptureConfig:
    return CaptureConfig(model="gpt-small", out=str(tmp_path / "unused"))


def rows_of(view) -> dict[str, dict[str, str]]:
    return {row[1]: dict(zip(view.table.headers, row, strict=True)) for row in view.table.rows}


def test_kept_knobs_carry_forward_and_gains_are_measured_against_the_kept_run(tmp_path):
    # eager 1000 and its repeat 1020: noise 2 %. keep_last_unsharded buys +10 % (kept);
    # the next knob, on top of it, +1 % (within the noise: not kept); the third +5 % (kept).
    def speed(cfg, nproc, count):
        if nproc == 1:
            return 600.0
        if count == 3:  # the repeat
            return 1020.0
        value = 1000.0
        if cfg.keep_last_unsharded:
            value *= 1.10
        if cfg.reshard_after_forward is False:
            value *= 1.01
        if cfg.shard_embeddings:
            value *= 1.05
        return value

    capture = ScriptedCapture(SAMPLES / "cpu-gloo-2proc", speed)
    result = tuning.tune(cpu_base(tmp_path), 2, tmp_path / "t", capture, budget=3)
    roles = [t.role for t in result.trials]
    assert (
        roles
        == [tuning.Role.BASELINE, tuning.Role.EAGER, tuning.Role.REPEAT] + [tuning.Role.TRIAL] * 3
    )
    # One definition: the repeat's row and the noise are the same gain (+2.0 % of 1000).
    repeat = result.trials[2]
    assert repeat.measured_pct == pytest.approx(2.0) and result.noise_pct == pytest.approx(2.0)
    knobs = [t.knob for t in result.trials[3:]]
    # CPU traces cannot be replayed: the findings' order (this run's last-unit finding
    # first), then FSDP2's standard knobs, each once.
    assert knobs == [
        "keep_last_unsharded=true",
        "reshard_after_forward=false",
        "shard_embeddings=true",
    ]
    assert [t.kept for t in result.trials[3:]] == [True, False, True]
    one, two, three = result.trials[3:]
    assert one.measured_pct == pytest.approx(10.0) and one.against == "eager"
    assert two.measured_pct == pytest.approx(1.0) and two.against == one.name
    assert three.measured_pct == pytest.approx(5.0) and three.against == one.name
    # Each capture got the kept knobs plus its own; a rejected knob did not carry forward.
    configs = [cfg for cfg, _ in capture.calls[3:]]
    assert configs[0].keep_last_unsharded and configs[0].reshard_after_forward is True
    assert configs[1].keep_last_unsharded and configs[1].reshard_after_forward is False
    assert configs[2].keep_last_unsharded and configs[2].reshard_after_forward is True
    assert configs[2].shard_embeddings
    # ... and each run recorded it: run.json's config has every knob kept before it.
    for trial, kept_before in zip(
        result.trials[3:],
        [{}, {"keep_last_unsharded": True}, {"keep_last_unsharded": True}],
        strict=True,
    ):
        config = json.loads((tmp_path / "t" / trial.name / "run.json").read_text())["config"]
        assert {k: config[k] for k in kept_before} == kept_before
        assert config["reshard_after_forward"] is (trial is not two)
    assert result.kept == {"keep_last_unsharded": True, "shard_embeddings": True}
    assert all(cfg.baseline == str(tmp_path / "t" / "1gpu") for cfg, _ in capture.calls[1:])
    assert "not predicted" in result.notes[0]
    saved = tuning.read_tune(tmp_path / "t")
    assert saved.to_json() == result.to_json()


def test_a_failed_capture_is_a_row_and_the_loop_goes_on(tmp_path):
    capture = ScriptedCapture(
        SAMPLES / "cpu-gloo-2proc",
        lambda cfg, nproc, count: 1000.0 + (50.0 if cfg.reshard_after_forward is False else 0),
        fail_on="keep-last-unsharded-true",
    )
    result = tuning.tune(cpu_base(tmp_path), 2, tmp_path / "t", capture, budget=2)
    first, second = result.trials[3:]
    assert first.failed == "rank 0: CUDA out of memory" and not first.kept
    assert first.measured_pct is None
    assert second.knob == "reshard_after_forward=false" and second.kept
    assert second.measured_pct == pytest.approx(5.0)


def test_the_loop_stops_at_the_target_and_at_no_budget(tmp_path, monkeypatch):
    predicting(
        monkeypatch, [(Knobs(keep_last_unsharded=True), 5.0), (Knobs(prefetch_forward=1), 1.0)]
    )

    def speed(cfg, nproc, count):
        if nproc == 1:
            return 1000.0
        return 950.0 if cfg.keep_last_unsharded else 800.0

    capture = ScriptedCapture(GPU, speed)
    result = tuning.tune(gpu_base(tmp_path), 2, tmp_path / "a", capture, budget=5, target=0.9)
    assert [t.knob for t in result.trials[3:]] == ["keep_last_unsharded=true"]
    assert result.stopped.startswith("target efficiency 90% reached (95.0%)")
    eager, trial = result.trials[1], result.trials[3]
    assert (eager.efficiency, eager.baseline) == (pytest.approx(0.8), "1gpu")
    assert (trial.efficiency, trial.baseline) == (pytest.approx(0.95), "1gpu")
    nothing = tuning.tune(gpu_base(tmp_path), 2, tmp_path / "b", capture, budget=0)
    assert len(nothing.trials) == 3 and nothing.stopped == "budget of 0 knob captures used"


def test_one_process_needs_no_separate_baseline(tmp_path):
    capture = ScriptedCapture(SAMPLES / "cpu-gloo-2proc", lambda cfg, nproc, count: 1000.0)
    result = tuning.tune(cpu_base(tmp_path), 1, tmp_path / "t", capture, budget=0)
    assert [t.role for t in result.trials] == [tuning.Role.EAGER, tuning.Role.REPEAT]
    assert [n for _, n in capture.calls] == [1, 1]


def test_on_gpu_traces_the_best_predicted_knob_goes_first(tmp_path):
    """The replay ranks the kept run's candidates; the loop takes the best predicted gain."""
    import fsdp_trace
    from fsdp_trace.whatif import rank_candidates

    sample = SAMPLES / "gpt-small-2gpu"
    capture = ScriptedCapture(sample, lambda cfg, nproc, count: 360661.0)
    result = tuning.tune(
        gpu_base(tmp_path),
        2,
        tmp_path / "t",
        capture,
        budget=1,
    )
    (trial,) = result.trials[3:]
    ranked = rank_candidates(fsdp_trace.analyze(tmp_path / "t" / "eager").only, standard=True)
    best, _ = ranked[0]
    assert best.throughput_gain_pct > 0
    assert trial.knob == best.knobs.describe()
    assert trial.predicted_pct == pytest.approx(best.throughput_gain_pct)
    assert trial.measured_pct == pytest.approx(0.0) and not trial.kept
    assert not result.notes


def test_capture_changes_turn_a_batch_factor_into_a_batch_size(tmp_path):
    from fsdp_trace.runrecord import read_run

    run = read_run(SAMPLES / "gpt-small-2gpu")
    changes = tuning.capture_changes(Knobs(batch_scale=2.0), run, SAMPLES)
    assert changes == {"batch_size": 32}
    assert tuning.capture_changes(Knobs(ac_coverage=0.5), run, SAMPLES) == {"ac_coverage": 0.5}


@pytest.mark.parametrize("text", ["fast", "0", "-1", "150%"])
def test_target_refuses_what_is_not_an_efficiency(text):
    with pytest.raises(UserError, match="--target"):
        tuning.parse_target(text)
    assert tuning.parse_target("90%") == pytest.approx(0.9)
    assert tuning.parse_target("0.85") == pytest.approx(0.85)


def test_the_table_rows_are_the_loop_s_runs(tmp_path):
    from fsdp_trace.present.tune import markdown
    from fsdp_trace.tune import folder_view

    capture = ScriptedCapture(
        SAMPLES / "cpu-gloo-2proc",
        lambda cfg, nproc, count: 2000.0 if cfg.keep_last_unsharded else 1000.0,
    )
    result = tuning.tune(cpu_base(tmp_path), 2, tmp_path / "t", capture, budget=1)
    view = folder_view(result, tmp_path / "t")
    rows = rows_of(view)
    trial = rows["trial1-keep-last-unsharded-true"]
    assert trial["measured Δ"] == "+100.0 %" and trial["kept"] == "kept"
    assert trial["tok/s/GPU"] == "2,000" and trial["efficiency"] == "— (CPU)"
    assert all(row["efficiency"] == "— (CPU)" for row in rows.values())  # the baseline too
    assert rows["eager"]["what was tried"] == "2 CPU ranks, eager"
    text = markdown(view, "t")
    assert text.count("\n| ") == 1 + len(result.trials)  # the header and one line per run
    assert "kept: keep_last_unsharded=True" in text


def test_gains_and_noise_are_measured_on_the_10th_percentile_step(tmp_path):
    """The replay predicts the 10th-percentile step: gains and noise compare the same. Here
    interference slowed the eager run's median (900 where its fast steps say 1000): on the
    medians the knob would read +11.4 % and be kept; on the 10th percentiles it is +0.3 %,
    within the noise (the repeat: +0.5 %)."""
    fast = {2: 1000.0, 3: 1005.0, 4: 1003.0}
    slow = {2: 900.0, 3: 1000.0, 4: 1003.0}
    capture = ScriptedCapture(
        SAMPLES / "cpu-gloo-2proc",
        lambda cfg, nproc, count: fast.get(count, 600.0),
        median=lambda cfg, nproc, count: slow.get(count, 600.0),
    )
    result = tuning.tune(cpu_base(tmp_path), 2, tmp_path / "t", capture, budget=1)
    eager, repeat, trial = result.trials[1:]
    assert repeat.measured_pct == pytest.approx(0.5) and result.noise_pct == pytest.approx(0.5)
    assert trial.measured_pct == pytest.approx(0.3) and not trial.kept
    assert eager.tokens_per_s_per_gpu == pytest.approx(900.0)  # run.json's, shown as it is
    assert eager.statistic == "p10" and eager.speed == pytest.approx(1000.0)
    # Every Δ can be recomputed from the table's p10 column.
    from fsdp_trace.present.tune import SPEED
    from fsdp_trace.tune import folder_view

    rows = rows_of(folder_view(result, tmp_path / "t"))
    column = {name: float(row[SPEED].replace(",", "")) for name, row in rows.items()}
    for name, row in rows.items():
        if row["against"] != "—":
            recomputed = 100 * (column[name] / column[row["against"]] - 1)
            assert row["measured Δ"] == f"{recomputed:+.1f} %"
    assert rows["eager"]["tok/s/GPU"] == "900" and rows["eager"][SPEED] == "1,000"


def test_without_a_10th_percentile_the_median_is_used_and_said(tmp_path):
    from fsdp_trace.present.tune import SPEED
    from fsdp_trace.tune import folder_view

    class NoP10(ScriptedCapture):
        def __call__(self, cfg, nproc):
            out = super().__call__(cfg, nproc)
            record = json.loads((out / "run.json").read_text())
            del record["figures"]["step_time_ms"]["p10"]
            (out / "run.json").write_text(json.dumps(record))
            return out

    capture = NoP10(SAMPLES / "cpu-gloo-2proc", lambda cfg, nproc, count: 1000.0 + count)
    result = tuning.tune(cpu_base(tmp_path), 1, tmp_path / "t", capture, budget=0)
    eager, repeat = result.trials
    assert eager.statistic == "median" and eager.speed == pytest.approx(1001.0)
    assert repeat.measured_pct == pytest.approx(100 * (1002 / 1001 - 1))
    assert "eager: run.json has no p10 step time: its gain is measured on the median step" in (
        result.notes
    )
    rows = rows_of(folder_view(result, tmp_path / "t"))
    assert rows["eager"][SPEED] == "1,001 (median)"


def test_the_statistic_is_the_one_the_replay_predicts():
    from fsdp_trace.present.tune import STATISTIC
    from fsdp_trace.whatif import ANCHOR

    assert STATISTIC == ANCHOR


def test_a_1gpu_tune_shows_no_efficiency_and_says_why_once(tmp_path, monkeypatch):
    from fsdp_trace.tune import folder_view

    predicting(monkeypatch, [(Knobs(batch_scale=2.0), 15.0)])
    capture = ScriptedCapture(
        GPU, lambda cfg, nproc, count: 1150.0 if cfg.batch_size == 32 else 1000.0 + count
    )
    result = tuning.tune(gpu_base(tmp_path), 1, tmp_path / "t", capture, budget=1)
    assert result.trials[-1].kept  # +14.7 %, over the noise of 0.1 %
    view = folder_view(result, tmp_path / "t")
    assert [row["efficiency"] for row in rows_of(view).values()] == ["—"] * 3
    assert sum("1-GPU tune has no scaling efficiency" in line for line in view.summary) == 1
    with pytest.raises(UserError, match="--target with --nproc-per-node 1: a 1-GPU tune"):
        tuning.tune(gpu_base(tmp_path), 1, tmp_path / "u", capture, budget=1, target=0.9)


def test_a_kept_batch_change_is_measured_against_a_baseline_at_its_batch(tmp_path, monkeypatch):
    """Twice the batch on 2 GPUs is 1000 tok/s/GPU, the old 1-GPU baseline's 1000: against
    it, efficiency 100 % and the target met by the batch alone. Against 1 GPU at the new
    batch (2000) it is 50 %: the loop goes on."""
    from fsdp_trace.tune import folder_view

    predicting(monkeypatch, [(Knobs(batch_size=32), 20.0), (Knobs(keep_last_unsharded=True), 5.0)])

    def speed(cfg, nproc, count):
        batch = cfg.batch_size or 16
        if nproc == 1:
            return 1000.0 * batch / 16
        return 800.0 * (1.25 if batch == 32 else 1.0) * (1.1 if cfg.keep_last_unsharded else 1.0)

    out = tmp_path / "t"
    capture = ScriptedCapture(GPU, speed)
    result = tuning.tune(gpu_base(tmp_path), 2, out, capture, budget=2, target=0.9)
    assert [t.name for t in result.trials] == [
        "1gpu",
        "eager",
        "eager-repeat",
        "trial1-batch-size-32",
        "1gpu-batch-size-32",
        "trial2-keep-last-unsharded-true",
    ]
    batch, base, knob = result.trials[3:]
    assert batch.kept and knob.kept and base.role is tuning.Role.BASELINE
    assert result.stopped == "budget of 2 knob captures used"  # the baseline is not a knob
    assert (batch.efficiency, batch.baseline) == (pytest.approx(0.5), "1gpu-batch-size-32")
    assert (knob.efficiency, knob.baseline) == (pytest.approx(0.55), "1gpu-batch-size-32")
    assert result.trials[1].efficiency == pytest.approx(0.8)
    configs = {Path(cfg.out).name: (cfg, n) for cfg, n in capture.calls}
    cfg, n = configs["1gpu-batch-size-32"]
    assert n == 1 and cfg.batch_size == 32 and cfg.baseline is None
    # run.json's own efficiency never against another batch's baseline
    assert configs["trial1-batch-size-32"][0].baseline is None
    assert configs["trial2-keep-last-unsharded-true"][0].baseline == str(out / "1gpu-batch-size-32")
    assert configs["trial2-keep-last-unsharded-true"][0].batch_size == 32
    rows = rows_of(folder_view(result, out))
    assert [rows[t.name]["efficiency"] for t in result.trials] == [
        "100.0 %",
        "80.0 %",
        "80.0 %",
        "50.0 %",
        "100.0 %",
        "55.0 %",
    ]
    assert rows["1gpu-batch-size-32"]["what was tried"] == "1 GPU (baseline at batch_size=32)"


def test_a_batch_change_not_kept_has_no_efficiency(tmp_path, monkeypatch):
    from fsdp_trace.tune import folder_view

    predicting(monkeypatch, [(Knobs(batch_scale=2.0), 20.0)])
    capture = ScriptedCapture(GPU, lambda cfg, nproc, count: 1000.0 if nproc == 1 else 800.0)
    out = tmp_path / "t"
    result = tuning.tune(gpu_base(tmp_path), 2, out, capture, budget=1, target=0.9)
    trial = result.trials[-1]
    assert not trial.kept and len(capture.calls) == 4  # no baseline for a change not kept
    view = folder_view(result, out)
    assert rows_of(view)[trial.name]["efficiency"] == "—"  # not 80 % against batch 16
    assert trial.efficiency is None
    assert trial.no_efficiency == (
        "its batch 32 × 1024 differs from every 1-GPU baseline's (1gpu: batch 16 × 1024): "
        "a batch change is not better scaling, so --target is not judged on it"
    )
    assert capture.calls[-1][0].baseline is None
    assert f"efficiency left blank for {trial.name}: {trial.no_efficiency}" in view.notices
    assert f"--target not judged on {trial.name}" not in " ".join(result.notes)  # not kept


def test_a_doubling_after_a_kept_doubling_is_a_new_trial(tmp_path, monkeypatch):
    """What was tried is what was captured (batch_size=64), not the knob's words."""
    predicting(monkeypatch, [(Knobs(batch_scale=2.0), 10.0)])
    capture = ScriptedCapture(
        GPU, lambda cfg, nproc, count: 1000.0 * ((cfg.batch_size or 16) / 16) ** 0.2
    )
    result = tuning.tune(gpu_base(tmp_path), 1, tmp_path / "a", capture, budget=3)
    trials = result.trials[2:]
    assert [t.changes for t in trials] == [{"batch_size": b} for b in (32, 64, 128)]
    assert [t.knob for t in trials] == ["batch_scale=2"] * 3 and all(t.kept for t in trials)
    assert [t.against for t in trials] == ["eager", *(t.name for t in trials[:2])]
    assert result.kept == {"batch_size": 128}
    # ... and a change captured once is not captured again in other words.
    predicting(monkeypatch, [(Knobs(batch_size=32), 10.0), (Knobs(batch_scale=2.0), 5.0)])
    flat = ScriptedCapture(GPU, lambda cfg, nproc, count: 1000.0)
    again = tuning.tune(gpu_base(tmp_path), 1, tmp_path / "b", flat, budget=2)
    assert [t.changes for t in again.trials[2:]] == [{"batch_size": 32}]
    assert again.stopped == "no knob left to try"


def test_render_only_rewrites_the_sample_as_committed(tmp_path):
    """The sample's tune.md is what --render-only writes from its runs, even from a tune.json
    of format 1 (gains over the median step, no efficiency fields): the figures are
    recomputed from the run folders. The README shows its table."""

    sample = SAMPLES / "tune-1gpu"
    folder = tmp_path / "tune"
    shutil.copytree(sample, folder)
    saved = json.loads((sample / "tune.json").read_text())
    old = {**saved, "format": 1, "noise_pct": 7.04}
    new_fields = ("speed", "statistic", "efficiency", "baseline", "no_efficiency")
    old["trials"] = [
        {**{k: v for k, v in t.items() if k not in new_fields}, "measured_pct": 99.0}
        for t in saved["trials"]
    ]
    (folder / "tune.json").write_text(json.dumps(old))
    done = run_cli("tune", "--out", str(folder), "--render-only")
    assert done.returncode == 0, done.stderr[-2000:]
    text = (folder / "tune.md").read_text()
    assert text == (sample / "tune.md").read_text()
    assert json.loads((folder / "tune.json").read_text()) == saved
    assert "100.0 %" not in text
    table = [line for line in text.splitlines() if line.startswith("|")]
    readme = (SAMPLES.parent / "README.md").read_text()
    section = readme.split("## Tune: which knob bought each point")[1].split("\n## ")[0]
    one_gpu = section.split("<!-- tune-2gpu:begin -->")[0]  # then the 2-GPU tune's table
    assert [line for line in one_gpu.splitlines() if line.startswith("|")] == table


@pytest.mark.parametrize("name", ["tune-2gpu", "tune-2gpu-b8"])
def test_render_only_rewrites_the_two_gpu_tune_as_it_ran(tmp_path, name):
    """The 2-GPU tunes' tune.md (2x H200 at batch 1, 2x H100 at batch 8), written by the loop
    on the GPU machine, is what --render-only writes again from tune.json and the runs."""
    sample = SAMPLES / name
    folder = tmp_path / "tune"
    shutil.copytree(sample, folder)
    done = run_cli("tune", "--out", str(folder), "--render-only")
    assert done.returncode == 0, done.stderr[-2000:]
    assert (folder / "tune.md").read_text() == (sample / "tune.md").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--out", "{tmp}/nothing", "--render-only"], "no such folder"),
        (["--out", "{tmp}", "--render-only"], "not a readable fsdp-trace tune.json"),
        (["--out", "{sample}", "--render-only", "--model", "tiny"], "captures nothing"),
        (["--out", "{tmp}/new", "--nproc-per-node", "1", "--target", "0.9"], "1-GPU tune"),
    ],
)
def test_tune_refuses_bad_input_in_one_line(tmp_path, args, message):
    args = [a.format(tmp=tmp_path, sample=SAMPLES / "tune-1gpu") for a in args]
    done = run_cli("tune", *args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"nproc": "2"}, "nproc '2'"),
        ({"trials": [{"name": "../eager", "role": "eager"}]}, "trial name '../eager'"),
        ({"trials": [{"name": 3, "role": "eager"}]}, "trial name 3"),
        ({"trials": [{"name": "eager", "role": "best"}]}, "'best' is not a valid Role"),
        ({"format": 3}, "format 3"),
    ],
)
def test_render_only_refuses_a_malformed_tune_json(tmp_path, edit, message):
    import shutil

    folder = tmp_path / "tune"
    shutil.copytree(SAMPLES / "tune-1gpu", folder)
    saved = json.loads((folder / "tune.json").read_text())
    (folder / "tune.json").write_text(json.dumps({**saved, **edit}))
    done = run_cli("tune", "--out", str(folder), "--render-only")
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.slow
def test_tune_end_to_end_on_cpu(tmp_path):
    out = tmp_path / "tune"
    done = run_cli(
        "tune",
        "--nproc-per-node",
        "2",
        "--budget",
        "2",
        "--out",
        str(out),
        "--model",
        "tiny",
        "--warmup-steps",
        "0",
        "--timing-steps",
        "1",
        "--timed-steps",
        "3",
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    saved = json.loads((out / "tune.json").read_text())
    names = [t["name"] for t in saved["trials"]]
    assert names[:3] == ["1gpu", "eager", "eager-repeat"] and len(names) == 5
    runs = {n: json.loads((out / n / "run.json").read_text()) for n in names}
    assert runs["1gpu"]["world"]["world_size"] == 1
    assert all(runs[n]["world"]["world_size"] == 2 for n in names[1:])
    figures = {n: r["figures"] for n, r in runs.items()}
    speed = {  # tokens per step per GPU ÷ the 10th-percentile step, from run.json
        n: f["tokens_per_step_per_gpu"] / (f["step_time_ms"]["p10"] / 1e3)
        for n, f in figures.items()
    }
    a, b = speed["eager"], speed["eager-repeat"]
    assert saved["trials"][2]["measured_pct"] == pytest.approx(100 * (b / a - 1))
    assert saved["noise_pct"] >= abs(100 * (b / a - 1)) - 1e-9
    # Each trial: its knob captured on top of every knob kept before it (a knob not kept
    # carries nothing forward), measured against the run kept then.
    kept, against = {}, "eager"
    eager_config = runs["eager"]["config"]
    for trial in saved["trials"][3:]:
        config = runs[trial["name"]]["config"]
        for key, value in eager_config.items():
            if key not in ("out", "baseline"):
                expected = trial["changes"].get(key, kept.get(key, value))
                assert config[key] == expected, (trial["name"], key)
        assert trial["against"] == against
        assert trial["measured_pct"] == pytest.approx(
            100 * (speed[trial["name"]] / speed[against] - 1)
        )
        assert trial["kept"] == (trial["measured_pct"] > saved["noise_pct"])
        if trial["kept"]:
            kept.update(trial["changes"])
            against = trial["name"]
    assert saved["kept"] == kept
    table = (out / "tune.md").read_text()
    assert all(f"| {n} |" in table for n in names)
    assert (out / "tune.html").exists()
    written = re.findall(r"^fsdp-trace: wrote (\S+)", done.stderr, re.MULTILINE)
    assert [Path(p).name for p in written][-3:] == ["tune.json", "tune.md", "tune.html"]
