"""The neutral readings: PyTorch's allocator and NVML, read into rows made once, written as one line.

What a sample costs: PyTorch's nested stats read once per device, the process's NVML figure
twice, one line of text; at most once per interval (20 ms, doubled every 1000 samples up to 5 s or
to --interval where that is longer: contract.interval_ceiling; and lengthened so that the samples
take at most 1% of the program's time: SAMPLE_SHARE), and at each of the first 100 steps. The
reads' costs depend on the host (NOTES.md): stats 10-21 us and NVML about 7 us on an H200; stats
about 150 us and NVML 7 us on one H100 host, 20 us and 38 us on another
(benchmarks/sample_cost.py). The reads go through `Neutral` (neutral.py), and nothing else on the
way makes a container: the program's garbage collections come when they would have come. Each
process's exit record keeps what its samples cost (`cost`).
"""
from __future__ import annotations

import gc
import threading
import time

from .events import import_in_progress
from .felt import SAMPLE
from ..neutral import BALLAST, NO_ROOM, Neutral
from ..peak.phase_watch import RISING_INTERVAL_S
from ...contract import interval_ceiling

SAMPLES_PER_DOUBLING = 1000  # long runs sample more slowly so a recording stays small
FIRST_ALLOCATION_WAIT_S = 10.0
# A time sample put off for lack of room below the collector's threshold is taken with collection held
# off (briefly, ~0.3 ms) at once where the count has not moved since the last try (the program is idle:
# it sleeps, or waits on the GPU), else once put off this long. (0.25 s left a sleeping program with
# its count near the threshold 4 samples a second: a leak of 1.2 s was not seen, on an H100.)
STARVED_S = 0.1
EVERY_STEP_UNTIL = 100  # the first steps are all sampled (50-400 us each): short runs need them
COST_WINDOW_S = 60.0  # the samples' cost is also kept for the first and the last such window
NAP_S = 0.05  # the sampling thread's longest sleep: how soon it sees the program ending
# The samples' share of the program's time, at most: the interval is lengthened to the mean cost of
# a sample over this share. A sample made between the steps of a launch-bound loop costs 200-400 us
# on the lent H100s (benchmarks/sample_cost.py --busy), 1-2% of a 1 ms-step loop at 20 ms; a
# GPU-bound loop hides it behind its queued kernels.
SAMPLE_SHARE = 0.01
COST_WEIGHT = 0.1  # of the newest sample in the running mean of the samples' cost
# The first samples set nothing: the first reading costs what its first calls do (13.6 ms on the H100,
# beside seven other programs), and as the mean's start it stretched a short program's interval to
# 1.4 s, where it took no second sample.
UNPACED_SAMPLES = 3


