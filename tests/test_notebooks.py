"""The notebooks run top to bottom (so they never rot)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path):
    import nbformat  # here, not at collection: importing it takes ~1 s (jsonschema)
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    ).execute()
    errors = [
        o
        for c in notebook.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors


def run_cells(path: Path) -> list[tuple[str, str, object]]:
    """A notebook's code cells run in one namespace, here (in-process, fast): per cell its
    source, what it printed and the value of its last expression (what Jupyter displays)."""
    import ast
    import contextlib
    import io
    import json

    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    namespace: dict = {}
    out = []
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        tree = ast.parse(source)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(tree, str(path), "exec"), namespace)
            value = (
                eval(compile(ast.Expression(last.value), str(path), "eval"), namespace)
                if last is not None
                else None
            )
        out.append((source, printed.getvalue(), value))
    return out


def test_explore_sample_says_what_the_cli_says(monkeypatch):
    """The walk-through's findings read as the CLI's: a note (no cost of its own: the sample's
    two are about the measurement) prints no "0.00 ms per step (0.0 %)" and no empty `try:`
    line; its breakdown, shown in ms, names its columns in ms."""
    import pandas as pd

    monkeypatch.chdir(Path(__file__).parent.parent)
    cells = run_cells(Path(__file__).parent.parent / "notebooks" / "explore_sample.ipynb")
    printed = "".join(p for _, p, _ in cells)
    assert "Host-bound only under the profiler" in printed  # a note, shown
    assert "0.00 ms per step" not in printed and "(0.0 %)" not in printed, printed
    assert not re.search(r"try:\s*$", printed, re.MULTILINE), printed
    (breakdown,) = [v for s, _, v in cells if "result.breakdown" in s]
    assert isinstance(breakdown, pd.DataFrame)
    assert not [c for c in breakdown.columns if c.endswith("_us")], list(breakdown.columns)
    assert "step_ms" in breakdown.columns
    assert breakdown["step_ms"].between(40, 60).all()  # the sample's steps, in ms
