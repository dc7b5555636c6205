"""--json / --csv: every number of the analysis, with stable column names, written atomically."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fsdp_trace import __version__, atomic
from fsdp_trace.analyze.results import Analysis


def _clean(value: Any) -> Any:
    """JSON-safe: NaN → null, numpy scalars → Python."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    return value


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [_clean(r) for r in frame.astype(object).where(frame.notna(), None).to_dict("records")]


def to_payload(analysis: Analysis) -> dict[str, Any]:
    """The whole analysis as one JSON-ready dict (the --json schema)."""
    run = analysis.run or {}
    return _clean(
        {
            "tool": "fsdp-trace",
            "version": __version__,
            "inputs": analysis.inputs,
            "notices": analysis.notices,
            "run": {
                "config": run.get("config"),
                "model": run.get("model"),
                "world": run.get("world"),
                "figures": run.get("figures"),
            }
            if run
            else None,
            "ranks": [
                {
                    **r.summary(),
                    "path": r.path,
                    "device": r.device,
                    "notices": r.notices,
                    "streams": r.streams,
                }
                for r in analysis.ranks
            ],
            "distortion": analysis.distortion(),
            "steps": records(analysis.steps),
            "blocks": records(analysis.blocks),
            "collectives": records(analysis.collectives),
            "hta": records(analysis.hta) if analysis.hta is not None else None,
            "findings": [dataclasses.asdict(f) for f in analysis.findings],
            "crossrank": _crossrank(analysis.crossrank),
        }
    )


def _crossrank(crossrank: Any) -> dict[str, Any] | None:
    if crossrank is None or crossrank.empty:
        return None
    return {
        "per_rank": records(crossrank.per_rank),
        "clock_offsets_us": crossrank.clock_offsets_us,
        "notices": crossrank.notices,
        "matched": records(crossrank.matched),
    }


def write_text_atomically(path: Path, text: str) -> None:
    atomic.write_text(path, text)


def write_json(analysis: Analysis, path: Path) -> None:
    write_text_atomically(path, json.dumps(to_payload(analysis), indent=1) + "\n")


def write_csv(analysis: Analysis, folder: Path) -> list[Path]:
    """steps.csv, blocks.csv and collectives.csv in `folder` (all or nothing)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        names = {
            "steps": analysis.steps,
            "blocks": analysis.blocks,
            "collectives": analysis.collectives,
        }
        for name, frame in names.items():
            frame.to_csv(staging / f"{name}.csv", index=False)
        folder.mkdir(exist_ok=True)
        written = []
        for name in names:
            os.replace(staging / f"{name}.csv", folder / f"{name}.csv")
            written.append(folder / f"{name}.csv")
        return written
    finally:
        shutil.rmtree(staging, ignore_errors=True)
