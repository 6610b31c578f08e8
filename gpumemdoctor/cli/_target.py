"""What Python would run: `run`'s target (a script, a folder with __main__.py, a zip, a module with
-m, a Python command on PATH such as torchrun) looked at before it starts, and refused with a one-line
reason where python could not run it. The target's own code is never run here: a module is found by
its files, not imported."""
from __future__ import annotations

import importlib.machinery
import os
import re
import shutil
import sys

from ..errors import UsageError

_SCRIPT_PROBE_BYTES = 4096
# pip's console script where the interpreter's path is too long for #!: #!/bin/sh, then
# '''exec' "/long/path/python" "$0" "$@"
_EXEC_LINE = re.compile(r"""^'''exec' "?([^"\s]+)"? "\$0" "\$@"$""")
# What a package's code names when it may make modules importable as it runs (_may_add_modules).
_ADDS_MODULES = (b"__path__", b"sys.modules", b"declare_namespace")


def resolve_command(target: list[str]) -> tuple[list[str], str | None]:
    """A command on PATH that is a Python script (torchrun, a console script) runs as that
    script, under sys.executable; anything else on PATH is refused. Returns the target and
    a note for standard error when the script names another Python on its #! line."""
    command = target[0]
    if command == "-m" or os.sep in command or os.path.exists(command):
        return target, None
    path = shutil.which(command)
    if path is None:
        return target, None  # check_target says there is no such file
    try:
        with open(path, "rb") as f:
            head = f.read(_SCRIPT_PROBE_BYTES)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    interpreter = _python_of(head)
    if interpreter is None:
        if os.path.basename(command).startswith("python"):
            raise UsageError(f"{command} is Python itself: gpumemdoctor runs your script with its own "
                             "Python, so leave it out (gpumemdoctor run train.py, or -m MODULE)")
        raise UsageError(f"{command} ({path}) is not a Python script; gpumemdoctor runs Python "
                         "programs: give a Python script, or a module with -m")
    if _same_python(interpreter, sys.executable):
        return [path, *target[1:]], None
    # The agent starts through sitecustomize under sys.executable's environment, so the script
    # runs there; refuse only when that environment cannot import what a console script runs.
    module = _entry_module(head)
    if module is not None and not _findable(module.split(".")[0]):
        raise UsageError(f"{command} is a script for {interpreter} (its #! line), and gpumemdoctor's "
                         f"Python, {sys.executable}, cannot import {module.split('.')[0]!r}: install "
                         f"gpumemdoctor where {command} is installed ({interpreter} -m pip install "
                         f"gpumemdoctor) and run that gpumemdoctor")
    return [path, *target[1:]], (f"{command}'s #! line names {interpreter}; it runs under "
                                 f"{sys.executable}, the Python gpumemdoctor runs in")


def _python_of(head: bytes) -> str | None:
    """The Python a script's #! line names (also through /usr/bin/env, or the exec line of a
    console script for a long path); None when it is not Python."""
    lines = head.split(b"\n", 2)
    first = lines[0].decode(errors="replace").strip()
    if not first.startswith("#!") or b"\0" in head:
        return None
    words = first[2:].split()
    if words and os.path.basename(words[0]) in ("sh", "bash") and len(lines) > 1:
        m = _EXEC_LINE.match(lines[1].decode(errors="replace").strip())
        words = [m.group(1)] if m else words
    if words and os.path.basename(words[0]) == "env":
        named = [w for w in words[1:] if not w.startswith("-") and "=" not in w][:1]
        words = [shutil.which(named[0]) or named[0]] if named else []
    if not words or not os.path.basename(words[0]).startswith("python"):
        return None
    return words[0]


def _same_python(a: str, b: str) -> bool:
    """The same interpreter in the same environment: the same folder (a virtual environment's
    bin/ holds links to the system's Python) and the same file."""
    try:
        return (os.path.dirname(os.path.abspath(a)) == os.path.dirname(os.path.abspath(b))
                and os.path.samefile(a, b))
    except OSError:
        return False


def _entry_module(head: bytes) -> str | None:
    """The module a console script imports its entry point from (`from X import main`)."""
    m = re.search(rb"^from ([\w.]+) import ", head, re.M)
    return m.group(1).decode() if m else None


def _search_path() -> list[str]:
    """Where the target's Python looks for a top-level module: the current folder first (python -m)."""
    search = [os.getcwd(), *os.environ.get("PYTHONPATH", "").split(os.pathsep), *sys.path[1:]]
    return [p for p in search if p]


def _findable(top: str) -> bool:
    """Whether the target's Python would find this top-level module (the current folder first)."""
    return top in sys.builtin_module_names or importlib.machinery.PathFinder.find_spec(top, _search_path()) is not None


