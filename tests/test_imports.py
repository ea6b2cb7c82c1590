"""The package's import structure, read from the source with ``ast`` (nothing is imported).

The graph: one node per module of ``src/trainplan``; an edge A -> B when A's source has an
``import`` of B anywhere — at module level or inside a function, a method or a branch — except
under ``if TYPE_CHECKING:`` (never run). ``from P import N`` is an edge to ``P.N`` when that is a
module of the package, else to ``P``; the implicit import of a parent package is not an edge.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "trainplan"
INTERFACES = ("cli", "web", "run", "planner.command", "export")
"""The groups whose mutual imports must form no cycle: ``web``, ``run`` and ``export`` are all of
their package's modules together, ``cli`` and ``planner.command`` one module each."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                yield from _imports(child)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _imports(node)


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    known = _modules()
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in known}
    base = node.module or ""
    if node.level:  # relative import
        package = module if _modules()[module].name == "__init__.py" else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    out = set()
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        if sub in known:
            out.add(sub)
        elif base in known:
            out.add(base)
    return out


@cache
def import_graph() -> dict[str, frozenset[str]]:
    """Module -> the package modules it imports (module and function level, not TYPE_CHECKING)."""
    graph: dict[str, frozenset[str]] = {}
    for name, path in _modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges: set[str] = set()
        for node in _imports(tree):
            edges |= _targets(name, node)
        graph[name] = frozenset(edges - {name})
    return graph


def _group(module: str) -> str:
    rest = module.removeprefix("trainplan.")
    for g in INTERFACES:
        if rest == g or rest.startswith(g + "."):
            return g
    return module


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_module_and_function_level_imports() -> None:
    graph = import_graph()
    assert "trainplan.errors" in graph["trainplan.cli"]  # module level
    assert "trainplan.planner.command" in graph["trainplan.cli"]  # inside cmd_plan
    assert "trainplan.web.plan_api" in graph["trainplan.web.server"]  # `from trainplan.web import plan_api`
    assert "trainplan.predict" not in graph["trainplan.cli"]  # only under TYPE_CHECKING there
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_nothing_in_the_package_imports_the_cli() -> None:
    importers = sorted(m for m, edges in import_graph().items() if "trainplan.cli" in edges)
    assert importers == [], (
        f"{importers} import trainplan.cli; import trainplan.cli_args / inputs / api instead"
    )


def test_no_import_cycle_through_the_cli_or_between_interfaces() -> None:
    """No cycle of the module graph contains trainplan.cli, and with web/*, run/* and export/*
    each taken as one node, no cycle contains cli, web, run, planner.command or export."""
    modules = {m: set(e) for m, e in import_graph().items()}
    through_cli = [c for c in _cycles(modules) if "trainplan.cli" in c]
    assert through_cli == []
    grouped: dict[str, set[str]] = {}
    for m, edges in modules.items():
        grouped.setdefault(_group(m), set()).update(_group(e) for e in edges if _group(e) != _group(m))
    bad = [sorted(c) for c in _cycles(grouped) if c & set(INTERFACES)]
    assert bad == [], f"import cycles between interfaces: {bad}"


def test_the_estimate_command_imports_neither_numpy_nor_the_planner() -> None:
    code = (
        "import sys, contextlib, io, trainplan.cli\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    rc = trainplan.cli.main(['estimate', 'llama-3.1-8b', '--hardware', 'h100-sxm', '--devices', '8',"
        " '--zero', '3', '--tokens', '1e9', '--json'])\n"
        "assert rc == 0 and out.getvalue().startswith('{'), (rc, out.getvalue()[:200])\n"
        "print(sorted(m for m in sys.modules if m == 'numpy' or m.startswith(('trainplan.planner', 'torch'))))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout


def test_import_trainplan_is_cheap() -> None:
    code = (
        "import sys, trainplan\n"
        "print(sorted(m for m in sys.modules if m.startswith(('trainplan.', 'numpy', 'torch', 'argparse'))))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout
