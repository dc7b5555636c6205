"""The per-unit tables' compute lengths (fsdp_trace.analysis.rank.blocks), against a union
computed here one group at a time."""

from __future__ import annotations

import numpy as np

from fsdp_trace.analysis.rank.blocks import _compute_by_block_phase, phase_table
from tests.synth import random_unit_rows


def _union_length(starts: list[float], ends: list[float]) -> float:
    total, reach = 0.0, -np.inf
    for s, e in sorted(zip(starts, ends, strict=True)):
        if s > reach:
            total += e - s
            reach = e
        elif e > reach:
            total += e - reach
            reach = e
    return total


def _expected(block, phase, ts, end) -> dict[str, float]:
    """Per "block|phase" text (no block: ""; no phase: no group), the union of its rows."""
    groups: dict[str, tuple[list[float], list[float]]] = {}
    for b, p, s, e in zip(block, phase, ts, end, strict=True):
        if p is None:
            continue
        starts, ends = groups.setdefault(f"{'' if b is None else b}|{p}", ([], []))
        starts.append(s)
        ends.append(e)
    return {k: _union_length(*v) for k, v in groups.items()}


def test_compute_by_block_phase_is_the_union_of_each_text_key():
    """Blocks and phases paired at random (no block among them), and two pairs that read as
    one key ("x|y" + "f" and "x" + "y|f": one group, as the key says) beside a row with no
    phase (in no group)."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        block, phase, ts, end = random_unit_rows(rng, int(rng.integers(1, 60)), 10)
        got = _compute_by_block_phase({"block": block, "phase": phase, "ts": ts, "end": end})
        expected = _expected(block, phase, ts, end)
        assert got.keys() == expected.keys()
        assert all(np.isclose(got[k], expected[k], rtol=0, atol=1e-9) for k in got)
    block = np.array(["x|y", "x", "x"], dtype=object)
    phase = np.array(["f", "y|f", None], dtype=object)
    ts, end = np.array([0.0, 0.5, 20.0]), np.array([1.0, 2.0, 25.0])
    got = _compute_by_block_phase({"block": block, "phase": phase, "ts": ts, "end": end})
    assert got == {"x|y|f": 2.0}


def test_phase_table_orders_by_step_then_phase():
    table = phase_table(
        np.array([2, 0, 2, 0]),
        np.array(["forward", "recompute", "backward", "backward"], dtype=object),
        np.array([1.0, 2.0, 3.0, 4.0]),
        rank=3,
        source="trace",
    )
    assert table["step"].tolist() == [0, 0, 2, 2]
    assert table["phase"].tolist() == ["backward", "recompute", "backward", "forward"]
    assert table["compute_us"].tolist() == [4.0, 2.0, 3.0, 1.0]
    assert table["rank"].tolist() == [3] * 4
