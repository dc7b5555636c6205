"""Write the figures of the committed 2-GPU runs into the documents that quote them, from their
run.json (and analysis.json) files, never by hand:

    python scripts/gpu_tables.py          # rewrite them
    python scripts/gpu_tables.py --check  # exit 1 when a document is stale
    python scripts/gpu_tables.py --predictions DIR  # record the what-if predict stage's
                                          # outputs (DIR), then rewrite them

- README.md `sweep`: the AC-coverage sweep `sample_traces/sweep-gpt-1.3b-b14` (three repeats),
  per coverage: median scaling efficiency with the repeats' min–max, tokens/s/GPU, MFU, exposed
  and recompute % of the step, peak memory on 1 and 2 GPUs and the 1-GPU allocator retries —
  the figures `fsdp-trace plot` draws (`sweep.run_table`);
- README.md `h100-b4` (inline): the eager batch-4 scaling figure on 2×H100;
- benchmarks/results/capture_scaling.md `h100x2`: the eager scaling runs of
  benchmarks/results/capture/h100x2/ (batch 4 and 1, three repeats, each 2-GPU run against the
  1-GPU run of its repeat), the machine and each run's command;
- sample_traces/README.md `sweep-commands`: the sweep's commands, from its run.json files;
- README.md `whatif-2gpu`: the what-if pairs of sample_traces/whatif-2gpu (2× H200): each
  pair's recorded prediction (predictions.jsonl, `fsdp-trace whatif --json`) against the other
  run's measured 10th-percentile step (its run.json), and the pair no knob models
  (NCCL_MAX_NCHANNELS) measured only;
- README.md `tune-2gpu` and `tune-2gpu-b8`: the tables of sample_traces/tune-2gpu/tune.md and
  sample_traces/tune-2gpu-b8/tune.md.

Each part sits between `<!-- NAME:begin -->` and `<!-- NAME:end -->`; tests/test_readme.py runs
--check.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fsdp_trace import sweep  # noqa: E402

README = ROOT / "README.md"
SCALING_MD = ROOT / "benchmarks" / "results" / "capture_scaling.md"
SAMPLES_MD = ROOT / "sample_traces" / "README.md"
SWEEP = ROOT / "sample_traces" / "sweep-gpt-1.3b-b14"
SCALING = ROOT / "benchmarks" / "results" / "capture" / "h100x2"
WHATIF_2GPU = ROOT / "sample_traces" / "whatif-2gpu"
TUNE_2GPU = ROOT / "sample_traces" / "tune-2gpu"
SCALING_NAME = re.compile(r"(?P<model>.+)-b(?P<batch>\d+)-r(?P<repeat>\d+)-(?P<gpus>\d)gpu")


def repeats() -> list[Path]:
    return sorted(p for p in SWEEP.iterdir() if p.is_dir())


def spread(values: list[float], spec: str) -> str:
    """'0.975 (0.973–0.987)': the median and the min–max of the repeats."""
    return (
        f"{format(statistics.median(values), spec)} "
        f"({format(min(values), spec)}–{format(max(values), spec)})"
    )


def median(values, spec: str) -> str:
    return format(statistics.median(list(values)), spec)


def counts(values) -> str:
    """Allocator retries of the repeats: '30' when alike, else '0–30'."""
    values = sorted(int(v) for v in values)
    return str(values[0]) if values[0] == values[-1] else f"{values[0]}–{values[-1]}"


def sweep_points() -> list[dict]:
    """Per coverage, the medians over the repeats of what `fsdp-trace plot` tabulates."""
    table = sweep.run_table(sweep.find_runs(repeats()), with_traces=False, notify=None)
    points = []
    for coverage, runs in table.groupby("ac_coverage"):
        one, two = runs[runs["world_size"] == 1], runs[runs["world_size"] == 2]
        points.append(
            {
                "coverage": coverage,
                "runs": len(two),
                "efficiency": two["scaling_efficiency"].tolist(),
                "tokens_2": two["tokens_per_s_per_gpu"].tolist(),
                "tokens_1": one["tokens_per_s_per_gpu"].tolist(),
                "mfu_2": two["mfu"].tolist(),
                "exposed_2": two["exposed_pct"].tolist(),
                "recompute_2": two["recompute_pct"].tolist(),
                "memory_1": one["peak_allocated_gib"].tolist(),
                "memory_2": two["peak_allocated_gib"].tolist(),
                "retries_1": one["alloc_retries"].tolist(),
            }
        )
    return points


def sweep_table() -> str:
    lines = [
        "| AC coverage | scaling efficiency, median (min–max) | tokens/s/GPU, 2 GPUs "
        "| tokens/s, 1 GPU | MFU, 2 GPUs | exposed % of step, 2 GPUs | recompute % of step, "
        "2 GPUs | peak memory, 1 GPU | peak memory, 2 GPUs | allocator retries, 1 GPU |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in sweep_points():
        lines.append(
            f"| {p['coverage']:g} | {spread(p['efficiency'], '.3f')} "
            f"| {median(p['tokens_2'], ',.0f')} | {median(p['tokens_1'], ',.0f')} "
            f"| {median(p['mfu_2'], '.3f')} | {median(p['exposed_2'], '.2f')} "
            f"| {median(p['recompute_2'], '.1f')} | {median(p['memory_1'], '.1f')} GiB "
            f"| {median(p['memory_2'], '.1f')} GiB | {counts(p['retries_1'])} |"
        )
    return "\n".join(lines)


def scaling_runs() -> dict[int, dict[int, dict[int, dict]]]:
    """batch → repeat → GPUs → run.json, from benchmarks/results/capture/h100x2/."""
    runs: dict[int, dict[int, dict[int, dict]]] = {}
    for path in sorted(SCALING.glob("*.run.json")):
        name = SCALING_NAME.fullmatch(path.name.removesuffix(".run.json"))
        if name is None:
            raise SystemExit(f"{path}: not a MODEL-bB-rN-Ngpu.run.json name")
        batch, repeat, gpus = (int(name[k]) for k in ("batch", "repeat", "gpus"))
        runs.setdefault(batch, {}).setdefault(repeat, {})[gpus] = json.loads(path.read_text())
    return runs


def scaling_rows() -> list[dict]:
    """Per batch, largest first: each repeat's 2-GPU run against its own 1-GPU run."""
    rows = []
    for batch, by_repeat in sorted(scaling_runs().items(), reverse=True):
        pairs = [(r[1]["figures"], r[2]["figures"]) for _, r in sorted(by_repeat.items())]
        rows.append(
            {
                "batch": batch,
                "repeats": len(pairs),
                "step_1": [one["step_time_ms"]["median"] for one, _ in pairs],
                "step_2": [two["step_time_ms"]["median"] for _, two in pairs],
                "tokens_2": [two["tokens_per_s_per_gpu"] for _, two in pairs],
                "mfu_1": [one["mfu"] for one, _ in pairs],
                "mfu_2": [two["mfu"] for _, two in pairs],
                "efficiency": [
                    two["tokens_per_s_per_gpu"] / one["tokens_per_s_per_gpu"] for one, two in pairs
                ],
                "memory_1": [one["peak_allocated_gib"] for one, _ in pairs],
                "memory_2": [two["peak_allocated_gib"] for _, two in pairs],
            }
        )
    return rows


