"""The CI-check options shared by `run` and `compare` (their policy and results: app/checks.py)."""
from __future__ import annotations

from typing import Callable

import click

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
