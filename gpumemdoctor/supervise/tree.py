"""What the supervisor does once the target runs: it watches the target's process tree (what NVML
says each member holds, its host memory) and makes the recording of the finished run.

Imported by `supervisor.run` only after the target has started: psutil, pynvml and the recording's
modules are imported while the target starts, not before it (0.2 s of the run's start on an H100
machine).
"""
from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from .. import __version__
from ..recording.recording import ProcessRecord, Recording
from ..recording.series import Series
from ..system import nvml, procs

if TYPE_CHECKING:
    from ..recording.agent_files import AgentFiles

TREE_REFRESH_S = 0.5
ORPHAN_GRACE_S = 1.0
HOST_RSS_S = 0.2  # the target tree's host memory (RSS) is read this often
DEVICE_MEMORY_S = 0.2  # each GPU's used and free memory (all its processes) is read this often
NVML_RETRY_S = 1.0  # a device whose NVML calls fail is tried again this often
MAX_NVML_FAILURES = 16  # outages recorded; later ones are only counted
MAX_MEMBERS = 256  # process records; past it, ended processes that never held GPU memory are forgotten
MAX_STRANGERS = 4096  # other users' PIDs remembered as not ours; past it, forgotten and looked up again
# What is kept of each long series (see series.py): an NVML series gets a point only when its
# figure changes; the host memory is read every HOST_RSS_S.
NVML_SERIES = {"head": 64, "tail": 64, "buckets": 128, "window": 16, "events": 2}
# The series of a process that has ended and let go of its memory shrinks to this (its first and
# last points, its peak): DataLoader workers with CUDA contexts, respawned every epoch for a day,
# stay small. At most MAX_ENDED_SERIES are kept, those that held the most.
ENDED_SERIES = {"head": 2, "tail": 2, "buckets": 2, "window": 0, "events": 0}
MAX_ENDED_SERIES = 256
HOST_SERIES = {"head": 64, "tail": 64, "buckets": 128, "window": 16, "events": 2}
DEVICE_SERIES = {"head": 16, "tail": 64, "buckets": 64, "window": 0, "events": 0}


def _two_figures(point: tuple) -> tuple:
    """The figures a series follows in a point (t, a, b): host memory's, or a GPU's used and free."""
    return point[1], point[2]


