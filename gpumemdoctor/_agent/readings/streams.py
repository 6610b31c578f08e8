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
held for work that has not finished. Then which streams hold it: each stream that the program's
main module names and that is still busy is waited for in turn (`Stream.synchronize`), and what one
more small allocation then releases was held for that stream; the device is synchronised for the
rest (a library's streams), and a last reading taken. The `pending` record says, per device: the
gap at the end, the gap after the events were processed, the streams with their bytes and how long
after the end each one finished (handle -1: streams not named), and the gap after synchronising.
The allocator's snapshot cannot say it: a block's segment names the stream it was allocated on,
not the streams its events wait for. The program has ended: its streams' work is waited for
here, never while it runs.
"""
from __future__ import annotations

import sys
import time

MAX_STREAMS = 8  # streams waited for one by one, per device


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


def allocate_one(torch, index: int) -> None:
    """One small allocation on the device, freed at once: the allocator processes its completed
    events first (and a context not yet complete is completed)."""
    t = torch.empty(1, device=f"cuda:{index}")
    del t


def _settle(torch, stats, index: int) -> dict | None:
    started = time.monotonic()
    before = _gap(stats, index)
    if not before:
        return None
    allocate_one(torch, index)
    unfinished = _gap(stats, index)
    record = {"type": "pending", "t": started, "device": index, "before_bytes": before,
              "unfinished_bytes": unfinished, "streams": [], "wait_s": None, "after_sync_bytes": None}
    if not unfinished:
        return record
    # Which stream held what: each stream the program names, still busy, waited for in turn, and what
    # one more allocation then releases is what its work held; the rest waits for the device.
    mark = time.perf_counter()
    held = unfinished
    for handle, name, stream in _named_streams(torch, index)[:MAX_STREAMS - 1]:  # room for the rest's row
        try:
            stream.synchronize()
        except Exception:
            continue
        waited = round(time.perf_counter() - mark, 6)
        allocate_one(torch, index)
        left = _gap(stats, index)
        if left < held:
            record["streams"].append([handle, held - left, name, waited])
        held = left
    torch.cuda.synchronize(index)
    record["wait_s"] = round(time.perf_counter() - mark, 6)
    allocate_one(torch, index)
    record["after_sync_bytes"] = after = _gap(stats, index)
    if held > after:  # streams the program does not name in its main module (a library's)
        record["streams"].append([-1, held - after, None, record["wait_s"]])
    return record


def _named_streams(torch, index: int) -> list:
    """[(handle, name, stream)] of the CUDA streams on this device that the program's main module holds
    in its globals and that still have work queued (`query()` is False); read from the module's dict,
    no code of the program run."""
    found = []
    main = sys.modules.get("__main__")
    stream_type = getattr(torch.cuda, "Stream", None)
    if main is None or stream_type is None:
        return found
    for name, value in list(getattr(main, "__dict__", {}).items()):
        if not isinstance(name, str) or not issubclass(type(value), stream_type):
            continue
        try:
            if stream_type.query(value) or (getattr(value, "device_index", index) != index):
                continue
            found.append((int(value.cuda_stream), name, value))
        except Exception:
            pass
    return found
