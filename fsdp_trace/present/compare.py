"""The compare table (`fsdp-trace compare`) as text, once for the terminal and compare.html:
each run in the order given (named by its directory, or --label), what changed and what it
bought. Exposure figures are the worst rank's (never a median pooled over ranks), split into
transfer and waiting for peers where the cross-rank match told them apart. A CPU run's
efficiency reads "— (CPU)": its timing says nothing about scaling (the table's notice says
why)."""

from __future__ import annotations

import pandas as pd

from fsdp_trace import fmt
from fsdp_trace.present.view import Table


def _exposed(row: dict) -> str:
    """ "21.9 (3.6 / 18.9)": exposed %, and its transfer / waiting split when known."""
    text = fmt.pct(row["exposed_pct"])
    transfer, wait = row.get("exposed_transfer_pct"), row.get("exposed_wait_pct")
    if fmt.finite(transfer) or fmt.finite(wait):
        text += f" ({fmt.pct(transfer)} / {fmt.pct(wait)})"
    return text


CPU_EFFICIENCY = f"{fmt.DASH} (CPU)"


def on_cpu(row: dict) -> bool:
    return row.get("device") == "cpu"


def _efficiency(row: dict) -> str:
    return CPU_EFFICIENCY if on_cpu(row) else fmt.fraction_pct(row["scaling_efficiency"])


def _ranks(row: dict) -> str:
    return f"{row['world_size']} (CPU)" if on_cpu(row) else str(row["world_size"])


COLUMNS = (
    # header, cell, numeric
    ("#", lambda i, row: str(i + 1), True),
    ("run", lambda i, row: str(row["label"]), False),
    ("ranks", lambda i, row: _ranks(row), True),
    ("tok/s/GPU", lambda i, row: fmt.num(row["tokens_per_s_per_gpu"], ",.0f"), True),
    ("Δ tok/s/GPU", lambda i, row: fmt.signed(row["tokens_per_s_per_gpu_change_pct"], " %"), True),
    ("efficiency", lambda i, row: _efficiency(row), True),
    ("baseline (1 GPU)", lambda i, row: str(row["baseline"] or fmt.DASH), False),
    ("exposed % (transfer / waiting)", lambda i, row: _exposed(row), True),
    ("Δ exposed", lambda i, row: fmt.signed(row["exposed_pct_change"], " pt"), True),
    ("MFU", lambda i, row: fmt.fraction_pct(row["mfu"]), True),
    ("mem GiB", lambda i, row: fmt.num(row["peak_allocated_gib"], ".2f"), True),
    ("Δ mem", lambda i, row: fmt.signed(row["peak_allocated_gib_change"], " GiB"), True),
    ("what changed", lambda i, row: str(row["change"] or fmt.DASH), False),
)


def compare_table(table: pd.DataFrame) -> Table:
    """The rows both the terminal and compare.html show (the notices, `table.attrs`, go
    under them)."""
    rows = [
        [cell(i, row) for _, cell, _ in COLUMNS] for i, row in enumerate(table.to_dict("records"))
    ]
    headers = [header for header, _, _ in COLUMNS]
    return Table(
        "compare",
        "Runs compared, in the order given (exposure: the worst rank's)",
        headers,
        rows,
        names=(headers.index("run"), headers.index("baseline (1 GPU)")),
        heading=2,
    )


def numeric(header: str) -> bool:
    return next(n for h, _, n in COLUMNS if h == header)
