"""Three commands timed in turn (A B F A B F ...), each a fresh process: the ratios A/F and
B/F taken round by round, so that a drift of the machine's speed moves a command and its
yardstick alike (farm-bench pairs two commands; this pairs a change, the code before it and
the yardstick in one run).

    python benchmarks/three_way.py --rounds 3 \\
        --a "python -c '...main()' analyze /tmp/spd/world1000 --no-cache --no-report" \\
        --b "python -c 'import sys; sys.path.insert(0, BASE); ...main()' analyze ..." \\
        --floor "python benchmarks/parse_floor.py /tmp/spd/world1000/rank*.json"

Each command is split as a shell splits words (globs expanded here, no shell run); its output
is kept (the A and B outputs compared round by round: `same` or `DIFFER`). `--warmup` rounds
(default 1) run first, not counted: on this VM the first process after a pause ran up to 3x
slower (its memory faulted in again). Prints one line per round (wall seconds, ratios) and the
median, min and max of each ratio.
"""

from __future__ import annotations

import argparse
import glob
import shlex
import statistics
import subprocess
import time


def words(command: str) -> list[str]:
    out: list[str] = []
    for word in shlex.split(command):
        matched = sorted(glob.glob(word)) if any(c in word for c in "*?[") else []
        out += matched or [word]
    return out


def timed(argv: list[str]) -> tuple[float, bytes]:
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, check=True)
    return time.perf_counter() - start, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, help="the command measured (this checkout)")
    parser.add_argument("--b", required=True, help="the command before (another checkout)")
    parser.add_argument("--floor", required=True, help="the yardstick (the parse floor)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--warmup", type=int, default=1, help="rounds run first and not counted (default 1)"
    )
    args = parser.parse_args()
    a, b, floor = words(args.a), words(args.b), words(args.floor)
    for _ in range(args.warmup):  # the first run after a pause faults its memory in slowly
        for argv in (a, b, floor):
            timed(argv)
    ratios: dict[str, list[float]] = {"A/F": [], "B/F": [], "A/B": []}
    for i in range(1, args.rounds + 1):
        ta, out_a = timed(a)
        tb, out_b = timed(b)
        tf, _ = timed(floor)
        for key, value in (("A/F", ta / tf), ("B/F", tb / tf), ("A/B", ta / tb)):
            ratios[key].append(value)
        same = "same" if out_a == out_b else "DIFFER"
        print(
            f"round {i}: A {ta:.2f} s, B {tb:.2f} s, floor {tf:.2f} s; A/F {ta / tf:.2f}x, "
            f"B/F {tb / tf:.2f}x, A/B {ta / tb:.2f}; outputs {same}",
            flush=True,
        )
    for key, values in ratios.items():
        print(
            f"{key}: median {statistics.median(values):.2f}x "
            f"(min {min(values):.2f}, max {max(values):.2f})"
        )


if __name__ == "__main__":
    main()