class Sampler:
    """One reading of every device the process touched, at a step boundary or on the timer."""

    def __init__(self, shared, interval_s: float, process_groups):
        self.shared = shared
        self.process_groups = process_groups  # checked after each sample (process_groups.py)
        self.base_interval_s = interval_s  # --interval, doubled every SAMPLES_PER_DOUBLING samples
        self.interval_s = interval_s  # the one in force: the base, or longer for the samples' cost
        self.max_interval_s = interval_ceiling(interval_s)  # neither of the two grows past it
        self.mean_cost_s = 0.0  # a sample's cost (its thread's time), a running mean
        self.context: dict[int, int] = {}  # torch index -> smallest NVML - reserved after an allocation
        self.samples = 0
        self.last_sample_t = 0.0
        self.last_step_sample_t = 0.0
        self.lock = threading.Lock()
        self.neutral: Neutral | None = None  # made at CUDA's start, on the program's thread
        self.stats_fn = None  # torch index -> PyTorch's nested allocator stats
        self.rows: list[list] = []  # one reading per device, filled in place (see _read_rows)
        self.live: list[bool] = []  # which rows the last reading filled
        self.nvml_before: list = []  # per device, NVML's figure before PyTorch's was read
        self.nvml_readers: list = []  # nvml.ProcessMemory per device, or None
        self.first_alloc_t: float | None = None
        self.first_pools: list[dict] = []  # other libraries' pools at the first allocation (libraries.py)
        self.samples_skipped = 0  # time samples put off because the collector was near its threshold
        self.no_room_count = -1  # the collector's count at the last time sample put off
        self.collector_off = 0  # samples that found automatic collection disabled (gc.disable())
        self.cost = SampleCost(shared.cost)
        self.after: tuple = ()  # (felt's part, check(now, by)) after each sample, in order: core's watches

    def prepare(self) -> None:
        """What every later reading fills in place, made once here on the program's thread (no container later)."""
        shared = self.shared
        torch = shared.torch
        self.stats_fn = getattr(getattr(torch, "_C", None), "_cuda_memoryStats", None) \
            or torch.cuda.memory_stats_as_nested_dict
        self.rows = [[d["index"], None, None, None, None, None, None, None] for d in shared.devices]
        self.live = [False] * len(shared.devices)
        # per row: allocations and frees so far (history.py sizes its ring by a step's)
        self.events = [None] * len(shared.devices)
        self.nvml_before = [None] * len(shared.devices)
        self.nvml_readers = []
        for d in shared.devices:
            reader = None
            if shared.nvml is not None and d["nvml_device"] is not None:
                try:
                    reader = shared.nvml.ProcessMemory(d["nvml_device"], shared.pid)
                    if reader.used() is None:
                        reader = None
                except Exception:
                    reader = None
            self.nvml_readers.append(reader)
        self.neutral = Neutral(ballast=0 if shared.run_dir else BALLAST)  # (under `run`: neutral.top_up)

    # -- readings -----------------------------------------------------------------
    def read_allocated(self, out: list) -> None:
        """out[i] = allocated bytes of device slot i (through Neutral: makes only PyTorch's dicts)."""
        stats_fn = self.stats_fn
        devices = self.shared.devices
        for i in range(len(devices)):
            try:
                out[i] = stats_fn(devices[i]["index"])["allocated_bytes"]["all"]["current"]
            except Exception:
                out[i] = 0

    def any_reserved(self, _) -> bool:
        stats_fn = self.stats_fn
        devices = self.shared.devices
        for i in range(len(devices)):
            if stats_fn(devices[i]["index"])["reserved_bytes"]["all"]["current"]:
                return True
        return False

    def read_devices(self) -> list:
        """[torch index, allocated, active, reserved, requested, nvml used, alloc peak, reserved
        peak] of each device this process has touched: copies, for the paths that keep them."""
        if self.neutral is None:
            return []
        self._read_rows(False)
        return [list(self.rows[i]) for i in range(len(self.rows)) if self.live[i]]

    def _read_rows(self, room: bool):
        """Fill self.rows in place: NVML's figures, then PyTorch's, then NVML's again (if NVML
        moved meanwhile, the allocator reserved or released memory between the reads, and the
        pair does not describe one moment: read again). NVML is read twice and PyTorch once, not
        the other way round: on the host where this was chosen a stats read cost about 150 us
        and an NVML read 7 us (on another, 20 us and 38 us). PyTorch is read inside
        Neutral.read; NVML outside it, because the foreign call lets other threads run, and what
        the program allocates meanwhile must not be counted as the agent's. NO_ROOM when `room`
        is asked and the collector is near its threshold."""
        neutral = self.neutral
        rows = self.rows
        before = self.nvml_before  # made once: a sample makes no container
        self._read_nvml()
        for _ in range(3):
            for i in range(len(rows)):
                before[i] = rows[i][5]
            if neutral.read(self._read_torch, None, room) is NO_ROOM:
                return NO_ROOM
            self._read_nvml()
            moved = False
            for i in range(len(rows)):
                if rows[i][5] != before[i]:
                    moved = True
                    break
            if not moved:
                break
        for i in range(len(rows)):
            row = rows[i]
            reserved = row[3]
            nvml_used = row[5]
            if not reserved and not nvml_used:
                self.live[i] = False  # a device this process has not touched
                continue
            if reserved and nvml_used == 0:
                row[5] = None  # NVML does not list us though we hold memory: another PID namespace
            self.live[i] = True
        return True

    def _read_torch(self, _) -> None:
        """PyTorch's figures into the rows; makes only PyTorch's dicts, one device's at a time."""
        stats_fn = self.stats_fn
        rows = self.rows
        for i in range(len(rows)):
            row = rows[i]
            stats = stats_fn(row[0])
            row[1] = _stat(stats, "allocated_bytes", "current")
            row[2] = _stat(stats, "active_bytes", "current")
            row[3] = _stat(stats, "reserved_bytes", "current")
            row[4] = _stat(stats, "requested_bytes", "current")
            row[6] = _stat(stats, "allocated_bytes", "peak")
            row[7] = _stat(stats, "reserved_bytes", "peak")
            try:
                counts = stats["allocation"]["all"]
                self.events[i] = counts["allocated"] + counts["freed"]
            except (KeyError, TypeError):
                pass

    def _read_nvml(self) -> None:
        shared = self.shared
        rows = self.rows
        for i in range(len(rows)):
            reader = self.nvml_readers[i]
            used = None
            if reader is not None:
                try:
                    used = reader.used()
                except Exception:
                    used = None
            elif shared.nvml is not None and shared.devices[i]["nvml_device"] is not None:
                try:  # no direct reading on this driver: pynvml's list (makes containers)
                    used = shared.nvml.used_by(shared.devices[i]["nvml_device"], shared.pid)
                except Exception:
                    used = None
            rows[i][5] = used

    # -- a sample -----------------------------------------------------------------
    def sample(self, by: str) -> bool:
        """One reading of every device; False when it was put off (the caller may try again).

        A step sample runs on the program's thread, with automatic collection held off
        while it reads. The agent's own thread ("time", "first") never changes the
        collector's settings: it reads only when that cannot set a collection off."""
        shared = self.shared
        if shared.channel.dead or not shared.devices or self.neutral is None:
            return True
        if by == "step":
            return self._sample(by, True) is not False
        done = self._sample(by, False)
        if done is None:  # no room below the collector's threshold
            self.samples_skipped += 1
            idle = self.neutral.t3[0] == self.no_room_count  # nothing made or freed since the last try
            self.no_room_count = self.neutral.t3[0]
            if not idle and time.monotonic() - self.last_sample_t < STARVED_S:
                return False
            done = self._sample(by, True)  # idle, or no room for a while: collection held off, briefly
        return done is not False

    def _sample(self, by: str, quiet: bool):
        """True when read, False when another reading was in progress, None when there was no
        room below the collector's threshold. Makes no container on the way (see Neutral):
        the record is written as text, into rows and series made once."""
        lock = self.lock
        if by != "step" and lock.locked():
            return False  # the timer never waits; a step boundary waits for a timer sample (tens of us)
        lock.acquire()
        started = time.thread_time()  # the agent's own work, not its waits for the GIL
        apart = 0.0  # of it, a peak's capture: not the samples' pace
        checks, felt = 0.0, self.shared.felt  # of it, the watches after the reading (felt's)
        enabled = gc.isenabled()  # read before the sample holds collection off itself
        if not enabled:  # the program's doing (gc.disable())
            self.collector_off += 1
        collecting = quiet and enabled
        if collecting:
            gc.disable()
        try:
            shared = self.shared
            now = time.monotonic()
            if self._read_rows(not quiet) is NO_ROOM:
                return None
            self.last_sample_t = now
            if by == "step":
                self.last_step_sample_t = now
            # (the first readings set the context's size: later ones can catch an NVML dip)
            text = _rows_text(self.rows, self.live, self.context if self.samples < 5 else None)
            shared.channel.write_line(f'{{"type":"s","t":{now!r},"by":"{by}","step":{shared.steps},"d":[{text}]}}')
            self.samples += 1
            self.process_groups.check(now)  # a record only when the count of process groups changed
            if shared.run_dir and (by == "step" or by == "time"):
                t0 = time.perf_counter()
                apart = _after(self.after, now, by, felt)
                checks = time.perf_counter() - t0
            if self.samples % SAMPLES_PER_DOUBLING == 0:
                self.base_interval_s = min(self.base_interval_s * 2, self.max_interval_s)
        except Exception:
            pass
        finally:
            if collecting:
                gc.enable()
            spent = time.thread_time() - started
            self.cost.count(self.last_sample_t, spent)
            if felt is not None:  # (the reading itself: the thread's time less the watches' part)
                felt.add(SAMPLE, spent - checks if spent > checks else 0.0)
            if self.samples > UNPACED_SAMPLES:
                self._pace(spent - apart)
            lock.release()
        return True

    def _pace(self, spent: float) -> None:
        """The interval in force: the base, or the samples' mean cost over SAMPLE_SHARE if longer.
        Floats only: nothing the collector counts."""
        mean = self.mean_cost_s
        mean = spent if mean == 0.0 else mean + (spent - mean) * COST_WEIGHT
        self.mean_cost_s = mean
        paced = mean / SAMPLE_SHARE
        interval = self.base_interval_s
        most = self.max_interval_s
        if paced > interval:
            interval = paced if paced < most else most
        self.interval_s = interval


