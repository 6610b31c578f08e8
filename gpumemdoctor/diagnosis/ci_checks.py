"""CI checks on a finished diagnosis: ceilings, finding kinds, and a baseline. Pure: no NVML, no torch, no files.

The figures compared with a baseline are the ones that repeat from run to run:
PyTorch's peak of allocated memory, and the live tensors at exit. NVML's totals
include the CUDA context, which changes with the driver and the libraries
loaded, so they are compared only when asked (`nvml_tolerance`), with their own
tolerance.

In a report with the ranks of a distributed job, the ceilings apply to each rank (one
rank's GPU is what runs out of memory), and the job-wide check is the highest rank's;
a baseline is compared rank by rank where both runs have the rank.

What made a peak (the diagnosis's peak compositions) is taken from the process and GPU with the
largest peak, which is what runs out of memory first: a `max-peak` check carries its parts, and a
baseline written by this version keeps them per category (`peak_parts`), so that a later run's growth
is said by category. A baseline without them (older, or from a run with no composition) compares as before.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from .. import __version__
from .diagnose import FINDING_KINDS, INFORMATIVE, PEAK_CATEGORIES, Diagnosis, PeakComposition
from .findings import LATER_PEAK_CATEGORIES
from ..errors import BadReportError, UsageError
from .summaries import tell
from .summaries_ci import of_rank, tolerance_words
from ..recording.recording import Recording
from ..files.schema import SIZE, STR, Shape, absent, dict_of, need_dict, need_int_key, opt, written
from ..units import parse_size

BASELINE_SCHEMA = "gpumemdoctor.baseline/1"
FAILABLE = tuple(k for k in FINDING_KINDS if k not in INFORMATIVE)
MIN_SLACK_BYTES = 1 << 20  # a tolerance in percent of a tiny figure still allows 1 MiB


@dataclass(frozen=True)
class Tolerance:
    """How much a figure may grow over its baseline: a fraction, or bytes."""

    fraction: float = 0.0
    bytes: int = 0

    def allowed(self, base: int) -> int:
        return max(int(base * (1 + self.fraction)), base + self.bytes, base + MIN_SLACK_BYTES)

    def __str__(self) -> str:
        return tolerance_words(self.fraction, self.bytes)


def parse_tolerance(text: str) -> Tolerance:
    """'5%' or '64MiB'. A bare number is refused: 5 would be 5 bytes, which nobody means."""
    if text.strip().startswith("-"):
        raise UsageError(tell("tolerance-negative", text=text))
    m = re.fullmatch(r"\s*(\d{1,6}(?:\.\d{1,6})?)\s*%\s*", text)
    if m:
        return Tolerance(fraction=float(m.group(1)) / 100)
    if re.fullmatch(r"\s*\d+(?:\.\d+)?\s*", text):
        raise UsageError(tell("tolerance-without-unit", text=text))
    try:
        return Tolerance(bytes=parse_size(text))
    except ValueError:
        raise UsageError(tell("tolerance-unread", text=text)) from None


def parse_kinds(text: str) -> tuple[str, ...]:
    """'leak,non-torch' -> ('leak', 'non-torch'); unknown names are a usage error."""
    kinds = tuple(k.strip() for k in text.split(","))
    if not all(kinds):
        raise UsageError(tell("fail-on-empty-name", text=text, failable=FAILABLE))
    unknown = [k for k in kinds if k not in FAILABLE]
    if unknown:
        raise UsageError(tell("fail-on-unknown", unknown=unknown, failable=FAILABLE))
    return kinds


@dataclass
class Policy:
    """What the run must satisfy."""

    max_peak_bytes: int | None = None
    max_retained_bytes: int | None = None
    fail_on: tuple[str, ...] = ()
    baseline: dict | None = None  # figures
    tolerance: Tolerance = field(default_factory=lambda: Tolerance(fraction=0.05))
    nvml_tolerance: Tolerance | None = None
    baseline_ranks: dict | None = None  # rank -> figures (rank_figures), for a baseline with ranks
    baseline_peak_parts: dict | None = None  # category -> bytes (peak_parts), where the baseline has them

    @property
    def empty(self) -> bool:
        return (self.max_peak_bytes is None and self.max_retained_bytes is None and not self.fail_on
                and self.baseline is None)


@dataclass
class CheckResult:
    name: str
    passed: bool
    message: str
    measured: int | None = None
    limit: int | None = None
    # What filled the peak (a max-peak check): its process and GPU's composition, parts largest first.
    peak: PeakComposition | None = None
    made_of: list[tuple[str, int]] = field(default_factory=list)
    # Against a baseline with parts: the change of the largest peak and of each part that changed, largest
    # growth first ("change" and "parts" as peak_growth gives them).
    grew_by: dict | None = None


def figures(recording: Recording, diagnosis: Diagnosis) -> dict[str, int | None]:
    """The run's figures that checks and baselines use; None where not measured. With ranks, the
    live tensors are the ranks' together (the target may be their launcher, which holds none)."""
    target = recording.target_pid
    mine = [b for b in diagnosis.breakdowns if b.pid == target]
    live = sum(b.live_tensor_bytes or 0 for b in mine) if any(
        b.live_tensor_bytes is not None for b in mine) else None
    if diagnosis.ranks:
        ranked = [f["live_tensor_bytes"] for f in rank_figures(recording, diagnosis).values()]
        live = sum(v for v in ranked if v is not None) if any(v is not None for v in ranked) else None
    retained = None
    if diagnosis.breakdowns and all(b.nvml_bytes is not None and b.context_bytes is not None
                                    for b in diagnosis.breakdowns):
        retained = sum(max(0, b.nvml_bytes - b.context_bytes) for b in diagnosis.breakdowns)
    elif recording.nvml_available:
        retained = 0 if not diagnosis.breakdowns else None
    return {
        "peak_allocated_bytes": diagnosis.peaks.get("allocated_bytes"),
        "peak_reserved_bytes": diagnosis.peaks.get("reserved_bytes"),
        "peak_nvml_bytes": diagnosis.peaks.get("nvml_bytes"),
        "live_tensor_bytes": live,
        "retained_bytes": retained,
    }


