"""Option parsers the subcommands share: sizes and rates, refused with click's usage error."""
from __future__ import annotations

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
    from ..watcher import parse_rate

    if value is None:
        return None
    try:
        return parse_rate(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
