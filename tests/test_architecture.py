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
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "fsdp_trace"

# Records: what every stage returns. They import nothing of fsdp_trace but each other and the
# leaf modules below them (ARCHITECTURE.md, "Floors").
RECORDS = ("fsdp_trace.analysis.results", "fsdp_trace.result")
# The ground floor: modules that import nothing of fsdp_trace (the records may use them).
GROUND = (
    "fsdp_trace.errors",
    "fsdp_trace.vocab",
    "fsdp_trace.knobs",
    "fsdp_trace.printable",
    "fsdp_trace.analysis.intervals",
)
# The one import upward a record makes, at first use: `Result.to_json()`, README's API, a shim
# to the presentation layer's `fsdp_trace.present.payload.to_json`.
SHIMS = {("fsdp_trace.result", "fsdp_trace.present.payload")}


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


def test_records_import_nothing_above_them():
    top, inner = import_graphs()
    # A package's face (an __init__ importing nothing) runs on the way to its modules.
    faces = {m for m, path in modules().items() if path.name == "__init__.py" and not top[m]}
    upward = {
        (m, t)
        for graph in (top, inner)
        for m, targets in graph.items()
        if _inside(m, RECORDS)
        for t in targets
        if not _inside(t, RECORDS + GROUND) and t not in faces
    }
    upward -= SHIMS
    assert sorted(upward) == []


def every_import() -> dict[str, set[str]]:
    """Module- and function-level imports together, without those of the package's root
    (`fsdp_trace`: `__version__`, and the facade's `analyze` loaded on first use)."""
    top, inner = import_graphs()
    root = "fsdp_trace"
    graph = {m: (top[m] | inner[m]) - {root} for m in top if m != root}
    for m, t in SHIMS:
        graph[m].discard(t)
    return graph


def test_no_circle_even_through_imports_at_first_use():
    """Function-level imports run downward too (a light entry point defers a heavy stage
    below it; nothing below reaches back up at first use)."""
    assert circles(every_import()) == []


# analysis/'s stages, lowest first: each imports only those before it (and the records and
# ground floor, which import none of them).
STAGES = ("fsdp_trace.analysis.read", "fsdp_trace.analysis.rank", "fsdp_trace.analysis.job")
# Below analysis/ stand only the records, the ground floor and run.json's reading.
BELOW_ANALYSIS = (
    *RECORDS,
    *GROUND,
    "fsdp_trace.runrecord",
    "fsdp_trace.fmt",
    "fsdp_trace.analysis",
)


def test_every_import_of_analysis_runs_downward():
    graph = every_import()
    wrong = []
    for m, targets in graph.items():
        if not _inside(m, ("fsdp_trace.analysis",)):
            continue
        mine = [i for i, s in enumerate(STAGES) if _inside(m, (s,))]
        for t in targets:
            theirs = [i for i, s in enumerate(STAGES) if _inside(t, (s,))]
            above = bool(mine and theirs and theirs[0] > mine[0])
            outside = not theirs and not _inside(t, BELOW_ANALYSIS)
            if above or outside:
                wrong.append((m, t))
    assert wrong == []


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
