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
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

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
    # Modules the caller needs after the run (the report's): imported on a thread of their own
    # once the target is started, so that their import is off the run's wall time.
    prepare: tuple[str, ...] = ()


def run(options: RunOptions) -> Recording:
    """Run the target to its end and return everything measured."""
    t0 = time.monotonic()
    started_wall = time.time()
    versions: dict = {"tool": __version__, "python": sys.version.split()[0]}
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

    argv = [sys.executable, *python_arguments(options.target_args)]
    proc: subprocess.Popen | None = None
    notes: list[str] = []
    signals = Forwarder()  # what is sent to the supervisor goes on to the target, once
    signals.catch()
    cost: dict = {"before_target_s": _since_process_start()}
    try:
        proc = subprocess.Popen(argv, env=env)
        launched = time.monotonic()
        signals.target(proc)
        # The run file at once (a supervisor killed now leaves a run folder that can be recovered),
        # and again below with the target's start time and the devices.
        _write_run_file(run_dir, options, t0, started_wall, proc.pid, None, versions, [])
        # The target starts (its interpreter, then its imports: a second at least before CUDA) while
        # the supervisor imports and sets up what it watches it with.
        from ..recording.agent_files import AgentFiles
        from ..system import procs
        from .tree import TreeWatch, collect

        oom_kills_before = procs.cgroup_oom_kills()
        devices, measure_gpu = _devices(options.measure_gpu, versions, notes)
        watch = TreeWatch(proc.pid, t0, devices, measure_gpu)
        if not measure_gpu:
            options = replace(options, measure_gpu=False)
        cost["watch_set_up_s"] = round(time.monotonic() - launched, 6)  # while the target starts
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
                                   and oom_kills_after is not None else None), host=host_name())
    if options.snapshot_path:
        recording.notes.extend(_keep_snapshots(run_dir, options.snapshot_path, proc.pid))
    shutil.rmtree(run_dir, ignore_errors=True)
    cost["collect_s"] = round(time.monotonic() - t0 - duration, 6)  # (the orphans' wait is in the duration)
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


def _import_quietly(modules: tuple[str, ...]) -> None:
    """Import these while the target runs; one that fails is imported again, and says why, when
    it is needed."""
    for name in modules:
        try:
            importlib.import_module(name)
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
