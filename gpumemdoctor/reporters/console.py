"""The one console wrapper: colour, width and where the tool's own output goes."""
from __future__ import annotations

import os
import sys

from rich.console import Console


def make_console(stderr: bool = True, width: int | None = None, color: bool | None = None) -> Console:
    """A rich console; no colour when not a terminal or when NO_COLOR is set.

    The tool writes its own report to stderr so that the target's stdout stays
    the target's alone.
    """
    stream = sys.stderr if stderr else sys.stdout
    if color is None:
        color = stream.isatty() and not os.environ.get("NO_COLOR")
    # markup=False: what is drawn holds the target's command line, file and GPU names, and rich
    # would take "[/]" in them for markup (and fail); the reporters style with Text, never markup.
    return Console(file=stream, width=width, no_color=not color, highlight=False,
                   color_system="auto" if color else None, soft_wrap=False,
                   emoji=False, markup=False)
