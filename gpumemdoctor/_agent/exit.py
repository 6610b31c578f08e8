"""The end of a process: the exit probes, each followed by a reading, then the exit record.

In order: `end` (the memory as the program left it, with the parts parts.py reads: CUDA graphs'
private pools, NCCL, CUDA's module loading); the blocks freed but held for stream work, told
apart into finished and unfinished work (streams.py, a `pending` record); the allocator snapshot
(--snapshot);
a holder search over all live memory (after growth or with --trace on, or when
LIVE_SEARCH_MIN_BYTES of tensors are alive; its first sweep, first_sweep.py, places every block on a
reachable tensor in most programs, all but cuBLAS's workspaces, which are confirmed after the last
reading: `_confirm`); `gc` (what gc.collect() freed, looked at first:
garbage.py; not collected when that search found no memory only garbage could hold, or when no
tensor is allocated and no other GPU library was imported); `sync` (work
finished on side streams); `empty_cache` (the cache given back); then, after the last reading, the
cuBLAS workspaces (what clearing them frees). The parts go into the exit record's `parts`.
What each re-measure gives back says what held the memory. Automatic collection is held off
until the garbage has been looked at.

A process that leaves through os._exit() runs no atexit hook: `hard_exit`, called from the
agent's stand-in for os._exit (`install_hard_exit`), writes one last reading first, so that the
report has the memory as the program left it and knows that its end was a hard one.
"""
from __future__ import annotations

import gc
import os
import sys
import time

from .readings import parts as parts_of
from .readings import streams
from .readings.events import uncaught
from .readings.libraries import KNOWN
from ..contract import ENV_SNAPSHOT

# A run in which no growth was seen is searched at exit when its live tensors reach this: the
# answer to "why does nvidia-smi still show the memory I freed?".
LIVE_SEARCH_MIN_BYTES = 64 << 20


def install_hard_exit(current) -> None:
    """Put a stand-in for os._exit in place, once per interpreter: it takes the last reading of
    the process's agent (`current()`), then calls the real os._exit. Nothing else changes: no
    flushing, no atexit hooks, the same status."""
    real = os._exit
    if getattr(real, "_gpumemdoctor", False):
        return

    def _exit(status):
        try:
            agent = current()
            if agent is not None:
                hard_exit(agent, status)
        except BaseException:
            pass
        real(status)

    _exit._gpumemdoctor = True
    _exit.__name__, _exit.__qualname__, _exit.__doc__ = real.__name__, real.__qualname__, real.__doc__
    os._exit = _exit


def hard_exit(agent, status) -> None:
    """os._exit(status) in the process that started the agent: one last reading (the lock waited
    for briefly, never long) and the record of the hard exit. The exit probes cannot run."""
    shared = agent.shared
    if shared.pid != os.getpid() or shared.finished:
        return
    shared.finished = True
    rows = _last_reading(agent.sampler, agent.history) if shared.devices else []
    shared.channel.write({"type": "hard-exit", "t": time.monotonic(), "status": status if isinstance(status, int)
                          else None, "steps": shared.steps, "d": rows})


def _last_reading(sampler, history) -> list:
    """The devices' rows read once more (the sampler's lock waited for briefly, never long), and a
    history reading whose walk was put off to a later step made now."""
    if sampler.neutral is None:
        return []
    locked = sampler.lock.acquire(timeout=0.05)
    try:
        rows = sampler.read_devices()
    except Exception:
        rows = []
    finally:
        if locked:
            sampler.lock.release()
    if history.taken is not None:  # a reading whose walk was put off to a later step
        try:
            history.finish()
        except Exception:
            pass
    return rows


