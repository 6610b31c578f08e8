"""The one console wrapper: colour, width and where the tool's own output goes."""
from __future__ import annotations

import os
import re
import sys

from rich.console import Console

_PADDING = re.compile(r"[ \t]+(?=\n)")


def make_console(stderr: bool = True, width: int | None = None, color: bool | None = None) -> Console:
    """A rich console; no colour when not a terminal or when NO_COLOR is set, and no padding.

    The tool writes its own report to stderr so that the target's stdout stays
    the target's alone.
    """
    stream = sys.stderr if stderr else sys.stdout
    terminal = stream.isatty()
    if color is None:
        color = terminal and not os.environ.get("NO_COLOR")
    # markup=False: what is drawn holds the target's command line, file and GPU names, and rich
    # would take "[/]" in them for markup (and fail); the reporters style with Text, never markup.
    return Console(file=stream if terminal else _Unpadded(stream), width=width, no_color=not color,
                   highlight=False, color_system="auto" if color else None, soft_wrap=False,
                   emoji=False, markup=False)


class _Unpadded:
    """A stream that is not a terminal (a CI log, a file, a pipe), written without the spaces that rich
    pads a table's lines with: a log is read, searched and compared line by line. Rich writes whole
    lines; everything else is the stream's own."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(_PADDING.sub("", text))
        return len(text)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)
