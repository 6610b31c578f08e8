"""The supervisor: runs the target as a child, watches its tree through NVML, builds the recording.

The target is `sys.executable` with the user's arguments, its standard streams
inherited untouched. The agent reaches it (and every Python process it starts)
through the bootstrap folder put first on PYTHONPATH. NVML is polled here, in
the supervisor's own process, so polling costs the target nothing.
"""
from __future__ import annotations

import importlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from .. import __version__
from ..system import nvml, procs
from ..contract import (ENV_INTERVAL, ENV_MAX_PAUSE, ENV_PACKAGE_PARENT, ENV_RUN_DIR, ENV_SNAPSHOT, ENV_TRACE,
                        INTERVAL_DEFAULT_S, MAX_PAUSE_DEFAULT_S, POLL_INTERVAL_DEFAULT_S)
from ..recording.agent_files import AgentFiles
from ..recording.recording import ProcessRecord, Recording
from .recovery import RUN_FILE, RUN_SCHEMA
from .signals import Forwarder
from ..recording.series import Series

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # gpumemdoctor/
BOOTSTRAP_DIR = os.path.join(PACKAGE_DIR, "_bootstrap")
TREE_REFRESH_S = 0.5
ORPHAN_GRACE_S = 1.0
AGENT_READ_S = 1.0  # the agents' files are read this often while the target runs
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


@dataclass
class RunOptions:
    """What to run and how closely to watch it."""

    target_args: list[str]  # what follows `python`: [script, *args] or ["-m", module, *args]
    poll_interval_s: float = POLL_INTERVAL_DEFAULT_S
    agent_interval_s: float = INTERVAL_DEFAULT_S
    measure_gpu: bool = True
    extra_env: dict[str, str] = field(default_factory=dict)
    trace: str = "auto"  # allocation stacks: "auto" (once growth is seen), "on", "off"
    max_pause_s: float = MAX_PAUSE_DEFAULT_S  # the longest pause a search during the run may cost
    snapshot_path: str | None = None  # where the target's allocator snapshot goes
    # Modules the caller needs after the run (the report's): imported on a thread of their own
    # once the target is started, so that their import is off the run's wall time.
    prepare: tuple[str, ...] = ()


def _two_figures(point: tuple) -> tuple:
    """The figures a series follows in a point (t, a, b): host memory's, or a GPU's used and free."""
    return point[1], point[2]


class _TreeWatch:
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


def run(options: RunOptions) -> Recording:
    """Run the target to its end and return everything measured."""
    t0 = time.monotonic()
    started_wall = time.time()
    devices: list = []
    versions: dict = {"tool": __version__, "python": sys.version.split()[0]}
    if options.measure_gpu:
        nvml.init()
        devices = nvml.devices()
        versions.update(nvml.versions())

    run_dir = tempfile.mkdtemp(prefix="gpumemdoctor-")  # 0700: only its owner can look inside
    env = dict(os.environ)
    env.update(options.extra_env)
    env[ENV_RUN_DIR] = run_dir
    env[ENV_INTERVAL] = str(options.agent_interval_s)
    env[ENV_TRACE] = options.trace
    env[ENV_MAX_PAUSE] = str(options.max_pause_s)
    if options.snapshot_path:
        env[ENV_SNAPSHOT] = "1"
    env[ENV_PACKAGE_PARENT] = os.path.dirname(PACKAGE_DIR)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (BOOTSTRAP_DIR, env.get("PYTHONPATH")) if p)

    argv = [sys.executable, *options.target_args]
    proc: subprocess.Popen | None = None
    notes: list[str] = []
    signals = Forwarder()  # what is sent to the supervisor goes on to the target, once
    signals.catch()
    cost: dict = {"before_target_s": _since_process_start()}
    oom_kills_before = procs.cgroup_oom_kills()
    try:
        proc = subprocess.Popen(argv, env=env)
        signals.target(proc)
        watch = _TreeWatch(proc.pid, t0, devices, options.measure_gpu)
        _write_run_file(run_dir, options, t0, started_wall, proc.pid, watch.members[proc.pid].create_time,
                        versions, devices)
        agents = AgentFiles(run_dir, t0, proc.pid)
        if options.prepare:
            threading.Thread(target=_import_quietly, args=(options.prepare,), name="gpumemdoctor-prepare",
                             daemon=True).start()
        last_read = time.monotonic()
        while proc.poll() is None:
            try:
                watch.poll()
            except Exception as exc:  # never leave the target unsupervised over a failed poll
                if watch.measure_gpu:
                    notes.append(f"NVML polling stopped at {time.monotonic() - t0:.1f} s: {exc}")
                watch.measure_gpu = False
            if time.monotonic() - last_read >= AGENT_READ_S:
                last_read = time.monotonic()
                try:
                    agents.poll()  # read as the run goes: the end stays quick, the memory bounded
                except Exception as exc:
                    notes.append(f"reading the agents' files failed at {last_read - t0:.1f} s: {exc}")
                    last_read = float("inf")
            time.sleep(options.poll_interval_s)
        returncode = proc.wait()
        exited = time.monotonic()
        try:
            watch.after_exit()
        except Exception as exc:
            notes.append(f"the check for orphaned processes failed: {exc}")
    except BaseException:
        if proc is not None:
            proc.wait()  # the target is the user's: let it finish before the tool gives up
        raise
    finally:
        signals.release()
    duration = time.monotonic() - t0
    cost["orphan_wait_s"] = round(time.monotonic() - exited, 6)
    oom_kills_after = procs.cgroup_oom_kills()
    recording = collect(options, watch, agents, proc.pid, returncode, started_wall=started_wall,
                        duration_s=duration, versions=versions, devices=devices, notes=notes, cost=cost,
                        oom_kills=(oom_kills_after - oom_kills_before if oom_kills_before is not None
                                   and oom_kills_after is not None else None))
    if options.snapshot_path:
        recording.notes.extend(_keep_snapshots(run_dir, options.snapshot_path, proc.pid))
    shutil.rmtree(run_dir, ignore_errors=True)
    cost["collect_s"] = round(time.monotonic() - t0 - duration - cost["orphan_wait_s"], 6)
    cost["supervisor_peak_rss_bytes"] = procs.peak_rss_of_self()
    return recording


