"""Files from outside (reports, baselines, run files), read with a real bound and parsed as strict JSON.

A path may name anything: a named pipe with no writer (opening it to read would wait forever), a
device that never ends (/dev/zero), or a /proc file that says it is 0 bytes long and is not. So
only regular files are opened, the bound counts the bytes actually read (at most the bound plus
one), and JSON's NaN and Infinity are refused.
"""
from __future__ import annotations

import json
import math
import os
import stat
from typing import Any

from ..errors import BadReportError, UsageError

_CHUNK = 1 << 20

_KINDS = {stat.S_ISFIFO: "a named pipe", stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device",
          stat.S_ISSOCK: "a socket"}


def _not_regular(path: str, mode: int) -> UsageError:
    if stat.S_ISDIR(mode):
        return UsageError(f"{path} is a directory, not a file")
    kind = next((name for test, name in _KINDS.items() if test(mode)), "not a plain file")
    return UsageError(f"{path} is not a regular file ({kind}): give a file saved on disk")


def read_bounded(path: str, limit: int, what: str, missing: str | None = None) -> bytes:
    """The bytes of a regular file of at most `limit` bytes. A path that does not exist, a folder, a
    pipe or a device, or a file that cannot be read is a UsageError; a larger file is a
    BadReportError (it cannot be a `what` this tool wrote)."""
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(path, mode)  # before open(): opening a pipe or a device can block
        # O_NONBLOCK: should the path have become a pipe since, open() still returns at once.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UsageError(missing or f"{path} does not exist") from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(path, mode)
        chunks, size = [], 0
        while size <= limit:  # st_size is not trusted: /proc's files say 0 and hold more
            chunk = os.read(fd, min(_CHUNK, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if size > limit:
        raise BadReportError(f"{path} is larger than {limit:,} bytes, larger than any {what} this tool writes")
    return b"".join(chunks)


def read_json(path: str, limit: int, what: str, missing: str | None = None) -> Any:
    """A file of strict JSON (no NaN, no Infinity, UTF-8), read as `read_bounded` reads it.
    What is not such JSON is a BadReportError that names the file and says it is not a `what`."""
    data = read_bounded(path, limit, what, missing)
    try:
        return loads_strict(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise BadReportError(f"{path} is not a gpumemdoctor {what} (not UTF-8 text)") from None
    except RecursionError:
        raise BadReportError(f"{path} is not a gpumemdoctor {what} (nested too deeply)") from None
    except ValueError as exc:  # also a number of more than 4300 digits
        raise BadReportError(f"{path} is not a gpumemdoctor {what} (invalid JSON: {exc})") from None


def loads_strict(text: str) -> Any:
    """JSON without NaN, Infinity or a number too large for a float; ValueError otherwise."""
    return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 reads as infinity
        raise ValueError(f"{text[:40]} is too large a number")
    return value