def finish(agent) -> None:
    """The exit probes, once, in the process that started the agent; then the exit record. Called at
    the start of the interpreter's shutdown (threads.install_shutdown_hook), before it joins the
    program's threads, or else from the agent's atexit hook; the record's `shutdown` says which."""
    shared = agent.shared
    if shared.pid != os.getpid() or shared.finished:
        return
    shared.finished = True
    parts: dict = {}
    collector = collector_state(agent.sampler, agent.history)  # before the probes hold automatic collection off
    if agent.collections is not None:
        agent.collections.paused = True  # the exit probes' own collections are not the program's
    try:
        agent.timer.stop()
        torch = shared.torch
        if torch is not None and shared.devices and torch.cuda.is_initialized():
            snapshot = os.path.join(shared.run_dir, f"snapshot-{shared.pid}.pickle") if shared.run_dir else None
            _exit_probes(torch, parts, sampler=agent.sampler, channel=shared.channel, watch=agent.growth_watch,
                         peak_watch=agent.peak_watch, history=agent.history, trace=agent.trace, cost=shared.cost,
                         snapshot_path=snapshot)
    except Exception as exc:
        shared.channel.write({"type": "error", "where": "exit probes", "message": repr(exc)[:500]})
    died_of = None
    try:
        died_of = uncaught()
    except Exception:
        pass
    shared.channel.write(exit_record(agent, parts, died_of, collector, _libraries(agent.sampler.first_pools)))
    if agent.server is not None:
        agent.server.close()


def exit_record(agent, parts: dict | None, died_of: dict | None, collector: dict | None, libraries: dict) -> dict:
    """The process's last record: its steps, samples, collections, errors and costs (and what the exit
    probes measured, `parts`, where they ran; the agent taken out of a running program has none)."""
    shared, sampler = agent.shared, agent.sampler
    return {"type": "exit", "t": time.monotonic(), "steps": shared.steps,
            "explicit_steps": shared.explicit_steps, "cupy": _cupy_pool(), "parts": parts or None,
            "uncaught": died_of, "samples": sampler.samples, "samples_skipped": sampler.samples_skipped,
            "collections": agent.collections.summary() if agent.collections is not None else None,
            "out_of_memory": agent.oom.records, "collector": collector, **libraries,
            "shutdown": agent.shutdown, "step_gaps": _step_gaps(shared.felt),
            "cost": {k: round(v, 6) for k, v in {**shared.cost, **sampler.cost.windows(),
                                                 "interval_at_exit_s": sampler.interval_s}.items()}}


def _step_gaps(felt) -> dict | None:
    """The longest step gap as the program felt it (felt.py), where steps were counted."""
    try:
        return felt.record() if felt is not None and felt.gaps else None
    except Exception:
        return None


def _libraries(first_pools: list[dict]) -> dict:
    """Other GPU libraries' pools and live arrays, where one of them was imported (libraries.py);
    a pool no longer readable at exit is the one read at PyTorch's first allocation."""
    from .readings.libraries import KNOWN, foreign_arrays, pools

    if not any(name in sys.modules for name in KNOWN):
        return {}
    try:
        return {"libraries": pools() or first_pools, "foreign_arrays": foreign_arrays()}
    except Exception:
        return {"libraries": first_pools} if first_pools else {}


def collector_state(sampler, history) -> dict | None:
    """The garbage collector as the program left it, how often the samples found it off, and how the
    agent's own readings stayed neutral to it (neutral.py): the readings after which the count could
    not be put back (no ballast left), and the ballast left."""
    try:
        neutral, bulk = sampler.neutral, history.bulk
        short = (neutral.short if neutral is not None else 0) + (bulk.short if bulk is not None else 0)
        return {"enabled_at_exit": gc.isenabled(), "threshold": gc.get_threshold()[0],
                "off_samples": sampler.collector_off, "samples": sampler.samples,
                "count_left_higher": short, "ballast": None if neutral is None else len(neutral.ballast)}
    except Exception:
        return None


