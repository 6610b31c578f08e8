"""psutil look-ups that survive a process vanishing or belonging to someone else."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import psutil

_GONE = (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ProcessLookupError,
         PermissionError, OSError)


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    ppid: int | None
    cmdline: list[str] | None
    create_time: float | None
    username: str | None
    status: str | None
    rss_bytes: int | None

    def to_json(self) -> dict:
        return {"pid": self.pid, "ppid": self.ppid, "cmdline": self.cmdline,
                "create_time": self.create_time, "username": self.username}


def _get(fn, default=None):
    try:
        return fn()
    except _GONE:
        return default


def info(pid: int) -> ProcessInfo | None:
    """What can be known about a process now; None when it does not exist."""
    try:
        proc = psutil.Process(pid)
    except _GONE:
        return None
    mem = _get(proc.memory_info)
    return ProcessInfo(
        pid=pid,
        ppid=_get(proc.ppid),
        cmdline=_get(proc.cmdline),
        create_time=_get(proc.create_time),
        username=_get(proc.username),
        status=_get(proc.status),
        rss_bytes=mem.rss if mem is not None else None,
    )


def session_leader(pid: int) -> bool | None:
    """True when the process leads its own session (as a daemon does); None when not known."""
    try:
        return os.getsid(pid) == pid
    except OSError:
        return None


def session_id(pid: int) -> int | None:
    """The session a process is in (0: one whose leader is outside this PID namespace); None when not
    known."""
    try:
        return os.getsid(pid)
    except OSError:
        return None


def environ(pid: int) -> dict[str, str] | None:
    """The process's environment; None when it is gone or not ours to read.

    Only a process of our own user is read (its real and effective user both ours), even
    when we run as root: what a process of another user keeps in its environment is not
    ours to show."""
    try:
        proc = psutil.Process(pid)
        uids = proc.uids()
        if not uids.real == uids.effective == os.getuid():
            return None
        return proc.environ()
    except _GONE:
        return None


def owner(pid: int) -> tuple[int, int, int] | None:
    """(real, effective, saved) user ids of a process; None when it is gone."""
    try:
        uids = psutil.Process(pid).uids()
        return uids.real, uids.effective, uids.saved
    except _GONE:
        return None


def group(pid: int) -> int | None:
    """The real group id of a process; None when it is gone."""
    try:
        return psutil.Process(pid).gids().real
    except _GONE:
        return None


def cwd(pid: int) -> str | None:
    """A process's working folder; None when it is gone or not ours to read."""
    try:
        return psutil.Process(pid).cwd()
    except _GONE:
        return None


def parents() -> dict[int, int]:
    """PID -> parent PID of every process here, read in one pass over /proc."""
    found = {}
    for proc in psutil.process_iter(["ppid"]):
        ppid = proc.info.get("ppid")
        if ppid is not None:
            found[proc.pid] = ppid
    return found


def descendants(pid: int) -> list[int]:
    """PIDs of every living descendant; empty when the process is gone."""
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except _GONE:
        return []


def descends_from(pid: int, ancestor: int) -> bool:
    """True when `ancestor` is on the parent chain of `pid` right now."""
    try:
        proc = psutil.Process(pid)
        return any(parent.pid == ancestor for parent in proc.parents())
    except _GONE:
        return False


def same_process(pid: int, create_time: float | None) -> bool:
    """True when `pid` still names the process that started at `create_time`."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return create_time is None or abs(proc.create_time() - create_time) < 0.01
    except _GONE:
        return False


_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss(pid: int) -> int | None:
    """A process's resident host memory in bytes; None when it has ended (a zombie included).

    Read from /proc/<pid>/statm (one small read, cheap enough to sample several times a
    second); through psutil where there is no /proc."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            pages = int(f.read().split()[1])
        return pages * _PAGE_BYTES or None  # a zombie reads 0
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return None
    except (OSError, ValueError, IndexError):
        return None
    try:
        value = psutil.Process(pid).memory_info().rss
        return value or None
    except _GONE:
        return None


def peak_rss_of_self() -> int | None:
    """The most host memory this process has held, in bytes (Linux: ru_maxrss is in KiB)."""
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (ImportError, OSError):
        return None
    return int(peak) * (1 if sys.platform == "darwin" else 1024)


def cgroup_oom_kills() -> int | None:
    """How many processes the kernel's out-of-memory killer has ended in this process's
    memory cgroup (`oom_kill` in cgroup v2's memory.events, or v1's memory.oom_control);
    None where that cannot be read."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    places = []
    for _, controllers, path in (x for x in lines if len(x) == 3):
        if controllers == "":
            places.append(os.path.join("/sys/fs/cgroup", path.lstrip("/"), "memory.events"))
        elif "memory" in controllers.split(","):
            places.append(os.path.join("/sys/fs/cgroup/memory", path.lstrip("/"), "memory.oom_control"))
    for place in places:
        try:
            with open(place, encoding="utf-8") as f:
                for line in f:
                    name, _, value = line.partition(" ")
                    if name == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None
