"""The files the tool writes (reports, HTML pages, JUnit XML, baselines, watch's log): checked before
the work starts, never one over another or over an input, and written readable by their owner only.

One rule for every file: a new file is created with mode 0600 (they hold the target's command line
and working folder); an existing regular file that may be overwritten is replaced by a new one,
written beside it first, so it is 0600 too and a failed write leaves the old file whole; an existing
file that is not a regular file (/dev/stdout, /dev/null, a pipe being read) is written in place.
A symbolic link is followed: the file it names is the one written (`resolved`).
"""
from __future__ import annotations

import os
import stat
import tempfile
from typing import Callable

from ..errors import UsageError

# The option that names each kind of file, for the messages.
OPTIONS = {"report": "-o", "snapshot": "--snapshot", "HTML page": "--html", "JUnit XML": "--junit",
           "baseline": "--baseline", "watch log": "--jsonl"}
MAX_FIRST_LINE_BYTES = 1 << 20  # of a log appended to: enough for a sample of a large job


def resolved(path: str) -> str:
    """The file that `path` names, links followed. /dev/stdout, when standard output is a pipe or a
    socket, leads through /proc/self/fd to a name that is no path ('pipe:[123]'): the kernel opens such
    a link itself, so the path given is the one to open."""
    real = os.path.realpath(path)
    if not os.path.exists(real) and os.path.exists(path):
        return path
    return real


def is_standard_output(path: str) -> bool:
    """Whether `path` is the tool's own standard output (/dev/stdout, /proc/self/fd/1, the file it goes to)."""
    try:
        written, out = os.stat(path), os.fstat(1)
    except OSError:
        return False
    return (written.st_dev, written.st_ino) == (out.st_dev, out.st_ino)


def folder_ending(path: str) -> str | None:
    """The end of `path` that makes it a folder's name whether or not one is there (`x.json/`, `out/.`,
    `..`), or None: the kernel takes such a name for a folder, and resolving it gives the file `x.json`."""
    for sep in (os.sep, os.altsep):
        if sep and path.endswith(sep):
            return sep
    name = os.path.basename(path)
    return (os.sep + name if name != path else name) if name in (os.curdir, os.pardir) else None


def names_folder(path: str) -> bool:
    """Whether `path` is a folder, or is written as one (folder_ending)."""
    return os.path.isdir(path) or folder_ending(path) is not None


def refuse_folder(path: str, what: str, option: str) -> None:
    """The one refusal of an output path that names a folder, for every output (-o, --html, --junit, ...)."""
    if names_folder(path):
        how = "is a directory" if os.path.isdir(path) else f"names a directory (it ends in {folder_ending(path)})"
        raise UsageError(f"the {what} path {path} {how}: give a file name with {option}")


def _exists_message(path: str, option: str) -> str:
    return f"{path} exists: pass --force to overwrite it, or {option} to choose another name"


