"""The supervisor: runs the target as a child, watches its tree through NVML, builds the recording.

The target is `sys.executable` with the user's arguments, its standard streams
inherited untouched. The agent reaches it (and every Python process it starts)
through the bootstrap folder put first on PYTHONPATH. NVML is polled here, in
the supervisor's own process, so polling costs the target nothing.

The target starts first: what the supervisor needs only once it runs (pynvml, psutil, the
recording's modules: `tree.py`) is imported and set up while the target starts. The CLI has
already checked that NVML answers (`nvml.check_available`).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable

from .. import __version__
from ..contract import (ENV_INTERVAL, ENV_MAX_PAUSE, ENV_PACKAGE_PARENT, ENV_RUN_DIR, ENV_SNAPSHOT, ENV_TRACE,
                        INTERVAL_DEFAULT_S, MAX_PAUSE_DEFAULT_S, POLL_INTERVAL_DEFAULT_S, python_arguments)
from .signals import Forwarder

if TYPE_CHECKING:
    from ..recording.recording import Recording

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # gpumemdoctor/
BOOTSTRAP_DIR = os.path.join(PACKAGE_DIR, "_bootstrap")
AGENT_READ_S = 1.0  # the agents' files are read this often while the target runs
RUN_FILE = "run.json"  # in the run folder: what `report --from-run-dir` needs if the supervisor dies
RUN_SCHEMA = "gpumemdoctor.run/1"


@dataclass
class RunOptions:
    """What to run and how closely to watch it."""

    target_args: list[str]  # what follows `python`: [script, *args] or ["-m", module, *args]
    poll_interval_s: float = POLL_INTERVAL_DEFAULT_S
    agent_interval_s: float = INTERVAL_DEFAULT_S
    measure_gpu: bool = True
    extra_env: dict[str, str] = field(default_factory=dict)
    trace: str = "auto"  # allocation stacks: "auto" (windows), "on", "events" (none; the peak's events), "off"
    max_pause_s: float = MAX_PAUSE_DEFAULT_S  # the longest pause a search during the run may cost
    snapshot_path: str | None = None  # where the target's allocator snapshot goes
    # What the caller needs done before the run ends (the report's imports: app/pipeline.py's
    # `prepare`): called on a thread of its own once the target is started, off the run's wall time.
    prepare: Callable[[], None] | None = None


def run(options: RunOptions) -> Recording:
    """Run the target to its end and return everything measured."""
    t0 = time.monotonic()
    started_wall = time.time()
    versions: dict = {"tool": __version__, "python": sys.version.split()[0]}
    run_dir = tempfile.mkdtemp(prefix="gpumemdoctor-")  # 0700: only its owner can look inside
    argv = [sys.executable, *python_arguments(options.target_args)]
    proc: subprocess.Popen | None = None
    notes: list[str] = []
    signals = Forwarder()  # what is sent to the supervisor goes on to the target, once
    signals.catch()
    cost: dict = {"before_target_s": _since_process_start()}
    try:
        proc = subprocess.Popen(argv, env=_environment(options, run_dir))
        signals.target(proc)
        watching = _Watching.start(proc, options, run_dir, t0, started_wall, versions, notes, cost)
        returncode = watching.until_exit()
    except BaseException:
        if proc is not None:
            proc.wait()  # the target is the user's: let it finish before the tool gives up
        raise
    finally:
        signals.release()
    return watching.recording(returncode, run_dir)


def _environment(options: RunOptions, run_dir: str) -> dict[str, str]:
    """The target's environment: the caller's, with the contract's variables and the bootstrap
    folder first on PYTHONPATH (so that every Python process of the run starts the agent)."""
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
    return env


@dataclass
class _Watching:
    """A started target and what watches it: its tree through NVML (`tree.TreeWatch`), its agents'
    files (`AgentFiles`), until it exits; then the recording."""

    proc: subprocess.Popen
    options: RunOptions
    t0: float
    started_wall: float
    versions: dict
    notes: list[str]
    cost: dict
    devices: list
    watch: Any
    agents: Any
    oom_kills_before: int | None
    exited: float = 0.0

    @classmethod
    def start(cls, proc: subprocess.Popen, options: RunOptions, run_dir: str, t0: float, started_wall: float,
              versions: dict, notes: list[str], cost: dict) -> _Watching:
        launched = time.monotonic()
        # The run file at once (a supervisor killed now leaves a run folder that can be recovered),
        # and again below with the target's start time and the devices.
        _write_run_file(run_dir, options, t0, started_wall, proc.pid, None, versions, [])
        # The target starts (its interpreter, then its imports: a second at least before CUDA) while
        # the supervisor imports and sets up what it watches it with.
        from ..recording.agent_files import AgentFiles
        from ..system import procs
        from .tree import TreeWatch

        oom_kills_before = procs.cgroup_oom_kills()
        devices, measure_gpu = _devices(options.measure_gpu, versions, notes)
        watch = TreeWatch(proc.pid, t0, devices, measure_gpu)
        if not measure_gpu:
            options = replace(options, measure_gpu=False)
        cost["watch_set_up_s"] = round(time.monotonic() - launched, 6)  # while the target starts
        _write_run_file(run_dir, options, t0, started_wall, proc.pid, watch.members[proc.pid].create_time,
                        versions, devices)
        agents = AgentFiles(run_dir, t0, proc.pid)
        if options.prepare is not None:
            threading.Thread(target=_quietly, args=(options.prepare,), name="gpumemdoctor-prepare",
                             daemon=True).start()
        return cls(proc, options, t0, started_wall, versions, notes, cost, devices, watch, agents, oom_kills_before)

    def until_exit(self) -> int:
        """Poll NVML and read the agents' files until the target exits; its return code."""
        watch, t0 = self.watch, self.t0
        last_read = time.monotonic()
        while self.proc.poll() is None:
            try:
                watch.poll()
            except Exception as exc:  # never leave the target unsupervised over a failed poll
                if watch.measure_gpu:
                    self.notes.append(f"NVML polling stopped at {time.monotonic() - t0:.1f} s: {exc}")
                watch.measure_gpu = False
            if time.monotonic() - last_read >= AGENT_READ_S:
                last_read = time.monotonic()
                try:
                    self.agents.poll()  # read as the run goes: the end stays quick, the memory bounded
                except Exception as exc:
                    self.notes.append(f"reading the agents' files failed at {last_read - t0:.1f} s: {exc}")
                    last_read = float("inf")
            time.sleep(self.options.poll_interval_s)
        returncode = self.proc.wait()
        self.exited = time.monotonic()
        try:
            watch.after_exit()
        except Exception as exc:
            self.notes.append(f"the check for orphaned processes failed: {exc}")
        return returncode

    def recording(self, returncode: int, run_dir: str) -> Recording:
        """The recording of the ended run (`tree.collect`), its snapshots kept, the run folder removed."""
        from ..system import procs
        from .tree import collect

        options, cost = self.options, self.cost
        duration = time.monotonic() - self.t0
        cost["orphan_wait_s"] = round(time.monotonic() - self.exited, 6)
        before, after = self.oom_kills_before, procs.cgroup_oom_kills()
        recording = collect(options, self.watch, self.agents, self.proc.pid, returncode,
                            started_wall=self.started_wall, duration_s=duration, versions=self.versions,
                            devices=self.devices, notes=self.notes, cost=cost,
                            oom_kills=after - before if before is not None and after is not None else None,
                            host=host_name())
        if options.snapshot_path:
            recording.notes.extend(_keep_snapshots(run_dir, options.snapshot_path, self.proc.pid))
        shutil.rmtree(run_dir, ignore_errors=True)
        cost["collect_s"] = round(time.monotonic() - self.t0 - duration, 6)  # (the orphans' wait is in the duration)
        cost["supervisor_peak_rss_bytes"] = procs.peak_rss_of_self()
        return recording


def _devices(measure_gpu: bool, versions: dict, notes: list[str]) -> tuple[list, bool]:
    """NVML's devices, with the driver's versions added to `versions`; none, and a note, where NVML
    fails now though the CLI's check found it answering."""
    if not measure_gpu:
        return [], False
    from ..system import nvml

    try:
        nvml.init()
        devices = nvml.devices()
        versions.update(nvml.versions())
    except Exception as exc:
        notes.append(f"NVML could not be used once the target had started ({exc}): no GPU figures from NVML")
        return [], False
    return devices, True


def _quietly(prepare: Callable[[], None]) -> None:
    """The caller's preparation, while the target runs; a failure is the caller's to meet again (an
    import that fails is made again, and says why, when it is needed)."""
    try:
        prepare()
    except Exception:
        pass


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