def _exit_probes(torch, parts: dict, *, sampler, channel, watch, peak_watch, history, trace, cost: dict,
                 snapshot_path: str | None) -> None:
    """The probes in order (the module's docstring), with the agent's parts they use: the sampler's
    readings, the record file, the growth watch (its searches), the peak watch and the history (the
    end as a new high), the trace (its mode, whether stacks were on), the costs (each probe's time)
    and where --snapshot's file goes (None without a run folder)."""
    # No automatic collection until the garbage has been looked at: the snapshot and the
    # search allocate, and a collection they set off would free the cycles unseen.
    collecting = gc.isenabled()
    gc.disable()
    mark = time.perf_counter()

    def took(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        cost[f"exit_{name}_s"] = now - mark
        mark = now

    try:
        end = sampler.read_devices()  # the memory as the program left it
        channel.write({"type": "p", "phase": "end", "t": time.monotonic(), "d": end})
        peak_watch.at_exit()  # the end as a new high: a leak's peak is often its end
        history.at_exit()  # the last steps' allocated peak, if it rose past the last reading
        took("peak")
        stats = sampler.stats_fn or torch.cuda.memory_stats_as_nested_dict
        # Freed blocks still held for stream work: finished work not yet processed, or unfinished
        # work (streams.py). Told apart now, before the probes below give the work time to finish.
        streams.settle(torch, stats, program_devices(end), channel.write)
        took("streams")
        touched = [row[0] for row in end]
        parts.update(parts_of.measure_at_end(torch, stats, touched))
        took("parts")
        watch.wait_for_copies()  # a search still under way in a copy of the process
        if os.environ.get(ENV_SNAPSHOT) == "1" and snapshot_path:
            _dump_snapshot(torch, snapshot_path, trace, channel.write)
            took("snapshot")
        # One search at exit covers every live block, those new since the baseline (a
        # leak's) and the rest (what a program that grew nothing still holds).
        searched = budget = None
        if watch.suspected or trace.mode == "on":
            searched = watch.search("exit", hold=True)
        elif channel.fd is not None and any((row[1] or 0) >= LIVE_SEARCH_MIN_BYTES for row in end):
            budget = "live"
            searched = watch.search("exit", budget=budget, hold=True)
        took("search")
        # Blocks the search took for cuBLAS's workspaces (first_sweep.py): confirmed below.
        guessed = searched.get("workspaces") if searched else None
        if searched and not guessed:
            watch.write_exit_search(searched)
        if searched and searched.get("complete"):
            skip_gc = "the exit search found no CUDA memory that only garbage could hold"
        elif guessed:
            skip_gc = ("the exit search found no CUDA memory that only garbage could hold: it placed every "
                       "block on a reachable tensor but cuBLAS's workspaces")
        elif all(row[1] == 0 for row in end) and not any(name in sys.modules for name in KNOWN):
            skip_gc = "no tensor was allocated at exit and no other GPU library was imported"
        else:
            skip_gc = None
        held = None
        try:
            held = _probe(torch, end, took, sampler.read_devices, channel.write,
                          lambda: _collect_garbage(torch, trace, watch.tensor_kind, channel.write), skip_gc,
                          hold=bool(guessed))
            parts["cublas_workspaces"] = parts_of.cublas_workspaces(torch, stats, touched)
            took("cublas")
        finally:
            if guessed:  # also after a probe that failed: then nothing confirms them
                _confirm(watch, channel.write, searched, held, parts.get("cublas_workspaces"), budget)
                took("confirm")
    finally:
        if collecting:
            gc.enable()


def _confirm(watch, write, searched: dict, held: dict | None, cleared: list | None, budget: str | None) -> None:
    """Whether the blocks the exit search took for cuBLAS's workspaces were exactly those: clearing
    the workspaces (after the last reading) gave back, on each device, the bytes of the blocks it
    took. Every workspace is a block no tensor holds, so they are among those blocks, and the same
    total leaves room for nothing else. Then the search's record and the `gc` probe it let be
    skipped are written. Else the full search is made now (its blocks are those of the skipped
    collection less the cleared workspaces) and written instead: where it places every block, or
    finds it held by no Python object, the skip is proven all the same; where not, no `gc` probe is
    written (what garbage held is not known) and an error says why. `watch`: the growth watch, which
    searches and writes the search's record; `write`: the record file's."""
    given = {index: n for index, n in cleared or []}
    if all(given.get(device) == n for device, n, _count in searched["workspaces"]):
        watch.write_exit_search(searched)
        if held is not None:
            write(held)
        return
    full = watch.search("exit", budget=budget, first=False)
    if full is not None and full.get("complete"):
        if held is not None:
            write(held)
        return
    took = ", ".join(f"{n} bytes in {count} blocks on device {device}" for device, n, count in searched["workspaces"])
    write({"type": "error", "where": "exit probes", "message": (
        f"the exit search took {took} for cuBLAS's workspaces, but clearing them gave back "
        f"{cleared if cleared is not None else 'nothing that could be read'}, and the full search then "
        "left blocks it could not place: the exit's collection was skipped unproven, and what garbage held "
        "is not known")})


def _probe(torch, end: list, took, read, write, collect, skip_gc: str | None = None,
           hold: bool = False) -> dict | None:
    """Re-measure after each thing that can give memory back, to say what held it. The collection
    is skipped (`skip_gc` says why) when no garbage can hold CUDA memory: the exit search placed
    every block on a reachable object or found it held by no Python object, or no tensor was
    allocated at all and no other GPU library (CuPy's arrays in a cycle) was imported. A full
    collection of a big heap (0.6 s at a million objects on an H100 machine, 0.38 s at the end of
    a Lightning run that had freed everything) would only delay the end for nothing. With `hold`,
    a skipped collection's record is returned, not written (exit._confirm writes it). `read`: the
    sampler's reading of the devices; `write`: the record file's; `collect`: the collection, having
    looked at what it frees (`_collect_garbage`), which returns how many objects it collected."""
    touched = program_devices(end)  # never allocate on a device the program left alone
    held = None
    if skip_gc:
        held = {"type": "p", "phase": "gc", "t": time.monotonic(), "collected": None, "d": read(),
                "skipped": skip_gc}
        if not hold:
            write(held)
            held = None
    else:
        collected = collect()
        write({"type": "p", "phase": "gc", "t": time.monotonic(), "collected": collected, "d": read()})
    took("garbage")
    for index in touched:
        torch.cuda.synchronize(index)
        streams.allocate_one(torch, index)  # blocks held for finished stream work are reclaimed then
    write({"type": "p", "phase": "sync", "t": time.monotonic(), "d": read()})
    torch.cuda.empty_cache()
    write({"type": "p", "phase": "empty_cache", "t": time.monotonic(), "d": read()})
    took("release")
    return held


def program_devices(end: list) -> list[int]:
    """The torch indexes of the `end` rows where the program's allocator reserved memory (now or at
    its peak). A row with NVML's memory only is a context the program made there and never used (a
    stray one): synchronizing and allocating on it would make the agent the program's user there."""
    return [row[0] for row in end if row[3] or (len(row) > 7 and row[7])]


def _collect_garbage(torch, trace, tensor_kind, write) -> int:
    """gc.collect(), having looked at what it frees: the types and the CUDA tensors in the cycles
    (their stacks where the trace was on; `tensor_kind`: the growth watch's, which tells tensors)."""
    try:
        from .search.blocks import Spans, live_blocks
        from .garbage import collect_garbage

        frames_of = None
        if trace.on or trace.was_on:
            frames_of = Spans((b["address"], b["size"], b["frames"]) for b in live_blocks(torch) if b["frames"])
        report = collect_garbage(tensor_kind(), frames_of)
    except Exception as exc:
        write({"type": "error", "where": "garbage", "message": repr(exc)[:500]})
        return gc.collect()
    write({"type": "garbage", "t": time.monotonic(), **report})
    return report["collected"]


def _dump_snapshot(torch, path: str, trace, write) -> None:
    """PyTorch's allocator snapshot into the run folder (--snapshot), and a record that says where."""
    try:
        from .search.blocks import no_inductor_import

        with no_inductor_import(torch):
            torch.cuda.memory._dump_snapshot(path)
        os.chmod(path, 0o600)
        write({"type": "snapshot", "t": time.monotonic(), "path": path, "trace": trace.on})
    except Exception as exc:
        write({"type": "error", "where": "snapshot", "message": repr(exc)[:500]})


def _cupy_pool():
    """CuPy's default pool on CuPy's current device (the CUDA device number, as torch's index)."""
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return None
    try:
        pool = cupy.get_default_memory_pool()
        found = {"used_bytes": int(pool.used_bytes()), "total_bytes": int(pool.total_bytes())}
    except Exception:
        return None
    try:
        found["device"] = int(cupy.cuda.runtime.getDevice())
    except Exception:
        found["device"] = None
    return found
