"""`gpumemdoctor report FILE.json`: show a saved report again; needs no GPU."""
from __future__ import annotations

import click


@click.command("report")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--width", type=click.IntRange(40, 400), default=None, help="Columns to draw in.")
def report_command(path: str, width: int | None) -> int:
    """Render a saved JSON report in the terminal."""
    from ..console import make_console
    from ..report import load
    from ..reporters import terminal

    recording, diagnosis = load(path)
    terminal.render(make_console(stderr=False, width=width), recording, diagnosis)
    return 0