def _import_quietly(modules: tuple[str, ...]) -> None:
    """Import these while the target runs; one that fails is imported again, and says why, when
    it is needed."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:
            pass


def collect(options: RunOptions, watch: _TreeWatch, agents: AgentFiles, pid: int, returncode: int, *,
            started_wall: float, duration_s: float, versions: dict, devices: list, notes: list[str],
            cost: dict, oom_kills: int | None) -> Recording:
    """The recording of a finished run: the agents' files read to their end, with the tree's
    NVML series, host memory and outages (a step of its own, so the long-run benchmark
    drives the same code)."""
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
        downsampling={**watch.downsampling(), **agent_series}, host=host_name(),
        device_memory={index: series.points() for index, series in watch.device_memory.items()},
    )


def _write_run_file(run_dir: str, options: RunOptions, t0: float, started_wall: float, pid: int,
                    create_time: float | None, versions: dict, devices: list) -> None:
    """What a recovery needs to know of the run, should the supervisor not live to its end."""
    info = {"schema": RUN_SCHEMA, "tool_version": __version__, "t0": t0, "started_wall": started_wall,
            "target_args": list(options.target_args), "pid": pid, "create_time": create_time,
            "cwd": os.getcwd(), "poll_interval_s": options.poll_interval_s, "measure_gpu": options.measure_gpu,
            "versions": versions, "devices": [d.to_json() for d in devices], "host": host_name()}
    try:
        tmp = os.path.join(run_dir, RUN_FILE + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(info, f)
        os.replace(tmp, os.path.join(run_dir, RUN_FILE))
    except OSError:
        pass  # only a recovery would miss it


def host_name() -> str | None:
    """This machine's name, which tells a multi-node job's reports apart (their PIDs repeat)."""
    try:
        return socket.gethostname() or None
    except OSError:
        return None


def _since_process_start() -> float | None:
    """Seconds since this process (the tool's own interpreter) started: its start-up cost.
    From /proc, in clock ticks since boot (psutil's create_time counts boot time in whole
    seconds, too coarse for this); None elsewhere."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        return round(max(0.0, uptime - started_ticks / os.sysconf("SC_CLK_TCK")), 3)
    except (OSError, ValueError, IndexError):
        return None


def _keep_snapshots(run_dir: str, path: str, target_pid: int) -> list[str]:
    """Move the agents' allocator snapshots out of the run folder: the target's to PATH, any
    other process's next to it with its PID. Returns a note for each (or why there is none)."""
    found = sorted(n for n in os.listdir(run_dir) if n.startswith("snapshot-") and n.endswith(".pickle"))
    if not found:
        return ["no allocator snapshot was written: the target never used CUDA through PyTorch, or "
                "it did not exit normally"]
    notes = []
    stem, ext = os.path.splitext(path)
    for name in found:
        pid = int(name[len("snapshot-"):-len(".pickle")])
        dest = path if pid == target_pid else f"{stem}-{pid}{ext or '.pickle'}"
        try:
            shutil.move(os.path.join(run_dir, name), dest)
            os.chmod(dest, 0o600)
            notes.append(f"allocator snapshot of process {pid}: {dest} (drag it onto "
                         "https://pytorch.org/memory_viz to browse it)")
        except OSError as exc:
            notes.append(f"could not write the allocator snapshot of process {pid} to {dest}: "
                         f"{exc.strerror or exc}")
    return notes


def exit_status(recording: Recording) -> int:
    """The target's exit status as a shell reports it: its code, or 128 + the signal."""
    target = recording.target
    if target.get("signal"):
        return 128 + int(target["signal"])
    return int(target.get("exit_code") or 0)
