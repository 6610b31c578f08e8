"""The tool's own standard output and error, as its commands write to them: what happens when they cannot
be written.

- A reader that stops reading (`gpumemdoctor report R.json | head -1`): the rest of the output is
  dropped, quietly, and the command ends with the exit code it would have had.
- Standard output that cannot be written otherwise (a full disk, `> /dev/full`, closed with `>&-`):
  the command stops with one line on standard error and exit 2, as for any output it cannot write.
- Standard error that cannot be written: what was to go there is dropped, quietly (it is where that
  line would go), and the exit status stays: after `run`, the target's.
- A character the stream's encoding lacks (`PYTHONIOENCODING=ascii`) is written as `?`.

A stream that failed is pointed at /dev/null once the command has ended (`silence`): Python flushes
both once more as it exits, and a failed flush then would change the exit status to 120. Not before:
`run` starts its target with the tool's own standard streams, and a target started after a failed
write must still get the stream it was given.
"""
from __future__ import annotations

import errno
import os

from ..errors import UsageError


class _Closed:
    """A standard stream that was closed when the tool started (`>&-`): Python gives None for it."""

    encoding = "utf-8"
    errors = "strict"

    def isatty(self) -> bool:
        return False

    def write(self, text) -> int:
        if not isinstance(text, str):
            raise TypeError("write() argument must be str")  # as a text stream answers (click asks)
        if not text:
            return 0
        raise OSError(errno.EBADF, "it is closed (>&-)")

    def flush(self) -> None:
        pass


class StandardStream:
    """Standard output (`fatal`: a failed write stops the command) or error (a failed write is dropped);
    see the module's docstring. Everything else is the stream's own, but its binary `buffer`: click
    would write around this wrapper to it."""

    def __init__(self, stream, name: str, fatal: bool):
        self.original = stream  # given back as the command ends
        self.stream = stream if stream is not None else _Closed()
        self.name = name
        self.fatal = fatal
        self.gone = False  # nothing more is written: the reader left, or the stream failed

    def write(self, text: str) -> int:
        if isinstance(text, str) and not text:
            return 0  # click asks a stream what it is by writing nothing: no answer of a failure there
        if not self.gone:
            try:
                try:
                    return self.stream.write(text)
                except UnicodeEncodeError:
                    return self.stream.write(_encodable(text, self.stream))
            except OSError as exc:
                self._failed(exc)
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self.stream.flush()
            except OSError as exc:
                self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        self.gone = True
        if self.fatal and not isinstance(exc, BrokenPipeError):
            raise UsageError(f"cannot write to {self.name}: {exc.strerror or exc}; send it where it can be "
                             "written (a file, a pipe)") from None

    def silence(self) -> None:
        """Point the stream's file descriptor at /dev/null once it has failed (see the module's docstring)."""
        if not self.gone:
            return
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass  # closed from the start, or not a file (a test's StringIO)

    def __getattr__(self, name: str):
        if name == "buffer":
            raise AttributeError(name)
        return getattr(self.stream, name)


def _encodable(text: str, stream) -> str:
    encoding = getattr(stream, "encoding", None) or "ascii"
    return text.encode(encoding, errors="replace").decode(encoding)