class TreeWatch:
    """The target's process tree, what NVML says each member holds, and its host memory.

    Everything it keeps is bounded, however long the run: each NVML series and the host
    memory are series.Series, the process records are capped at MAX_MEMBERS (ended
    processes that never held GPU memory are forgotten first), and NVML outages at
    MAX_NVML_FAILURES. A device whose NVML calls fail is not read as empty (that would
    look like every process freeing its memory): its series stop, the outage is recorded
    with its error, and the device is tried again every NVML_RETRY_S."""

    def __init__(self, target_pid: int, t0: float, devices: list, measure_gpu: bool):
        self.target_pid = target_pid
        self.t0 = t0
        self.devices = devices
        self.measure_gpu = measure_gpu
        self.members: dict[int, ProcessRecord] = {}
        self.strangers: set[int] = set()
        self.series: dict[tuple[int, int], Series] = {}
        self.host: Series = Series(figures=_two_figures, **HOST_SERIES)
        # NVML index -> (t, used, free) of the whole GPU: the free memory a growth would fill
        self.device_memory: dict[int, Series] = {}
        self.failures: list[dict] = []
        self.failures_dropped = 0
        self.forgotten = 0  # process records dropped past MAX_MEMBERS
        self.ended: set[tuple[int, int]] = set()  # series shrunk: their process ended and let go
        self.ended_dropped = 0
        self._failing: dict[int, dict] = {}  # NVML index -> its outage under way
        self._retry_at: dict[int, float] = {}
        self._live: list[int] = [target_pid]  # the tree at the last refresh
        self.last_refresh = 0.0
        self.last_host = 0.0
        self.last_device_memory = 0.0
        self._add(target_pid, is_target=True)

    def _add(self, pid: int, is_target: bool = False) -> None:
        info = procs.info(pid)
        self.members[pid] = ProcessRecord(
            pid=pid, ppid=info.ppid if info else None, cmdline=info.cmdline if info else None,
            create_time=info.create_time if info else None, is_target=is_target,
            first_seen_t=round(time.monotonic() - self.t0, 6))

    def refresh_tree(self) -> None:
        live = procs.descendants(self.target_pid)
        for pid in live:
            if pid not in self.members:
                self._add(pid)
        self._live = [self.target_pid, *live]
        self._shrink_ended(set(self._live))
        if len(self.members) > MAX_MEMBERS:
            self._forget()
        if len(self.strangers) > MAX_STRANGERS:
            self.strangers.clear()
        self.last_refresh = time.monotonic()

    def _shrink_ended(self, live: set) -> None:
        for key, series in list(self.series.items()):
            if key in self.ended or key[0] in live or series.last[1] != 0:
                continue
            small = Series(**ENDED_SERIES)
            small.extend(series.points())
            small.seen = series.seen
            self.series[key] = small
            self.ended.add(key)
        while len(self.ended) > MAX_ENDED_SERIES:
            key = min(self.ended, key=lambda k: max((u or 0 for _, u in self.series[k].points()), default=0))
            self.ended.discard(key)
            del self.series[key]
            self.ended_dropped += 1

    def _forget(self) -> None:
        """Drop the oldest records of processes that have ended without holding GPU memory."""
        keep = set(self._live) | {pid for pid, _ in self.series}
        for record in sorted(self.members.values(), key=lambda p: p.first_seen_t):
            if len(self.members) <= MAX_MEMBERS:
                break
            if not record.is_target and record.pid not in keep:
                del self.members[record.pid]
                self.forgotten += 1

    def sample_host(self) -> None:
        """The host memory of the target, and of the target with its descendants."""
        now = time.monotonic()
        self.last_host = now
        target = procs.rss(self.target_pid)
        if target is None:
            return  # ended (a zombie has no memory of its own any more)
        tree = target + sum(r for r in (procs.rss(pid) for pid in self._live[1:]) if r)
        self.host.add((round(now - self.t0, 6), target, tree))

    def poll(self) -> None:
        now = time.monotonic()
        if now - self.last_refresh >= TREE_REFRESH_S:
            self.refresh_tree()
        if now - self.last_host >= HOST_RSS_S:
            self.sample_host()
        if not self.measure_gpu:
            return
        t = round(now - self.t0, 6)
        if now - self.last_device_memory >= DEVICE_MEMORY_S:
            self.sample_device_memory(now, t)
        for device in self.devices:
            index = device.index
            if index in self._failing and now < self._retry_at[index]:
                continue
            try:
                listed_all = nvml.processes(device, strict=True)
            except Exception as exc:  # a GPU lost, an NVML error on every call: the run goes on
                self._failed(index, t, now, exc)
                continue
            if index in self._failing:
                self._failing.pop(index)["to_t"] = t
            listed = {}
            for pid, used in listed_all:
                if pid not in self.members and pid not in self.strangers:
                    if procs.descends_from(pid, self.target_pid):
                        self._add(pid)
                    else:
                        self.strangers.add(pid)
                if pid in self.members:
                    listed[pid] = used
            for pid, used in listed.items():
                self._record(pid, index, t, used)
            for (pid, i), series in self.series.items():
                if i == index and pid not in listed and series.last[1] != 0:
                    series.add((t, 0))  # no context on this device any more

    def sample_device_memory(self, now: float, t: float) -> None:
        """Each GPU's used and free memory, every process on it counted (NVML's own figures); a
        device whose NVML calls fail is left out until it answers again."""
        self.last_device_memory = now
        for device in self.devices:
            if device.index in self._failing:
                continue
            try:
                memory = nvml.memory_info(device)
            except Exception as exc:  # the driver gone: a failure of this device, as a failed process list
                self._failed(device.index, t, now, exc)
                continue
            series = self.device_memory.get(device.index)
            if series is None:
                series = self.device_memory[device.index] = Series(figures=_two_figures, **DEVICE_SERIES)
            series.add((t, memory.used_bytes, memory.free_bytes))

    def _failed(self, index: int, t: float, now: float, exc: Exception) -> None:
        failure = self._failing.get(index)
        if failure is None:
            failure = {"device": index, "from_t": t, "to_t": None, "error": str(exc)[:300] or type(exc).__name__,
                       "failed_calls": 0}
            self._failing[index] = failure
            if len(self.failures) < MAX_NVML_FAILURES:
                self.failures.append(failure)
            else:
                self.failures_dropped += 1
        failure["failed_calls"] += 1
        self._retry_at[index] = now + NVML_RETRY_S

    def _record(self, pid: int, index: int, t: float, used: int | None) -> None:
        series = self.series.get((pid, index))
        if series is None:
            series = self.series[(pid, index)] = Series(**NVML_SERIES)
        if series.last is None or series.last[1] != used:
            series.add((t, used))

    def after_exit(self) -> None:
        """Give exiting descendants a moment, then note who still holds memory."""
        deadline = time.monotonic() + ORPHAN_GRACE_S
        while True:
            self.poll()
            holders = [p for p in self._alive_descendants() if self._holds_memory(p.pid)]
            if not holders or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        for record in self._alive_descendants():
            record.alive_after_exit = True
            for (pid, index), series in self.series.items():
                if pid == record.pid:
                    record.used_after_exit_bytes[index] = series.last[1]

    def _alive_descendants(self) -> list[ProcessRecord]:
        return [p for p in self.members.values()
                if not p.is_target and procs.same_process(p.pid, p.create_time)]

    def _holds_memory(self, pid: int) -> bool:
        return any(series.last[1] for (p, _), series in self.series.items() if p == pid)

    def notes(self) -> list[str]:
        out = []
        if self.failures_dropped:
            out.append(f"NVML failed {self.failures_dropped} more times than the report lists")
        if self.ended_dropped:
            out.append(f"the NVML series of {self.ended_dropped} ended processes that held the least GPU memory "
                       f"are not kept (the report keeps {MAX_ENDED_SERIES})")
        if self.forgotten:
            out.append(f"{self.forgotten} short-lived processes of the target's tree that never held GPU "
                       f"memory are not listed (the report keeps {MAX_MEMBERS} process records)")
        return out

    def downsampling(self) -> dict:
        out = {}
        for (pid, index), series in sorted(self.series.items()):
            if series.seen > series.kept:
                out[f"nvml {pid} gpu {index}"] = series.summary()
        if self.host.seen > self.host.kept:
            out["host_rss"] = self.host.summary()
        for index, series in sorted(self.device_memory.items()):
            if series.seen > series.kept:
                out[f"device_memory gpu {index}"] = series.summary()
        return out