def machine(record: dict) -> str:
    env = record["environment"]
    links = ", ".join(f"{v} between GPUs {k}" for k, v in env["interconnect"]["pairs"].items())
    return (
        f"{env['gpu_count']}× {env['gpu_name']} ({env['gpu_memory_gib']:.1f} GiB each, {links}; "
        f"{env['cpu_count']} vCPU), torch {env['torch']}, NCCL {env['nccl']}, "
        f"driver {env['driver']}; MFU against the dense bf16 peak of "
        f"{env['dense_bf16_peak_tflops']:g} TFLOP/s"
    )


def scaling_section() -> str:
    runs = scaling_runs()
    first = next(iter(next(iter(runs.values())).values()))[2]
    rows = scaling_rows()
    lines = [
        f"Machine: {machine(first)}. Step time: median of "
        f"{first['figures']['step_time_ms']['n']} un-profiled timed steps; every figure below "
        f"is the median of the {rows[0]['repeats']} repeats, the efficiency with their "
        "min–max (each repeat's 2-GPU run against the 1-GPU run captured just before it).",
        "",
        "| configuration | batch | 1 GPU step ms | 2 GPU step ms | tok/s/GPU (2 GPU) "
        "| MFU 1 GPU | MFU 2 GPU | scaling efficiency, median (min–max) | peak mem 1 GPU "
        "| peak mem 2 GPU |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| eager, defaults | {row['batch']} | {median(row['step_1'], '.1f')} "
            f"| {median(row['step_2'], '.1f')} | {median(row['tokens_2'], ',.0f')} "
            f"| {median(row['mfu_1'], '.3f')} | {median(row['mfu_2'], '.3f')} "
            f"| {spread(row['efficiency'], '.3f')} | {median(row['memory_1'], '.1f')} GiB "
            f"| {median(row['memory_2'], '.1f')} GiB |"
        )
    lines += [
        "",
        "Each run's command, from its run.json (`benchmarks/gpu_runs_2gpu.sh scaling 4`, then "
        "`scaling 1`; the files are "
        "`benchmarks/results/capture/h100x2/MODEL-bB-rN-Ngpu.run.json`):",
        "",
        "```bash",
    ]
    for _, by_repeat in sorted(runs.items(), reverse=True):
        for _, by_gpus in sorted(by_repeat.items()):
            lines += [by_gpus[g]["command"] for g in sorted(by_gpus)]
    lines.append("```")
    return "\n".join(lines)


