"""`gpumemdoctor compare OLD.json NEW.json`: the differences between two runs, judged like `run`."""
from __future__ import annotations

import click

from ._ci_checks import check_options
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
    from ..app import pipeline
    from ..files.outputs import check_distinct, check_writable

    check_distinct({f"--junit {junit}": junit}, {f"the report {old}": old, f"the report {new}": new})
    if junit is not None:
        check_writable(junit, True, what="JUnit XML")
    return pipeline.compare(old, new, {"max_peak": max_peak, "max_retained": max_retained, "fail_on": fail_on,
                                       "tolerance": tolerance, "nvml_tolerance": nvml_tolerance}, junit)
