"""Write the README's diagnosis tables from the code: the rule registry (what each rule
looks for and needs), and what the diagnosis says on every shipped sample, in order.

    python scripts/rules_table.py          # rewrite the tables in README.md
    python scripts/rules_table.py --check  # exit 1 when README.md's tables are stale

The tables sit between `<!-- rules:begin -->` / `<!-- rules:end -->` and
`<!-- samples:begin -->` / `<!-- samples:end -->`; tests/test_readme.py runs --check.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import fsdp_trace  # noqa: E402
from fsdp_trace.diagnose import RULES  # noqa: E402
from fsdp_trace.runrecord import RUN_FILE  # noqa: E402

README = ROOT / "README.md"
SAMPLES = ROOT / "sample_traces"


def rules_table() -> str:
    lines = ["| rule | what it finds | fires when | needs |", "|---|---|---|---|"]
    for rule in RULES.values():
        lines.append(f"| `{rule.id}` | {rule.title} | {rule.fires_when} | {rule.needs} |")
    return "\n".join(lines)


def sample_runs() -> list[Path]:
    """Every shipped capture run that still has its traces (the sweep's points do not), then
    the set-ups fsdp-trace did not make (foreign-*/: traces as torch.profiler wrote them)."""
    runs = []
    for run_json in sorted(SAMPLES.rglob(RUN_FILE)):
        folder = run_json.parent
        if any(folder.glob("rank*.timing.json.gz")):
            runs.append(folder)
    return runs + sorted(p for p in SAMPLES.glob("foreign-*/*") if p.is_dir())


def samples_table() -> str:
    lines = [
        "| sample | set-up | verdict (first) | findings, in order (folded symptoms) | minor |",
        "|---|---|---|---|---|",
    ]
    for folder in sample_runs():
        run = fsdp_trace.analyze(folder, cache=False).only
        d = run.diagnosis
        causes = []
        for f in d.findings:
            text = f"`{f.rule}`"
            if f.symptoms:
                text += " (" + ", ".join(f"`{s.rule}`" for s in f.symptoms) + ")"
            causes.append(text)
        minor = ", ".join(f"`{f.rule}`" for f in d.minor)
        name = folder.relative_to(SAMPLES).as_posix()
        if not run.gpu:
            first = "not measured (CPU)"
        elif d.healthy:
            first = "healthy"
        else:
            first = f"`{d.findings[0].rule}` {d.findings[0].cost_pct:.0f} %"
        setup = run.config.setup.value.describe()
        lines.append(
            f"| `{name}` | {setup} | {first} | {' → '.join(causes) or '—'} | {minor or '—'} |"
        )
    return "\n".join(lines)


def replace(text: str, name: str, body: str) -> str:
    pattern = re.compile(rf"(<!-- {name}:begin -->\n)(?:.*?\n)?(<!-- {name}:end -->)", re.DOTALL)
    if not pattern.search(text):
        raise SystemExit(f"README.md has no <!-- {name}:begin --> / <!-- {name}:end --> markers")
    return pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)


def render() -> str:
    text = README.read_text()
    text = replace(text, "rules", rules_table())
    return replace(text, "samples", samples_table())


def main() -> int:
    if "FSDP_TRACE_CACHE_DIR" in os.environ:
        return _write_or_check()
    # The samples' analyses cached in a folder of this run alone, removed after it.
    with tempfile.TemporaryDirectory(prefix="fsdp-trace-cache-") as cache:
        os.environ["FSDP_TRACE_CACHE_DIR"] = cache
        try:
            return _write_or_check()
        finally:
            del os.environ["FSDP_TRACE_CACHE_DIR"]


def _write_or_check() -> int:
    new = render()
    if "--check" in sys.argv[1:]:
        if new != README.read_text():
            print("README.md's diagnosis tables are stale: run python scripts/rules_table.py")
            return 1
        return 0
    README.write_text(new)
    print("README.md: diagnosis tables written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
