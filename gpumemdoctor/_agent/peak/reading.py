"""One reading of PyTorch's allocation events (history.py decides when), in two parts that may fall
in two steps of the program, so that neither pause is the whole reading's:

- `take`, at the reading's moment: PyTorch's statistics, its allocator snapshot with the events only
  (`events_only`), the optimizers' storages (where the walk is put off, their gradients only), the
  marks and the library loop the program is in. The snapshot's entries are kept (history.py holds
  them) until
- `walk`, at once or over the next step samples, as long as history.WALK_SLICE_S allows at each:
  the parameters' and optimizer state's storages where the take left them out, the walk back
  (replay.Walk, which goes on where it stopped), the snapshot let go (LET_GO_CHUNK entries at a
  time), the holder of a loop's gathered result where the program is still in that
  loop (loop_holder.py; such a walk is made at once), and the `peak_history` record as one JSON line.

Both run inside neutral.Bulk with automatic collection held off, each leaving the collector's count
and the free lists as it found them (the entries kept between them are untracked dicts in one list,
which the program's collections pass over). Costs per entry (H100): the snapshot 0.6-1.2 us, the
walk 0.5 us, letting it go 0.2 us; the `peak_history` record has each part's time.
"""
from __future__ import annotations

import os
import sys
import time
from json.encoder import encode_basestring

from . import replay, saved_by
from ..search import loop_holder
from ..neutral import HELD_SPARE
from .peak import ALL_STORAGES, GRADIENTS, PARAMETERS, STATE, place

RETRIES = 3  # readings made again because the ring did not reach back to the peak
NO_POOL = (1 << 60, 1 << 60)  # a memory pool id no segment has: the snapshot's events without its segments
# A taken reading: a list (no tuple: Bulk counts them), read by these indices.
INDEX, SNAPSHOT, TRACE, COUNTER, ALLOCATED, RESERVED, STORAGES, SIZES, TIMES, KINDS, NOW, NOW_US, STEP, \
    LOOP, CALLED, SNAPSHOT_S, FIGURES_S, TAKEN_S, WALK, REPLAY_S, PARTS, FOUND, FREED_S, OPTIMIZERS = range(24)
LET_GO_CHUNK = 512  # the snapshot's entries let go between two looks at the clock
# Library loops that gather a model's outputs on the GPU, whose own switches say how not to:
# (file's ending, function) -> the name a reading records (diagnosis/allocated_peak.py has the remedy).
LIBRARY_LOOPS = {(os.path.join("transformers", "trainer.py"), "evaluation_loop"): "transformers.Trainer.evaluation_loop",
                 (os.path.join("transformers", "trainer.py"), "prediction_loop"): "transformers.Trainer.prediction_loop",
                 # Lightning's validation (lightning.pytorch and pytorch_lightning): _EvaluationLoop.run
                 (os.path.join("loops", "evaluation_loop.py"), "run"): "lightning.validation"}
# The modules of LIBRARY_LOOPS' loops: a reading walks the main thread's frames only where one is imported.
LOOP_MODULES = ("transformers.trainer", "lightning.pytorch.loops.evaluation_loop",
                "pytorch_lightning.loops.evaluation_loop")


def take(history, index: int, put_off: bool = False):
    """The reading's first part (see the module's docstring), as a list, or an error record's line.
    `history`: the History reading (its shared state, its sampler's stats, its peak watch's figures).
    A reading whose walk is `put_off` reads the optimizers' gradients only: their parameters and
    state, which stay while they step, are read at the walk's first part (OPTIMIZERS: how many
    optimizers had stepped at this moment)."""
    shared = history.shared
    torch = shared.torch
    began = time.perf_counter()
    try:
        stats = history.sampler.stats_fn(index)
        counter = stats["allocated_bytes"]["all"]["peak"]
        allocated = stats["allocated_bytes"]["all"]["current"]
        reserved = stats["reserved_bytes"]["all"]["current"]
        del stats
        started = time.perf_counter()
        snapshot = events_only(torch, history.incref)
        snapshot_s = time.perf_counter() - started
        traces = snapshot["device_traces"]
        trace = traces[index] if index < len(traces) else []
        del traces
        storages: dict = {}
        sizes: dict = {}
        stepped = len(history.peak_watch.optimizers) if put_off else None
        history.peak_watch.optimizer_figures(index, [0, 0, 0], storages, sizes,
                                             GRADIENTS if put_off else ALL_STORAGES)
        times: list = []
        kinds: list = []
        history.marks.ordered(times, kinds, trace[0]["time_us"] if trace else 0)
        loop = called = None
        if any(m in sys.modules for m in LOOP_MODULES):  # (walking the frames makes frame objects)
            loop, called, frame = loop_of(sys._getframe(1))
            del frame
        now_us = time.time_ns() // 1000
        now = time.monotonic()  # (with now_us: the two clocks read together)
        figures_s = time.perf_counter() - started - snapshot_s
        return [index, snapshot, trace, counter, allocated, reserved, storages, sizes, times, kinds, now, now_us,
                shared.steps, loop, called, snapshot_s, figures_s, time.perf_counter() - began, None, 0.0, 0,
                None, 0.0, stepped]
    except Exception as exc:
        return error_line(history.readings, index, exc)