RANK_FIGURES = ("peak_allocated_bytes", "peak_reserved_bytes", "peak_nvml_bytes", "live_tensor_bytes",
                "retained_bytes")


def rank_figures(recording: Recording, diagnosis: Diagnosis) -> dict[int, dict]:
    """Per rank (of the rank table): its peaks, each the highest on any of its GPUs, its live tensors
    at exit and what it still held beyond its contexts, and its verdict."""
    out: dict[int, dict] = {}
    procs: dict[int, set] = {}
    for row in diagnosis.ranks:
        if row.rank is None:
            continue
        figs = out.setdefault(row.rank, {"verdict": row.verdict, **{k: None for k in RANK_FIGURES}})
        procs.setdefault(row.rank, set()).add((row.host, row.pid))
        for key in ("peak_allocated_bytes", "peak_reserved_bytes", "peak_nvml_bytes"):
            value = getattr(row, key)
            if value is not None:
                figs[key] = max(figs[key] or 0, value)
    for rank, figs in out.items():
        mine = [b for b in diagnosis.breakdowns if (b.host, b.pid) in procs[rank]]
        live = [b.live_tensor_bytes for b in mine if b.live_tensor_bytes is not None]
        figs["live_tensor_bytes"] = sum(live) if live else None
        # A breakdown without a context (a GPU where PyTorch never reserved anything: a stray
        # context, its own finding) holds nothing beyond a context.
        known = [b for b in mine if b.nvml_bytes is not None and b.context_bytes is not None]
        figs["retained_bytes"] = (sum(max(0, b.nvml_bytes - b.context_bytes) for b in known) if known
                                  else 0 if recording.nvml_available and not mine else None)
    return dict(sorted(out.items()))


