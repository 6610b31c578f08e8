"""The notebook's look at its own kernel (`%gpumemdoctor`, gpumemdoctor/notebook.py): PyTorch's
split on each device now, and which names hold the largest tensors, those people forget first.

The places looked at, each with the one thing that lets it go (its remedy):
- IPython's output history: `Out[n]` (and `_n`, `_`, `__`, `___`, which name the same values):
  `%reset -f out` (`Out.clear()` alone leaves `_n` and `_`); IPython also keeps the last three outputs
  in a hidden copy of `_`, `__`, `___` (`user_ns_hidden`, which `%reset -f out` leaves, as IPython 9.18
  does): `get_ipython().user_ns_hidden.update(_=None, __=None, ___=None)`;
- the last error: the locals of each frame of its traceback, which `sys.last_traceback`, `sys.last_value`
  (and `sys.last_exc` from Python 3.12) hold, and IPython's traceback formatter too
  (`get_ipython().InteractiveTB.tb`): each of them set to None;
- the notebook's globals (IPython's own names left out): `del name`.
Each place is read as the probe of a peak reads a name (probe.py's `Probe`: a tensor, a list, tuple
or dict of them, an object's public attributes, a module's parameters, one level down), each place
with a probe of its own so that a tensor two places hold counts for both (both must let go). A probe
over them all together gives what the places hold at all; the rest of the live tensors is held
elsewhere (deeper in objects, closures, C code): what `gpumemdoctor run`'s holder search finds.
No collection is made (gc.collect() would change the kernel): garbage cycles are not told apart.
"""
from __future__ import annotations

import os
import re
import sys
import time

from .probe import Probe

BUDGET_S = 2.0  # the whole look, all places together
MAX_PLACES = 12
OUT_REMEDY = "%reset -f out  (Out.clear() alone leaves _N and _)"
HISTORY_REMEDY = "%reset -f out  (the output history, and _, __, ___, _N with it)"
HIDDEN_REMEDY = "get_ipython().user_ns_hidden.update(_=None, __=None, ___=None)  (%reset -f out leaves it)"
LAST_ERROR = ("sys.last_traceback", "sys.last_value", "sys.last_type") + (
    ("sys.last_exc",) if sys.version_info >= (3, 12) else ())
_CELL = re.compile(r"<ipython-input-(\d+)-")


def look(user_ns: dict, shell=None, torch=None) -> dict:
    """What the kernel holds now: {"cuda": whether CUDA is started, "devices": PyTorch's split per device,
    "places": [{"place", "kind", "bytes", "tensors", "detail", "remedy"}] largest first, "named_bytes",
    "tensor_bytes" (all live tensors of the kind counted, where known), "elapsed_s"}."""
    started = time.perf_counter()
    torch = torch or sys.modules.get("torch")
    if torch is None:
        return {"torch": False, "cuda": False, "devices": [], "places": [], "named_bytes": 0, "tensor_bytes": None,
                "elapsed_s": 0.0}
    cuda = bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    on_device = (lambda t: t.is_cuda) if cuda else (lambda t: not t.is_cuda and t.device.type == "cpu")
    deadline = started + BUDGET_S
    everything = Probe(torch, deadline, on_device)
    places = []
    for place, kind, value, line, remedy in _places(user_ns, shell):
        probe = Probe(torch, deadline, on_device)
        for p in (probe, everything):
            p._named(value, place, line, "kept-tensors", True)
            p._named(value, place, line, "kept-tensors", False)
        entries = [(name, e) for found in probe.found.values() for name, e in found.items()]
        size = sum(e[0] for _, e in entries)
        if size:
            top = max(entries, key=lambda kv: kv[1][0])[0]
            places.append({"place": place, "kind": kind, "bytes": size, "tensors": sum(e[2] for _, e in entries),
                           "detail": top if top != place else None, "line": line, "remedy": remedy})
    places.sort(key=lambda p: -p["bytes"])
    named = sum(e[0] for found in everything.found.values() for e in found.values())
    return {"torch": True, "cuda": cuda, "devices": _split(torch) if cuda else [], "places": places[:MAX_PLACES],
            "more_places": max(0, len(places) - MAX_PLACES), "named_bytes": named,
            "tensor_bytes": _allocated(torch) if cuda else None, "stopped": everything.stopped,
            "elapsed_s": round(time.perf_counter() - started, 4)}


