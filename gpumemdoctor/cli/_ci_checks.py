"""The CI-check options shared by `run` and `compare`, and what to do with their results."""
from __future__ import annotations

import os
from typing import Callable

import click

from ..errors import UsageError
from ._params import FileName
from ._params import size as _size


TOLERANCE_DEFAULT = "5%"


def check_options(fn: Callable) -> Callable:
    """Add --max-peak, --max-retained, --fail-on, --tolerance, --nvml-tolerance, --junit."""
    options = [
        click.option("--max-peak", callback=_size, metavar="SIZE",
                     help="Fail when the peak GPU memory of the run (NVML, target and children) "
                          "is over SIZE (512MiB, 2GiB); with ranks, of each rank."),
        click.option("--max-retained", callback=_size, metavar="SIZE",
                     help="Fail when the memory still held at exit, beyond the CUDA context, is over SIZE."),
        click.option("--fail-on", metavar="KINDS",
                     help="Fail on any of these findings, comma-separated: leak, out-of-memory, "
                          "allocator-cache, pending-stream, garbage-cycle, non-torch, child-contexts, stray-context, "
                          "orphan-process, host-memory, rank-imbalance, avoidable-peak."),
        click.option("--tolerance", default=TOLERANCE_DEFAULT, show_default=True, metavar="TOL",
                     callback=_tolerance_given,
                     help="How much a baseline figure may grow: 5% or 64MiB."),
        click.option("--nvml-tolerance", metavar="TOL", callback=_tolerance_given,
                     help="Also compare the NVML peak with the baseline, with this tolerance."),
        click.option("--junit", type=FileName(), metavar="PATH",
                     help="Write the checks as JUnit XML, one test case per check."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _tolerance_given(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A tolerance given empty (`--nvml-tolerance "$TOL"` with the variable unset in CI) is refused, not
    taken for no tolerance: that silently dropped the NVML check."""
    if value is not None and not value.strip():
        raise click.BadParameter("an empty tolerance (is a variable unset?): give a percentage (5%) or a "
                                 "size (64MiB)")
    return value


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
