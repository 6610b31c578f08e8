"""The agent's records as they are read back: each one's strict shape. Pure.

A device reading is one row of a sample. Besides samples the agent writes, per process:
when it suspected growth, when allocation history was turned on, its holder searches
("investigations": memory allocated since a baseline and still alive, grouped by allocating
stack, with the reference path that holds it), what gc.collect() freed at exit, the threads
that changed GPU memory, the collections that freed CUDA memory and its out-of-memory errors.
They come from a file, so each is declared here (a `Shape`) and checked before `agent_files.py`
and `recording.py` keep it; `suspects.py` turns them into suspects. A report's suspects are checked here too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..files.schema import (BOOL, COUNT, DURATION, INT, NUM, PID, SECONDS, SIZE, STR, Shape, absent, dict_of, frame,
                            list_of, one_of, may, null_as, opt, pair, row, since, then)
from ..contract import AGENT_PARTS, HISTORY_PARTS, HISTORY_PHASES

SUSPECT_KINDS = ("allocation", "garbage", "thread")
HOLDER_KINDS = ("global", "attribute", "frame-local", "kept-exception", "hook", "closure",
                "autograd-graph", "cycle", "generator", "cache", "foreign")
# Why a group's blocks have no holder: no Python object refers to them; something does, but
# nothing the program's modules or frames reach holds that (C code, a dead cycle); the search's
# budget ran out before it reached them; (at exit) the first sweep took them for cuBLAS's workspaces,
# which clearing the workspaces confirmed.
UNHELD_WHY = ("no-python-object", "unreachable", "not-reached", "cublas-workspace")


# The sizes of one device at one moment, as a row: torch index, allocated, active, reserved,
# requested, NVML used, then (from later versions) the allocated and reserved peaks.
READING = row(INT, *[opt(SIZE)] * 7, least=6)


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
    def from_json(cls, value: Any, what: str = "device reading") -> DeviceReading:
        return DEVICE_READING(value, what)


DEVICE_READING = then(READING, lambda values: DeviceReading(*values), DeviceReading.to_json)


# -- the records' shapes --------------------------------------------------------------------

_SIZES = opt(list_of(pair(SIZE, COUNT)))  # the most common block sizes, [size, count]
HOLDER = Shape({"path": STR, "pattern": STR, "kind": one_of(*HOLDER_KINDS), "count": COUNT, "bytes": SIZE,
                "sizes": _SIZES})
# [why, bytes, count, type of the highest object above the holder or null]
_WHY = row(one_of(*UNHELD_WHY), SIZE, COUNT, opt(STR))
_NUMBERS = dict_of(STR, NUM)
# "new": allocated since the baseline; None in recordings from before exit searches covered all
# live memory, which held new blocks only.
GROUP = Shape({"device": opt(INT), "new": opt(BOOL), "bytes": SIZE, "count": COUNT, "frames": list_of(frame),
               "thread": opt(list_of(STR)), "holders": list_of(HOLDER), "unheld_bytes": SIZE,
               "unheld_count": opt(COUNT), "unheld_sizes": _SIZES, "unheld_why": opt(list_of(_WHY))})
# "visited": the objects the garbage collector tracked when the search began (its heap), or, where
# the exit's first sweep placed the blocks, the objects that sweep reached; "forked": made in a copy
# of the process; "phases": seconds (and counts) of its parts; "workspaces": [torch index, bytes,
# blocks] the exit's first sweep took for cuBLAS's workspaces, confirmed at exit.
INVESTIGATION = Shape({"when": one_of("growth", "exit", "oom", "phase"), "t": SECONDS, "step": opt(INT), "trace": BOOL,
                       "source": one_of("allocator", "tensors"), "all_live": opt(BOOL),
                       "candidate_bytes": SIZE,
                       "candidate_count": COUNT, "groups": list_of(GROUP), "visited": COUNT,
                       "gave_up": opt(STR), "elapsed_s": DURATION, "snapshot_s": opt(DURATION),
                       "budget_s": opt(DURATION), "tensors": opt(COUNT), "graph_nodes": opt(COUNT),
                       "graph_grads": opt(COUNT), "complete": opt(BOOL),
                       "forked": opt(BOOL), "phases": opt(_NUMBERS),
                       "workspaces": may(list_of(row(opt(INT), SIZE, COUNT)))})
SUSPICION = Shape({"t": SECONDS, "step": opt(INT), "device": INT, "by": STR, "grown_bytes": SIZE, "rate": NUM})
BASELINE = Shape({"t": SECONDS, "step": opt(INT), "why": STR, "blocks": COUNT, "elapsed_s": DURATION})
GARBAGE_TENSOR = Shape({"holder": STR, "cycle": STR, "frames": list_of(frame), "bytes": SIZE, "count": COUNT})
GARBAGE = Shape({"objects": COUNT, "types": list_of(pair(STR, COUNT)),
                 "cuda_tensor_bytes": SIZE, "cuda_tensors": COUNT, "tensors": list_of(GARBAGE_TENSOR),
                 "collected": COUNT})
THREAD = Shape({"name": STR, "entry": opt(pair(STR, STR)),
                "t0": SECONDS, "t": SECONDS, "d0": list_of(READING), "d1": list_of(READING)})
SNAPSHOT = Shape({"path": STR, "trace": BOOL})
# A collection of Python's garbage collector that freed CUDA memory, while the program ran.
COLLECTION = Shape({"t": SECONDS, "step": opt(INT), "generation": INT, "collected": COUNT,
                    "freed": list_of(pair(INT, SIZE)), "thread": STR, "stack": list_of(frame),
                    "elapsed_s": DURATION})
# PyTorch's allocator could not serve a request (its out-of-memory observer); since issue 40 also what
# the optimizers that had stepped held then ([class, parameters, gradients, state]), whether the main
# thread was inside backward() or an optimizer's step, the failing thread's grad mode, and whether the
# steps had paused. Since issue 56 the tensors passed to the outermost module's forward on the stack
# at the error ([name, shape, dtype]: `input_ids`, or `args[0]`), where one was running, and the
# per-process memory fraction in force then (1.0 where none was set).
OOM = Shape({"t": SECONDS, "step": opt(INT), "device": INT, "request_bytes": SIZE, "limit_bytes": SIZE,
             "device_free_bytes": SIZE, "allocated_bytes": opt(SIZE), "reserved_bytes": opt(SIZE),
             "active_bytes": opt(SIZE), "largest_free_block_bytes": opt(SIZE),
             "free_in_segments_bytes": opt(SIZE), "processes": list_of(pair(PID, opt(SIZE))),
             "thread": STR, "stack": list_of(frame),
             "optimizers": may(list_of(row(STR, SIZE, SIZE, SIZE))), "inside": may(opt(STR)),
             "grad_enabled": may(BOOL), "paused": may(BOOL),
             "inputs": may(list_of(row(STR, list_of(INT), STR))), "memory_fraction": may(opt(NUM)),
             # the earlier steps' inputs (_agent/readings/step_inputs.py): [name, largest shape, dtype, steps read]
             "earlier_inputs": may(list_of(row(STR, list_of(INT), STR, COUNT)))})
# Where a process started CUDA, and what kind of process it is.
CUDA_ORIGIN = Shape({"thread": opt(STR), "stack": opt(list_of(frame)),
                     "dataloader_worker": opt(Shape({"id": COUNT, "num_workers": COUNT})),
                     "multiprocessing_child": opt(BOOL)})
UNCAUGHT = Shape({"exc_type": STR, "message": STR, "stack": list_of(frame)})
COLLECTIONS_SUMMARY = Shape({"measured": COUNT, "skipped": COUNT, "freeing": COUNT, "freed_bytes": SIZE,
                             "max_freed_bytes": SIZE, "cost_s": DURATION})
# What the exit probes measured of the parts PyTorch's totals do not name (_agent/readings/parts.py), each
# null where it could not be read: bytes per torch index freed by clearing the cuBLAS workspaces,
# and reserved in private pools (CUDA graphs); the default process group's backend; the value of
# CUDA_MODULE_LOADING. Recordings from before it have none.
_PER_DEVICE = opt(list_of(pair(INT, SIZE)))  # [torch index, bytes]
# "process_groups": torch.distributed's groups alive at exit, and what their NCCL communicators said
# they hold (NCCL-tracked GPU memory, null where PyTorch or NCCL cannot say); null without
# torch.distributed.
EXIT_GROUPS = opt(Shape({"groups": COUNT, "nccl_bytes": opt(SIZE)}))
# "memory_fraction": [[torch index, fraction, limit bytes]], the per-process memory fraction in force at exit
# (torch.cuda.set_per_process_memory_fraction; 1.0 where none was set); "graph_pools": [[torch index, pools,
# reserved, allocated]], CUDA graphs' private pools (_agent/parts.graph_pools); both absent from recordings
# before issue 56.
PARTS = Shape({"cublas_workspaces": _PER_DEVICE, "private_pools": _PER_DEVICE, "dist_backend": opt(STR),
               "module_loading": opt(STR), "process_groups": may(EXIT_GROUPS),
               "memory_fraction": may(opt(list_of(row(INT, NUM, SIZE)))),
               "graph_pools": may(opt(list_of(row(INT, INT, SIZE, SIZE))))})
# The garbage collector's state: enabled when the process ended, its first threshold, and the
# samples that found it disabled (gc.disable() in effect). Recordings from before it have none.
# Since 2026-11-28: the agent's readings after which it could not put the collector's count back
# (none left neutral.py's ballast to), and the ballast left (null before CUDA started).
COLLECTOR = Shape({"enabled_at_exit": opt(BOOL), "threshold": opt(INT), "off_samples": opt(COUNT),
                   "samples": opt(COUNT), "count_left_higher": may(INT), "ballast": may(opt(INT))})
# Other GPU libraries (_agent/readings/libraries.py): one imported, and when; a preallocating library's pool on
# a device, from its own statistics; the live arrays of other libraries by type, [type, count, bytes].
LIBRARY = Shape({"t": SECONDS, "name": STR})
LIBRARY_POOL = Shape({"name": STR, "device": INT, "bytes": SIZE, "field": STR, "in_use_bytes": opt(SIZE)})
# What the agent wrote as the process ended.
# When the exit probes ran (_agent/threads.py): at the start of the interpreter's shutdown, before it
# joined the threads it names (executors' idle workers), or, where a non-daemon thread was still at
# work (`waiting` names it), from the agent's atexit hook after the joins. Absent from recordings
# before it, and null where the shutdown's hook did not run.
SHUTDOWN = Shape({"before_shutdown": BOOL, "threads_joined": COUNT, "waiting": list_of(STR)})
# The longest time between two step ends after the first five, as the program felt it (_agent/readings/felt.py):
# the step it ended at, the agent's work inside it, the collections that ran inside it (seconds, and the
# oldest generation among them, null where none ran), the median of the 16 gaps before it (null where
# none), and the gaps counted; where each step's first module call was read, the longest gap between two
# steps' starts and the step it began (absent before 2026-12-02's fifteenth session, null where none
# was read). Absent from recordings before issue 57. Since 2026-12-03's seventeenth session: the agent's
# work in each gap by its part (AGENT_PARTS, only those that ran), and for the starts' gap what ran in it,
# the median before it and the gaps counted, as for the ends' (absent where no start was read).
_AGENT_PARTS = dict_of(one_of(*AGENT_PARTS), DURATION)
STEP_GAPS = Shape({"step_gap_max_s": DURATION, "step_gap_max_step": COUNT, "step_gap_agent_s": DURATION,
                   "step_gap_agent_parts": may(_AGENT_PARTS),
                   "step_gap_collection_s": DURATION, "step_gap_collection_generation": opt(INT),
                   "step_gap_typical_s": opt(DURATION), "step_gaps": COUNT,
                   "step_start_gap_max_s": may(opt(DURATION)), "step_start_gap_max_step": may(opt(COUNT)),
                   "step_start_gap_agent_s": may(DURATION), "step_start_gap_agent_parts": may(_AGENT_PARTS),
                   "step_start_gap_collection_s": may(DURATION), "step_start_gap_collection_generation": may(opt(INT)),
                   "step_start_gap_typical_s": may(opt(DURATION)), "step_start_gaps": may(COUNT)})
EXIT_INFO = Shape({"uncaught": opt(UNCAUGHT), "samples": opt(COUNT), "samples_skipped": opt(COUNT),
                   "collections": opt(COLLECTIONS_SUMMARY), "out_of_memory": opt(COUNT),
                   "cost": opt(_NUMBERS), "parts": opt(PARTS), "collector": may(opt(COLLECTOR)),
                   "libraries": may(opt(list_of(LIBRARY_POOL))),
                   "foreign_arrays": may(opt(list_of(row(STR, COUNT, SIZE)))),
                   "shutdown": may(opt(SHUTDOWN)), "step_gaps": may(opt(STEP_GAPS))})
SUSPECT = Shape({"kind": one_of(*SUSPECT_KINDS), "bytes": SIZE, "count": opt(COUNT),
                 "where": opt(frame), "stack": list_of(frame), "thread": opt(list_of(STR)),
                 "holders": list_of(HOLDER), "unheld_bytes": opt(SIZE), "summary": STR, "remedy": STR})

# torch.distributed's process groups changed in number (_agent/readings/process_groups.py): the count, the
# backends; the first record with groups also the world size, NCCL's version and the NCCL_* variables
# that size its memory. Recordings from before issue 29 have none.
GROUPS = Shape({"t": SECONDS, "step": opt(INT), "groups": COUNT, "backends": list_of(STR), "world_size": opt(COUNT),
                "nccl_version": opt(STR), "nccl_env": opt(dict_of(STR, STR))})

# A new high of the process's memory on one device (_agent/peak/peak.py): the allocator's figures, the
# optimizers' parameters, gradients and state ([class, parameters, gradients, state] each), where
# the main thread was. Its probe: what the program's names held then, by category, [holder, bytes,
# line] each. Recordings from before issue 31 have none.
PEAK = Shape({"n": INT, "t": SECONDS, "step": opt(INT), "device": INT, "allocated": opt(SIZE), "reserved": opt(SIZE),
              "nvml": opt(SIZE), "allocated_peak": opt(SIZE), "inactive_split": opt(SIZE), "parameters": SIZE,
              "gradients": SIZE, "optimizer_state": SIZE,
              "optimizers": list_of(row(STR, SIZE, SIZE, SIZE)),
              "where": opt(STR), "inside": opt(STR), "paused": BOOL})
# [holder, bytes, line]; from issue 31's second part also the tensors counted and the autograd graph
# nodes reached from them ("graph_holders": the holders whose tensors carry graphs, most first), and
# since 2026-11-25 (its last recordings had the nodes) instead of the nodes, 0, the length of the
# chain of one operation the graph repeats (a running sum's additions; `graph_links`: read in all).
_HELD = list_of(row(STR, SIZE, opt(STR), COUNT, COUNT, COUNT, least=3))
PEAK_PROBE = Shape({"n": INT, "t": SECONDS, "elapsed_s": DURATION, "stopped": may(opt(STR)), "graphs": may(COUNT),
                    "graph_nodes": may(COUNT), "graph_links": may(COUNT), "graph_holders": may(_HELD),
                    "error": may(STR),
                    **{k: may(_HELD) for k in ("parameters", "temporaries", "kept-tensors")},
                    **{f"{k}_bytes": may(SIZE) for k in ("parameters", "temporaries", "kept-tensors")}})
# A holder search during the run that was not made (_agent/search/forked.py `declined`): why, and for a copy
# that would have paused the program too long, the estimate, the limit and the process's own memory.
# Recordings from before issue 31 have none (the reason was an agent error then).
DECLINED = Shape({"t": SECONDS, "step": opt(INT), "when": one_of("growth", "oom", "phase"), "why": STR,
                  "pause_s": opt(DURATION), "limit_s": opt(DURATION), "private_bytes": opt(SIZE)})
# The call that turned PyTorch's allocation history on or off took `elapsed_s` on the program's (or
# the agent's) thread; absent from recordings from before issue 31.
TRACE = Shape({"t": SECONDS, "step": opt(INT), "why": STR, "ok": BOOL, "error": opt(STR), "elapsed_s": may(DURATION)})

# Freed blocks held for stream work at exit, on one device (_agent/readings/streams.py): the gap `active -
# allocated` at the end, what was still held once the allocator had processed its completed events
# (work unfinished at exit), the streams holding it ([handle, bytes, the program's name for it, seconds
# from then until it finished]), the wait for the device's work and the gap after it. Recordings from
# before issue 42 have none.
PENDING = Shape({"t": SECONDS, "device": INT, "before_bytes": SIZE, "unfinished_bytes": SIZE,
                 "streams": list_of(row(INT, SIZE, opt(STR), opt(SECONDS))), "wait_s": opt(DURATION),
                 "after_sync_bytes": opt(SIZE)})
# Where a process's CUDA context was read before NCCL could set up (_agent/readings/process_groups.py): the
# device, NVML's figure for the process and PyTorch's reserved bytes then; device -1 and no figures
# where init_process_group had no device_id (NCCL then sets up after the first allocation).
# Recordings from before issue 42 have none.
CONTEXT = Shape({"t": SECONDS, "device": INT, "nvml": opt(SIZE), "reserved": opt(SIZE), "why": STR})

# PyTorch's allocation events kept from CUDA's start (_agent/peak/history.py): whether they could be, the
# ring's size, whether backward() is marked. A reading at a new high of the allocated peak counter
# (_agent/peak/replay.py): the highest allocated total the events lead back to, the segments' bytes then,
# how long before the reading it came (`peak_before_s`), what part of a step it fell in, whether the events reached back to it (`complete`),
# and what was live then by part: bytes, blocks and when the first and last were made (seconds before
# the reading); `joined`, a gathered block as large as the gathered ones made before it (a
# concatenation made while its pieces were held). Recordings from before issue 40's peak have none.
HISTORY = Shape({"t": SECONDS, "ok": BOOL, "error": opt(STR), "capacity": COUNT, "backward_marked": BOOL})
_HISTORY_PART = Shape({"bytes": SIZE, "blocks": COUNT, "first_before_s": opt(SECONDS),
                       "last_before_s": opt(SECONDS)})
PEAK_HISTORY = Shape({"n": INT, "t": SECONDS, "step": may(opt(INT)), "device": INT, "error": may(STR),
                      "counter": may(SIZE), "allocated_peak": may(SIZE), "reserved_at_peak": may(opt(SIZE)),
                      "allocated": may(SIZE), "peak_before_s": may(opt(SECONDS)),
                      "stretch_before_s": may(opt(SECONDS)),  # (written by the first recordings only)
                      "phase": may(one_of(*HISTORY_PHASES)), "complete": may(BOOL), "ring_full": may(BOOL),
                      "events": may(COUNT), "capacity": may(COUNT), "backward_marked": may(BOOL),
                      "parts": may(dict_of(one_of(*HISTORY_PARTS), _HISTORY_PART)),
                      "joined": may(opt(Shape({"bytes": SIZE, "pieces": COUNT, "pieces_bytes": SIZE,
                                               "held": may(BOOL)}))),
                      "loop": may(opt(STR)), "loop_called_at": may(opt(STR)), "loop_holder": may(opt(STR)),
                      "snapshot_s": may(DURATION), "figures_s": may(DURATION), "replay_s": may(DURATION),
                      "freed_s": may(DURATION), "taken_s": may(DURATION), "put_off": may(BOOL), "walked_step": may(INT), "walk_parts": may(INT),
                      "elapsed_s": may(DURATION)})
# What saved one step's activations (_agent/peak/saved_by.py): the modules whose forward made them, by
# folded name, largest first, the rest's bytes, what no module made, and the line that called the
# outermost forward; `read_step`, the step whose end read it. Recordings from before it have none, and
# those before 2026-11-28 no `read_step`.
FORWARD_MODULES = Shape({"t": SECONDS, "step": INT, "read_step": may(INT), "device": INT, "error": may(STR),
                         "activations": may(SIZE),
                         "outside_modules": may(SIZE), "rest": may(SIZE), "forwards": may(COUNT), "full": may(BOOL),
                         "line": may(opt(Shape({"file": STR, "line": INT, "function": STR}))),
                         "modules": may(list_of(Shape({"name": STR, "bytes": SIZE, "blocks": COUNT}))),
                         "snapshot_s": may(DURATION), "elapsed_s": may(DURATION)})

# agent record type -> (key in a process's root-cause data, shape); _SINGLE keys hold one record
RECORDS = {"suspect": ("suspicions", SUSPICION), "trace": ("traces", TRACE), "baseline": ("baselines", BASELINE),
           "investigation": ("investigations", INVESTIGATION), "thread": ("threads", THREAD),
           "garbage": ("garbage", GARBAGE), "snapshot": ("snapshot", SNAPSHOT),
           "collection": ("collections", COLLECTION), "oom": ("ooms", OOM), "library": ("libraries", LIBRARY),
           "groups": ("groups", GROUPS), "peak": ("peaks", PEAK), "peak_probe": ("peak_probes", PEAK_PROBE),
           "declined": ("declined", DECLINED), "pending": ("pending_streams", PENDING),
           "context": ("contexts", CONTEXT), "history": ("histories", HISTORY),
           "peak_history": ("peak_histories", PEAK_HISTORY), "forward_modules": ("forward_modules", FORWARD_MODULES)}
_SINGLE = ("garbage", "snapshot")
# Root records added since reports were first written: written only where there are some, so that an
# older report reads back to itself.
NEW_ROOT_RECORDS = ("libraries", "groups", "peaks", "peak_probes", "declined", "pending_streams", "contexts",
                    "histories", "peak_histories", "forward_modules")


def empty_root() -> dict:
    return {"suspicions": [], "traces": [], "baselines": [], "investigations": [], "threads": [],
            "garbage": None, "snapshot": None, "collections": [], "ooms": [], "libraries": [], "groups": [],
            "peaks": [], "peak_probes": [], "declined": [], "pending_streams": [], "contexts": [],
            "histories": [], "peak_histories": [], "forward_modules": []}


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


# A process's root-cause data in a recording: each kind of record, a list of them or the one.
ROOT = Shape({name: (opt(shape) if name in _SINGLE else
                     (since if name in NEW_ROOT_RECORDS else absent)(null_as([], list_of(shape)), []))
              for name, shape in RECORDS.values()})
SUSPECTS = null_as([], list_of(SUSPECT))


def parse_root(obj: Any, what: str = "root cause") -> dict:
    return ROOT(obj, what)


def parse_suspects(obj: Any) -> list[dict]:
    return SUSPECTS(obj, "suspects")
