"""Watching a running process from outside (`gpumemdoctor watch`): its VRAM and its floor's growth.

Works for any program, Python or not, and needs nothing installed in it: NVML
gives the VRAM of the process and its descendants on each GPU, psutil the host
memory. The leak judgement is the floor's growth (growth.floor_growth) over the
samples so far, given once there are enough of them; where it grows, each GPU's own floor and
the free memory NVML says the GPU has left give the time until it is full (`Watcher.time_to_full`).
Watching a launcher (torchrun) follows
every rank under it, those that start later or restart too, each labelled with its rank
(`roles.place`, from its environment where that is ours to read), and a rank's stray context on
another GPU is flagged (`stray.rank_flags`). Watching for hours or days keeps
its memory bounded: the recent samples (for the timeline) are a ring of HISTORY, and
the floor is judged on the whole watch's shape, kept by a series.Series.
"""
from __future__ import annotations

import json
import re
import time
from collections import deque
from dataclasses import asdict, dataclass, field

from ..system import agent_socket, nvml, procs
from . import roles, stray
from ..contract import MIN_GROWTH_BYTES  # the diagnosis's least growth
from ..growth import floor_growth, seconds_to_full
from ..recording.series import Series
from ..units import format_bytes as fb
from ..units import full_words
from ..units import parse_size

HISTORY = 4096  # recent samples kept for the timeline
# The whole watch's VRAM total, for the judgement: its start, its last samples, and the lowest
# and highest of each bucket in between (the floor survives, however long the watch).
FLOOR_SERIES = {"head": 64, "tail": 512, "buckets": 512, "window": 0, "events": 0}


@dataclass
class WatchSample:
    t: float  # seconds since watching began
    gpu_bytes: dict[int, int]  # NVML index -> bytes held by the process and its descendants
    rss_bytes: int | None
    alive: bool
    pids: list[int] = field(default_factory=list)  # the processes that held GPU memory
    torch: dict[int, list[dict]] = field(default_factory=dict)  # pid -> its agent's per-device breakdown
    # Each process that holds GPU memory, and each rank even before it does: {"pid", "role"
    # (launcher, rank, worker or None), "rank", "local_rank", "restart_count" (None: not known),
    # "gpu_bytes" (NVML index -> bytes)}
    processes: list[dict] = field(default_factory=list)
    # What needs a look in the job: each rank's stray contexts (stray.rank_flags)
    flags: list[dict] = field(default_factory=list)
    # NVML index -> the GPU's free memory (its total less what every process on it uses), for each
    # GPU the tree holds memory on; None: NVML did not say
    free_bytes: dict[int, int | None] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(self.gpu_bytes.values())

    def to_json(self) -> dict:
        return asdict(self) | {"total_bytes": self.total_bytes}


def is_watch_log(first_line: str) -> bool:
    """Whether a file whose first line this is was written by `watch --jsonl` (or is empty), so that a
    watch may append to it."""
    if not first_line.strip():
        return True
    try:
        sample = json.loads(first_line)
    except ValueError:
        return False
    return isinstance(sample, dict) and {"t", "gpu_bytes", "total_bytes", "alive"} <= sample.keys()


def parse_rate(text: str) -> float:
    """'64MiB/min' or '1MiB/s' -> bytes per minute."""
    if text.strip().startswith("-"):
        raise ValueError(f"{text!r:.60}: a rate must not be negative; write it like 64MiB/min or 1MiB/s")
    m = re.fullmatch(r"\s*(.+?)\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*", text)
    if not m:
        raise ValueError(f"{text!r} is not a rate; write it like 64MiB/min or 1MiB/s")
    per = {"s": 60, "sec": 60, "second": 60, "m": 1, "min": 1, "minute": 1, "h": 1 / 60, "hour": 1 / 60}
    return parse_size(m.group(1)) * per[m.group(2)]


