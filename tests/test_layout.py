"""The package's shape: layers that import only downwards, no import circle, no module over 500
lines, no class over 250, no function over 80.

The imports are read from the source with `ast`, every one of them: at the top of a module and
inside functions (an import made late is still a tie between two modules). A circle is reported
with the modules on it, so that it can be broken where the tie is weakest.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gpumemdoctor"
MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 250
MAX_FUNCTION_LINES = 80  # a function that does one job (issue 59 item 6)
LONG_FUNCTIONS_ALLOWED: set[str] = set()  # (none over now; a name here would be let through)

# The layers, bottom up (ARCHITECTURE.md): each entry is a top-level module or sub-package of
# gpumemdoctor. A module may import its own layer and those below, never one above. Two of a layer
# do not import each other unless they are the same entry.
LAYERS = (
    ("gpumemdoctor", "gpumemdoctor.errors", "gpumemdoctor.units", "gpumemdoctor.growth", "gpumemdoctor.contract",
     "gpumemdoctor.stray_rule"),
    ("gpumemdoctor.files",),
    ("gpumemdoctor.system",),
    ("gpumemdoctor._agent",),
    ("gpumemdoctor._bootstrap",),
    ("gpumemdoctor.recording",),
    ("gpumemdoctor.supervise",),
    ("gpumemdoctor.diagnosis", "gpumemdoctor.live"),
    ("gpumemdoctor.reporters",),
    ("gpumemdoctor.app",),
    ("gpumemdoctor.cli", "gpumemdoctor.pytest_plugin", "gpumemdoctor.notebook"),
    ("gpumemdoctor.__main__",),
)
# The package's face, `gpumemdoctor.step()` and `enable()`, imports the agent when called (and
# `load_ipython_extension` the notebook's magic, when IPython loads it): the one
# way up, so that a program can import gpumemdoctor without loading anything of the tool.
UPWARD_ALLOWED = {("gpumemdoctor", "gpumemdoctor._agent"), ("gpumemdoctor", "gpumemdoctor.notebook")}
# The packages whose docstring names each of their modules (the agent's top and the CLI's say what
# their modules are as a whole: the parts of `core.Agent`, one module per subcommand).
LISTING_PACKAGES = ("app", "diagnosis", "files", "live", "recording", "reporters", "supervise", "system",
                    "_agent/search", "_agent/peak", "_agent/readings")
# The agent's shape (ARCHITECTURE.md, "The agent"): its life cycle at the top, a few modules, and its
# parts grouped by job one level down.
AGENT_PACKAGES = ("peak", "readings", "search")
MAX_AGENT_TOP_MODULES = 16


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = [package.name, *path.relative_to(package).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(p, package): p for p in sorted(package.rglob("*.py"))}


def imported(path: Path, known: dict[str, Path], package: Path = PACKAGE, within: ast.AST | None = None) -> set[str]:
    """The package's modules that the module at `path` imports, anywhere in its code (or `within` one
    of its nodes: a function)."""
    name = module_name(path, package)
    # A package's __init__ resolves relative imports against itself; a module against its package.
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for node in ast.walk(within or ast.parse(path.read_text(encoding="utf-8"))):
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


def entry_of(module: str) -> str:
    """The top-level module or sub-package a module belongs to."""
    return ".".join(module.split(".")[:2])


def layer_of(module: str) -> int:
    entry = entry_of(module)
    for index, layer in enumerate(LAYERS):
        if entry in layer:
            return index
    raise AssertionError(f"{entry} is in no layer of tests/test_layout.py's LAYERS: place it there "
                         f"and in ARCHITECTURE.md")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a higher layer's module, and each between two entries of one layer."""
    wrong = []
    for module, targets in graph.items():
        for target in targets:
            a, b = entry_of(module), entry_of(target)
            if a == b or (a, b) in UPWARD_ALLOWED:
                continue
            if layer_of(target) > layer_of(module):
                wrong.append(f"{module} imports {target}, a higher layer")
            elif layer_of(target) == layer_of(module):
                wrong.append(f"{module} imports {target}, of its own layer")
    return sorted(wrong)


def test_every_module_imports_only_lower_layers():
    assert upward_imports(import_graph()) == []


