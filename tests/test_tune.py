"""`fsdp-trace tune`: the loop's decisions against an independent reading of the runs it
captured (a scripted capture over real sample traces, so every decision is known), and the
whole command on CPU with real captures."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from fsdp_trace import tune as tuning
from fsdp_trace.capture.config import CaptureConfig
from fsdp_trace.capture.launcher import CaptureFailed
from fsdp_trace.errors import UserError
from tests.conftest import SAMPLES, run_cli


class ScriptedCapture:
    """A capture that writes a sample's traces under `cfg.out` with a run.json whose config
    is the one asked for and whose tokens/s/GPU is `speed(cfg, nproc, count)`; records every
    config it was given."""

    def __init__(self, sample: Path, speed, fail_on: str | None = None, efficiency=None):
        self.sample, self.speed, self.fail_on = sample, speed, fail_on
        self.efficiency = efficiency
        self.calls: list[tuple[CaptureConfig, int]] = []

    def __call__(self, cfg: CaptureConfig, nproc: int) -> Path:
        self.calls.append((cfg, nproc))
        if self.fail_on and Path(cfg.out).name.endswith(self.fail_on):
            raise CaptureFailed("rank 0: CUDA out of memory", 1)
        out = Path(cfg.out)
        out.mkdir(parents=True)
        record = json.loads((self.sample / "run.json").read_text())
        record["config"] = {**record["config"], **dataclasses.asdict(cfg)}
        figures = record["figures"]
        figures["tokens_per_s_per_gpu"] = self.speed(cfg, nproc, len(self.calls))
        figures["step_time_ms"]["stdev"] = 0.0  # the noise is then the repeat's difference
        figures["scaling_efficiency"] = (
            self.efficiency(cfg, nproc) if self.efficiency and nproc > 1 else None
        )
        (out / "run.json").write_text(json.dumps(record))
        for trace in self.sample.glob("rank*.json.gz"):
            (out / trace.name).symlink_to(trace.resolve())
        return out


def cpu_base(tmp_path: Path) -> CaptureConfig:
    return CaptureConfig(model="tiny", device="cpu", out=str(tmp_path / "unused"))


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
    assert result.noise_pct == pytest.approx(100 * 20 / 1010)
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


def test_the_loop_stops_at_the_target_and_at_no_budget(tmp_path):
    capture = ScriptedCapture(
        SAMPLES / "cpu-gloo-2proc",
        lambda cfg, nproc, count: 1000.0 * (1.2 if cfg.keep_last_unsharded else 1.0),
        efficiency=lambda cfg, nproc: 0.95 if cfg.keep_last_unsharded else 0.8,
    )
    result = tuning.tune(cpu_base(tmp_path), 2, tmp_path / "a", capture, budget=5, target=0.9)
    assert [t.knob for t in result.trials[3:]] == ["keep_last_unsharded=true"]
    assert result.stopped.startswith("target efficiency 90% reached (95.0%)")
    nothing = tuning.tune(cpu_base(tmp_path), 2, tmp_path / "b", capture, budget=0)
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
        dataclasses.replace(cpu_base(tmp_path), model="gpt-small", device="auto"),
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
    from fsdp_trace.whatif.knobs import Knobs

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
    from fsdp_trace.present.tune import folder_view, markdown

    capture = ScriptedCapture(
        SAMPLES / "cpu-gloo-2proc",
        lambda cfg, nproc, count: 2000.0 if cfg.keep_last_unsharded else 1000.0,
    )
    result = tuning.tune(cpu_base(tmp_path), 2, tmp_path / "t", capture, budget=1)
    view = folder_view(result, tmp_path / "t")
    rows = {row[1]: dict(zip(view.table.headers, row, strict=True)) for row in view.table.rows}
    trial = rows["trial1-keep-last-unsharded-true"]
    assert trial["measured Δ"] == "+100.0 %" and trial["kept"] == "kept"
    assert trial["tok/s/GPU"] == "2,000" and trial["efficiency"] == "— (CPU)"
    assert rows["eager"]["what was tried"] == "2 CPU ranks, eager"
    text = markdown(view, "t")
    assert text.count("\n| ") == 1 + len(result.trials)  # the header and one line per run
    assert "kept: keep_last_unsharded=True" in text


@pytest.mark.slow
def test_tune_end_to_end_on_cpu(tmp_path):
    out = tmp_path / "tune"
    done = run_cli(
        "tune",
        "--nproc-per-node",
        "2",
        "--budget",
        "1",
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
    assert names[:3] == ["1gpu", "eager", "eager-repeat"] and len(names) == 4
    runs = {n: json.loads((out / n / "run.json").read_text()) for n in names}
    assert runs["1gpu"]["world"]["world_size"] == 1
    assert all(runs[n]["world"]["world_size"] == 2 for n in names[1:])
    trial = saved["trials"][3]
    # The trial's capture had its knob, and its figures are read back exactly.
    for key, value in trial["changes"].items():
        assert runs[trial["name"]]["config"][key] == value
    tps = {n: r["figures"]["tokens_per_s_per_gpu"] for n, r in runs.items()}
    assert trial["measured_pct"] == pytest.approx(100 * (tps[names[3]] / tps["eager"] - 1))
    a, b = tps["eager"], tps["eager-repeat"]
    assert saved["noise_pct"] >= 100 * abs(a - b) / ((a + b) / 2) - 1e-9
    assert trial["kept"] == (trial["measured_pct"] > saved["noise_pct"])
    table = (out / "tune.md").read_text()
    assert all(f"| {n} |" in table for n in names)
    assert (out / "tune.html").exists()
    written = re.findall(r"^fsdp-trace: wrote (\S+)", done.stderr, re.MULTILINE)
    assert [Path(p).name for p in written][-3:] == ["tune.json", "tune.md", "tune.html"]
