"""`gpumemdoctor report FILE.json`: show a saved report again, or write it as HTML; needs no GPU."""
from __future__ import annotations

import click


@click.command("report")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--width", type=click.IntRange(40, 400), default=None, help="Columns to draw in.")
@click.option("--html", "html", type=click.Path(dir_okay=False), metavar="OUT", default=None,
              help='Write the report as one self-contained HTML page instead '
                   '(needs pip install "gpumemdoctor[html]").')
@click.option("--force", is_flag=True, help="Overwrite the --html file if it exists.")
def report_command(path: str, width: int | None, html: str | None, force: bool) -> int:
    """Render a saved JSON report in the terminal, or as an HTML page with --html."""
    from ..console import make_console
    from ..report import check_writable, load, write_text

    if html is not None:
        from ..reporters import html as html_reporter

        html_reporter.require_plotly()
        check_writable(html, force, what="HTML page")
        recording, diagnosis = load(path)
        text = html_reporter.render(recording, diagnosis, path)
        write_text(text, html, force, what="HTML page")
        click.echo(f"HTML report: {html} ({len(text.encode()) / 1e6:.1f} MB)")
        return 0
    from ..reporters import terminal

    recording, diagnosis = load(path)
    terminal.render(make_console(stderr=False, width=width), recording, diagnosis)
    return 0