def test_an_upward_import_is_found():
    """The check itself can fail: the diagnosis importing a reporter, the agent the recording."""
    graph = {"gpumemdoctor.diagnosis.judgement": {"gpumemdoctor.reporters.terminal"},
             "gpumemdoctor._agent.core": {"gpumemdoctor.recording.records", "gpumemdoctor.system.nvml"},
             "gpumemdoctor.live.ps": {"gpumemdoctor.diagnosis.findings"}}
    assert upward_imports(graph) == [
        "gpumemdoctor._agent.core imports gpumemdoctor.recording.records, a higher layer",
        "gpumemdoctor.diagnosis.judgement imports gpumemdoctor.reporters.terminal, a higher layer",
        "gpumemdoctor.live.ps imports gpumemdoctor.diagnosis.findings, of its own layer"]


def test_the_top_level_is_layer_packages_and_a_few_basics():
    """`ls gpumemdoctor` shows the layers: every top-level module is placed in LAYERS (a new one
    must be placed, or go into a package)."""
    entries = {entry_of(m) for m in modules()}
    assert all(layer_of(e) is not None for e in entries)
    flat = sorted(e for e in entries if e != "gpumemdoctor" and not (PACKAGE / e.split(".")[1]).is_dir())
    assert flat == ["gpumemdoctor.__main__", "gpumemdoctor.contract", "gpumemdoctor.errors",
                    "gpumemdoctor.growth", "gpumemdoctor.notebook", "gpumemdoctor.pytest_plugin", "gpumemdoctor.stray_rule",
                    "gpumemdoctor.units"]