def walk(history, taken: list, put_off: bool, deadline=None):
    """The reading's second part, at once or at later steps' samples (`put_off`): its `peak_history`
    record as one JSON line, without `elapsed_s` (history.py adds it), or "" where the events hold no
    allocation; lets the snapshot go. With a `deadline` (time.perf_counter()), the walk back
    (replay.Walk) and the letting go stop there and this returns None: the next call goes on from
    where it stopped (`walk_parts` in the record: the calls it took; `replay_s`: their walk, the
    storages read at the first among it)."""
    index = taken[INDEX]
    try:
        started = time.perf_counter()
        taken[PARTS] += 1
        w = taken[WALK]
        if w is None:  # (the first part)
            if taken[OPTIMIZERS] is not None:  # the storages that stay, of the optimizers that had stepped
                history.peak_watch.optimizer_figures(index, [0, 0, 0], taken[STORAGES], taken[SIZES],
                                                     PARAMETERS | STATE, taken[OPTIMIZERS])
            trace = taken[TRACE]
            w = taken[WALK] = replay.Walk(trace, taken[ALLOCATED], taken[TIMES], taken[KINDS], taken[STORAGES],
                                          taken[SIZES], taken[RESERVED], taken[COUNTER],
                                          len(trace) >= history.ring.capacity)
            del trace
        if w is not False:  # (False: walked, the snapshot being let go)
            done = w.run(deadline)
            taken[REPLAY_S] += time.perf_counter() - started
            if not done:
                return None
            taken[FOUND] = w.result
            taken[WALK] = False
            del w
            started = time.perf_counter()
        gone = _let_go(history, taken, put_off, deadline)
        taken[FREED_S] += time.perf_counter() - started
        if not gone:
            return None
        found, taken[FOUND] = taken[FOUND], None
        replay_s = taken[REPLAY_S]
        freed_s = taken[FREED_S]
        if found is None:
            return ""
        if not found["complete"] and found["ring_full"] and history.retries < RETRIES:
            history.retries += 1
            history.retry = index  # (read again at the next step sample, when the ring holds a step)
        activations = found["parts"].get("activations")
        if activations is not None and activations["bytes"] >= saved_by.MIN_BYTES and found["complete"]:
            history.forward_watch.arm(index)  # the modules that saved them, from the next step
        now_us = taken[NOW_US]
        parts = ""
        for name in found["parts"]:
            p = found["parts"][name]
            item = (f'{encode_basestring(name)}:{{"bytes":{p["bytes"]},"blocks":{p["blocks"]},'
                    f'"first_before_s":{_before(p["first_us"], now_us)},'
                    f'"last_before_s":{_before(p["last_us"], now_us)}}}')
            parts = f"{parts},{item}" if parts else item
        reserved_at = found["reserved_at_peak"]
        joined = found["joined"]
        loop = _loop_fields(history.shared.torch, taken[LOOP], taken[CALLED], joined)
        joined = "null" if joined is None else (f'{{"bytes":{joined["bytes"]},"pieces":{joined["pieces"]},'
                                                f'"pieces_bytes":{joined["pieces_bytes"]},'
                                                f'"held":{_bool(joined["held"])}}}')
        return (f'{{"type":"peak_history","n":{history.readings},"t":{taken[NOW]!r},"step":{taken[STEP]},'
                f'"device":{index},{loop},'
                f'"counter":{taken[COUNTER]},"allocated_peak":{found["allocated_peak"]},'
                f'"reserved_at_peak":{"null" if reserved_at is None else reserved_at},'
                f'"allocated":{found["allocated_now"]},"peak_before_s":{_before(found["peak_time_us"], now_us)},'
                f'"phase":"{found["phase"]}",'
                f'"complete":{_bool(found["complete"])},"ring_full":{_bool(found["ring_full"])},'
                f'"events":{found["events"]},"capacity":{history.ring.capacity},'
                f'"backward_marked":{_bool(history.backward_marked)},"joined":{joined},"parts":{{{parts}}},'
                f'"snapshot_s":{taken[SNAPSHOT_S]!r},"figures_s":{taken[FIGURES_S]!r},"replay_s":{replay_s!r},'
                f'"freed_s":{freed_s!r},"taken_s":{taken[TAKEN_S]!r},"put_off":{_bool(put_off)},'
                f'"walked_step":{history.shared.steps},"walk_parts":{taken[PARTS]}}}')
    except Exception as exc:
        if taken[SNAPSHOT] is not None:
            _let_go(history, taken, put_off)
        return error_line(history.readings, index, exc)


