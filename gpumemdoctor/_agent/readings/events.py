"""What the agent records besides samples and searches: collections, CUDA's start, a fatal exception.

The garbage collections that freed CUDA memory (`Collections`, the collector's callback,
whose readings go through `Neutral`), where a process started CUDA, and the exception a
program died of. Runs inside the target; the agent guards every call.
"""
from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time

from ..search.blocks import is_library_file
from .felt import COLLECTOR
from ..neutral import Neutral, top_up

# gpumemdoctor's own folder, not this package's: frames of gpumemdoctor.step() are ours too.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # gpumemdoctor/
MIN_FREED_RECORD_BYTES = 1 << 20  # a collection that freed less CUDA memory is only counted
MAX_COLLECTION_RECORDS = 1000  # then collections are only added up
GC_COST_SHARE = 0.01  # the callback stops measuring while it has cost more than this share of the run
MAX_STACK = 16
MAX_DEPTH = 300  # frames looked through beyond MAX_STACK for the program's own
MAX_HELD_INFO = 20_000  # info dicts kept (two dicts each, ~130 bytes): then the rare miss is left alone


def program_stack(frame, limit: int = MAX_STACK) -> list:
    """[file, line, function] from `frame` outwards, innermost first, without gpumemdoctor's frames.
    Where the innermost `limit` frames are all libraries' (an error deep inside a model's forward), the
    program's own innermost frame beyond them is added last: the line the program was on."""
    out = []
    while frame is not None and len(out) < limit:
        code = frame.f_code
        if not code.co_filename.startswith(_PACKAGE_DIR):
            out.append([code.co_filename, frame.f_lineno or 0, code.co_name])
        frame = frame.f_back
    if frame is not None and all(is_library_file(f[0]) for f in out):
        depth = 0
        while frame is not None and depth < MAX_DEPTH:
            code = frame.f_code
            if not is_library_file(code.co_filename):
                out.append([code.co_filename, frame.f_lineno or 0, code.co_name])
                break
            frame = frame.f_back
            depth += 1
    return out