class Watcher:
    """Samples one process tree; keeps the recent history and judges it."""

    def __init__(self, pid: int, devices: list):
        self.pid = pid
        self.devices = devices
        self.create_time = (procs.info(pid) or procs.ProcessInfo(pid, None, None, None, None, None, None)).create_time
        self.t0 = time.monotonic()
        self.samples: deque[WatchSample] = deque(maxlen=HISTORY)
        self.totals: Series = Series(**FLOOR_SERIES)  # (t, VRAM total) while the process lives
        self.per_gpu: dict[int, Series] = {}  # NVML index -> (t, the tree's VRAM on it), likewise
        self.peak_bytes = 0
        self.count = 0
        self.known: set[int] = set()  # descendants seen so far: they may outlive the process
        self.facts: dict[int, roles.ProcessFacts] = {}  # of the tree's processes, read once each
        self.strays: dict[tuple, dict] = {}  # (pid, GPU) -> its flag at the most it held: for the summary

    def sample(self) -> WatchSample:
        alive = procs.same_process(self.pid, self.create_time)
        if alive:
            self.known.update(procs.descendants(self.pid))
        self.known = {p for p in self.known if procs.info(p) is not None}
        tree = {self.pid, *self.known}
        gpu_bytes: dict[int, int] = {}
        held: dict[int, dict[int, int]] = {}
        for device in self.devices:
            for pid, used in nvml.processes(device):
                if pid in tree and used:
                    gpu_bytes[device.index] = gpu_bytes.get(device.index, 0) + used
                    held.setdefault(pid, {})[device.index] = used
        holders = set(held)
        rss = None
        if alive:
            infos = [procs.info(p) for p in tree]
            rss = sum(i.rss_bytes or 0 for i in infos if i is not None)
        torch = {}
        for pid in sorted(({self.pid} if alive else set()) | holders):
            reply = agent_socket.query(pid)
            if reply is not None:
                torch[pid] = breakdown(reply)
        processes = self._processes(tree, held)
        free = {d.index: nvml.memory_info(d).free_bytes for d in self.devices if d.index in gpu_bytes}
        s = WatchSample(t=round(time.monotonic() - self.t0, 3), gpu_bytes=gpu_bytes, rss_bytes=rss,
                        alive=alive, pids=sorted(holders), torch=torch, processes=processes,
                        flags=job_flags(processes, torch), free_bytes=free)
        for flag in s.flags:
            seen = self.strays.get((flag["pid"], flag.get("gpu")))
            if seen is None or (flag.get("bytes") or 0) > (seen.get("bytes") or 0):
                self.strays[(flag["pid"], flag.get("gpu"))] = flag
        self.samples.append(s)
        if alive:
            self.totals.add((s.t, s.total_bytes))
            for index in sorted(set(gpu_bytes) | set(self.per_gpu)):
                self.per_gpu.setdefault(index, Series(**FLOOR_SERIES)).add((s.t, gpu_bytes.get(index, 0)))
        self.peak_bytes = max(self.peak_bytes, s.total_bytes)
        self.count += 1
        return s

    def _processes(self, tree: set[int], held: dict[int, dict[int, int]]) -> list[dict]:
        """Each holder and each rank of the tree, with its place in the job (if any)."""
        self.facts = {pid: f for pid, f in self.facts.items() if pid in tree}
        for pid in tree - set(self.facts):
            info = procs.info(pid)
            if info is not None:  # a process's command line and environment do not change
                env = procs.environ(pid)
                self.facts[pid] = roles.ProcessFacts(pid, info.ppid, info.cmdline,
                                                    roles.Identity.from_environ(env) if env is not None else None)
        rows = []
        for pid in sorted(tree):
            p = roles.place(pid, self.facts)
            if pid not in held and (p is None or p.role != "rank"):
                continue
            identity = (p.identity if p is not None else None) or roles.Identity()
            rows.append({"pid": pid, "role": p.role if p is not None else None, "rank": identity.rank,
                         "local_rank": identity.local_rank, "restart_count": identity.restart_count,
                         "gpu_bytes": dict(sorted(held.get(pid, {}).items()))})
        return rows

    def floor_rate_per_min(self) -> float | None:
        """Bytes per minute the floor of the VRAM total rises at; 0 when flat; None until enough data."""
        points = self.totals.points()
        if len(points) < 8:
            return None
        fit = floor_growth([t for t, _ in points], [total for _, total in points], MIN_GROWTH_BYTES)
        return fit.rate_bytes_per_x * 60 if fit is not None else 0.0

    def time_to_full(self, rate_per_min: float | None) -> TimeToFull | None:
        """The GPU that is full soonest, at the rate its own floor grows and the free memory it has
        at the latest sample; None while the floor of the total does not grow, or where no GPU's
        own floor grows on a GPU whose free memory is known."""
        if not rate_per_min or not self.samples:
            return None
        free = self.samples[-1].free_bytes
        soonest = None
        for index, series in sorted(self.per_gpu.items()):
            points = series.points()
            if len(points) < 8 or free.get(index) is None:
                continue
            fit = floor_growth([t for t, _ in points], [used for _, used in points], MIN_GROWTH_BYTES)
            seconds = seconds_to_full(fit.rate_bytes_per_x, free[index]) if fit is not None else None
            if seconds is not None and (soonest is None or seconds < soonest.seconds):
                soonest = TimeToFull(index, fit.rate_bytes_per_x, free[index], seconds)
        return soonest