def check_writable(path: str, force: bool, what: str = "report") -> None:
    """Fail before the work starts when `path` could not be written once it is done: a folder; an
    existing file without `force`; a folder that does not exist, is a file, or refuses a new file
    there (a read-only disk, /proc)."""
    option = OPTIONS[what]
    refuse_folder(path, what, option)
    real = resolved(path)
    if os.path.exists(real):
        if not force:
            raise UsageError(_exists_message(path, option))
        if not stat.S_ISREG(os.stat(real).st_mode):
            _probe_open(real, what, path)  # a device or a pipe is written in place
            return
    exists = os.path.exists(real)
    check_folder_writable(os.path.dirname(real), what, option, probe=exists)  # a replacement is made there
    if not exists:
        # Create the very name and remove it again: a folder may take no new file at all (/proc) or
        # refuse this name (too long), which its permissions do not tell.
        try:
            os.close(os.open(real, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
            os.unlink(real)
        except FileExistsError:
            pass  # made meanwhile: the write will say what it finds then
        except OSError as exc:
            raise UsageError(f"cannot write the {what} to {path}: {exc.strerror or exc}") from None


def check_folder_writable(folder: str, what: str = "report", option: str = "-o", probe: bool = True) -> None:
    """The folder a file will go to exists, is a folder, and (with `probe`, by making one) takes a new file."""
    if not os.path.isdir(folder):
        if os.path.exists(folder):
            raise UsageError(f"cannot write the {what}: {folder} is a file, not a folder")
        raise UsageError(f"cannot write the {what}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"cannot write the {what}: folder {folder} is not writable; "
                         f"pass {option} to write it elsewhere")
    if not probe:
        return
    try:  # root passes os.access everywhere, also where no file can be made (/proc, a read-only disk)
        fd, made = tempfile.mkstemp(dir=folder, prefix=".gpumemdoctor-probe-")
        os.close(fd)
        os.unlink(made)
    except OSError as exc:
        raise UsageError(f"cannot write the {what} in {folder}: {exc.strerror or exc}; "
                         f"pass {option} to write it elsewhere") from None


def _probe_open(real: str, what: str, path: str) -> None:
    try:  # O_NONBLOCK: a pipe that nobody reads fails at once (ENXIO) instead of waiting
        os.close(os.open(real, os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)))
    except OSError as exc:
        raise UsageError(f"cannot write the {what} to {path}: {exc.strerror or exc}") from None


def write_text(text: str, path: str, force: bool, what: str = "report") -> bool:
    """Write `text` to `path` as the module's rule says; refuse to replace a file unless `force`.
    A write that fails midway (a full disk) leaves no half file and the old file whole. False where
    `path` is a pipe whose reader stopped reading (`--html /dev/stdout | head -c 100`): it took what
    it wanted, which is no error (as for the tool's own standard output, cli/_stdio.py)."""
    option = OPTIONS[what]
    refuse_folder(path, what, option)
    real = resolved(path)
    try:
        if os.path.exists(real):
            if not force:
                raise UsageError(_exists_message(path, option))
            if stat.S_ISREG(os.stat(real).st_mode):
                _replace(text, real)
                return True
            return _write_in_place(text, real)
        try:
            fd = os.open(real, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise UsageError(_exists_message(path, option)) from None
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError:
            _remove(real)
            raise
        return True
    except OSError as exc:
        raise UsageError(f"cannot write the {what} to {path}: {exc.strerror or exc}") from None


def _write_in_place(text: str, real: str) -> bool:
    """A file that is no regular file (/dev/stdout, a pipe, a device) written as it is; False where a
    pipe's reader left before the end (EPIPE: Python ignores SIGPIPE, so the write fails instead)."""
    try:
        with open(real, "w", encoding="utf-8") as f:
            f.write(text)
    except BrokenPipeError:
        return False
    return True


def _replace(text: str, real: str) -> None:
    fd, temporary = tempfile.mkstemp(dir=os.path.dirname(real), prefix=f".{os.path.basename(real)}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:  # mkstemp makes it 0600
            f.write(text)
        os.replace(temporary, real)
    except BaseException:
        _remove(temporary)
        raise


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _identity(path: str) -> tuple:
    """What tells two paths to one file apart: the file itself where it exists, else where it would be."""
    real = resolved(path)
    try:
        st = os.stat(real)
        return ("file", st.st_dev, st.st_ino)
    except OSError:
        return ("path", real)


def same_file(path: str, files: dict[str, str | None]) -> str | None:
    """The label of the file among `files` (label -> path) that `path` leads to, or None."""
    key = _identity(path)
    return next((label for label, other in files.items() if other is not None and _identity(other) == key), None)


def check_distinct(outputs: dict[str, str | None], inputs: dict[str, str | None]) -> None:
    """Refuse an output that is one of the inputs (the script, a report being read, the baseline
    compared with) or another output: each named by what the user gave (`-o r.json`)."""
    seen: dict[tuple, str] = {}
    for label, path in inputs.items():
        if path is not None:
            seen.setdefault(_identity(path), label)
    outs: dict[tuple, str] = {}
    for label, path in outputs.items():
        if path is None:
            continue
        key = _identity(path)
        if key in seen:
            raise UsageError(f"{label} would write over {seen[key]}: give {label.split()[0]} another file name")
        if key in outs:
            raise UsageError(f"{outs[key]} and {label} name the same file: give each its own")
        outs[key] = label


class LineLog:
    """A file the tool appends to a line at a time as it goes (`watch --jsonl`, for tail -f). Unbuffered:
    a line is in the file once written, and nothing is left over to fail again when it is closed. The
    first write that fails ends the log."""

    def __init__(self, path: str, fd: int):
        self.path = path
        self._fd: int | None = fd

    def write(self, line: str) -> str | None:
        """Append `line`; None, or once, on the write that fails (a full disk, a reader gone), why."""
        if self._fd is None:
            return None
        data = line.encode()
        try:
            while data:
                data = data[os.write(self._fd, data):]
        except OSError as exc:
            self.close()
            return f"stopped writing {self.path}: {exc.strerror or exc}"
        return None

    def close(self) -> None:
        if self._fd is not None:
            _close_quietly(self._fd)
            self._fd = None


def check_log(path: str, force: bool, is_log: Callable[[str], bool], what: str = "watch log") -> bool:
    """Before the work starts: refuse a log path that is a folder, or in a folder that does not exist,
    and an existing regular file that is not such a log (`is_log` of its first line says; an empty
    file is one), unless `force`. True when that file is to be replaced rather than appended to."""
    option = OPTIONS[what]
    refuse_folder(path, what, option)
    real = resolved(path)
    if not os.path.exists(real):
        check_folder_writable(os.path.dirname(real), what, option, probe=False)
        return False
    if not stat.S_ISREG(os.stat(real).st_mode) or is_log(_first_line(real)):
        return False  # a pipe or a device is written in place; the tool's own log is appended to
    if not force:
        raise UsageError(f"{path} exists and is not a log of gpumemdoctor watch: pass --force to write "
                         f"over it, or {option} to choose another name")
    return True


def _first_line(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(MAX_FIRST_LINE_BYTES).split(b"\n", 1)[0].decode("utf-8", errors="replace")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None


def open_log(path: str, replace: bool = False) -> LineLog:
    """Open `path` to append lines to: a new file is its owner's only (0600), an existing one keeps its
    mode, unless `replace` (check_log's answer), which puts a new empty 0600 file in its place; a pipe
    with no reader fails at once instead of waiting for one."""
    try:
        if replace:
            _replace("", resolved(path))
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
    os.set_blocking(fd, True)  # O_NONBLOCK was for the open alone
    return LineLog(path, fd)


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