class Collections:
    """gc.callbacks: the CUDA memory each collection freed, whoever set it off.

    Tensors that live until a collection are garbage held by reference cycles, even
    when nothing is left of them at exit. Reading `allocated` costs about 11 us per
    device, twice a collection; collections are rare in tensor code (one per 500
    steps of an AdamW loop on an H100), and the callback stops measuring while it
    has cost more than GC_COST_SHARE of the time since CUDA started.

    The callback makes no container of its own while the program runs: both readings
    go through `Neutral`, into lists made once, and a record is one line of text. The
    Python stack of the place the collection interrupted is kept for the first record
    only: reading it makes frame objects, which the program frees later (a count of one
    moved per record).
    """

    def __init__(self, neutral: Neutral, read_allocated, devices: int, write_line, steps, felt=None,
                 ballast_of: list | None = None):
        self.neutral = neutral
        self.felt = felt  # felt.py: each collection timed, start to stop, for the step gaps
        self.ballast_of = ballast_of or []  # whose ballast is made at collections' starts (neutral.top_up)
        self.read_allocated = read_allocated  # (out) -> out[i]: allocated bytes of device slot i
        self.devices = devices
        self.indexes = [0] * devices  # torch index of each slot, filled by read_allocated's owner
        self.before = [0] * devices
        self.after = [0] * devices
        self.write_line = write_line
        self.steps = steps  # () -> the step count now
        self.started = time.perf_counter()
        self.paused = False
        self.measuring = False
        self.t0 = 0.0
        self.held = []  # the collector's own info dicts, kept off the free list (see _keep_info)
        self.measured = 0
        self.skipped = 0
        self.freeing = 0  # collections that freed CUDA memory (at least MIN_FREED_RECORD_BYTES)
        self.freed_bytes = 0
        self.max_freed_bytes = 0
        self.records = 0
        self.cost_s = 0.0

    def install(self) -> None:
        if self.callback not in gc.callbacks:
            gc.callbacks.append(self.callback)

    def _keep_info(self, info) -> None:
        """The collector makes its `info` dict only because a callback is installed. Made anew
        (the dict free list was empty), it would go to the free list when the callbacks
        return, and the program's next dict would come from there instead of being made: its
        next collection one allocation late. The free list is empty now exactly when a dict
        made now is new; then both are kept. (Empty now can also mean that `info` took the
        list's last dict: that is told apart nowhere, and rarer in a program that collects.)"""
        if len(self.held) >= MAX_HELD_INFO:
            return
        c = gc.get_count()[0]
        probe = {}
        if gc.get_count()[0] != c:
            self.held.append(info)
            self.held.append(probe)

    def callback(self, phase, info) -> None:
        try:
            if self.paused:
                return
            now = time.perf_counter()
            felt = self.felt
            if phase == "start":
                self._start(now, info)
                if felt is not None:
                    ended = time.perf_counter()
                    felt.add(COLLECTOR, ended - now)
                    felt.collection_start(ended)
                return
            if felt is not None:
                felt.collection_stop(now, info["generation"])
            if self.measuring:
                self._stop(now, info)
                if felt is not None:
                    felt.add(COLLECTOR, time.perf_counter() - now)
        except Exception:
            self.measuring = False

    def _start(self, now: float, info) -> None:
        """A collection starts: the ballast made up (neutral.top_up), the allocated bytes read."""
        self._keep_info(info)
        for holder in self.ballast_of:
            if top_up(holder):
                now = time.perf_counter()  # (the cost share counts the readings: ballast is made only early on)
        self.measuring = False
        if self.cost_s > GC_COST_SHARE * (now - self.started) + 0.002:
            self.skipped += 1
            return
        self.neutral.read(self.read_allocated, self.before)
        self.t0 = now
        self.measuring = True
        self.cost_s += time.perf_counter() - now

    def _stop(self, now: float, info) -> None:
        """A collection ends: what it freed of CUDA memory, recorded where it is 1 MiB or more."""
        self.measuring = False
        self.neutral.read(self.read_allocated, self.after)
        self.measured += 1
        total = 0
        freed = ""
        for i in range(self.devices):
            gone = self.before[i] - self.after[i]
            if gone > 0:
                total += gone
                freed = f"{freed},[{self.indexes[i]},{gone}]" if freed else f"[{self.indexes[i]},{gone}]"
        if total >= MIN_FREED_RECORD_BYTES:
            self.freeing += 1
            self.freed_bytes += total
            if total > self.max_freed_bytes:
                self.max_freed_bytes = total
            if self.records < MAX_COLLECTION_RECORDS:
                self.records += 1
                stack = program_stack_json(sys._getframe(), 6) if self.records == 1 else "[]"
                self.write_line(
                    f'{{"type":"collection","t":{time.monotonic()!r},"step":{self.steps()},'
                    f'"generation":{info.get("generation", -1)},"collected":{info.get("collected", 0)},'
                    f'"freed":[{freed}],"thread":{json_text(threading.current_thread().name)},'
                    f'"stack":{stack},"elapsed_s":{round(time.perf_counter() - self.t0, 6)!r}}}')
        self.cost_s += time.perf_counter() - now

    def summary(self) -> dict:
        return {"measured": self.measured, "skipped": self.skipped, "freeing": self.freeing,
                "freed_bytes": self.freed_bytes, "max_freed_bytes": self.max_freed_bytes,
                "cost_s": round(self.cost_s, 6), "info_dicts_kept": len(self.held) // 2}


def json_text(text: str) -> str:
    """A JSON string, without json.dumps's containers (plain text needs no escaping)."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    return json.dumps(text)


def program_stack_json(frame, limit: int = MAX_STACK) -> str:
    """program_stack() as JSON text, made without containers."""
    out = ""
    n = 0
    while frame is not None and n < limit:
        code = frame.f_code
        if not code.co_filename.startswith(_PACKAGE_DIR):
            item = f"[{json_text(code.co_filename)},{frame.f_lineno or 0},{json_text(code.co_name)}]"
            out = f"{out},{item}" if out else item
            n += 1
        frame = frame.f_back
    return f"[{out}]"


def cuda_origin() -> dict:
    """Where this process started CUDA, and whether it is a DataLoader worker or a
    multiprocessing child: processes that often should not hold a context of their own."""
    worker = None
    module = sys.modules.get("torch.utils.data._utils.worker")
    info = getattr(module, "_worker_info", None) if module is not None else None
    if info is not None:
        worker = {"id": int(getattr(info, "id", -1)), "num_workers": int(getattr(info, "num_workers", -1))}
    mp_child = False
    mp = sys.modules.get("multiprocessing")
    if mp is not None:
        try:
            mp_child = mp.parent_process() is not None
        except Exception:
            mp_child = False
    return {"thread": threading.current_thread().name, "stack": program_stack(sys._getframe()),
            "dataloader_worker": worker, "multiprocessing_child": mp_child}


def uncaught() -> dict | None:
    """The exception the program is dying of, if one reached the top (read at exit)."""
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if exc is None:
        return None
    frames = []
    tb = getattr(exc, "__traceback__", None)
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append([code.co_filename, tb.tb_lineno, code.co_name])
        tb = tb.tb_next
    kind = type(exc)
    return {"exc_type": f"{kind.__module__}.{kind.__qualname__}".replace("builtins.", ""),
            "message": str(exc)[:800], "stack": frames[::-1][:MAX_STACK]}


def import_in_progress() -> bool:
    """True while some module is still being imported (by any thread)."""
    for module in list(sys.modules.values()):
        spec = getattr(module, "__spec__", None)
        if spec is not None and getattr(spec, "_initializing", False):
            return True
    return False
