"""No import cycle inside dpcost: the package is layered, each concept imports only downwards.

The graph is read from the source (ast), not by importing, and counts every import, at module
level or inside a function: a lazy import hides a cycle at import time but not from a reader.
A submodule's import of its own package (`from dpcost.measure import x` runs
`dpcost/measure/__init__.py` first) is not an edge; importing one of the package's submodules is.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def modules(root: Path, package: str) -> dict[str, Path]:
    found = {}
    for path in (root / package).rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def import_graph(root: Path, package: str = "dpcost") -> dict[str, set[str]]:
    """{module: the package's modules it imports}, edges to its own ancestors left out."""
    mods = modules(root, package)
    graph = {name: set() for name in mods}
    for name, path in mods.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, up level - 1 packages
                    parent = here.split(".")[:len(here.split(".")) - (node.level - 1)]
                    base = ".".join(parent + ([node.module] if node.module else []))
                named = [f"{base}.{alias.name}" for alias in node.names]
                subs = [t for t in named if t in mods]
                targets = subs if len(subs) == len(named) else [base, *subs]
            else:
                continue
            graph[name] |= {t for t in targets
                            if t in mods and t != name and not name.startswith(t + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of two or more modules (Tarjan), sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


@pytest.fixture(scope="module")
def dpcost_graph():
    """The package's graph, read once for the tests below (it parses every module)."""
    return import_graph(ROOT)


def test_dpcost_has_no_import_cycle(dpcost_graph):
    graph = dpcost_graph
    assert "dpcost.measure.launch" in graph["dpcost.measure"]  # the graph is read at all
    assert cycles(graph) == []


def test_the_check_finds_a_lazy_cycle_and_ignores_a_package_import(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from pkg.sub import a\n")
    (package / "sub" / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from . import a\n")
    (package / "c.py").write_text("import pkg.sub\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.sub.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.sub.a"}
    assert graph["pkg.c"] == {"pkg.sub"}
    assert cycles(graph) == [["pkg.sub.a", "pkg.sub.b"]]


def test_the_figures_do_not_import_the_measurements(dpcost_graph):
    """dpcost.plots sits below dpcost.measure (which needs torch): a figure of a measured
    timeline reads its events through dpcost.timeline_events, not through measure."""
    graph = dpcost_graph
    upward = {(m, t) for m, targets in graph.items() if m.startswith("dpcost.plots")
              for t in targets if t.startswith("dpcost.measure")}
    assert upward == set()
    assert "dpcost.timeline_events" in graph["dpcost.plots.timeline"]