def job_flags(processes: list[dict], torch: dict[int, list[dict]]) -> list[dict]:
    """The flags of the ranks among a sample's processes (stray.rank_flags), told for certain where
    a rank's agent said what its PyTorch reserved on each GPU."""
    ranks = [{"pid": row["pid"], "rank": row["rank"], "local_rank": row["local_rank"], "gpus": row["gpu_bytes"]}
             for row in processes if row["role"] == "rank"]
    reserved = {pid: {r["nvml_index"]: r["reserved_bytes"] for r in rows if r["nvml_index"] is not None}
                for pid, rows in torch.items()}
    flagged = stray.rank_flags(ranks, reserved)
    return [flag for r in ranks for flag in flagged.get(r["pid"], [])]


def breakdown(reply: dict) -> list[dict]:
    """Per device, from an agent's `stats` answer: where its memory is, in bytes (None: not known)."""
    rows = []
    for d in reply.get("devices") or []:
        if not isinstance(d, dict):
            continue
        get = {k: d.get(k) if isinstance(d.get(k), int) and not isinstance(d.get(k), bool) else None
               for k in ("allocated_bytes", "active_bytes", "reserved_bytes", "nvml_bytes", "context_bytes")}
        a, act, r, n, c = (get[k] for k in ("allocated_bytes", "active_bytes", "reserved_bytes",
                                             "nvml_bytes", "context_bytes"))
        rows.append({
            "torch_index": d.get("torch_index"), "nvml_index": d.get("nvml_index"),
            "allocated_bytes": a, "reserved_bytes": r,
            "pending_stream_bytes": max(0, act - a) if act is not None and a is not None else None,
            "cache_bytes": max(0, r - (act if act is not None else a)) if r is not None and (act or a) is not None else None,
            "context_bytes": c,
            "non_torch_bytes": max(0, n - r - c) if None not in (n, r, c) else None,
        })
    return rows


@dataclass(frozen=True)
class TimeToFull:
    """How soon a GPU whose floor grows is full, at the rate its floor grows and its free memory now."""

    gpu: int  # NVML index
    rate_bytes_per_s: float
    free_bytes: int
    seconds: float

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Alert:
    """A limit crossed at one sample: which one, by the option that set it, and the figures."""

    limit: str  # "--max-vram" (bytes) or "--max-growth" (bytes per minute)
    measured: float
    allowed: float


def alerts(sample: WatchSample, rate_per_min: float | None, max_vram: int | None,
           max_growth_per_min: float | None) -> list[Alert]:
    """What crossed a limit at this sample; pure."""
    found = []
    if max_vram is not None and sample.total_bytes > max_vram:
        found.append(Alert("--max-vram", sample.total_bytes, max_vram))
    if max_growth_per_min is not None and rate_per_min is not None and rate_per_min > max_growth_per_min:
        found.append(Alert("--max-growth", rate_per_min, max_growth_per_min))
    return found


def judgement(rate_per_min: float | None, full: TimeToFull | None = None) -> str:
    """The floor in words: 'growing 2.05 GiB/min; at 35.0 MiB/s GPU 0 is full in about 12 minutes'."""
    if rate_per_min is None:
        return "not enough data yet"
    if rate_per_min == 0:
        return "flat: no sustained growth"
    growing = f"growing {fb(int(rate_per_min))}/min"
    if full is None:
        return growing
    return f"{growing}; {full_words(full.rate_bytes_per_s, full.seconds, f'GPU {full.gpu}')}"
