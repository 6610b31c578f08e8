"""The agent's local socket: read-only statistics for `gpumemdoctor watch`, for the same user only.

Each process that runs the agent with its socket on listens at
`<private folder>/agent-<pid>.sock`. The folder is made 0700 and is refused when
it is a link, belongs to someone else or is open to others; the peer's user is
checked on Linux as well. The one request understood is `stats`: the answer is
the agent's latest allocator and NVML figures as one JSON line. Nothing sent is
ever executed. The socket file goes when the process exits.
"""
from __future__ import annotations

import json
import os
import socket
import stat
import struct
import tempfile
from typing import Any, Callable

STATS_SCHEMA = "gpumemdoctor.agent-stats/1"
MAX_REQUEST_BYTES = 64
MAX_REPLY_BYTES = 1 << 20


def socket_dir() -> str:
    """This user's private folder for agent sockets (not yet checked or made)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if not base or not os.path.isdir(base):
        base = tempfile.gettempdir()
    return os.path.join(base, f"gpumemdoctor-{os.getuid()}")


def socket_path(pid: int) -> str:
    return os.path.join(socket_dir(), f"agent-{pid}.sock")


def private_dir() -> str | None:
    """Make or check the folder: ours, a real folder, closed to others; None when it is not."""
    path = socket_dir()
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None  # someone else made it, or it is open to others: no socket
    return path


def _peer_is_us(conn: socket.socket) -> bool:
    creds = getattr(socket, "SO_PEERCRED", None)
    if creds is None:
        return True  # the 0700 folder is the guard where the kernel cannot tell
    pid, uid, gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, creds, struct.calcsize("3i")))
    return uid == os.getuid()


class StatsServer:
    """Listens on the process's socket and answers `stats` with what `answer()` returns."""

    def __init__(self, answer: Callable[[], dict]):
        self.answer = answer
        self.path: str | None = None
        self.sock: socket.socket | None = None

    def open(self) -> bool:
        folder = private_dir()
        if folder is None:
            return False
        path = os.path.join(folder, f"agent-{os.getpid()}.sock")
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                os.unlink(path)  # left by an earlier process with this PID
        except OSError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            old = os.umask(0o177)
            try:
                sock.bind(path)  # the socket file itself is 0600
            finally:
                os.umask(old)
            sock.listen(4)
        except OSError:
            sock.close()
            return False
        self.path, self.sock = path, sock
        return True

    def serve_forever(self) -> None:
        sock = self.sock
        while sock is not None:
            try:
                conn, _ = sock.accept()
            except OSError:
                return  # closed
            try:
                with conn:
                    conn.settimeout(1.0)
                    if not _peer_is_us(conn):
                        continue
                    request = conn.recv(MAX_REQUEST_BYTES).strip()
                    if request == b"stats":
                        reply = self.answer()
                    else:
                        reply = {"schema": STATS_SCHEMA, "error": "the only request is 'stats'"}
                    conn.sendall(json.dumps(reply, separators=(",", ":")).encode() + b"\n")
            except Exception:
                continue  # one bad client never stops the server, nor the program

    def forget(self) -> None:
        """Close the listening socket without removing its file (a forked child's copy)."""
        sock, self.sock = self.sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def close(self) -> None:
        """Stop serving and remove the socket file. The listening socket is shut down first: that wakes
        the serving thread from accept() on Linux (closing it alone does not), so that the thread ends
        (an agent taken out of a running program leaves no thread). Not in `forget`: a forked child's
        copy shares the parent's socket, and shutting it down would stop the parent's too."""
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.forget()
        if self.path is not None:
            try:
                os.unlink(self.path)
            except OSError:
                pass


def query(pid: int, timeout_s: float = 0.5) -> dict[str, Any] | None:
    """Ask the agent in process `pid` for its statistics; None when there is none to ask."""
    path = socket_path(pid)
    try:
        st = os.lstat(path)
        folder = os.lstat(os.path.dirname(path))
    except OSError:
        return None
    if (not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid() or folder.st_uid != os.getuid()
            or folder.st_mode & 0o077):
        return None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(path)
            sock.sendall(b"stats\n")
            data = b""
            while not data.endswith(b"\n") and len(data) < MAX_REPLY_BYTES:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
    except OSError:
        return None
    try:
        reply = json.loads(data)
    except ValueError:
        return None
    if not isinstance(reply, dict) or reply.get("schema") != STATS_SCHEMA or "error" in reply:
        return None
    return reply
