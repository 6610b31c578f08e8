"""The CI checks' words: why a tolerance, a --fail-on list or a baseline's schema is refused, each
check's message (a ceiling, the ranks' ceilings, a finding kind, a figure against its baseline) and the
ranks a baseline does not compare (ci_checks.py decides them). Pure.

The same registry as summaries.py's (summaries_registry.py): each sentence a registered function, its
keyword arguments the facts ci_checks.py decided; `tell(name, **facts)` makes it. `of_rank` and
`tolerance_words` are ci_checks.py's too (a check's label for one rank, a tolerance as its messages
write it).
"""
from __future__ import annotations

from .summaries_registry import summary as _summary
from .summaries_ranks import ranges
from ..units import format_bytes as fb


def of_rank(label: str, rank: int) -> str:
    """'peak GPU memory (NVML) of rank 1': a check's label for one rank."""
    return f"{label} of rank {rank}"


def tolerance_words(fraction: float, size: int) -> str:
    """'5%', or '64.00 MiB' for a tolerance in bytes."""
    return f"{fraction * 100:g}%" if size == 0 else fb(size)


def _ranks_words(ranks: list[int]) -> str:
    """'rank 1', 'ranks 1-2, 5'."""
    return f"rank{'s' if len(ranks) > 1 else ''} {ranges(ranks)}"


# -- the options refused (parse_tolerance, parse_kinds) ---------------------------------------

@_summary("tolerance-negative")
def _tolerance_negative(text: str) -> str:
    return f"tolerance {text!r:.40} must not be negative: give a percentage (5%) or a size (64MiB)"


@_summary("tolerance-without-unit")
def _tolerance_without_unit(text: str) -> str:
    """A bare number: 5 would be 5 bytes."""
    return (f"tolerance {text!r:.40} has no unit: give a percentage ({text.strip()[:20]}%) or a "
            f"size ({text.strip()[:20]}MiB)")


@_summary("tolerance-unread")
def _tolerance_unread(text: str) -> str:
    return f"tolerance {text!r:.60} is neither a percentage (5%) nor a size (64MiB)"


@_summary("fail-on-empty-name")
def _fail_on_empty_name(text: str, failable: tuple[str, ...]) -> str:
    return (f"--fail-on {text!r:.60} has an empty name in it: give finding kinds separated by "
            f"single commas, from {', '.join(failable)}")


@_summary("fail-on-unknown")
def _fail_on_unknown(unknown: list[str], failable: tuple[str, ...]) -> str:
    return (f"--fail-on takes a comma-separated list of {', '.join(failable)}; "
            f"not {', '.join(repr(k)[:60] for k in unknown)}")


# -- a finding kind (--fail-on) ---------------------------------------------------------------

@_summary("fail-on-found")
def _fail_on_found(kind: str, summary: str) -> str:
    """The first finding of the kind, by its summary."""
    return f"{kind}: {summary}"


@_summary("fail-on-unmeasured")
def _fail_on_unmeasured(kind: str, why: str) -> str:
    """No finding on no evidence (`why`: what the run did not measure)."""
    return f"{kind}: not measured ({why}), so the run cannot be said to have none"


@_summary("fail-on-passed")
def _fail_on_passed(kind: str) -> str:
    return f"no {kind} finding"


# -- ceilings (--max-peak, --max-retained) ----------------------------------------------------

@_summary("ceiling-unmeasured")
def _ceiling_unmeasured(label: str, limit: int) -> str:
    return f"{label}: not measured, so it cannot be checked against {fb(limit)}"


@_summary("ceiling")
def _ceiling(label: str, measured: int, limit: int, within: bool) -> str:
    return f"{label}: {fb(measured)} {'within' if within else 'over'} {fb(limit)}"


@_summary("rank-ceiling-unmeasured")
def _rank_ceiling_unmeasured(label: str, count: int, limit: int) -> str:
    """The job-wide check where none of its `count` ranks measured the figure."""
    return f"{label}: not measured on any of the {count} ranks, so it cannot be checked against {fb(limit)}"


@_summary("rank-ceiling-failed")
def _rank_ceiling_failed(label: str, top_rank: int, top: int, limit: int, within: bool, over: list[int],
                         unmeasured: list[int]) -> str:
    """The job-wide check failed: the highest rank over the limit (`within` False), or within it with
    ranks not measured; `over`: the other ranks over it."""
    message = f"{label} of each rank: the highest, rank {top_rank}, {fb(top)} " \
              f"{'within' if within else 'over'} {fb(limit)}"
    if over:
        message += f"; also over: {_ranks_words(over)}"
    if unmeasured:
        message += f"; not measured: {_ranks_words(unmeasured)}"
    return message


@_summary("rank-ceiling-passed")
def _rank_ceiling_passed(label: str, top_rank: int, top: int, limit: int, count: int) -> str:
    """The job-wide check passed: its highest of `count` ranks within the limit."""
    return (f"{label} of each rank: the highest, rank {top_rank}, {fb(top)} within "
            f"{fb(limit)} ({count} rank{'s' if count > 1 else ''})")


# -- against a baseline (--baseline) ----------------------------------------------------------

@_summary("baseline-unmeasured")
def _baseline_unmeasured(label: str) -> str:
    """Measured neither in this run nor in the baseline."""
    return (f"{label}: not measured, in this run nor in the baseline, so it "
            "cannot be compared (a run without a GPU measures no figures)")


@_summary("baseline-unmeasured-there")
def _baseline_unmeasured_there(label: str, new: int) -> str:
    """Measured in this run, not in the baseline."""
    return (f"{label}: {fb(new)} in this run, but not measured in the baseline, "
            "so it cannot be compared; write the baseline again (--update-baseline) "
            "from a run that measures it")


@_summary("baseline-unmeasured-here")
def _baseline_unmeasured_here(label: str, old: int) -> str:
    """Measured in the baseline, not in this run."""
    return f"{label}: not measured in this run (baseline {fb(old)})"


@_summary("baseline-compared")
def _baseline_compared(label: str, new: int, old: int, change: int, tolerance: str) -> str:
    """This run's figure against the baseline's (`change`: new - old; `tolerance`: as tolerance_words writes it)."""
    pct = f" ({change / old * 100:+.1f}%)" if old else ""
    return f"{label}: {fb(new)} against {fb(old)}, {fb(change, signed=True)}{pct}; tolerance {tolerance}"


@_summary("baseline-ranks-not-compared")
def _baseline_ranks_not_compared(only_new: list[int], only_old: list[int]) -> str:
    """The ranks that only one of the two runs has."""
    parts = ([f"{_ranks_words(only_new)} only in this run"] if only_new else []) + \
            ([f"{_ranks_words(only_old)} only in the baseline"] if only_old else [])
    return f"{'; '.join(parts)}: not compared"


@_summary("baseline-schema")
def _baseline_schema(schema, expected: str) -> str:
    """A baseline document of another schema (`schema`: what it says, whatever it is)."""
    return f"schema {schema!r:.60}, expected {expected!r}"
