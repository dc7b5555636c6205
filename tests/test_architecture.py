"""The package's import graph, read from the source (nothing is imported): no circles among
module-level imports, and records at the bottom import nothing above them.

Two graphs are built from every module's AST: module-level imports (run when the module is
imported; `if TYPE_CHECKING:` blocks excluded) and function-level imports (run on first use).
A circle among module-level imports fails the test; function-level imports are listed apart
(they are how a light entry point defers a heavy stage) and must run downward too where a
layer rule names them. The layout is ARCHITECTURE.md's.

    python tests/test_architecture.py   # prints both graphs' circles
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "fsdp_trace"

# ARCHITECTURE.md's floors, lowest first: a module may import its own floor and those below,
# never one above (module-level imports and imports at first use alike). A module belongs to
# the floor of the longest prefix naming it.
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "ground",
        (
            "fsdp_trace",  # the package's root: __version__ (its `analyze`: a shim, below)
            "fsdp_trace.errors",
            "fsdp_trace.vocab",
            "fsdp_trace.knobs",
            "fsdp_trace.printable",
            "fsdp_trace.fmt",
            "fsdp_trace.runrecord",
            "fsdp_trace.atomic",
            "fsdp_trace.collector",
            "fsdp_trace.analysis.intervals",
            "fsdp_trace.analysis.classify",
            "fsdp_trace.analysis.table",
        ),
    ),
    ("records", ("fsdp_trace.analysis.results", "fsdp_trace.result", "fsdp_trace.trials")),
    ("read", ("fsdp_trace.analysis.read",)),
    ("rank", ("fsdp_trace.analysis.rank",)),
    ("job", ("fsdp_trace.analysis", "fsdp_trace.analysis.job")),
    ("facade", ("fsdp_trace.pipeline", "fsdp_trace.whatif", "fsdp_trace.diagnose")),
    ("present", ("fsdp_trace.present",)),
    ("render", ("fsdp_trace.render",)),
    ("commands", ("fsdp_trace.sweep", "fsdp_trace.tune", "fsdp_trace.capture", "fsdp_trace.view")),
    ("entry", ("fsdp_trace.cli", "fsdp_trace.__main__")),
)
# The imports upward that are named exceptions, each at first use: `Result.to_json()` and
# `RunAnalysis.to_json()` (README's API) call the presentation's serializer; the package's
# `fsdp_trace.analyze` is the facade (and its `Result` the record); a record's kernels read
# again go through the job stage (`RankAnalysis.load_kernels`, on a result unpickled in a
# process that never analyzed).
SHIMS = {
    ("fsdp_trace.result", "fsdp_trace.present.payload"),
    ("fsdp_trace", "fsdp_trace.pipeline"),
    ("fsdp_trace", "fsdp_trace.result"),
    ("fsdp_trace.analysis.results", "fsdp_trace.analysis.job.perrank"),
}


def floor_of(module: str) -> int | None:
    """The index of `module`'s floor in FLOORS (None: in none). The root names itself only."""
    found = [
        (len(prefix), i)
        for i, (_, prefixes) in enumerate(FLOORS)
        for prefix in prefixes
        if module == prefix or (prefix != "fsdp_trace" and module.startswith(prefix + "."))
    ]
    return max(found)[1] if found else None


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _targets(node: ast.Import | ast.ImportFrom, here: str, is_package: bool, known) -> set[str]:
    """The fsdp_trace modules an import statement loads (a package's __init__ included)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = here.split(".")
            keep = len(parts) - node.level + (1 if is_package else 0)
            base = ".".join(parts[:keep] + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        if base == "fsdp_trace":  # the root's `analyze` is the facade's, loaded on first use
            names = [
                "fsdp_trace.pipeline" if a.name == "analyze" else n
                for a, n in zip(node.names, names, strict=True)
            ]
    found = set()
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name.startswith("fsdp_trace"):
            found.add(name)
    return found


def import_graphs() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module-level, function-level) imports: module -> the fsdp_trace modules it imports."""
    known = modules()
    top: dict[str, set[str]] = {m: set() for m in known}
    inner: dict[str, set[str]] = {m: set() for m in known}

    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"

        def visit(node: ast.AST, in_function: bool, name=name, is_package=is_package) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and _is_type_checking(child):
                    for sub in child.orelse:
                        visit(sub, in_function)
                    continue
                if isinstance(child, ast.Import | ast.ImportFrom):
                    graph = inner if in_function else top
                    graph[name] |= _targets(child, name, is_package, known) - {name}
                    continue
                nested = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
                visit(child, in_function or nested)

        visit(tree, False)
    # Importing a.b.c runs a/__init__ and a/b/__init__ first.
    for graph in (top,):
        for name in list(graph):
            for target in list(graph[name]):
                parent = target.rpartition(".")[0]
                while parent.startswith("fsdp_trace") and parent != name:
                    if not name.startswith(parent + "."):
                        graph[name].add(parent)
                    parent = parent.rpartition(".")[0]
    return top, inner


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(found)


def _inside(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_no_circle_among_module_level_imports():
    top, _ = import_graphs()
    assert circles(top) == []


def every_import() -> dict[str, set[str]]:
    """Module- and function-level imports together, without those of the package's root
    (`fsdp_trace`: `__version__`, and the facade's `analyze` loaded on first use)."""
    top, inner = import_graphs()
    root = "fsdp_trace"
    graph = {m: (top[m] | inner[m]) - {root} for m in top if m != root}
    for m, t in SHIMS:
        graph.get(m, set()).discard(t)
    return graph


def test_no_circle_even_through_imports_at_first_use():
    """Function-level imports run downward too (a light entry point defers a heavy stage
    below it; nothing below reaches back up at first use)."""
    assert circles(every_import()) == []


def _faces() -> set[str]:
    """Packages' faces: an __init__ importing nothing runs on the way to its modules."""
    top, _ = import_graphs()
    return {m for m, path in modules().items() if path.name == "__init__.py" and not top[m]}


def test_every_module_has_a_floor():
    assert [m for m in modules() if floor_of(m) is None] == []


def test_every_import_runs_downward():
    """Module-level and first-use imports alike: none reaches a floor above its own."""
    top, inner = import_graphs()
    faces = _faces()
    upward = sorted(
        (m, t)
        for graph in (top, inner)
        for m, targets in graph.items()
        for t in targets
        if t not in faces and (m, t) not in SHIMS and (floor_of(t) or 0) > (floor_of(m) or 0)
    )
    named = [(m, FLOORS[floor_of(m) or 0][0], t, FLOORS[floor_of(t) or 0][0]) for m, t in upward]
    assert named == []


def test_the_floors_test_sees_an_upward_import(tmp_path, monkeypatch):
    """The check above fails on a new upward import: one written into a copy of a record."""
    import shutil

    copy = tmp_path / "fsdp_trace"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    results = copy / "analysis" / "results.py"
    results.write_text(
        results.read_text() + "\n\ndef _up():\n    from fsdp_trace.render import terminal\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", copy)
    with pytest.raises(AssertionError):
        test_every_import_runs_downward()


if __name__ == "__main__":
    top, inner = import_graphs()
    for title, graph in (("module-level", top), ("module- and function-level", None)):
        if graph is None:
            graph = every_import()
        found = circles(graph)
        print(f"{title}: {len(found)} circles")
        for part in found:
            print(f"  {len(part)}: {' '.join(part)}")


# A room a newcomer reads in one sitting: the structure issue's bound on a module's length.
MAX_LINES = 800


def test_no_module_over_the_bound():
    long = {
        module_name(path): n
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"split these by what they do: {long}"
