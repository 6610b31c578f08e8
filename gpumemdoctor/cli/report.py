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
    from ..app import pipeline
    from ..files.outputs import check_distinct, check_writable

    if not paths and run_dir is None:
        raise UsageError("neither a report file nor --from-run-dir was given: give a report file, or --from-run-dir "
                         "DIR for the run folder that a killed run left behind")
    if paths and run_dir is not None:
        raise UsageError("give a report file or --from-run-dir DIR, not both")
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
        recordings = _job(paths)
        from ..diagnosis.diagnose import diagnose_job

        return pipeline.show(recordings, diagnose_job(recordings), list(paths), html, force, width)
    from ..diagnosis.diagnose import diagnose

    if run_dir is not None:
        from ..app.report_file import build, write
        from ..supervise.recovery import recover

        recording = recover(run_dir)
        diagnosis = diagnose(recording)
        if output is not None:
            write(build(recording, diagnosis), output, force)
    else:
        from ..app.report_file import load

        recording, diagnosis = load(path)
        diagnosis = _judged_now(path, recording, diagnosis, diagnose(recording), rejudge)
    return pipeline.show([recording], diagnosis, [path] if path else [], html, force, width, output)


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


def _job(paths: tuple[str, ...]) -> list:
    """Several reports of one job: each read strictly, the same run refused twice, reports that are not
    one job's nodes refused; their recordings, to be diagnosed together (diagnosis.diagnose_job)."""
    from ..app.report_file import load

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
    _check_one_job(paths, recordings)
    return recordings


# The nodes of one job start within the rendezvous' wait of each other, so their runs overlap in time;
# their clocks are not compared closer than this (docs/distributed.md).
MAX_CLOCK_SKEW_S = 300.0


def _check_one_job(paths: tuple[str, ...], recordings: list) -> None:
    """Refuse reports that are not the nodes of one distributed job (two unrelated runs, `report A.json
    B.json`): merged, they would get one job's verdict over runs that were never one job. The nodes of
    a job each have ranks, one world size and one run id (where said), no rank twice, and ran at the same
    time."""
    from ..diagnosis.ranks import rank_processes

    def refuse(reason: str) -> None:
        raise UsageError(f"{', '.join(paths)} are not the nodes of one distributed job ({reason}): give one "
                         "report at a time, or the reports of one job's nodes")

    ranks: dict[int, str] = {}  # rank -> the file it is in
    first: dict[str, tuple] = {}  # "world size", "run id" -> (its value, the file that said it first)
    for path, recording in zip(paths, recordings):
        dists = list(rank_processes(recording).values())
        if not dists:
            refuse(f"{path} has no ranks: its run was not a distributed job")
        for dist in dists:
            for what, value in (("world size", dist.world_size), ("run id", dist.run_id)):
                if value is None:
                    continue  # not said: nothing to hold against the others
                said, where = first.setdefault(what, (value, path))
                if value != said:
                    refuse(f"{where} has {what} {said!r}, {path} {value!r}")
            if dist.rank is not None and ranks.setdefault(dist.rank, path) != path:
                refuse(f"rank {dist.rank} is in both {ranks[dist.rank]} and {path}")
    spans = [(r.started_wall, r.started_wall + (r.duration_s or 0.0), p) for p, r in zip(paths, recordings)]
    latest_start = max(spans)
    earliest_end = min(spans, key=lambda span: span[1])
    if latest_start[0] - earliest_end[1] > MAX_CLOCK_SKEW_S:
        refuse(f"{earliest_end[2]} ended at {_utc(earliest_end[1])}, before {latest_start[2]} started at "
               f"{_utc(latest_start[0])}")


def _utc(wall: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(wall, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
