"""psutil look-ups that survive a process vanishing or belonging to someone else."""
from __future__ import annotations

import os
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


def environ(pid: int) -> dict[str, str] | None:
    """The process's environment; None when it is gone or not ours to read."""
    try:
        return psutil.Process(pid).environ()
    except _GONE:
        return None


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
