"""The supervisor: runs the target as a child, watches its tree through NVML, builds the recording.

The target is `sys.executable` with the user's arguments, its standard streams
inherited untouched. The agent reaches it (and every Python process it starts)
through the bootstrap folder put first on PYTHONPATH. NVML is polled here, in
the supervisor's own process, so polling costs the target nothing.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from . import __version__, nvml, procs
from ._agent import ENV_INTERVAL, ENV_RUN_DIR, ENV_SNAPSHOT, ENV_TRACE
from .recording import ProcessRecord, Recording, read_agents

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bootstrap")
FORWARDED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
TREE_REFRESH_S = 0.5
ORPHAN_GRACE_S = 1.0


@dataclass
class RunOptions:
    """What to run and how closely to watch it."""

    target_args: list[str]  # what follows `python`: [script, *args] or ["-m", module, *args]
    poll_interval_s: float = 0.005
    agent_interval_s: float = 0.02
    measure_gpu: bool = True
    extra_env: dict[str, str] = field(default_factory=dict)
    trace: str = "auto"  # allocation stacks: "auto" (once growth is seen), "on", "off"
    snapshot_path: str | None = None  # where the target's allocator snapshot goes


class _TreeWatch:
    """The target's process tree and what NVML says each member holds."""

    def __init__(self, target_pid: int, t0: float, devices: list, measure_gpu: bool):
        self.target_pid = target_pid
        self.t0 = t0
        self.devices = devices
        self.measure_gpu = measure_gpu
        self.members: dict[int, ProcessRecord] = {}
        self.strangers: set[int] = set()
        self.series: dict[tuple[int, int], list[tuple[float, int | None]]] = {}
        self.last_refresh = 0.0
        self._add(target_pid, is_target=True)

    def _add(self, pid: int, is_target: bool = False) -> None:
        info = procs.info(pid)
        self.members[pid] = ProcessRecord(
            pid=pid, ppid=info.ppid if info else None, cmdline=info.cmdline if info else None,
            create_time=info.create_time if info else None, is_target=is_target,
            first_seen_t=round(time.monotonic() - self.t0, 6))

    def refresh_tree(self) -> None:
        for pid in procs.descendants(self.target_pid):
            if pid not in self.members:
                self._add(pid)
        self.last_refresh = time.monotonic()

    def poll(self) -> None:
        if time.monotonic() - self.last_refresh >= TREE_REFRESH_S:
            self.refresh_tree()
        if not self.measure_gpu:
            return
        t = round(time.monotonic() - self.t0, 6)
        for device in self.devices:
            listed = {}
            for pid, used in nvml.processes(device):
                if pid not in self.members and pid not in self.strangers:
                    if procs.descends_from(pid, self.target_pid):
                        self._add(pid)
                    else:
                        self.strangers.add(pid)
                if pid in self.members:
                    listed[pid] = used
            for pid, used in listed.items():
                self._record(pid, device.index, t, used)
            for (pid, index), points in self.series.items():
                if index == device.index and pid not in listed and points[-1][1] != 0:
                    points.append((t, 0))  # no context on this device any more

    def _record(self, pid: int, index: int, t: float, used: int | None) -> None:
        points = self.series.setdefault((pid, index), [])
        if not points or points[-1][1] != used:
            points.append((t, used))

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
            for (pid, index), points in self.series.items():
                if pid == record.pid:
                    record.used_after_exit_bytes[index] = points[-1][1]

    def _alive_descendants(self) -> list[ProcessRecord]:
        return [p for p in self.members.values()
                if not p.is_target and procs.same_process(p.pid, p.create_time)]

    def _holds_memory(self, pid: int) -> bool:
        return any(points[-1][1] for (p, _), points in self.series.items() if p == pid)


def _terminal_delivered_it() -> bool:
    """True when a terminal key press already sent this signal to the target's process group."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


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
    if options.snapshot_path:
        env[ENV_SNAPSHOT] = "1"
    env["GPUMEMDOCTOR_PACKAGE_PARENT"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (BOOTSTRAP_DIR, env.get("PYTHONPATH")) if p)

    argv = [sys.executable, *options.target_args]
    proc: subprocess.Popen | None = None
    early: list[int] = []  # signals that arrived before the target existed
    notes: list[str] = []

    def forward(signum, _frame):
        if proc is None:
            early.append(signum)
            return
        if proc.poll() is not None:
            return
        if signum in (signal.SIGINT, signal.SIGQUIT) and _terminal_delivered_it():
            return
        try:
            proc.send_signal(signum)
        except OSError:
            pass

    previous = {}
    for name in FORWARDED_SIGNALS:
        signum = getattr(signal, name, None)
        if signum is not None:
            previous[signum] = signal.signal(signum, forward)
    cost: dict = {"before_target_s": _since_process_start()}
    try:
        proc = subprocess.Popen(argv, env=env)
        for signum in early:
            forward(signum, None)
        watch = _TreeWatch(proc.pid, t0, devices, options.measure_gpu)
        while proc.poll() is None:
            try:
                watch.poll()
            except Exception as exc:  # never leave the target unsupervised over a failed poll
                if watch.measure_gpu:
                    notes.append(f"NVML polling stopped at {time.monotonic() - t0:.1f} s: {exc}")
                watch.measure_gpu = False
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
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    duration = time.monotonic() - t0
    cost["orphan_wait_s"] = round(time.monotonic() - exited, 6)
    agents = read_agents(run_dir, t0)
    if options.snapshot_path:
        notes.extend(_keep_snapshots(run_dir, options.snapshot_path, proc.pid))
    shutil.rmtree(run_dir, ignore_errors=True)
    cost["collect_s"] = round(time.monotonic() - t0 - duration - cost["orphan_wait_s"], 6)

    for agent in agents:
        if agent.torch_version:
            versions.setdefault("torch", agent.torch_version)
    return Recording(
        tool_version=__version__,
        target={"argv": list(options.target_args), "pid": proc.pid,
                "exit_code": returncode if returncode >= 0 else None,
                "signal": -returncode if returncode < 0 else None, "cwd": os.getcwd()},
        started_wall=started_wall, duration_s=round(duration, 6),
        poll_interval_s=options.poll_interval_s, nvml_available=options.measure_gpu,
        versions=versions, devices=[d.to_json() for d in devices], nvml=watch.series,
        processes=sorted(watch.members.values(), key=lambda p: (not p.is_target, p.pid)),
        agents=agents, notes=notes, tool_cost=cost,
    )


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