def collect(options, watch: TreeWatch, agents: AgentFiles, pid: int, returncode: int, *,
            started_wall: float, duration_s: float, versions: dict, devices: list, notes: list[str],
            cost: dict, oom_kills: int | None, host: str | None) -> Recording:
    """The recording of a finished run: the agents' files read to their end, with the tree's
    NVML series, host memory and outages (a step of its own, so the long-run benchmark
    drives the same code). `options`: the run's supervisor.RunOptions."""
    agent_list, agent_notes, agent_series = agents.finish()
    for agent in agent_list:
        if agent.torch_version:
            versions.setdefault("torch", agent.torch_version)
    return Recording(
        tool_version=__version__,
        target={"argv": list(options.target_args), "pid": pid,
                "exit_code": returncode if returncode >= 0 else None,
                "signal": -returncode if returncode < 0 else None, "cwd": os.getcwd(),
                "cgroup_oom_kills": oom_kills},
        started_wall=started_wall, duration_s=round(duration_s, 6),
        poll_interval_s=options.poll_interval_s, nvml_available=options.measure_gpu,
        versions=versions, devices=[d.to_json() for d in devices],
        nvml={key: series.points() for key, series in watch.series.items()},
        processes=sorted(watch.members.values(), key=lambda p: (not p.is_target, p.pid)),
        agents=agent_list, notes=notes + agent_notes + watch.notes(), tool_cost=cost,
        host_rss=watch.host.points(), nvml_failures=watch.failures,
        downsampling={**watch.downsampling(), **agent_series}, host=host,
        device_memory={index: series.points() for index, series in watch.device_memory.items()},
    )
