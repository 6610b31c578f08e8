"""The one pipeline of a finished recording: diagnosed, its JSON report written, its HTML page, its
terminal report, then the CI gate. `run` (and `watch --attach`) go through `after_run`; `report`
through `show` (one recording, or one job's); `compare` through `compare`. The CLI checks the options
and every file before; here the work is sequenced once."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import click

from ..errors import EXIT_CHECK_FAILED, UsageError


@dataclass(frozen=True)
class RunOutputs:
    """What `run` writes and draws once its target has ended; every file checked before it started."""

    name: str  # the target's name, for the report's default file name
    report: str | None  # -o; None: the default name, known once the target's PID is
    force: bool
    quiet: bool
    html: str | None
    html_next_to_json: bool
    junit: str | None
    new_baseline: str | None  # the file --update-baseline writes; None without it
    reads: dict = field(default_factory=dict)  # what the run read (label -> path): the script, the baseline


def prepare() -> None:
    """Import what `after_run` needs (the diagnosis, the report's writers and drawers): the supervisor
    calls it on a thread of its own while the target runs, so that these imports are off the run's
    wall time. A test keeps these imports equal to after_run's (tests/test_layout.py)."""
    from ..diagnosis import ci_checks  # noqa: F401
    from ..diagnosis.diagnose import diagnose  # noqa: F401
    from ..files.outputs import write_text  # noqa: F401
    from ..reporters import html as html_reporter  # noqa: F401
    from ..reporters import terminal  # noqa: F401
    from ..reporters.console import make_console  # noqa: F401
    from . import baseline_file, checks, report_file  # noqa: F401


def after_run(recording, status: int, outputs: RunOutputs, policy) -> int:
    """Diagnose, write and draw the report, then the checks; the exit status is the target's, or 10
    when it succeeded and a check failed. A file that cannot be written now is said in one line."""
    from ..diagnosis.diagnose import diagnose
    from ..reporters.console import make_console
    from .report_file import default_name

    diagnosis = diagnose(recording)
    default_path = default_name(outputs.name, recording, os.environ)  # with the host and node under a launcher
    console = make_console()
    path = _write_report(recording, diagnosis, outputs.report or default_path, outputs.force)
    html = outputs.html
    if outputs.html_next_to_json and html is None:
        html = next_to(outputs.report or default_path)
    if html is not None and not _write_page(recording, diagnosis, path, html, outputs.force):
        html = None
    _draw(console, recording, diagnosis, path, html, outputs.quiet)
    failed = outputs.new_baseline is not None and not _write_baseline(console, recording, diagnosis,
                                                                       outputs.new_baseline)
    if policy is not None and not policy.empty:
        failed = not _gate(console, recording, diagnosis, policy, outputs, outputs.report or default_path,
                           html) or failed
    return EXIT_CHECK_FAILED if status == 0 and failed else status  # the target's own failure wins


def _write_report(recording, diagnosis, path: str, force: bool) -> str | None:
    """The JSON report written; None where it could not be (the run happened: its verdict and exit
    status still come)."""
    from .report_file import build, write

    try:
        write(build(recording, diagnosis), path, force)
    except UsageError as exc:
        click.echo(f"gpumemdoctor: error: {exc}; the verdict follows, the exit status is the target's",
                   err=True)
        return None
    return path


def _write_page(recording, diagnosis, path: str | None, html: str, force: bool) -> bool:
    from ..files.outputs import write_text
    from ..reporters import html as html_reporter

    try:
        write_text(html_reporter.render(recording, diagnosis, path), html, force, what="HTML page")
    except UsageError as exc:
        click.echo(f"gpumemdoctor: error: {exc}", err=True)
        return False
    return True


def _draw(console, recording, diagnosis, path: str | None, html: str | None, quiet: bool) -> None:
    """The terminal report on standard error; with -q its one line, for scripts."""
    from ..reporters import terminal

    if quiet:
        verdict = diagnosis.verdict or "none (no GPU measured)"
        console.print(f"gpumemdoctor verdict: {verdict}" + (f"  report: {path}" if path else "")
                      + (f"  html: {html}" if html else ""), soft_wrap=True)
        return
    console.print()
    terminal.render(console, recording, diagnosis, path)
    if html:
        console.print(f"HTML report: {html}", soft_wrap=True)


def _gate(console, recording, diagnosis, policy, outputs: RunOutputs, report: str, html: str | None) -> bool:
    """The checks of a run, drawn and published; whether they all passed."""
    from ..diagnosis import ci_checks
    from .checks import publish

    results = ci_checks.evaluate(recording, diagnosis, policy)
    written = {f"the report {report}": report, f"the HTML page {html}": html,
               f"the JUnit XML {outputs.junit}": outputs.junit,
               f"the baseline {outputs.new_baseline}": outputs.new_baseline}
    publish(console, " ".join(recording.target.get("argv") or []), diagnosis.verdict,
            ci_checks.figures(recording, diagnosis), results, outputs.junit, html,
            files={**outputs.reads, **written})
    return all(r.passed for r in results)


def _write_baseline(console, recording, diagnosis, path: str) -> bool:
    """Write the run's figures as the baseline; False when the run measured too little to make one (a
    baseline of nulls would fail every later check). A write that fails is said, and is no failure of
    the run's: the exit status stays."""
    from ..diagnosis import ci_checks
    from .baseline_file import write_baseline

    document = ci_checks.baseline_document(recording, diagnosis)
    missing = ci_checks.unmeasured(document["figures"])
    if missing:
        click.echo(f"gpumemdoctor: error: --update-baseline: the run did not measure {' or '.join(missing)} "
                   f"(did the target use PyTorch on a GPU?), so the baseline {path} is not written", err=True)
        return False
    try:
        write_baseline(path, document)
        console.print(f"Baseline written: {path}", soft_wrap=True)
    except UsageError as exc:
        click.echo(f"gpumemdoctor: error: {exc}; the exit status is the target's", err=True)
    return True


def next_to(json_path: str) -> str:
    """The HTML page's name beside a JSON report: vram-report.json -> vram-report.html."""
    stem, ext = os.path.splitext(json_path)
    return (stem if ext.lower() == ".json" else json_path) + ".html"


def show(recordings: list, diagnosis, paths: list[str], html: str | None, force: bool,
         width: int | None, output: str | None = None) -> int:
    """`report`: a diagnosis drawn as a page (--html) or in the terminal, on standard output. One
    recording (`paths`: the report it was read from, or none) or several, one job's nodes; `output`,
    the JSON report just written (--from-run-dir -o)."""
    from ..reporters.console import make_console

    job = len(recordings) > 1
    if html is not None:
        from ..files.outputs import write_text
        from ..reporters import html as html_reporter

        text = (html_reporter.render_job(recordings, diagnosis, paths) if job else
                html_reporter.render(recordings[0], diagnosis, (paths[0] if paths else None) or output))
        if write_text(text, html, force, what="HTML page"):  # (not where its reader stopped early)
            _said_written(html, text)
        return 0
    from ..reporters import terminal

    console = make_console(stderr=False, width=width)
    if job:
        terminal.render_job(console, recordings, diagnosis, paths)
    else:
        terminal.render(console, recordings[0], diagnosis, output)
    return 0


def _said_written(html: str, text: str) -> None:
    """The page's name and size; on standard error when the page itself went to standard output
    (`--html /dev/stdout | ...`), where the line would have ended it."""
    from ..files.outputs import is_standard_output

    click.echo(f"HTML report: {html} ({len(text.encode()) / 1e6:.1f} MB)", err=is_standard_output(html))


def compare(old: str, new: str, policy_options: dict, junit: str | None) -> int:
    """`compare`: OLD's figures as the baseline, NEW judged against them, drawn, then the gate;
    10 when a check fails, else 0. `policy_options` are make_policy's, but the baseline."""
    from ..diagnosis import ci_checks
    from ..reporters import ci_checks as reporter
    from ..reporters.console import make_console
    from .checks import make_policy, publish
    from .report_file import load

    old_recording, old_diagnosis = load(old)
    new_recording, new_diagnosis = load(new)
    old_figures = ci_checks.figures(old_recording, old_diagnosis)
    new_figures = ci_checks.figures(new_recording, new_diagnosis)
    old_ranks = ci_checks.rank_figures(old_recording, old_diagnosis)
    baseline = {**old_figures, "ranks": old_ranks} if old_ranks else dict(old_figures)  # compared rank by rank
    old_parts, new_parts = ci_checks.peak_parts(old_diagnosis), ci_checks.peak_parts(new_diagnosis)
    if old_parts is not None:
        baseline["peak_parts"] = old_parts  # what grew is said by category
    policy = make_policy(**policy_options, baseline=baseline)
    results = ci_checks.evaluate(new_recording, new_diagnosis, policy)
    console = make_console(stderr=False)
    reporter.render_comparison(console, old_diagnosis.verdict, new_diagnosis.verdict, old_figures,
                               new_figures, old_ranks, ci_checks.rank_figures(new_recording, new_diagnosis),
                               ci_checks.peak_growth(old_parts, new_parts), old_parts, new_parts)
    notes = reporter.comparison_notes(old_recording, new_recording)
    for note in notes:
        console.print(f"note: {note}")
    publish(console, f"{old} -> {new}", new_diagnosis.verdict, new_figures, results, junit,
            files={f"the report {old}": old, f"the report {new}": new, f"the JUnit XML {junit}": junit},
            target_ran=False, notes=notes)
    return 0 if all(r.passed for r in results) else EXIT_CHECK_FAILED
