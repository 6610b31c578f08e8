"""Work asked of the program's main thread, between two of its bytecodes (`Py_AddPendingCall`):
the search at an evaluation's height (phase_watch.py) and the probe of a peak (peak.py). No signal,
no hook, nothing the program can see; the call runs where a step boundary's work would run."""
from __future__ import annotations

import opcode
import os

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pending_call(fn):
    """(the C callback made of `fn(_) -> int`, CPython's Py_AddPendingCall), made once on the
    program's thread; (None, None) where ctypes cannot make them."""
    try:
        import ctypes

        callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(fn)
        add = ctypes.pythonapi.Py_AddPendingCall
        add.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        add.restype = ctypes.c_int
        return callback, add
    except Exception:
        return None, None


def ask(add, callback) -> bool:
    """Queue the callback for the main thread; False when it cannot be (no ctypes, the queue full).
    The caller marks it asked before: the main thread may run it before this returns."""
    if add is None:
        return False
    try:
        return add(callback, None) == 0
    except Exception:
        return False


# The call runs at the end of a call instruction (or at a loop's jump back): there, what the call
# returned is still on the frame's stack, and `x = f()` names it only at the next instruction.
# (3.11's specialised PRECALL makes some calls itself and stops there, before its CALL.)
_OP = opcode.opmap
_CALLS = frozenset(_OP[n] for n in ("CALL", "CALL_FUNCTION_EX", "CALL_KW", "PRECALL") if n in _OP)
_BINDS = frozenset(code for name, code in _OP.items() if name.startswith(("STORE_", "UNPACK_", "RETURN_")))
_OPERANDS = frozenset(_OP[n] for n in (  # what `self.a.x = f()`, `d[k] = f()`, `x = y = f()` load first
    "LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_LOAD_FAST", "LOAD_NAME", "LOAD_GLOBAL", "LOAD_DEREF",
    "LOAD_CONST", "LOAD_ATTR", "COPY") if n in _OP)
_SKIPPED = frozenset(_OP[n] for n in ("CACHE", "EXTENDED_ARG", "PRECALL", "CALL") if n in _OP)


def binding(frame) -> bool:
    """Whether `frame` stopped right after a call whose result it binds next (`x = f()`,
    `self.x = f()`, `return f()`): the result has no name yet. Read from the code's bytes (Python
    3.11+: the instruction at f_lasti, then the next ones, CACHE and EXTENDED_ARG entries skipped,
    and a PRECALL's CALL); False where they cannot be read."""
    try:
        code = frame.f_code.co_code
        i = frame.f_lasti
        if code[i] not in _CALLS:
            return False
        end = len(code)
        for _ in range(6):
            i += 2
            while i < end and code[i] in _SKIPPED:
                i += 2
            if i >= end:
                return False
            if code[i] in _BINDS:
                return True
            if code[i] not in _OPERANDS:
                return False
        return False
    except Exception:
        return False


def interrupted(frame) -> bool:
    """Whether the main thread was stopped, at `frame` or below it, inside the agent's own work (a
    step sample, a search, exit) or in the middle of an import: then the call does nothing (the
    stacks' switch imports too, and a module half made would be seen: NOTES, torch._inductor's
    partially initialized module)."""
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_PACKAGE_DIR) or name.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False
