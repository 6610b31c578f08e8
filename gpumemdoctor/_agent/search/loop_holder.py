"""Who holds a library loop's gathered result: at a history reading made while a library loop runs
(reading.LIBRARY_LOOPS: transformers' evaluation loop) whose events show a concatenation's result
still allocated (replay.py's `joined`), the name that holds that tensor in the loop's frame or a
frame it called, read one level down (`all_preds.tensors`, `preds[*]`), with that frame's line: the
library's own line, beside the program's line that called the loop.

It reads the frames' locals, their objects' attributes and their containers' items, no deeper, and
at most MAX_LOOKED values; it runs no code of the program's (only plain tensors are asked for their
storage: a subclass's __torch_function__ would run). On Python 3.11 and 3.12 a frame's f_locals is a
snapshot the frame keeps: it is emptied again where nothing else holds it (probe.release_locals)."""
from __future__ import annotations

import os
import sys

from .blocks import PACKAGE_DIR
from ..probe import release_locals

MAX_LOOKED = 4000  # values looked at in all
MAX_ITEMS = 64  # of one container


class _Search:
    def __init__(self, tensor, parameter, address: int):
        self.tensor_type = tensor
        self.parameter_type = parameter
        self.address = address
        self.looked = 0

    def tensor(self, value) -> bool:
        """Whether value is a plain tensor whose storage is the block at the address."""
        self.looked += 1
        kind = type(value)
        if kind is not self.tensor_type and kind is not self.parameter_type:
            return False
        try:
            return value.untyped_storage().data_ptr() == self.address
        except Exception:
            return False

    def items(self, value):
        """A list's, tuple's or dict's first items, or None for another kind of value."""
        kind = type(value)
        if kind is list or kind is tuple:
            return value[:MAX_ITEMS]
        if kind is dict:
            out = []
            for k in value:
                if len(out) >= MAX_ITEMS:
                    break
                out.append(value[k])
            return out
        return None

    def within(self, value) -> str | None:
        """"" for value itself, "[*]" or ".attr" or ".attr[*]" for what holds the tensor inside it, or None."""
        if self.tensor(value):
            return ""
        items = self.items(value)
        if items is not None:
            for item in items:
                if self.tensor(item):
                    return "[*]"
            return None
        if isinstance(value, type) or type(value).__module__ == "builtins":
            return None
        try:
            attributes = object.__getattribute__(value, "__dict__")
        except Exception:
            return None
        if type(attributes) is not dict:
            return None
        for k in attributes:
            if self.looked >= MAX_LOOKED:
                return None
            v = attributes[k]
            if self.tensor(v):
                return f".{k}"
            inner = self.items(v)
            if inner is not None:
                for item in inner:
                    if self.tensor(item):
                        return f".{k}[*]"
        return None


def holder(tensor, parameter, frame, loop_frame, address: int) -> str | None:
    """"evaluation_loop() local all_preds.tensors at trainer.py:4398": the first name, in the loop's
    frame and then the frames it called (innermost last), that holds the tensor whose storage
    begins at `address`; None where none does, or where a tracer or profiler is set (it refreshes
    and writes back f_locals)."""
    if sys.gettrace() is not None or sys.getprofile() is not None:
        return None
    frames = []
    while frame is not None:
        if not frame.f_code.co_filename.startswith(PACKAGE_DIR):
            frames.append(frame)
        if frame is loop_frame:
            break
        frame = frame.f_back
    frame = None
    if not frames or frames[-1] is not loop_frame:
        return None
    search = _Search(tensor, parameter, address)
    found = None
    try:
        for f in reversed(frames):  # the loop's frame first
            local = f.f_locals
            for k in local:
                if search.looked >= MAX_LOOKED:
                    break
                inside = search.within(local[k])
                if inside is not None:
                    code = f.f_code
                    found = f"{code.co_name}() local {k}{inside} at {os.path.basename(code.co_filename)}:{f.f_lineno}"
                    break
            if found is not None or search.looked >= MAX_LOOKED:
                break
    finally:
        release_locals(frames)
        del frames[:]
    return found
