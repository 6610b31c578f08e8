"""`gpumemdoctor compare OLD.json NEW.json`: the differences between two runs, judged like `run`."""
from __future__ import annotations

import click

from ..errors import EXIT_CHECK_FAILED
from ._ci_checks import check_options, make_policy, publish
from ._params import FileName


@click.command("compare")
@click.argument("old", type=FileName())
@click.argument("new", type=FileName())
@check_options
def compare_command(old: str, new: str, max_peak: int | None, max_retained: int | None,
                    fail_on: str | None, tolerance: str, nvml_tolerance: str | None,
                    junit: str | None) -> int:
    """Compare two saved reports: OLD is the baseline, NEW is judged.

    Exits 10 when a check fails, 0 otherwise; needs no GPU.
    """
    from ..diagnosis import ci_checks
    from ..reporters.console import make_console
    from ..files.outputs import check_distinct, check_writable
    from ..diagnosis.report_file import load
    from ..reporters import ci_checks as reporter

    check_distinct({f"--junit {junit}": junit}, {f"the report {old}": old, f"the report {new}": new})
    if junit is not None:
        check_writable(junit, True, what="JUnit XML")
    old_recording, old_diagnosis = load(old)
    new_recording, new_diagnosis = load(new)
    old_figures = ci_checks.figures(old_recording, old_diagnosis)
    new_figures = ci_checks.figures(new_recording, new_diagnosis)
    old_ranks = ci_checks.rank_figures(old_recording, old_diagnosis)
    baseline = {**old_figures, "ranks": old_ranks} if old_ranks else dict(old_figures)  # compared rank by rank
    old_parts, new_parts = ci_checks.peak_parts(old_diagnosis), ci_checks.peak_parts(new_diagnosis)
    if old_parts is not None:
        baseline["peak_parts"] = old_parts  # what grew is said by category
    policy = make_policy(max_peak, max_retained, fail_on, tolerance, nvml_tolerance, baseline)
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
