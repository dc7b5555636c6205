"""The number formats every view uses, defined once. Standard library only."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DASH = "—"
# A CPU (gloo) run's scaling efficiency, as every view and the gate say it.
CPU_SCALING = "not meaningful on CPU: every rank shares the host's cores"


def finite(value: Any) -> bool:
    try:
        return value is not None and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def num(value: Any, spec: str = ".1f", unit: str = "") -> str:
    """`value` in `spec` with `unit`, or a dash when it is missing or not finite."""
    return f"{float(value):{spec}}{unit}" if finite(value) else DASH


def ms(us: Any, unit: str = "") -> str:
    """µs as ms with two decimals ("13.18"), `unit` appended (" ms")."""
    return num(float(us) / 1e3, ".2f", unit) if finite(us) else DASH


def pct(value: Any, unit: str = "") -> str:
    """A percentage (already ×100) with one decimal."""
    return num(value, ".1f", unit)


def fraction_pct(value: Any) -> str:
    """A 0–1 fraction as "86.9 %"."""
    return num(100.0 * float(value), ".1f", " %") if finite(value) else DASH


def signed(value: Any, unit: str = "") -> str:
    return num(value, "+.1f", unit)


def mb(nbytes: Any) -> str:
    return num(float(nbytes) / 1e6, ",.1f") if finite(nbytes) else DASH


def gib(value: Any) -> str:
    return num(value, ".2f", " GiB")


def count(value: Any) -> str:
    return f"{float(value):g}" if finite(value) else DASH


def spread(values: Sequence[float], scale: float = 1.0, spec: str = ".1f") -> tuple[str, str]:
    """(median, "min–max") of the finite values, scaled; ("—", "") when none, and no range
    when they are all equal."""
    clean = sorted(float(v) / scale for v in values if finite(v))
    if not clean:
        return DASH, ""
    n = len(clean)
    median = clean[n // 2] if n % 2 else (clean[n // 2 - 1] + clean[n // 2]) / 2
    if clean[0] == clean[-1]:
        return f"{median:{spec}}", ""
    return f"{median:{spec}}", f"{clean[0]:{spec}}–{clean[-1]:{spec}}"


def plural(n: float, word: str, many: str | None = None) -> str:
    """The count and the word that agrees with it: "1 finding", "2 findings", "0 files",
    "1.5 reductions", plural(3, "retry", "retries"). `many` is the plural form (`word` + "s"
    unless given); a float count is written as %g."""
    count = f"{n:g}" if isinstance(n, float) else str(n)
    return f"{count} {word if n == 1 else many or word + 's'}"


def agree(n: float, one: str, many: str) -> str:
    """The form that agrees with a count: agree(1, "is", "are") is "is", agree(2, ...) "are"."""
    return one if n == 1 else many


def ranks_text(ranks: Sequence[int], limit: int = 6) -> str:
    ranks = list(ranks)
    if not ranks:
        return ""
    shown = ", ".join(map(str, ranks[:limit])) + (", …" if len(ranks) > limit else "")
    return f"{agree(len(ranks), 'rank', 'ranks')} {shown}"


def short_name(run: Any) -> str:
    """'r2/ac0.50-2gpu': a run by its folder and name (repeats differ by their folder)."""
    path = Path(str(run))
    return f"{path.parent.name}/{path.name}" if path.parent.name else path.name