def _missing_module(module: str) -> str | None:
    """Why the target's Python would not find `module`'s submodule (`json.nope`), or a package's
    `__main__` (`-m json`, `-m emptydir`: a folder without __init__.py is a namespace package, which
    python finds and cannot run), or None where it would, or where that cannot be known without running
    the target's code.

    The packages are looked into, not imported: finding a submodule with importlib imports its parent
    packages, and a package's __init__.py is the target's own code (it may start CUDA in gpumemdoctor's
    process, or take seconds to import torch). So a parent whose code may add modules when it runs
    (it names __path__, sys.modules or pkg_resources' declare_namespace: pkgutil.extend_path, `os`
    with os.path), or that is not a file of Python (an import hook, a zip), is taken at its word:
    the target runs, and Python says whether it finds the module."""
    parts = module.split(".")
    locations = _search_path()
    for i, part in enumerate(parts):
        name = ".".join(parts[:i + 1])
        # By its last part alone: a nested namespace package's spec would look its parent up in sys.modules.
        spec = importlib.machinery.PathFinder.find_spec(part, locations)
        if spec is None:
            return None if i == 0 else (f"no module named {name!r}: the package {'.'.join(parts[:i])} has no "
                                        f"module {part!r} (check the name)")
        if spec.origin is None:  # a namespace package: its folders of that name, wherever its parent has one
            locations = [os.path.join(p, part) for p in locations if os.path.isdir(os.path.join(p, part))]
        elif _may_add_modules(spec.origin):
            return None
        elif spec.submodule_search_locations is None:
            if i == len(parts) - 1:
                return None  # a module: what python -m runs
            return f"no module named {'.'.join(parts[:i + 2])!r}: {name} is a module, not a package (check the name)"
        else:
            locations = list(spec.submodule_search_locations)
        if i == len(parts) - 1 and importlib.machinery.PathFinder.find_spec("__main__", locations) is None:
            # python -m runs a package's __main__ (a folder without __init__.py is a namespace package)
            return (f"no module named {name}.__main__; {name!r} is a package and cannot be directly executed, as "
                    f"python says: give one of its modules (-m {name}.MODULE), or give it a __main__.py")
    return None


def _may_add_modules(origin: str) -> bool:
    """Whether a module's code (a package's __init__.py) may make modules importable when it runs."""
    if not origin.endswith((".py", ".pyc")):
        return True  # compiled, or not a file
    try:
        with open(origin, "rb") as f:
            source = f.read(4 << 20)
    except OSError:
        return True  # inside a zip, or unreadable
    return any(marker in source for marker in _ADDS_MODULES)


def check_target(target: list[str]) -> str:
    """Refuse what python could not run, with a one-line reason; return a name for the report."""
    if target[0] == "-m":
        if len(target) < 2 or not target[1] or target[1].startswith("-"):
            raise UsageError("-m needs a module name, as in: gpumemdoctor run -m mypkg.train")
        module = target[1]
        top = module.split(".")[0]
        if not top.isidentifier():
            raise UsageError(f"{module!r} is not a module name")
        if not _findable(top):
            raise UsageError(f"no module named {top!r} (looked in the current folder and sys.path)")
        missing = _missing_module(module)
        if missing is not None:
            raise UsageError(missing)
        return module.replace(".", "-")
    script = target[0]
    if not script:
        raise UsageError("an empty script name (is a variable unset?): give a Python script to run, or a "
                         "module with -m")
    if not os.path.exists(script):
        if os.sep not in script and not script.endswith(".py"):
            raise UsageError(f"{script}: no such file, nor a command on PATH: give a Python script, "
                             "a module with -m, or a Python console script on PATH (torchrun)")
        raise UsageError(f"{script}: no such file")
    if os.path.isdir(script):
        if not os.path.exists(os.path.join(script, "__main__.py")):
            raise UsageError(f"{script} is a folder without __main__.py: give a Python script")
        return os.path.basename(os.path.abspath(script))
    try:
        with open(script, "rb") as f:
            head = f.read(_SCRIPT_PROBE_BYTES)
    except OSError as exc:
        raise UsageError(f"cannot read {script}: {exc.strerror or exc}") from None
    if not head.startswith(b"PK\x03\x04"):  # python also runs zip files
        if b"\0" in head:
            raise UsageError(f"{script} is a binary file, not a Python script")
        first = head.split(b"\n", 1)[0]
        if first.startswith(b"#!") and b"python" not in first:
            interpreter = first[2:].decode(errors="replace").strip()
            raise UsageError(f"{script} is a script for {interpreter!r}, not Python; "
                             f"gpumemdoctor runs Python programs")
    stem = os.path.splitext(os.path.basename(script))[0]
    return stem or "script"
