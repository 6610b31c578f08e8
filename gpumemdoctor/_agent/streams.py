"""Memory freed in Python but still held for stream work, told apart at exit: finished or not.

PyTorch's caching allocator keeps a block that was freed while another stream still used it
(`record_stream`, FSDP's and DDP's communication streams) as *active* until the CUDA events it
recorded on those streams have completed. It looks at those events only when it next allocates
(or empties its cache): a block whose work finished long ago still counts in `active_bytes` until
then. A clean FSDP rank ends with gigabytes of such blocks, all of their work done. So `active -
allocated` at the program's end is not "unfinished work": it is finished work not yet processed,
plus unfinished work.

`settle` tells them apart, once, right after the exit probes' first reading, before anything else
can let the work finish unseen: for each device where `active > allocated`, one small allocation
(the allocator then processes every stream's completed events), a reading; what is still held is
held for work that has not finished. Then which streams hold it (the allocator's snapshot, only
then), each stream's wait timed (`Stream.synchronize`), the device synchronised, one more small
allocation, a last reading. The `pending` record says, per device: the gap at the end, the gap
after the events were processed, the streams with their bytes and how long after the end each one
finished, and the gap after synchronising. The program has ended: its streams' work is waited for
here, never while it runs.
"""
from __future__ import annotations

import sys
import time

MAX_STREAMS = 8  # streams named per device, the largest first


def settle(torch, stats, devices: list[int], write) -> None:
    """The `pending` record of each device in `devices` (torch indexes) whose allocator holds
    freed blocks for stream work at exit; `stats(index)` is PyTorch's nested memory statistics."""
    for index in devices:
        try:
            record = _settle(torch, stats, index)
        except Exception as exc:
            write({"type": "error", "where": "pending streams", "message": repr(exc)[:500]})
            continue
        if record is not None:
            write(record)


def _gap(stats, index: int) -> int:
    s = stats(index)
    return max(0, int(s["active_bytes"]["all"]["current"]) - int(s["allocated_bytes"]["all"]["current"]))


def _allocate(torch, index: int) -> None:
    """One small allocation on the device: the allocator processes its completed events first."""
    t = torch.empty(1, device=f"cuda:{index}")
    del t


def _settle(torch, stats, index: int) -> dict | None:
    started = time.monotonic()
    before = _gap(stats, index)
    if not before:
        return None
    _allocate(torch, index)
    unfinished = _gap(stats, index)
    record = {"type": "pending", "t": started, "device": index, "before_bytes": before,
              "unfinished_bytes": unfinished, "streams": [], "wait_s": None, "after_sync_bytes": None}
    if not unfinished:
        return record
    mark = time.perf_counter()
    streams = _by_stream(torch, index)
    for stream in streams[:MAX_STREAMS]:
        stream.append(_wait(torch, index, stream[0], mark))
    torch.cuda.synchronize(index)
    record["wait_s"] = round(time.perf_counter() - mark, 6)
    _allocate(torch, index)
    record["after_sync_bytes"] = _gap(stats, index)
    record["streams"] = streams[:MAX_STREAMS]  # [handle, bytes, name, seconds until it finished]
    return record


def _by_stream(torch, index: int) -> list[list]:
    """[[stream handle, bytes held for it, its name in the program or None]], most bytes first, from
    the allocator's snapshot: the blocks whose state is pending, by their segment's stream."""
    held: dict[int, int] = {}
    for segment in torch.cuda.memory_snapshot():
        if segment.get("device") != index:
            continue
        pending = sum(int(b.get("size", 0)) for b in segment.get("blocks", ())
                      if "pending" in str(b.get("state", "")))
        if pending:
            stream = int(segment.get("stream") or 0)
            held[stream] = held.get(stream, 0) + pending
    names = _stream_names(torch)
    return [[stream, size, names.get(stream)] for stream, size in sorted(held.items(), key=lambda kv: -kv[1])]


def _stream_names(torch) -> dict[int, str]:
    """Stream handle -> the name the program's main module gives that stream (`side`), where it
    holds one in a global; read from the module's dict, no code of the program run."""
    names: dict[int, str] = {}
    main = sys.modules.get("__main__")
    stream_type = getattr(torch.cuda, "Stream", None)
    if main is None or stream_type is None:
        return names
    for name, value in list(getattr(main, "__dict__", {}).items()):
        if isinstance(name, str) and issubclass(type(value), stream_type):
            try:
                names.setdefault(int(value.cuda_stream), name)
            except Exception:
                pass
    return names


def _wait(torch, index: int, handle: int, mark: float) -> float | None:
    """Seconds from `mark` until the stream `handle` had finished its work (None: not waited for)."""
    try:
        if handle:
            torch.cuda.ExternalStream(handle, device=f"cuda:{index}").synchronize()
        else:
            torch.cuda.synchronize(index)
    except Exception:
        return None
    return round(time.perf_counter() - mark, 6)