def _rows_text(rows: list, live: list, context: dict | None) -> str:
    """The live rows of a reading as the sample record's JSON list items; with `context`, each row's
    NVML less reserved kept where it is the device's smallest yet (the CUDA context's size)."""
    text = ""
    for i in range(len(rows)):
        if not live[i]:
            continue
        row = rows[i]  # [index, allocated, active, reserved, requested, nvml, ...]
        if context is not None and row[3] and row[5]:
            gap = row[5] - row[3]
            known = context.get(row[0])
            if known is None or gap < known:
                context[row[0]] = gap
        item = (f"[{row[0]},{_json_int(row[1])},{_json_int(row[2])},{_json_int(row[3])},"
                f"{_json_int(row[4])},{_json_int(row[5])},{_json_int(row[6])},{_json_int(row[7])}]")
        text = f"{text},{item}" if text else item
    return text


def _after(after: tuple, now: float, by: str, felt) -> float:
    """The watches after a sample (the sampler's lock held), each timed as its part of felt's. Returns
    the thread time of what a check says it spent apart (a peak's capture, a history reading): not the
    samples' pace. A tuple made once, bound methods in it: nothing the collector tracks is made."""
    apart = 0.0
    for part, check in after:
        started = time.perf_counter()
        spent = check(now, by)
        if spent:
            apart += spent
        if felt is not None:
            felt.add(part, time.perf_counter() - started)
    return apart


