"""The run level's share of a many-rank run (issue 23): the client's steps after the last rank
arrives (grouping, configuration, the cross-rank match and columns, diagnosis and each rule),
timed by stage on the kept results of a folder of ranks, as `fsdp-trace analyze` holds them.

    python benchmarks/make_tiny_ranks.py --ranks 1000 --steps 1 --world --out /tmp/spd/world1000
    python benchmarks/run_level.py /tmp/spd/world1000 --rounds 3

The ranks are analyzed once (a pool of `--jobs`, kernels dropped, no cache: what a run keeps
of them); then, `--rounds` times, the run level runs on a fresh copy of those results in this
process with the collector's full passes deferred, as in the command. Each stage's CPU time
is wrapped where the pipeline calls it (`fsdp_trace.pipeline`'s module functions, each rule
of the registry); the least over the rounds is printed per stage, with the whole run level's.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pickle
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("FSDP_TRACE_QUIET", "1")

import fsdp_trace.diagnose  # noqa: F401  (registers the rules)
import fsdp_trace.pipeline as pipeline
from fsdp_trace.analysis.job import config, perrank
from fsdp_trace.analysis.read.inputs import resolve
from fsdp_trace.collector import full_passes_deferred
from fsdp_trace.diagnose import registry

STAGES = ("infer", "_apply_expectations", "copied_ranks", "match", "_apply_crossrank", "diagnose")
spent: Counter[str] = Counter()


def timed(name: str, function: Callable) -> Callable:
    def call(*args, **kwargs):
        start = time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            spent[name] += time.process_time() - start

    return call


def instrument() -> None:
    for name in STAGES:
        setattr(pipeline, name, timed(name, getattr(pipeline, name)))
    config._collectives = timed("infer: collectives of all ranks", config._collectives)
    for rule_id, rule in list(registry.RULES.items()):
        registry.RULES[rule_id] = dataclasses.replace(
            rule, check=timed(f"diagnose: {rule_id}", rule.check)
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a folder of rank traces (one run)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ["FSDP_TRACE_CACHE"] = "0"
    inputs = resolve(args.folder)
    work = [perrank.TraceInput(p) for p in inputs.loose]
    work += [t for run in inputs.runs for t in run.traces]
    kept = pickle.dumps(perrank.analyze_all(work, args.jobs, False, [False] * len(work)))
    instrument()
    best: dict[str, float] = {}
    with full_passes_deferred():
        for _ in range(args.rounds):
            spent.clear()
            results = [perrank.SharedGroups()(r) for r in pickle.loads(kept)]
            start = time.process_time()
            if inputs.runs:
                runs = [pipeline.analyze_run(inputs.runs[0], results, cache=False)]
            else:
                grouped = pipeline._group_loose(inputs, results, False)
                runs = [pipeline.analyze_run(r, a, cache=False) for r, a in grouped]
            spent["the run level, whole"] = time.process_time() - start
            for name, seconds in spent.items():
                best[name] = min(best.get(name, seconds), seconds)
    first = runs[0].diagnosis.findings
    print(f"{len(work)} ranks; first finding: {first[0].title if first else 'none'}")
    print(f"least CPU s over {args.rounds} rounds, by stage:\n")
    for name, seconds in sorted(best.items(), key=lambda item: -item[1]):
        if seconds >= 0.005:
            print(f"{seconds:7.2f} s  {name}")


if __name__ == "__main__":
    main()