def h100_b4() -> str:
    (row,) = [r for r in scaling_rows() if r["batch"] == 4]
    return (
        f"efficiency {spread(row['efficiency'], '.3f')} and MFU {median(row['mfu_2'], '.3f')} "
        f"over {row['repeats']} repeats"
    )


def sweep_commands() -> str:
    """The sweeps as typed (each repeat's run.json `argv`) and the plot, then every point's
    capture (its `command`) under its path here (tests/test_capture_samples.py reads them)."""
    typed, captures = [], []
    for repeat in repeats():
        for run in sorted(repeat.iterdir()):
            record = json.loads((run / "run.json").read_text())
            line = shlex.join(["fsdp-trace", *record["argv"][1:]])
            if line not in typed:
                typed.append(line)
            captures += [f"# {run.relative_to(SWEEP.parent).as_posix()}", record["command"]]
    plot = [
        "fsdp-trace",
        "plot",
        *(f"sample_traces/{SWEEP.name}/{r.name}" for r in repeats()),
        "--no-traces",
        "--out",
        f"sample_traces/{SWEEP.name}/efficiency.html",
    ]
    return "\n".join(
        [
            "The sweeps as typed (run.json `argv`; r1 was captured in two parts, r1a with AC 0-0.5",
            "and r1b with AC 0.75 and 1, merged into `r1` here), then the plot, from the",
            "repository root:",
            "",
            "```bash",
            *typed,
            shlex.join(plot),
            "```",
            "",
            "Each point's own capture, as its run.json records it:",
            "",
            "```bash",
            *captures,
            "```",
        ]
    )


def p10_ms(run: str) -> tuple[float, float]:
    """A pair run's 10th-percentile un-profiled step and its noise (2 × 1.25 σ/√n), in ms."""
    stats = json.loads((WHATIF_2GPU / run / "run.json").read_text())["figures"]["step_time_ms"]
    return stats["p10"], 2 * 1.25 * stats["stdev"] / stats["n"] ** 0.5


def whatif_2gpu_table() -> str:
    """Predicted against measured on the 2× H200 pairs, and what the errors add up to."""
    rows = [
        "| run | change | measured ms | predicted ms | the other run, measured | error | "
        "direction | within ± |",
        "|---|---|---:|---:|---:|---:|---|---|",
    ]
    errors, covered = [], []
    lines = (WHATIF_2GPU / "predictions.jsonl").read_text().splitlines()
    for pair in map(json.loads, lines):
        base, change, other = pair["base"], pair["change"], pair["other"]
        if "whatif" not in pair:
            rows.append(f"| `{base}` | {change} | — | refused: {pair['refused']} | | | | |")
            continue
        w = pair["whatif"]
        before = w["measured"]["step_us"] / 1e3
        pred = w["predicted"]["step_us"] / 1e3
        unc = w["predicted"]["uncertainty_us"] / 1e3
        after, noise_after = p10_ms(other)
        _, noise_before = p10_ms(base)
        error = pred / after - 1
        errors.append(abs(error))
        covered.append(abs(pred - after) <= unc)
        if abs(after - before) <= noise_before + noise_after:
            direction = "within noise"
        else:
            direction = "right" if (pred - before) * (after - before) > 0 else "**wrong**"
        rows.append(
            f"| `{base}` | {change} | {before:.1f} | {pred:.1f} ± {unc:.1f} | {after:.1f} | "
            f"{100 * error:+.1f} % | {direction} | {'yes' if covered[-1] else '**no**'} |"
        )
    for base in ("b2", "b8"):
        before, noise_base = p10_ms(base)
        for suffix, what in (
            ("nch8", "NCCL_MAX_NCHANNELS=8 (no what-if knob)"),
            ("repeat", "nothing (the same command again)"),
        ):
            after, noise = p10_ms(f"{base}-{suffix}")
            beyond = abs(after - before) > noise_base + noise
            rows.append(
                f"| `{base}` | {what} | {before:.1f} | — | {after:.1f} | "
                f"{100 * (after / before - 1):+.1f} % measured | "
                f"{'beyond noise' if beyond else 'within noise'} | |"
            )
    rows.append("")
    rows.append(
        f"2× H200 pairs: median error {100 * statistics.median(errors):.1f} %, largest "
        f"{100 * max(errors):.1f} %; the measured step lies within predicted ± uncertainty on "
        f"{sum(covered)} of {len(covered)}."
    )
    return "\n".join(rows)


def tune_table(folder: Path) -> str:
    """The rows of a tune folder's tune.md table, as `fsdp-trace tune` wrote them."""
    lines = (folder / "tune.md").read_text().splitlines()
    return "\n".join(line for line in lines if line.startswith("|"))


def replace(text: str, name: str, body: str, inline: bool = False) -> str:
    gap = "" if inline else "\n"
    pattern = re.compile(rf"(<!-- {name}:begin -->{gap})(.*?)({gap}<!-- {name}:end -->)", re.DOTALL)
    if not pattern.search(text):
        raise SystemExit(f"no <!-- {name}:begin --> / <!-- {name}:end --> markers")
    return pattern.sub(lambda m: m.group(1) + body + m.group(3), text, count=1)


def render() -> dict[Path, str]:
    readme = replace(README.read_text(), "sweep", sweep_table())
    readme = replace(readme, "h100-b4", h100_b4(), inline=True)
    readme = replace(readme, "whatif-2gpu", whatif_2gpu_table())
    readme = replace(readme, "tune-2gpu", tune_table(TUNE_2GPU))
    readme = replace(readme, "tune-2gpu-b8", tune_table(TUNE_2GPU.with_name("tune-2gpu-b8")))
    return {
        README: readme,
        SCALING_MD: replace(SCALING_MD.read_text(), "h100x2", scaling_section()),
        SAMPLES_MD: replace(SAMPLES_MD.read_text(), "sweep-commands", sweep_commands()),
    }


def record_predictions(folder: Path) -> None:
    """sample_traces/whatif-2gpu/predictions.jsonl from the `predict` stage's folder
    (benchmarks/gpu_runs_2gpu.sh: pairs.txt and each pair's `fsdp-trace whatif --json` N.json;
    a pair whose whatif refused has N.log's last line)."""
    lines = []
    for line in (folder / "pairs.txt").read_text().split():
        number, base, change, other = line.split("|")
        pair = {"pair": int(number), "base": base, "change": change, "other": other}
        done = folder / f"{number}.json"
        if done.exists():
            pair["whatif"] = json.loads(done.read_text())
        else:
            said = (folder / f"{number}.log").read_text().strip().splitlines()[-1]
            pair["refused"] = said.split("error: ", 1)[-1]
        lines.append(json.dumps(pair, sort_keys=True))
    (WHATIF_2GPU / "predictions.jsonl").write_text("\n".join(lines) + "\n")


def main() -> int:
    if sys.argv[1:2] == ["--predictions"]:  # --predictions DIR: record the predict stage's
        record_predictions(Path(sys.argv[2]))
    new = render()
    if "--check" in sys.argv[1:]:
        stale = [os.path.relpath(p, ROOT) for p, text in new.items() if text != p.read_text()]
        if stale:
            names = ", ".join(map(str, stale))
            print(f"{names}: the 2-GPU runs' figures are stale: run python scripts/gpu_tables.py")
            return 1
        return 0
    for path, text in new.items():
        path.write_text(text)
    print("wrote the 2-GPU runs' figures into " + ", ".join(os.path.relpath(p, ROOT) for p in new))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