# The baseline figures that are compared, and what each is called in messages.
COMPARED = {"peak_allocated_bytes": "peak of PyTorch's allocated memory",
            "live_tensor_bytes": "live tensors at exit"}


def unmeasured(figs: dict[str, int | None]) -> list[str]:
    """The compared figures that a run did not measure (a baseline without them fails every check)."""
    return [key for key in COMPARED if figs.get(key) is None]


def evaluate(recording: Recording, diagnosis: Diagnosis, policy: Policy) -> list[CheckResult]:
    """Apply the policy; one result per check asked for."""
    results = []
    figs = figures(recording, diagnosis)
    ranks = rank_figures(recording, diagnosis)
    if policy.max_peak_bytes is not None:
        peaks = (_rank_ceilings("max-peak", "peak GPU memory (NVML)", ranks, "peak_nvml_bytes",
                                policy.max_peak_bytes) if ranks else
                 [_ceiling("max-peak", "peak GPU memory of the run (NVML)", figs["peak_nvml_bytes"],
                           policy.max_peak_bytes)])
        results.extend(_with_parts(peaks, diagnosis, _rank_processes(diagnosis)))
    if policy.max_retained_bytes is not None:
        results.extend(_rank_ceilings("max-retained", "memory still held at exit beyond the CUDA context", ranks,
                                      "retained_bytes", policy.max_retained_bytes) if ranks else
                       [_ceiling("max-retained", "memory still held at exit beyond the CUDA context",
                                 figs["retained_bytes"], policy.max_retained_bytes)])
    for kind in policy.fail_on:
        name = f"fail-on {kind}"
        hits = [f for f in diagnosis.findings if f.kind == kind]
        unseen = _unmeasured_kind(recording, kind)
        if hits:
            results.append(CheckResult(name, False, tell("fail-on-found", kind=kind, summary=hits[0].summary),
                                       measured=hits[0].bytes))
        elif unseen is not None:  # no finding on no evidence is no pass: as a figure not measured
            results.append(CheckResult(name, False, tell("fail-on-unmeasured", kind=kind, why=unseen)))
        else:
            results.append(CheckResult(name, True, tell("fail-on-passed", kind=kind)))
    if policy.baseline is not None:
        grew = peak_growth(policy.baseline_peak_parts, peak_parts(diagnosis))
        for key, label in COMPARED.items():
            results.append(_against_baseline(key, label, figs.get(key), policy.baseline.get(key),
                                             policy.tolerance))
            if key == "peak_allocated_bytes":
                results[-1].grew_by = grew
        if policy.nvml_tolerance is not None:
            results.append(_against_baseline("peak_nvml_bytes", "peak GPU memory (NVML)",
                                             figs["peak_nvml_bytes"], policy.baseline.get("peak_nvml_bytes"),
                                             policy.nvml_tolerance))
            results[-1].grew_by = grew
    if policy.baseline is not None and policy.baseline_ranks:
        results.extend(_against_baseline_ranks(ranks, policy))
    return results


def _unmeasured_kind(recording: Recording, kind: str) -> str | None:
    """Why the run could not show a finding of this kind, or None where it could: `host-memory` rests on
    the supervisor's host memory readings, every other kind on the GPU's (NVML)."""
    if kind == "host-memory":
        return None if recording.host_rss else "no host memory was read"
    return None if recording.nvml_available else "no NVIDIA GPU was measured"


def largest_peak(compositions: list[PeakComposition]) -> PeakComposition | None:
    """The composition with the largest peak (the lowest PID, then GPU, among equals); None without any."""
    return min(compositions, key=PeakComposition.rank, default=None)


def peak_parts(diagnosis: Diagnosis) -> dict[str, int] | None:
    """The largest peak's bytes per category, every one of PEAK_CATEGORIES (0 where it has no such part);
    None where the diagnosis has no composition (a report made before them, a run without a GPU)."""
    top = largest_peak(diagnosis.peak_compositions)
    if top is None:
        return None
    out = dict.fromkeys(PEAK_CATEGORIES, 0)
    for p in top.parts:
        out[p.category] = out.get(p.category, 0) + p.bytes
    return out


