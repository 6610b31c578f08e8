"""The package's shape: no import circle, no module over 500 lines, no class over 250.

The imports are read from the source with `ast`, every one of them: at the top of a module and
inside functions (an import made late is still a tie between two modules). A circle is reported
with the modules on it, so that it can be broken where the tie is weakest.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "gpumemdoctor"
MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 250


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = [package.name, *path.relative_to(package).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(p, package): p for p in sorted(package.rglob("*.py"))}


def imported(path: Path, known: dict[str, Path], package: Path = PACKAGE) -> set[str]:
    """The package's modules that the module at `path` imports, anywhere in its code."""
    name = module_name(path, package)
    # A package's __init__ resolves relative imports against itself; a module against its package.
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = (here[:len(here) - node.level + 1] if node.level else [])
            base = ".".join([*base, *(node.module.split(".") if node.module else [])])
            # `from a import b` imports the module a.b where there is one, else a name of a.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c` of a name: the module holding it
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    known = modules(package)
    return {name: imported(path, known, package) for name, path in known.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_back():
    found = circles(import_graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_graph_reads_module_and_function_level_imports():
    graph = import_graph()
    assert "gpumemdoctor._agent.core" in graph["gpumemdoctor._agent"]  # from .core import Agent
    assert "gpumemdoctor._agent.search" in graph["gpumemdoctor._agent.growth_watch"]  # inside a method
    assert "gpumemdoctor._agent" in graph["gpumemdoctor"]  # from . import _agent, inside step()
    assert "gpumemdoctor.recording.records" in graph["gpumemdoctor.recording.recording"]  # from . import records


def test_a_circle_is_found(tmp_path):
    """The check itself can fail: a package whose two modules import each other, one of them late."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from .sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from ..a import x\n")
    (package / "c.py").write_text("from . import a\n")
    graph = import_graph(package)
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a"}
    assert circles(graph) == [["pkg.a", "pkg.sub.b"]]


def test_modules_and_classes_stay_readable_in_one_sitting():
    too_long = []
    for name, path in modules().items():
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            too_long.append(f"{name}: {lines} lines (at most {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_CLASS_LINES:
                    too_long.append(f"{name}.{node.name}: {length} lines (at most {MAX_CLASS_LINES})")
    assert not too_long, "; ".join(too_long)