def _let_go(history, taken: list, put_off: bool, deadline=None) -> bool:
    """The snapshot's entries let go, LET_GO_CHUNK at a time until `deadline` (None: all; one chunk
    at least, and the last LET_GO_CHUNK or fewer with the one before): whether all are. Where they
    were kept from an earlier run, the ballast that run spent on them is made first
    (neutral.Bulk.lift), for each chunk before it goes."""
    trace = taken[TRACE]
    if trace is not None and deadline is not None:
        while len(trace) > LET_GO_CHUNK:
            if put_off:
                history.bulk.lift(LET_GO_CHUNK)
            del trace[len(trace) - LET_GO_CHUNK:]
            if time.perf_counter() > deadline:
                del trace
                return False
    if put_off:
        history.bulk.lift((len(trace) if trace is not None else 0) + HELD_SPARE)
    del trace
    for i in (SNAPSHOT, TRACE, STORAGES, SIZES, TIMES, KINDS, WALK):
        taken[i] = None
    return True


def error_line(n: int, index: int, exc: BaseException) -> str:
    return (f'{{"type":"peak_history","n":{n},"t":{time.monotonic()!r},"device":{index},'
            f'"error":{encode_basestring(f"{type(exc).__name__}: {exc}"[:200])}}}')


def _loop_fields(torch, loop, called, joined) -> str:
    """The reading's `loop`, `loop_called_at` (taken with the snapshot) and `loop_holder` (what holds a
    concatenation's result still held in the loop, with the library's line: loop_holder.py, where
    the program is in that loop now), as JSON fields."""
    holder = None
    if loop is not None and joined is not None and joined["held"]:
        now, now_called, frame = loop_of(sys._getframe(1))
        if frame is not None and now == loop and now_called == called:
            holder = loop_holder.holder(torch.Tensor, torch.nn.Parameter, sys._getframe(), frame, joined["address"])
        del frame
    return (f'"loop":{"null" if loop is None else encode_basestring(loop)},'
            f'"loop_called_at":{"null" if called is None else encode_basestring(called)},'
            f'"loop_holder":{"null" if holder is None else encode_basestring(holder)}')


def loop_of(frame) -> tuple:
    """The library loop (LIBRARY_LOOPS) the main thread is in when a reading is made there, the
    program's line that called it (outside the loop: a callback the loop calls is the program's too)
    and the loop's frame; (None, None, None) outside one."""
    depth = 0
    while frame is not None and depth < 200:
        code = frame.f_code
        for key in LIBRARY_LOOPS:
            if code.co_name == key[1] and code.co_filename.endswith(key[0]):
                return LIBRARY_LOOPS[key], place(frame.f_back)[0], frame
        frame = frame.f_back
        depth += 1
    return None, None, None


def events_only(torch, incref) -> dict:
    """PyTorch's allocator snapshot with the events only: a pool no segment belongs to (NO_POOL)
    leaves the segments out. Their blocks may carry stacks (trace.py's windows), whose first reading
    in a process imports torch._dynamo (6 s on an H100 machine) where the program has not. PyTorch
    2.11 takes the pool id's two items as its own references and lets them go (a second call with the
    same tuple then read freed ints: "mempool_id elements must be integers", then a crash): each call
    first gives it the references it will drop (`incref`: search.blocks.py_incref())."""
    incref(NO_POOL[0])
    incref(NO_POOL[1])
    return torch._C._cuda_memorySnapshot(NO_POOL)


def _before(us, now_us: int) -> str:
    """How long before the reading a history time (Unix microseconds) was, in seconds, or null: the
    recording's clock is another, and the reading's `t` is on it."""
    return "null" if us is None else repr(max(0.0, (now_us - us) / 1e6))


def _bool(value) -> str:
    return "true" if value else "false"
