"""`gpumemdoctor report FILE.json`: show a saved report again, or write it as HTML; needs no GPU.
With `--from-run-dir DIR`, a report from the run folder a killed supervisor left behind."""
from __future__ import annotations

import click

from ..errors import UsageError


@click.command("report")
@click.argument("path", type=click.Path(dir_okay=False), required=False)
@click.option("--width", type=click.IntRange(40, 400), default=None, help="Columns to draw in.")
@click.option("--html", "html", type=click.Path(dir_okay=False), metavar="OUT", default=None,
              help='Write the report as one self-contained HTML page instead '
                   '(needs pip install "gpumemdoctor[html]").')
@click.option("--from-run-dir", "run_dir", type=click.Path(file_okay=False), default=None,
              help="Make the report from the run folder (gpumemdoctor-XXXXXXXX in $TMPDIR or /tmp) that a "
                   "gpumemdoctor run killed before its target ended left behind.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="With --from-run-dir: also write the JSON report here.")
@click.option("--force", is_flag=True, help="Overwrite the --html or -o file if it exists.")
def report_command(path: str | None, width: int | None, html: str | None, run_dir: str | None,
                   output: str | None, force: bool) -> int:
    """Render a saved JSON report in the terminal, or as an HTML page with --html (or recover
    one with --from-run-dir)."""
    from ..console import make_console

    if (path is None) == (run_dir is None):
        raise UsageError("give a report file, or --from-run-dir DIR (not both)")
    if output is not None and run_dir is None:
        raise UsageError("-o goes with --from-run-dir: a saved report is already a file")
    from ..report import check_writable

    if html is not None:
        from ..reporters import html as html_reporter

        html_reporter.require_plotly()
        check_writable(html, force, what="HTML page")
    if output is not None:
        check_writable(output, force)
    if run_dir is not None:
        from ..diagnosis import diagnose
        from ..report import build, write
        from ..supervisor import recover

        recording = recover(run_dir)
        diagnosis = diagnose(recording)
        if output is not None:
            write(build(recording, diagnosis), output, force)
    else:
        from ..report import load

        recording, diagnosis = load(path)
    if html is not None:
        from ..report import write_text

        text = html_reporter.render(recording, diagnosis, path or output)
        write_text(text, html, force, what="HTML page")
        click.echo(f"HTML report: {html} ({len(text.encode()) / 1e6:.1f} MB)")
        return 0
    from ..reporters import terminal

    terminal.render(make_console(stderr=False, width=width), recording, diagnosis, output)
    return 0
