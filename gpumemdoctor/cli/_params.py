"""Option parsers the subcommands share: sizes, rates, seconds and file names, refused with click's usage
error."""
from __future__ import annotations

import math
import os

import click

from ..units import parse_size


def size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """A click callback: '512MiB' -> bytes; None stays None."""
    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def rate(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """A click callback: '64MiB/min' -> bytes per minute; None stays None."""
    from ..live.watch import parse_rate

    if value is None:
        return None
    try:
        return parse_rate(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


class Seconds(click.FloatRange):
    """A number of seconds in a range, and finite: click's FloatRange lets NaN through (every
    comparison with NaN is false), and a NaN interval failed only after the target had run."""

    name = "seconds"

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return number


class FileName(click.Path):
    """A file's name, as click's Path, but never empty: an unset variable in CI (`--baseline "$BASELINE"`)
    gives one, which was taken for no file at all, or for a file of that name. Nor, where a folder is no
    answer, a name written as a folder's (`x.json/`), which click's Path lets through when no such
    folder exists, and which was then written as the file `x.json` (files.outputs.names_folder)."""

    def __init__(self, file_okay: bool = True, dir_okay: bool = False):
        super().__init__(file_okay=file_okay, dir_okay=dir_okay)

    def convert(self, value, param, ctx):
        if value == "":
            self.fail("an empty file name (is a variable unset?): give the file's name", param, ctx)
        from ..files.outputs import folder_ending

        ending = folder_ending(value) if isinstance(value, str) and not self.dir_okay else None
        if ending is not None and not os.path.isdir(value):  # (a folder that is there: click's Path says so)
            self.fail(f"{value!r} names a directory (it ends in {ending}): give a file name", param, ctx)
        return super().convert(value, param, ctx)