class SampleCost:
    """What the samples cost the program: the agent's own work (thread time, not its waits for the
    GIL), in all (the agent's cost["sample_s"]) and per sample early and late in a long run.

    Samples and seconds of the current COST_WINDOW_S, of the first one completed and of the
    last. Plain ints and floats, so that counting allocates nothing the garbage collector tracks.
    """

    def __init__(self, cost: dict):
        self.cost = cost  # the agent's: "sample_s" is added up here
        self.window_start = 0.0
        self.window_samples = self.first_samples = self.last_samples = 0
        self.window_s = self.first_s = self.last_s = 0.0

    def count(self, now: float, spent: float) -> None:
        self.cost["sample_s"] += spent
        if not self.window_samples:
            self.window_start = now
        elif now - self.window_start >= COST_WINDOW_S:
            if not self.first_samples:
                self.first_samples, self.first_s = self.window_samples, self.window_s
            self.last_samples, self.last_s = self.window_samples, self.window_s
            self.window_start, self.window_samples, self.window_s = now, 0, 0.0
        self.window_samples += 1
        self.window_s += spent

    def windows(self) -> dict:
        """The samples' cost in the first and the last COST_WINDOW_S of sampling (the window
        under way when no full one has passed)."""
        out = {}
        current = (self.window_samples, self.window_s)
        first = (self.first_samples, self.first_s) if self.first_samples else current
        last = (self.last_samples, self.last_s) if self.last_samples else current
        for name, (samples, spent) in (("first", first), ("last", last)):
            if samples:
                out[f"{name}_window_samples"] = samples
                out[f"{name}_window_sample_us"] = spent / samples * 1e6
        return out