def _places(user_ns: dict, shell):
    """(place, kind, value, line, remedy) of each place looked at, the forgotten ones first."""
    out = user_ns.get("Out")
    if isinstance(out, dict):
        for n, value in list(out.items()):
            yield f"Out[{n}]", "output history", value, None, OUT_REMEDY
    for name in ("_", "__", "___"):
        if name in user_ns:
            yield name, "output history", user_ns[name], None, HISTORY_REMEDY
    for name in sorted(k for k in list(user_ns) if re.fullmatch(r"_\d+", k)):
        yield name, "output history", user_ns[name], None, HISTORY_REMEDY
    hidden = getattr(shell, "user_ns_hidden", None) or {}
    for name in ("_", "__", "___"):
        if name in hidden:
            yield (f"get_ipython().user_ns_hidden[{name!r}]", "IPython's hidden copy of the output history",
                   hidden[name], None, HIDDEN_REMEDY)
    yield from _last_error(shell)
    for name in sorted(list(user_ns)):
        if name.startswith("_") or name in hidden or name in ("In", "Out", "exit", "quit", "get_ipython"):
            continue
        yield f"global {name}", "the notebook's globals", user_ns[name], None, f"del {name}"


def _last_error(shell):
    """The locals of the frames of the last error's traceback, with what holds that traceback."""
    from .search.blocks import is_library_file

    holders = [name for name in LAST_ERROR if getattr(sys, name.split(".")[1], None) is not None]
    tb = getattr(sys, "last_traceback", None)
    for name in ("last_exc", "last_value"):
        tb = tb or getattr(getattr(sys, name, None), "__traceback__", None)
    formatter = getattr(shell, "InteractiveTB", None)
    if getattr(formatter, "tb", None) is not None:
        holders.append("get_ipython().InteractiveTB.tb")
        tb = tb or formatter.tb
    remedy = " = ".join([*holders, "None"])
    while tb is not None:
        frame = tb.tb_frame
        code = frame.f_code
        # The notebook's cells and code, not IPython's own frames (its shell holds the whole namespace).
        ours = _CELL.search(code.co_filename) or not is_library_file(code.co_filename)
        if ours and frame.f_locals is not frame.f_globals:
            where = _where(code.co_filename, tb.tb_lineno)
            for name, value in list(frame.f_locals.items()):
                yield (f"the last error's frame {code.co_name}(), local {name}", "the last error's traceback", value,
                       where, remedy)
        tb = tb.tb_next


def _where(filename: str, line: int) -> str:
    """A cell as the notebook numbers it (In[4], line 3), else the file's name and line."""
    cell = _CELL.search(filename)
    if cell:
        return f"In[{cell.group(1)}], line {line}"
    return f"{os.path.basename(filename)}:{line}"


def _split(torch) -> list[dict]:
    """Per device PyTorch has touched: allocated, active, reserved, and NVML's figure for this process."""
    from .startup import open_nvml, read_devices

    nvml = open_nvml()
    out = []
    for d in read_devices(torch, nvml):
        stats = torch.cuda.memory_stats(d["index"])
        reserved = stats.get("reserved_bytes.all.current", 0)
        if not reserved:
            continue
        used = None
        if nvml is not None and d["nvml_device"] is not None:
            try:
                used = nvml.used_by(d["nvml_device"], os.getpid())
            except Exception:
                used = None
        out.append({"torch_index": d["index"], "nvml_index": d["nvml_device"].index if d["nvml_device"] else None,
                    "name": d["name"], "allocated_bytes": stats.get("allocated_bytes.all.current", 0),
                    "active_bytes": stats.get("active_bytes.all.current", 0), "reserved_bytes": reserved,
                    "nvml_bytes": used})
    return out


def _allocated(torch) -> int:
    return sum(torch.cuda.memory_allocated(i) for i in range(torch.cuda.device_count()))
