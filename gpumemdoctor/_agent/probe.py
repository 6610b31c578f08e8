"""The probe of the program's names at a new high of its memory (peak.py asks for it): on the main
thread, within its budget, what the main module's globals and the running functions' locals hold,
one level down, by category, and how long a chain the autograd graphs they carry repeat."""
from __future__ import annotations

import gc
import os
import sys
import time
import types
from itertools import islice

from ..contract import MAX_CHAIN

MAX_HOLDERS = 4  # per category in a probe's record
MAX_ITEMS = 4096  # of a list, tuple or dict, read by a probe
# A graph's chain of one operation (a running sum's additions) is followed MAX_CHAIN links per name, and
# this far in all per probe: each link read makes Python wrappers for the node's inputs, which
# PyTorch keeps as long as the graph lives (objects the collector counts).
MAX_LINKS = 128
_NOT_OBJECTS = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)


class Probe:
    """One probe: the program's names that hold CUDA tensors, by category ("temporaries": a running
    function's locals; "kept-tensors": the main module's globals; "parameters": of the modules among
    them), each storage counted once, largest holders kept. A name is read one level down: a list,
    tuple or dict of tensors (`name[*]`), and an object's or a module's public attributes that are
    tensors or such containers (`name.attr[*]`); a container, object or module reached again by another
    name is read once, under the first name. A tensor that carries an autograd graph is named so,
    and the chain of its graph's own operation is measured (`_chain`): what the graph saves is not
    read here (unpacking a saved tensor runs the program's saved-tensor hooks, if it set any: the
    holder search reads graphs, in a copy), but a chain of additions tells the name that keeps every
    batch's graph (a running sum) from one that keeps its own.

    On Python 3.11 and 3.12 a frame's f_locals is a snapshot that the frame keeps until it returns,
    holding what its locals held then: the probe empties it again (when nothing else holds it and
    no tracer is set, which refreshes it itself), so nothing lives longer than the program made it."""

    def __init__(self, torch, deadline: float, on_device=None):
        self.tensor = torch.Tensor
        self.module = torch.nn.Module
        # A tensor subclass with a __torch_function__ of its own would run it on every attribute the
        # probe reads: only tensors whose __torch_function__ is PyTorch's own are read.
        self.plain = {getattr(getattr(torch.Tensor, "__torch_function__", None), "__func__", None),
                      getattr(getattr(torch, "_C", None), "_disabled_torch_function_impl", None)} - {None}
        self.on_device = on_device or _is_cuda  # tests read CPU tensors
        self.deadline = deadline
        self.seen: set = set()  # storage addresses already counted
        # id()s of the containers and objects whose items or attributes were read (pass two), and of the
        # modules whose parameters were (pass one): one reached again by another name (the model as a
        # global and as a local of every frame it was passed down) is not read again
        self.walked: set = set()
        self.modules_read: set = set()
        # holder -> [bytes, line, tensors, chain]
        self.found: dict = {"parameters": {}, "temporaries": {}, "kept-tensors": {}}
        self.stopped = None
        self.graphs = 0  # tensors in the names that carry an autograd graph
        self.links = 0  # graph nodes read down chains, in all
        self.tensors = 0  # tensors looked at

    def optimizers(self, optimizers: list) -> None:
        """Their parameters, gradients and state are counted by the capture: not again here."""
        for opt in optimizers:
            if opt is None:
                continue
            try:
                for group in opt.param_groups:
                    for p in group["params"]:
                        for t in (p, p.grad, *(opt.state.get(p) or {}).values()):
                            if issubclass(type(t), self.tensor) and self.on_device(t):
                                self.seen.add(t.untyped_storage().data_ptr())
            except Exception:
                continue

    def run(self) -> dict:
        """Two passes over the program's frames (innermost first) and the main module's globals: the
        modules' parameters first (a module's weights are parameters wherever else they appear), then
        the tensors. It makes few containers of its own (no list of the names it walks), so that it
        moves the collector's count little."""
        from .search.blocks import is_library_file

        frames = []
        if sys.gettrace() is None and sys.getprofile() is None:  # a tracer refreshes and writes back f_locals
            frame = sys._getframe()
            while frame is not None:
                if not is_library_file(frame.f_code.co_filename) and frame.f_locals is not frame.f_globals:
                    frames.append(frame)
                frame = frame.f_back
            del frame
        main = sys.modules.get("__main__")
        scope = vars(main) if main is not None else {}
        for modules in (True, False):  # globals first: what a global holds outlives the frames
            for k, v in scope.items():
                if not self.stopped:
                    self._named(v, f"global {k}", None, "kept-tensors", modules)
            for frame in frames:
                code = frame.f_code
                where = f"{os.path.basename(code.co_filename)}:{frame.f_lineno}"
                for k, v in frame.f_locals.items():
                    if not self.stopped:
                        self._named(v, f"{code.co_name}() local {k}", where, "temporaries", modules)
        release_locals(frames)
        del frames
        out = {"stopped": self.stopped, "graphs": self.graphs, "graph_links": self.links}
        graphs = []
        # [holder, bytes, line, tensors, 0, chain]: the fifth column counted a graph's nodes before (it
        # made a wrapper for every node); records keep its place
        for category, holders in self.found.items():
            ranked = sorted(holders.items(), key=lambda kv: -kv[1][0])[:MAX_HOLDERS]
            out[category] = [[name, b, line, n, 0, chain] for name, (b, line, n, chain) in ranked]
            out[category + "_bytes"] = sum(h[0] for h in holders.values())
            graphs.extend((name, h) for name, h in holders.items() if h[3])
        graphs.sort(key=lambda kv: -kv[1][3])
        out["graph_holders"] = [[name, b, line, n, 0, chain] for name, (b, line, n, chain) in graphs[:MAX_HOLDERS]]
        return out

    def _named(self, value, name: str, line, category: str, modules: bool) -> None:
        """Pass one (`modules`): a module's parameters. Pass two: the tensors, one level down."""
        if issubclass(type(value), self.module):
            if modules:
                self._module(value, name, line)
            else:
                self._attributes(value, name, line, category)
        elif not modules and not self._value(value, name, line, category):
            self._attributes(value, name, line, category)
        self._late()

    def _value(self, value, name: str, line, category: str) -> bool:
        """A tensor, or a list, tuple or dict of tensors: True when value was one of those."""
        kind = type(value)
        if issubclass(type(value), self.tensor):
            self._tensor(value, name, line, category)
        elif kind is list or kind is tuple or kind is dict:  # (islice: no copy of a big container)
            if id(value) in self.walked:
                return True
            self.walked.add(id(value))
            n = 0
            for v in islice(value.values() if kind is dict else value, MAX_ITEMS):
                n += 1
                if self.stopped or (n % 256 == 0 and self._late()):  # (a long list of other things)
                    break
                if issubclass(type(v), self.tensor):
                    self._tensor(v, f"{name}[*]", line, category)
                    continue
                # One level further, when the first item is a tensor (a heap of dicts or lists of
                # numbers is not read): a list of (images, losses), or of a model's outputs
                # (transformers' ModelOutput is a dict, read as one: no code of its own runs).
                if (type(v) is tuple or type(v) is list) and v:
                    inner, first = v, v[0]
                elif issubclass(type(v), dict):  # (not `and v`: that asks a subclass's own __len__)
                    inner = dict.values(v)
                    first = next(iter(inner), None)
                else:
                    continue
                if issubclass(type(first), self.tensor):
                    for w in islice(inner, MAX_ITEMS):
                        if issubclass(type(w), self.tensor):
                            self._tensor(w, f"{name}[*]", line, category)
        else:
            return False
        return True

    def _attributes(self, value, name: str, line, category: str) -> None:
        """An object's public attributes (its own __dict__, read without running its code): the
        tensors they hold, one level down. Classes, functions and modules of code are left alone.
        Python 3.11+ keeps an object's attributes without a dict until something asks for its
        __dict__, which then makes one for good (a container the collector counts): it is asked for
        only when what the object refers to (gc.get_referents, which makes none) holds a tensor, a
        list or tuple that starts with one (or with a tuple), or a dict."""
        if issubclass(type(value), _NOT_OBJECTS) or not getattr(type(value), "__dictoffset__", 0):
            return  # (ints, strings and the like have no __dict__ to read)
        if id(value) in self.walked:
            return
        self.walked.add(id(value))
        try:
            if not any(map(self._may_hold, gc.get_referents(value))):
                return
            attributes = object.__getattribute__(value, "__dict__")
        except Exception:
            return
        if type(attributes) is not dict:
            return
        for k, v in attributes.items():
            if type(k) is str and not k.startswith("_") and (type(v) in (list, tuple, dict)
                                                          or issubclass(type(v), self.tensor)):
                self._value(v, f"{name}.{k}", line, category)

    def _may_hold(self, v) -> bool:
        """Whether an object's referent may hold tensors the probe reads: checked without a copy."""
        kind = type(v)
        if kind is dict or issubclass(type(v), self.tensor):
            return True
        return ((kind is list or kind is tuple) and len(v) > 0
                and (type(v[0]) is tuple or issubclass(type(v[0]), self.tensor)))

    def _module(self, module, name: str, line) -> None:
        if id(module) in self.modules_read:
            return
        self.modules_read.add(id(module))
        try:
            for t in (*module.parameters(), *module.buffers()):
                if self.on_device(t):
                    storage = t.untyped_storage()
                    address = storage.data_ptr()
                    if address not in self.seen:
                        self.seen.add(address)
                        self._add("parameters", f"{name} ({type(module).__name__})", storage.nbytes(), line)
        except Exception:
            pass

    def _late(self) -> bool:
        """Whether the probe has stopped, now that its budget is looked at."""
        if time.perf_counter() > self.deadline:
            self.stopped = "time"
        return bool(self.stopped)

    def _tensor(self, t, name: str, line, category: str) -> None:
        self.tensors += 1
        if self.stopped or (self.tensors % 256 == 0 and self._late()):
            return  # (a list of thousands: the budget is looked at inside it too)
        try:
            kind = type(t)
            if kind is not self.tensor:
                own = getattr(kind, "__torch_function__", None)
                if getattr(own, "__func__", own) not in self.plain:
                    return
            if not self.on_device(t):
                return
            chain = 0
            if t.requires_grad and not t.is_leaf:  # its autograd graph: its chain measured, nothing read
                self.graphs += 1
                name += " (holds its autograd graph)"
                chain = self._chain(t.grad_fn) if not self.stopped else 0
            storage = t.untyped_storage()
            address = storage.data_ptr()
            size = 0
            if address not in self.seen:
                self.seen.add(address)
                size = storage.nbytes()
            if size or chain:
                self._add(category, name, size, line, 1 if size else 0, chain)
        except Exception:
            return

    def _chain(self, fn) -> int:
        """How many nodes of fn's own operation follow one another down its inputs (`next_functions`):
        a running sum `total = total + loss` is a chain of one addition per batch, each keeping its
        batch's graph; a loss's own graph is a chain of 1. At most MAX_CHAIN, MAX_LINKS a probe."""
        try:
            kind = fn.name()
            length = 1
            while length < MAX_CHAIN and self.links < MAX_LINKS:
                self.links += 1
                fn = next((f for f, _ in fn.next_functions if f is not None and f.name() == kind), None)
                if fn is None:
                    break
                length += 1
            return length
        except Exception:
            return 0

    def _add(self, category: str, name: str, size: int, line, tensors: int = 1, chain: int = 0) -> None:
        entry = self.found[category].get(name)
        if entry is None:
            self.found[category][name] = [size, line, tensors, chain]
        else:
            entry[0] += size
            entry[2] += tensors
            entry[3] = max(entry[3], chain)


def release_locals(frames: list) -> None:
    """Empty the f_locals snapshots of these frames (Python 3.11, 3.12: a dict the frame keeps until it
    returns, holding every local's value) where nothing but the frame holds them; a module's globals
    are left alone, and 3.13's f_locals, a view, is not a dict. Makes no container."""
    for frame in frames:
        local = frame.f_locals
        if type(local) is dict and local is not frame.f_globals and sys.getrefcount(local) <= 3:
            local.clear()  # (the frame, `local`, getrefcount's argument)
        local = None


def _is_cuda(t) -> bool:
    return t.is_cuda