def peak_growth(old: dict[str, int] | None, new: dict[str, int] | None) -> dict | None:
    """How the largest peak changed between two runs, by category: {"change": its total's change, "parts":
    [(category, change), ...] for each category that changed, the largest change first, up or down (a
    peak that fell by little while one part grew a GiB says both); None unless both runs have parts."""
    if old is None or new is None:
        return None
    categories = list(dict.fromkeys([*new, *old]))
    changes = [(cat, new.get(cat, 0) - old.get(cat, 0)) for cat in categories]
    return {"change": sum(new.values()) - sum(old.values()),
            "parts": sorted([c for c in changes if c[1]], key=lambda c: (-abs(c[1]), -c[1]))}


def _rank_processes(diagnosis: Diagnosis) -> dict[str, set]:
    """Each max-peak check's name for a rank, with the (host, PID)s of the rank."""
    out: dict[str, set] = {}
    for row in diagnosis.ranks:
        if row.rank is not None:
            out.setdefault(_rank_check("max-peak", row.rank), set()).add((row.host, row.pid))
    return out


def _with_parts(results: list[CheckResult], diagnosis: Diagnosis, ranks: dict[str, set]) -> list[CheckResult]:
    """Each max-peak result with what made its peak: the largest composition (of its rank's processes)."""
    for r in results:
        mine = [c for c in diagnosis.peak_compositions if r.name not in ranks or (c.host, c.pid) in ranks[r.name]]
        top = largest_peak(mine)
        if top is not None:
            r.peak = top
            r.made_of = sorted([(p.category, p.bytes) for p in top.parts if p.bytes], key=lambda p: -p[1])
    return results


def _rank_ceilings(name: str, label: str, ranks: dict[int, dict], key: str, limit: int) -> list[CheckResult]:
    """The job-wide check (the highest rank, naming the ranks over), then one check per rank."""
    per = [_ceiling(_rank_check(name, r), of_rank(label, r), figs[key], limit) for r, figs in ranks.items()]
    measured = [(figs[key], r) for r, figs in ranks.items() if figs[key] is not None]
    top, top_rank = max(measured, key=lambda m: (m[0], -m[1])) if measured else (None, None)
    over = [r for value, r in sorted(measured, key=lambda m: m[1]) if value > limit and r != top_rank]
    unmeasured = [r for r, figs in ranks.items() if figs[key] is None]
    if top is None:
        job = CheckResult(name, False, tell("rank-ceiling-unmeasured", label=label, count=len(ranks), limit=limit),
                          None, limit)
    elif top > limit or unmeasured:
        job = CheckResult(name, False, tell("rank-ceiling-failed", label=label, top_rank=top_rank, top=top,
                                            limit=limit, within=top <= limit, over=over, unmeasured=unmeasured),
                          top, limit)
    else:
        job = CheckResult(name, True, tell("rank-ceiling-passed", label=label, top_rank=top_rank, top=top,
                                           limit=limit, count=len(ranks)), top, limit)
    return [job, *per]


def _rank_check(check: str, rank: int) -> str:
    """A check's name for one rank: 'max-peak rank 1' (the max-peak checks' parts are found by it)."""
    return f"{check} rank {rank}"


def _against_baseline_ranks(ranks: dict[int, dict], policy: Policy) -> list[CheckResult]:
    """The compared figures rank by rank, where both runs have the rank."""
    old = policy.baseline_ranks or {}
    results = []
    for r in sorted(set(ranks) & set(old)):
        for key, label in COMPARED.items():
            results.append(_against_baseline(key, of_rank(label, r), ranks[r].get(key), old[r].get(key),
                                             policy.tolerance, check=_rank_check("baseline", r)))
    only_new, only_old = sorted(set(ranks) - set(old)), sorted(set(old) - set(ranks))
    if only_new or only_old:
        results.append(CheckResult("baseline ranks", True, tell("baseline-ranks-not-compared", only_new=only_new,
                                                                only_old=only_old)))
    return results


