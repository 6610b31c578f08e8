"""Where the holder search's paths start: the program's own modules, the locals of every live
frame of every thread, and, for the climb, the globals of every module (search.py).

During the run the search is made in a copy of the process (forked.py), and everything is read
there but what the copy cannot see: the other threads. On the program's thread, just before the
fork, only `threads.Captured` is taken (each thread's innermost frame and the threads' names,
tens of microseconds); the modules (`_is_user_module` over all of sys.modules, milliseconds in a
program of thousands) and the frames' callers and locals are read in the copy, from the heap as
it was at the fork. The other threads are gone there but their frames stay in its memory: the
interpreter drops the threads' states after a fork without freeing their frame stacks.
"""
from __future__ import annotations

import gc
import sys
import types

from . import edges
from .blocks import PACKAGE_DIR, is_library_file
from ..threads import Captured


def _is_user_module(name: str, module) -> bool:
    return name == "__main__" or not is_library_file(getattr(module, "__file__", None) or "")


class Roots:
    """Where paths start: the program's modules, and the locals of every live frame of every
    thread but those in `skip_threads` (module-level frames are their module). `threads`: the
    threads as captured before a fork (the copy has only the thread that forked it); without it,
    the threads now."""

    def __init__(self, skip_threads: set, threads: Captured | None = None):
        self.user_dicts: list = []
        self.user_modules: set = set()
        self.modules: list = []
        for name, module in list(sys.modules.items()):
            attrs = getattr(module, "__dict__", None) if type(module) is types.ModuleType else None
            if type(attrs) is not dict:
                continue
            self.modules.append((name, module))
            if name.startswith("gpumemdoctor"):
                continue
            if _is_user_module(name, module):
                self.user_modules.add(name)
                self.user_dicts.append((name, attrs))
        self.user_dicts.sort(key=lambda r: r[0] != "__main__")
        self.locals: list = []  # (thread label, where, name, value)
        if threads is None:
            threads = Captured()
        names = threads.names
        for ident, frame in threads.frames.items():
            if ident in skip_threads:
                continue
            label = f"thread {names.get(ident, ident)!r}: "
            while frame is not None:
                if frame.f_code.co_filename.startswith(PACKAGE_DIR):
                    frame = frame.f_back
                    continue
                try:
                    local = frame.f_locals
                except Exception:
                    local = None
                if local is not None and local is not frame.f_globals:
                    where = edges.where(frame)
                    items = dict.items(local) if type(local) is dict else local.items()
                    self.locals += [(label, where, k, v) for k, v in items if gc.is_tracked(v)]
                frame = frame.f_back

    def closed(self) -> set:
        """Ids the sweep never walks into: modules and their globals, the roads to the whole heap."""
        out = {id(m) for _, m in self.modules}
        out.update(id(m.__dict__) for _, m in self.modules)
        return out

    def sweep_start(self) -> tuple[list, dict]:
        """Level 0 of the sweep (the program's module globals, then frame locals) and the labels
        of each of its objects."""
        objs, labels = [], {}
        for name, attrs in self.user_dicts:
            for k, v in list(dict.items(attrs)):
                if gc.is_tracked(v) and id(v) not in labels:
                    objs.append(v)
                    labels[id(v)] = [name, edges.key_label(k)]
        for label, where, k, v in self.locals:
            if id(v) not in labels:
                objs.append(v)
                labels[id(v)] = [label, f"{where} local {k}"]
        return objs, labels

    def climb_roots(self) -> dict:
        """id -> labels of every module global and every live frame's local."""
        objs, labels = self.sweep_start()
        del objs
        for name, module in self.modules:
            if name.startswith("gpumemdoctor"):
                continue
            for k, v in list(dict.items(module.__dict__)):
                if type(v) is not types.ModuleType and id(v) not in labels:
                    labels[id(v)] = [name, edges.key_label(k)]
        return labels
