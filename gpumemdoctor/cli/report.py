"""`gpumemdoctor report FILE.json`: show a saved report again, or write it as HTML; needs no GPU.
With several files (one per node of a distributed job), one view of the job; with
`--from-run-dir DIR`, a report from the run folder a killed supervisor left behind."""
from __future__ import annotations

import os

import click

from ..errors import UsageError
from ._params import FileName


@click.command("report")
@click.argument("paths", metavar="[PATH]...", type=FileName(), nargs=-1)
@click.option("--width", type=click.IntRange(40, 400), default=None, help="Columns to draw in.")
@click.option("--html", "html", type=FileName(), metavar="OUT", default=None,
              help='Write the report as one self-contained HTML page instead '
                   '(needs plotly: pip install plotly).')
@click.option("--from-run-dir", "run_dir", type=FileName(file_okay=False, dir_okay=True), default=None,
              help="Make the report from the run folder (gpumemdoctor-XXXXXXXX in $TMPDIR or /tmp) that a "
                   "gpumemdoctor run killed before its target ended left behind.")
@click.option("-o", "--output", type=FileName(), default=None,
              help="With --from-run-dir: also write the JSON report here.")
@click.option("--force", is_flag=True, help="Overwrite the --html or -o file if it exists.")
@click.option("--rejudge", is_flag=True,
              help="Show this version's judgement of the report's recording instead of the one saved in it.")
def report_command(paths: tuple[str, ...], width: int | None, html: str | None, run_dir: str | None,
                   output: str | None, force: bool, rejudge: bool) -> int:
    """Render a saved JSON report in the terminal, or as an HTML page with --html (or recover
    one with --from-run-dir). Several reports of one distributed job (one per node) are shown
    as one job."""
    from ..reporters.console import make_console
    from ..files.outputs import check_distinct, check_writable

    if (not paths) == (run_dir is None):
        raise UsageError("give a report file, or --from-run-dir DIR (not both)")
    path = paths[0] if len(paths) == 1 else None
    if output is not None and run_dir is None:
        raise UsageError("-o goes with --from-run-dir: a saved report is already a file")
    check_distinct({f"--html {html}": html, f"-o {output}": output}, _inputs(paths, run_dir))
    if html is not None:
        from ..reporters import html as html_reporter

        html_reporter.require_plotly()
        check_writable(html, force, what="HTML page")
    if output is not None:
        check_writable(output, force)
    if len(paths) > 1:
        return _job(paths, width, html, force)
    from ..diagnosis.diagnose import diagnose

    if run_dir is not None:
        from ..reporters.json_report import build, write
        from ..supervise.recovery import recover

        recording = recover(run_dir)
        diagnosis = diagnose(recording)
        if output is not None:
            write(build(recording, diagnosis), output, force)
    else:
        from ..reporters.json_report import load

        recording, diagnosis = load(path)
        diagnosis = _judged_now(path, recording, diagnosis, diagnose(recording), rejudge)
    if html is not None:
        from ..files.outputs import write_text

        text = html_reporter.render(recording, diagnosis, path or output)
        write_text(text, html, force, what="HTML page")
        _said_written(html, text)
        return 0
    from ..reporters import terminal

    terminal.render(make_console(stderr=False, width=width), recording, diagnosis, output)
    return 0


def _said_written(html: str, text: str) -> None:
    """The page's name and size; on standard error when the page itself went to standard output
    (`--html /dev/stdout | ...`), where the line would have ended it."""
    from ..files.outputs import is_standard_output

    click.echo(f"HTML report: {html} ({len(text.encode()) / 1e6:.1f} MB)", err=is_standard_output(html))


def _inputs(paths: tuple[str, ...], run_dir: str | None) -> dict[str, str]:
    """What `report` reads, which no output may overwrite: the reports, or the run folder's files."""
    inputs = {f"the report {p}": p for p in paths}
    if run_dir is not None and os.path.isdir(run_dir):
        try:
            names = [n for n in os.listdir(run_dir) if n == "run.json" or n.startswith("agent-")]
        except OSError:
            names = []
        inputs.update({f"the run folder's {n}": os.path.join(run_dir, n) for n in names})
    return inputs


def _judged_now(path: str, recording, saved, current, rejudge: bool):
    """The judgement to show: the one saved in the report, with a note on standard error when this
    version judges the same recording differently; with --rejudge, this version's, saying so."""
    from .. import __version__

    def judged(d) -> str:
        kinds = ", ".join(sorted({f.kind for f in d.findings})) or "none"
        return f"verdict {d.verdict or 'none'}; findings {kinds}"

    if rejudge:
        current.notes.append(f"judged again by gpumemdoctor {__version__} (--rejudge); the report was written "
                             f"by gpumemdoctor {recording.tool_version}: {judged(saved)}")
        return current
    if judged(saved) != judged(current):
        click.echo(f"gpumemdoctor: note: {path} was judged when it was written, by gpumemdoctor "
                   f"{recording.tool_version}: {judged(saved)}. This gpumemdoctor ({__version__}) judges its "
                   f"recording differently: {judged(current)}. `gpumemdoctor report --rejudge {path}` shows "
                   "that judgement.", err=True)
    return saved


def _job(paths: tuple[str, ...], width: int | None, html: str | None, force: bool) -> int:
    """Several reports of one job: each read strictly, the same run refused twice, then the
    recordings diagnosed together (diagnosis.diagnose_job)."""
    from ..reporters.console import make_console
    from ..diagnosis.diagnose import diagnose_job
    from ..reporters.json_report import load

    seen: dict = {}
    recordings = []
    for path in paths:
        real = os.path.realpath(path)
        if real in seen:
            raise UsageError(f"{path} is given twice")
        recording, _ = load(path)
        run = (recording.host, recording.target_pid, recording.started_wall)
        twin = next((p for p, key in seen.values() if key == run), None)
        if twin is not None:
            raise UsageError(f"{twin} and {path} are the same run (host {recording.host or 'not recorded'}, "
                             f"process {recording.target_pid}): give each node's report once")
        seen[real] = (path, run)
        recordings.append(recording)
    diagnosis = diagnose_job(recordings)
    if html is not None:
        from ..files.outputs import write_text
        from ..reporters import html as html_reporter

        text = html_reporter.render_job(recordings, diagnosis, list(paths))
        write_text(text, html, force, what="HTML page")
        _said_written(html, text)
        return 0
    from ..reporters import terminal

    terminal.render_job(make_console(stderr=False, width=width), recordings, diagnosis, list(paths))
    return 0