def _ceiling(name: str, label: str, measured: int | None, limit: int) -> CheckResult:
    if measured is None:
        return CheckResult(name, False, tell("ceiling-unmeasured", label=label, limit=limit), None, limit)
    ok = measured <= limit
    return CheckResult(name, ok, tell("ceiling", label=label, measured=measured, limit=limit, within=ok),
                       measured, limit)


def _against_baseline(key: str, label: str, new: int | None, old: int | None,
                      tolerance: Tolerance, check: str = "baseline") -> CheckResult:
    """The figure `key` against its baseline; the check is named `check` and the key ('baseline
    peak_allocated_bytes', 'baseline rank 1 peak_allocated_bytes')."""
    name = f"{check} {key}"
    # A figure not measured on either side fails: a check that cannot be made must not pass unseen.
    if old is None and new is None:
        return CheckResult(name, False, tell("baseline-unmeasured", label=label))
    if old is None:
        return CheckResult(name, False, tell("baseline-unmeasured-there", label=label, new=new), new)
    if new is None:
        return CheckResult(name, False, tell("baseline-unmeasured-here", label=label, old=old), None, old)
    allowed = tolerance.allowed(old)
    ok = new <= allowed
    return CheckResult(name, ok, tell("baseline-compared", label=label, new=new, old=old, change=new - old,
                                      tolerance=str(tolerance)), new, allowed)


# -- baseline files --------------------------------------------------------------

def baseline_document(recording: Recording, diagnosis: Diagnosis) -> dict:
    document = {"schema": BASELINE_SCHEMA, "tool_version": __version__, "created_wall": time.time(),
                "target_argv": recording.target.get("argv"), "figures": figures(recording, diagnosis)}
    ranks = baseline_ranks(recording, diagnosis)
    if ranks:
        document["ranks"] = {str(r): figs for r, figs in ranks.items()}
    document["peak_parts"] = peak_parts(diagnosis)
    return document


def baseline_ranks(recording: Recording, diagnosis: Diagnosis) -> dict[int, dict]:
    """The figures of each rank that a baseline keeps (no verdict)."""
    return {r: {k: figs[k] for k in RANK_FIGURES} for r, figs in rank_figures(recording, diagnosis).items()}


def parse_baseline(obj: Any) -> dict:
    """A baseline document's figures, read strictly; those of its ranks under "ranks", if it has any
    (`make_policy` passes them on as Policy.baseline_ranks). Every figure must be there: null where it
    was not measured (its check then fails), never left out. BadReportError says what is wrong. (The
    file is read and written by app/baseline_file.py.)"""
    obj = need_dict(obj, "baseline")
    if obj.get("schema") != BASELINE_SCHEMA:
        raise BadReportError(tell("baseline-schema", schema=obj.get("schema"), expected=BASELINE_SCHEMA))
    document = BASELINE(obj, "baseline")
    out: dict = document["figures"]
    if document["ranks"] is not None:
        out["ranks"] = document["ranks"]
    if document["peak_parts"] is not None:
        out["peak_parts"] = document["peak_parts"]
    return out


# A baseline's declared shape: its figures, each written (null where it was not measured), and the
# same per rank where the run had ranks.
BASELINE_FIGURES = Shape({key: written(opt(SIZE)) for key in RANK_FIGURES})
# The largest peak's parts, every category written (absent from baselines made before them); the
# categories added later read as 0 from a baseline made before them.
BASELINE_PEAK_PARTS = Shape({category: absent(SIZE, 0) if category in LATER_PEAK_CATEGORIES else written(SIZE)
                             for category in PEAK_CATEGORIES})
BASELINE = Shape({"tool_version": STR, "figures": BASELINE_FIGURES,
                  "ranks": opt(dict_of(need_int_key, BASELINE_FIGURES)),
                  "peak_parts": absent(opt(BASELINE_PEAK_PARTS), None)})