def test_the_agent_is_its_life_cycle_and_a_few_packages_by_job():
    """`ls gpumemdoctor/_agent` shows a short top and the sub-packages: a new module goes into one of
    them (or the top, if it is part of the agent's life cycle), never a level deeper."""
    agent = PACKAGE / "_agent"
    top = sorted(p.stem for p in agent.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_AGENT_TOP_MODULES, f"{len(top)} modules at _agent's top: {top}"
    folders = sorted(p.name for p in agent.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert folders == sorted(AGENT_PACKAGES)
    for name in AGENT_PACKAGES:
        assert (agent / name / "__init__.py").exists()
        assert not [p for p in (agent / name).iterdir() if p.is_dir() and p.name != "__pycache__"]


# The agent's composition root and its life cycle: they make the parts and end them, so they hold the
# agent (threads.py's and plugin_history.py's process hooks find it through `current()`, a local).
AGENT_HOLDERS = ("core", "exit", "attach", "__init__")


def parts_reaching_the_agent(agent: Path = PACKAGE / "_agent") -> list[str]:
    """Each place where a part of the agent holds the agent itself, through which it could reach its
    siblings unseen: an attribute named `agent` (`self.agent`) or a parameter named `agent`."""
    found = []
    for path in sorted(agent.rglob("*.py")):
        relative = path.relative_to(agent).with_suffix("")
        if str(relative) in AGENT_HOLDERS:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "agent":
                found.append(f"{relative}:{node.lineno} .agent")
            elif isinstance(node, ast.arg) and node.arg == "agent":
                found.append(f"{relative}:{node.lineno} parameter agent")
    return found


def test_each_part_of_the_agent_is_handed_what_it_uses():
    """Issue 59 item 2: core.py hands each part the shared state (shared.py) and, by name, the siblings
    it uses; no part is handed the agent, so every tie between parts is in `Agent.__init__`."""
    found = parts_reaching_the_agent()
    assert not found, "; ".join(found)


def test_a_part_that_holds_the_agent_is_found(tmp_path):
    """The check itself can fail: a part that keeps the agent, and a helper that takes it."""
    (tmp_path / "core.py").write_text("class Agent:\n    pass\n")
    (tmp_path / "part.py").write_text("class Part:\n    def __init__(self, agent):\n        self.agent = agent\n")
    assert parts_reaching_the_agent(tmp_path) == ["part:2 parameter agent", "part:3 .agent"]


def test_no_module_imports_itself_back():
    found = circles(import_graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_graph_reads_module_and_function_level_imports():
    graph = import_graph()
    assert "gpumemdoctor._agent.core" in graph["gpumemdoctor._agent"]  # from .core import Agent
    assert "gpumemdoctor._agent.search.search" in graph["gpumemdoctor._agent.growth_watch"]  # inside a method
    assert "gpumemdoctor._agent" in graph["gpumemdoctor"]  # from . import _agent, inside step()
    assert "gpumemdoctor.recording.records" in graph["gpumemdoctor.recording.recording"]  # from . import records


def test_what_run_imports_while_the_target_runs_is_what_it_needs_after():
    """`run` imports the report's modules on a thread while the target runs (app/pipeline.py's
    `prepare`): they are the modules that after_run and the functions it calls import, read from
    their code, so that the list cannot drift from them."""
    path = PACKAGE / "app" / "pipeline.py"
    functions = {node.name: node for node in ast.parse(path.read_text(encoding="utf-8")).body
                 if isinstance(node, ast.FunctionDef)}
    reached, todo = set(), ["after_run"]
    while todo:  # after_run, and the module's functions it calls, and theirs
        reached.add(name := todo.pop())
        todo += [n.func.id for n in ast.walk(functions[name]) if isinstance(n, ast.Call)
                 and isinstance(n.func, ast.Name) and n.func.id in functions and n.func.id not in reached]
    assert "_write_baseline" in reached and "prepare" not in reached
    known = modules()
    after = set().union(*(imported(path, known, within=functions[name]) for name in reached))
    assert sorted(imported(path, known, within=functions["prepare"])) == sorted(after)


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


def long_functions(package: Path = PACKAGE) -> list[str]:
    """Each function (a method, a nested one) over MAX_FUNCTION_LINES, from its `def` to its last line."""
    too_long = []
    for name, path in modules(package).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES and f"{name}.{node.name}" not in LONG_FUNCTIONS_ALLOWED:
                    too_long.append(f"{name}.{node.name}: {length} lines (at most {MAX_FUNCTION_LINES})")
    return too_long


def test_functions_do_one_job_each():
    too_long = long_functions()
    assert not too_long, "; ".join(too_long)


def test_a_long_function_is_found(tmp_path):
    """The check itself can fail: a method of 81 lines; one of 80 passes."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    body = "".join(f"        x = {i}\n" for i in range(79))
    (package / "a.py").write_text(f"class C:\n    def long(self):\n{body}        return x\n"
                                  f"    def fits(self):\n{body[:-len('        x = 78')-1]}        return x\n")
    assert long_functions(package) == ["pkg.a.long: 81 lines (at most 80)"]


def test_the_supervisor_ps_and_the_plugin_load_nothing_of_the_agent():
    """They share only `contract` with the agent: importing them loads no `_agent` module."""
    import subprocess
    import sys

    code = ("import sys, gpumemdoctor.supervise.supervisor, gpumemdoctor.live.ps, gpumemdoctor.pytest_plugin, "
            "gpumemdoctor.cli.run; print(sorted(m for m in sys.modules if m.startswith('gpumemdoctor._agent')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent).stdout
    assert out.strip() == "[]"


def test_the_bootstrap_spells_the_contracts_variables_as_the_contract_does():
    """sitecustomize runs before the package can be imported, so it writes two names out."""
    from gpumemdoctor import contract

    text = (PACKAGE / "_bootstrap" / "sitecustomize.py").read_text(encoding="utf-8")
    assert f'"{contract.ENV_RUN_DIR}"' in text and f'"{contract.ENV_PACKAGE_PARENT}"' in text
    assert "GPUMEMDOCTOR_" not in text.replace(contract.ENV_RUN_DIR, "").replace(contract.ENV_PACKAGE_PARENT, "")


@pytest.mark.parametrize("package", LISTING_PACKAGES)
def test_a_package_docstring_names_its_modules_as_ls_shows_them(package):
    """Every module of the package is named in its `__init__`'s docstring, and every name there in
    backquotes is one of its modules, a name one of them defines, or a module beside the package."""
    folder = PACKAGE / package
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8")))
    named = set(re.findall(r"`([A-Za-z_]\w*)`", doc))
    present = {p.stem for p in folder.glob("*.py") if p.name != "__init__.py"}
    assert sorted(present - named) == [], f"{package}/__init__.py does not name them"
    defined = set()
    for path in folder.glob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, ast.Assign):
                defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
    beside = {p.stem for p in folder.parent.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert sorted(named - present - defined - beside) == [], f"{package}/__init__.py names no such module"