class SamplingThread:
    """The agent's own thread: a time sample whenever no step sample came for an interval."""

    def __init__(self, shared, sampler: Sampler, trace, phase_watch, start_devices):
        self.shared = shared
        self.sampler = sampler
        self.trace = trace
        self.phase_watch = phase_watch  # a pause rising above the steps is sampled more often
        self.start_devices = start_devices  # core's: the devices read, where CUDA's callback did not come
        self.thread: threading.Thread | None = None
        self.stopping = False  # the thread sleeps in short naps and looks at this

    def start(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="gpumemdoctor-agent", daemon=True)
            self.thread.start()

    def stop(self) -> None:
        """At exit: the thread ends within a nap."""
        self.stopping = True
        if self.thread is not None:
            self.thread.join(timeout=1.0)

    def _run(self) -> None:
        try:
            shared = self.shared
            torch = shared.torch
            sampler = self.sampler
            while not torch.cuda.is_initialized():
                if self.nap(sampler.interval_s):
                    return
            if not shared.devices:  # CUDA started without the lazy-init callback
                self.start_devices()
            self._wait_for_first_allocation()
            trace = self.trace
            interval = self._interval()
            while not self.nap(interval):
                now = time.monotonic()
                interval = self._interval()
                # While the program marks steps, samples are taken at step boundaries instead.
                if now - sampler.last_sample_t >= interval and now - shared.last_step_t >= interval:
                    sampler.sample("time")
                if (trace.stop_at is not None and now >= trace.stop_at and not shared.steps
                        and not import_in_progress()):
                    trace.stop()  # growth seen over time: the stacks are turned off from here too
        except Exception:
            pass

    def _interval(self) -> float:
        """The interval in force, or RISING_INTERVAL_S while a pause in the steps rises above them
        (phase_watch.py; RISING_FOR_S at most): its height comes within the pause."""
        interval = self.sampler.interval_s
        watch = self.phase_watch
        if (watch.rising_step == self.shared.steps and interval > RISING_INTERVAL_S
                and time.monotonic() < watch.rising_until):
            return RISING_INTERVAL_S
        return interval

    def nap(self, seconds: float) -> bool:
        """Sleep; True when the agent is stopping. Short naps with time.sleep, not
        Event.wait: a timed wait on a lock makes a tuple each time."""
        end = time.monotonic() + seconds
        while not self.stopping:
            left = end - time.monotonic()
            if left <= 0:
                return False
            time.sleep(left if left < NAP_S else NAP_S)
        return True

    def _wait_for_first_allocation(self) -> None:
        """Read the context right after the first allocation, before libraries load their kernels.

        NVML shows only part of the context until the first allocation completes
        it, so the first sample with reserved memory is the one that measures it.
        The stats call polled here costs about 10 us.
        """
        sampler = self.sampler
        started = time.monotonic()
        while True:
            # The poll must not wait for room below the collector's threshold: a program that
            # allocated and then sleeps would never be read (seen on an H100: an idle child).
            collecting = gc.isenabled()
            if collecting:
                gc.disable()
            try:
                allocated = sampler.neutral.read(sampler.any_reserved, None)
            finally:
                if collecting:
                    gc.enable()
            if allocated:
                sampler.first_alloc_t = time.monotonic()
                while not sampler.sample("first"):  # put off while the collector is near its threshold
                    if self.nap(0.001):
                        return
                from .libraries import read_first_pools

                sampler.first_pools = read_first_pools()
                return
            waited = time.monotonic() - started
            if waited > FIRST_ALLOCATION_WAIT_S:
                sampler.sample("time")
                return
            if self.nap(0.001 if waited < 0.1 else 0.01):
                return


def _json_int(value) -> str:
    return "null" if value is None else str(value)


def _stat(stats: dict, name: str, field: str):
    try:
        return int(stats[name]["all"][field])
    except (KeyError, TypeError, ValueError):
        return None
