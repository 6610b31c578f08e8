"""The agent's records as they are read back: each one's strict shape. Pure.

A device reading is one row of a sample. Besides samples the agent writes, per process:
when it suspected growth, when allocation history was turned on, its holder searches
("investigations": memory allocated since a baseline and still alive, grouped by allocating
stack, with the reference path that holds it), what gc.collect() freed at exit, the threads
that changed GPU memory, the collections that freed CUDA memory and its out-of-memory errors.
They come from a file, so each is checked here before `combine.py` and `recording.py` keep
it; `suspects.py` turns them into suspects. A report's suspects are checked here too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import BadReportError
from ..files.strict import need_dict, need_int, need_list, need_num, need_size, need_str, opt_size

SUSPECT_KINDS = ("allocation", "garbage", "thread")
HOLDER_KINDS = ("global", "attribute", "frame-local", "kept-exception", "hook", "closure",
                "autograd-graph", "cycle", "generator", "cache", "foreign")
# Why a group's blocks have no holder: no Python object refers to them; something does, but
# nothing the program's modules or frames reach holds that (C code, a dead cycle); the search's
# budget ran out before it reached them.
UNHELD_WHY = ("no-python-object", "unreachable", "not-reached")


@dataclass
class DeviceReading:
    """The allocator and NVML figures of one device at one moment, from inside the process."""

    torch_index: int
    allocated_bytes: int | None
    active_bytes: int | None
    reserved_bytes: int | None
    requested_bytes: int | None
    nvml_used_bytes: int | None
    allocated_peak_bytes: int | None = None
    reserved_peak_bytes: int | None = None

    def to_json(self) -> list:
        return [self.torch_index, self.allocated_bytes, self.active_bytes, self.reserved_bytes,
                self.requested_bytes, self.nvml_used_bytes, self.allocated_peak_bytes,
                self.reserved_peak_bytes]

    @classmethod
    def from_json(cls, row: Any) -> DeviceReading:
        if not isinstance(row, list) or not 6 <= len(row) <= 8:
            raise BadReportError(f"a device reading must be a list of 6 to 8 numbers, not {row!r:.80}")
        need_int(row[0], "device index")
        for value in row[1:]:
            opt_size(value, "device reading")
        return cls(*row)


# -- strict shapes ------------------------------------------------------------------

def _opt(check: Callable) -> Callable:
    return lambda v, what: None if v is None else check(v, what)


def _list_of(check: Callable) -> Callable:
    return lambda v, what: [check(x, what) for x in need_list(v, what)]


def _bool(v: Any, what: str) -> bool:
    if not isinstance(v, bool):
        raise BadReportError(f"{what}: expected true or false, found {v!r:.40}")
    return v


def _frame(v: Any, what: str) -> list:
    if not isinstance(v, list) or len(v) != 3:
        raise BadReportError(f"{what}: a stack frame must be [file, line, function]")
    return [need_str(v[0], what), need_int(v[1], what), need_str(v[2], what)]


def _one_of(*allowed: str) -> Callable:
    def check(v: Any, what: str) -> str:
        if v not in allowed:
            raise BadReportError(f"{what}: {v!r:.40} is not one of {', '.join(allowed)}")
        return v
    return check


def _pair(first: Callable, second: Callable) -> Callable:
    def check(v: Any, what: str) -> list:
        v = need_list(v, what)
        if len(v) != 2:
            raise BadReportError(f"{what}: expected a pair")
        return [first(v[0], what), second(v[1], what)]
    return check


def _reading(v: Any, what: str) -> list:
    return DeviceReading.from_json(v).to_json()


def _shape(spec: dict) -> Callable:
    def check(v: Any, what: str) -> dict:
        v = need_dict(v, what)
        out = {}
        for key, field_check in spec.items():
            out[key] = field_check(v.get(key), f"{what} {key}")
        return out
    return check


_int, _num, _str = need_int, need_num, need_str
_SIZES = _opt(_list_of(_pair(_int, _int)))  # the most common block sizes, [size, count]
HOLDER = _shape({"path": _str, "pattern": _str, "kind": _one_of(*HOLDER_KINDS), "count": _int, "bytes": _int,
                 "sizes": _SIZES})
# "new": allocated since the baseline; None in recordings from before exit searches covered all
# live memory, which held new blocks only.


def _why(v: Any, what: str) -> list:
    """[why, bytes, count, type of the highest object above the holder or null]."""
    v = need_list(v, what)
    if len(v) != 4:
        raise BadReportError(f"{what}: expected [why, bytes, count, type]")
    return [_one_of(*UNHELD_WHY)(v[0], what), need_int(v[1], what), need_int(v[2], what),
            None if v[3] is None else need_str(v[3], what)]


def _numbers(v: Any, what: str) -> dict:
    return {need_str(k, what): need_num(x, what) for k, x in need_dict(v, what).items()}


GROUP = _shape({"device": _opt(_int), "new": _opt(_bool), "bytes": _int, "count": _int, "frames": _list_of(_frame),
                "thread": _opt(_list_of(_str)), "holders": _list_of(HOLDER), "unheld_bytes": _int,
                "unheld_count": _opt(_int), "unheld_sizes": _SIZES, "unheld_why": _opt(_list_of(_why))})
# "visited": the objects the garbage collector tracked when the search began (its heap); "forked":
# made in a copy of the process; "phases": seconds (and counts) of its parts.
INVESTIGATION = _shape({"when": _one_of("growth", "exit", "oom", "phase"), "t": _num, "step": _opt(_int), "trace": _bool,
                        "source": _one_of("allocator", "tensors"), "all_live": _opt(_bool),
                        "candidate_bytes": _int,
                        "candidate_count": _int, "groups": _list_of(GROUP), "visited": _int,
                        "gave_up": _opt(_str), "elapsed_s": _num, "snapshot_s": _opt(_num),
                        "budget_s": _opt(_num), "tensors": _opt(_int), "graph_nodes": _opt(_int),
                        "graph_grads": _opt(_int), "complete": _opt(_bool),
                        "forked": _opt(_bool), "phases": _opt(_numbers)})
SUSPICION = _shape({"t": _num, "step": _opt(_int), "device": _int, "by": _str, "grown_bytes": _int,
                    "rate": _num})
TRACE = _shape({"t": _num, "step": _opt(_int), "why": _str, "ok": _bool, "error": _opt(_str)})
BASELINE = _shape({"t": _num, "step": _opt(_int), "why": _str, "blocks": _int, "elapsed_s": _num})
GARBAGE_TENSOR = _shape({"holder": _str, "cycle": _str, "frames": _list_of(_frame), "bytes": _int,
                         "count": _int})
GARBAGE = _shape({"objects": _int, "types": _list_of(_pair(_str, _int)),
                  "cuda_tensor_bytes": _int, "cuda_tensors": _int, "tensors": _list_of(GARBAGE_TENSOR),
                  "collected": _int})
THREAD = _shape({"name": _str, "entry": _opt(_pair(_str, _str)),
                 "t0": _num, "t": _num, "d0": _list_of(_reading), "d1": _list_of(_reading)})
SNAPSHOT = _shape({"path": _str, "trace": _bool})
# A collection of Python's garbage collector that freed CUDA memory, while the program ran.
COLLECTION = _shape({"t": _num, "step": _opt(_int), "generation": _int, "collected": _int,
                     "freed": _list_of(_pair(_int, _int)), "thread": _str, "stack": _list_of(_frame),
                     "elapsed_s": _num})
# PyTorch's allocator could not serve a request (its out-of-memory observer).
OOM = _shape({"t": _num, "step": _opt(_int), "device": _int, "request_bytes": _int, "limit_bytes": _int,
              "device_free_bytes": _int, "allocated_bytes": _opt(_int), "reserved_bytes": _opt(_int),
              "active_bytes": _opt(_int), "largest_free_block_bytes": _opt(_int),
              "free_in_segments_bytes": _opt(_int), "processes": _list_of(_pair(_int, _opt(_int))),
              "thread": _str, "stack": _list_of(_frame)})
# Where a process started CUDA, and what kind of process it is.
CUDA_ORIGIN = _shape({"thread": _opt(_str), "stack": _opt(_list_of(_frame)),
                      "dataloader_worker": _opt(_shape({"id": _int, "num_workers": _int})),
                      "multiprocessing_child": _opt(_bool)})
UNCAUGHT = _shape({"exc_type": _str, "message": _str, "stack": _list_of(_frame)})
COLLECTIONS_SUMMARY = _shape({"measured": _int, "skipped": _int, "freeing": _int, "freed_bytes": _int,
                              "max_freed_bytes": _int, "cost_s": _num})


def _costs(v: Any, what: str) -> dict:
    return {need_str(k, what): need_num(x, what) for k, x in need_dict(v, what).items()}


# What the exit probes measured of the parts PyTorch's totals do not name (_agent/parts.py), each
# null where it could not be read: bytes per torch index freed by clearing the cuBLAS workspaces,
# and reserved in private pools (CUDA graphs); the default process group's backend; the value of
# CUDA_MODULE_LOADING. Recordings from before it have none.
_PER_DEVICE = _opt(_list_of(_pair(_int, need_size)))  # [torch index, bytes]
PARTS = _shape({"cublas_workspaces": _PER_DEVICE, "private_pools": _PER_DEVICE, "dist_backend": _opt(_str),
                "module_loading": _opt(_str)})
# What the agent wrote as the process ended.
EXIT_INFO = _shape({"uncaught": _opt(UNCAUGHT), "samples": _opt(_int), "samples_skipped": _opt(_int),
                    "collections": _opt(COLLECTIONS_SUMMARY), "out_of_memory": _opt(_int),
                    "cost": _opt(_costs), "parts": _opt(PARTS)})
SUSPECT = _shape({"kind": _one_of(*SUSPECT_KINDS), "bytes": _int, "count": _opt(_int),
                  "where": _opt(_frame), "stack": _list_of(_frame), "thread": _opt(_list_of(_str)),
                  "holders": _list_of(HOLDER), "unheld_bytes": _opt(_int), "summary": _str, "remedy": _str})

# agent record type -> (key in a process's root-cause data, shape); _SINGLE keys hold one record
RECORDS = {"suspect": ("suspicions", SUSPICION), "trace": ("traces", TRACE), "baseline": ("baselines", BASELINE),
           "investigation": ("investigations", INVESTIGATION), "thread": ("threads", THREAD),
           "garbage": ("garbage", GARBAGE), "snapshot": ("snapshot", SNAPSHOT),
           "collection": ("collections", COLLECTION), "oom": ("ooms", OOM)}
_SINGLE = ("garbage", "snapshot")


def empty_root() -> dict:
    return {"suspicions": [], "traces": [], "baselines": [], "investigations": [], "threads": [],
            "garbage": None, "snapshot": None, "collections": [], "ooms": []}


def apply_record(root: dict, kind: str, rec: dict, t0: float) -> None:
    """Add one agent record (times made relative to the run's start) to a process's root data."""
    name, shape = RECORDS[kind]
    rec = dict(rec)
    for key in ("t", "t0"):
        if isinstance(rec.get(key), (int, float)) and not isinstance(rec.get(key), bool):
            rec[key] = rec[key] - t0
    value = shape(rec, kind)
    if name in _SINGLE:
        root[name] = value
    else:
        root[name].append(value)


def parse_root(obj: Any) -> dict:
    obj = need_dict(obj, "root cause")
    root = empty_root()
    for name, shape in RECORDS.values():
        value = obj.get(name)
        if name in _SINGLE:
            root[name] = None if value is None else shape(value, name)
        else:
            root[name] = [shape(v, name) for v in need_list(value if value is not None else [], name)]
    return root


def parse_suspects(obj: Any) -> list[dict]:
    return [SUSPECT(s, "suspect") for s in need_list(obj if obj is not None else [], "suspects")]
