"""The CI gate of `run` and `compare`: the checks asked for made a policy (`make_policy`), and their
results drawn, written as JUnit XML and appended to GitHub's step summary (`publish`)."""
from __future__ import annotations

import os

import click

from ..errors import UsageError


def make_policy(max_peak: int | None, max_retained: int | None, fail_on: str | None,
                tolerance: str, nvml_tolerance: str | None, baseline: dict | None):
    from ..diagnosis.ci_checks import Policy, parse_kinds, parse_tolerance

    ranks = baseline.get("ranks") if baseline is not None else None  # a baseline's figures per rank
    parts = baseline.get("peak_parts") if baseline is not None else None  # its largest peak's parts
    return Policy(max_peak_bytes=max_peak, max_retained_bytes=max_retained,
                  fail_on=parse_kinds(fail_on) if fail_on is not None else (),
                  baseline=None if baseline is None else {k: v for k, v in baseline.items()
                                                          if k not in ("ranks", "peak_parts")},
                  baseline_peak_parts=parts,
                  tolerance=parse_tolerance(tolerance),
                  nvml_tolerance=parse_tolerance(nvml_tolerance) if nvml_tolerance is not None else None,
                  baseline_ranks=ranks)


def publish(console, title: str, verdict: str | None, figures: dict, results: list, junit: str | None,
            html: str | None = None, files: dict[str, str | None] | None = None, target_ran: bool = True,
            notes: list[str] = ()) -> None:
    """Draw the checks, write JUnit XML if asked, and append to GitHub's step summary if set; `notes`
    (`compare`'s: two reports of different GPUs or programs) go into both.

    `files` are those the command reads and writes (label -> path): the summary is never appended to
    one of them. A JUnit file that cannot be written now is said in one line; after a target ran its
    exit status stays, and without one (`compare`) it is the command's error (exit 2), raised once
    the summary is written."""
    from ..reporters import ci_checks as reporter

    from ..files.outputs import write_text

    reporter.render(console, results)
    failed = None
    if junit:
        try:  # checked before the work began; failing now, it is said
            write_text(reporter.junit_xml(results, notes=notes), junit, force=True, what="JUnit XML")
        except UsageError as exc:
            if not target_ran:
                failed = exc
            else:
                click.echo(f"gpumemdoctor: error: {exc}; the exit status stays the checks' and the target's",
                           err=True)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        _append_summary(summary, reporter.markdown_summary(title, verdict, figures, results, html,
                                                           _run_url(os.environ), notes), files or {})
    if failed is not None:
        raise failed


def _append_summary(path: str, text: str, files: dict[str, str | None]) -> None:
    """Append to GitHub's step summary; a warning on standard error (never into the report drawn on
    standard output) when it names a file of the command's own, or cannot be written."""
    from ..files.outputs import same_file

    clash = same_file(path, files)
    if clash is not None:
        click.echo(f"gpumemdoctor: warning: GITHUB_STEP_SUMMARY names {clash}: the step summary is not "
                   "appended to it", err=True)
        return
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        click.echo(f"gpumemdoctor: warning: could not append to GITHUB_STEP_SUMMARY {path} "
                   f"({exc.strerror or exc})", err=True)


def _run_url(env) -> str | None:
    """The GitHub Actions run's page, where its uploaded artifacts are listed; None outside Actions."""
    server, repo, run_id = (env.get(k) for k in ("GITHUB_SERVER_URL", "GITHUB_REPOSITORY", "GITHUB_RUN_ID"))
    return f"{server}/{repo}/actions/runs/{run_id}" if server and repo and run_id else None
