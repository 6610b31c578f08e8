"""CI checks on a finished diagnosis: ceilings, finding kinds, and a baseline. Pure: no NVML, no torch.

The figures compared with a baseline are the ones that repeat from run to run:
PyTorch's peak of allocated memory, and the live tensors at exit. NVML's totals
include the CUDA context, which changes with the driver and the libraries
loaded, so they are compared only when asked (`nvml_tolerance`), with their own
tolerance.
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

from . import __version__
from .diagnosis import FINDING_KINDS, INFORMATIVE, Diagnosis
from .errors import BadReportError, UsageError
from .recording import Recording
from .strict import need_dict, need_str, opt_int
from .units import format_bytes as fb
from .units import parse_size

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
        return f"{self.fraction * 100:g}%" if self.bytes == 0 else fb(self.bytes)


def parse_tolerance(text: str) -> Tolerance:
    """'5%' or '64MiB'."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*%\s*", text)
    if m:
        return Tolerance(fraction=float(m.group(1)) / 100)
    try:
        return Tolerance(bytes=parse_size(text))
    except ValueError:
        raise UsageError(f"tolerance {text!r} is neither a percentage (5%) nor a size (64MiB)") from None


def parse_kinds(text: str) -> tuple[str, ...]:
    """'leak,non-torch' -> ('leak', 'non-torch'); unknown names are a usage error."""
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in FAILABLE]
    if unknown or not kinds:
        raise UsageError(f"--fail-on takes a comma-separated list of {', '.join(FAILABLE)}; "
                         f"not {', '.join(unknown) or repr(text)}")
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


def figures(recording: Recording, diagnosis: Diagnosis) -> dict[str, int | None]:
    """The run's figures that checks and baselines use; None where not measured."""
    target = recording.target_pid
    mine = [b for b in diagnosis.breakdowns if b.pid == target]
    live = sum(b.live_tensor_bytes or 0 for b in mine) if any(
        b.live_tensor_bytes is not None for b in mine) else None
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


# The baseline figures that are compared, and what each is called in messages.
COMPARED = {"peak_allocated_bytes": "peak of PyTorch's allocated memory",
            "live_tensor_bytes": "live tensors at exit"}


def evaluate(recording: Recording, diagnosis: Diagnosis, policy: Policy) -> list[CheckResult]:
    """Apply the policy; one result per check asked for."""
    results = []
    figs = figures(recording, diagnosis)
    if policy.max_peak_bytes is not None:
        results.append(_ceiling("max-peak", "peak GPU memory of the run (NVML)", figs["peak_nvml_bytes"],
                                policy.max_peak_bytes))
    if policy.max_retained_bytes is not None:
        results.append(_ceiling("max-retained", "memory still held at exit beyond the CUDA context",
                                figs["retained_bytes"], policy.max_retained_bytes))
    for kind in policy.fail_on:
        hits = [f for f in diagnosis.findings if f.kind == kind]
        if hits:
            results.append(CheckResult(f"fail-on {kind}", False,
                                       f"{kind}: {hits[0].summary}", measured=hits[0].bytes))
        else:
            results.append(CheckResult(f"fail-on {kind}", True, f"no {kind} finding"))
    if policy.baseline is not None:
        for key, label in COMPARED.items():
            results.append(_against_baseline(key, label, figs.get(key), policy.baseline.get(key),
                                             policy.tolerance))
        if policy.nvml_tolerance is not None:
            results.append(_against_baseline("peak_nvml_bytes", "peak GPU memory (NVML)",
                                             figs["peak_nvml_bytes"], policy.baseline.get("peak_nvml_bytes"),
                                             policy.nvml_tolerance))
    return results


def _ceiling(name: str, label: str, measured: int | None, limit: int) -> CheckResult:
    if measured is None:
        return CheckResult(name, False, f"{label}: not measured, so it cannot be checked against "
                                        f"{fb(limit)}", None, limit)
    ok = measured <= limit
    return CheckResult(name, ok, f"{label}: {fb(measured)} {'within' if ok else 'over'} {fb(limit)}",
                       measured, limit)


def _against_baseline(key: str, label: str, new: int | None, old: int | None,
                      tolerance: Tolerance) -> CheckResult:
    name = f"baseline {key}"
    if old is None:
        return CheckResult(name, True, f"{label}: the baseline has no figure; not compared", new)
    if new is None:
        return CheckResult(name, False, f"{label}: not measured in this run (baseline {fb(old)})",
                           None, old)
    allowed = tolerance.allowed(old)
    change = new - old
    pct = f" ({change / old * 100:+.1f}%)" if old else ""
    ok = new <= allowed
    return CheckResult(name, ok, f"{label}: {fb(new)} against {fb(old)}, {fb(change, signed=True)}{pct}; "
                                 f"tolerance {tolerance}", new, allowed)


# -- baseline files --------------------------------------------------------------

def baseline_document(recording: Recording, diagnosis: Diagnosis) -> dict:
    return {"schema": BASELINE_SCHEMA, "tool_version": __version__, "created_wall": time.time(),
            "target_argv": recording.target.get("argv"), "figures": figures(recording, diagnosis)}


def write_baseline(path: str, document: dict) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(document, f, indent=1)
            f.write("\n")
    except OSError as exc:
        raise UsageError(f"cannot write the baseline {path}: {exc.strerror or exc}") from None


def load_baseline(path: str) -> dict:
    """The figures of a baseline file, read strictly."""
    try:
        if os.path.getsize(path) > 1 << 20:
            raise BadReportError(f"{path} is too large to be a baseline")
        with open(path, encoding="utf-8") as f:
            obj: Any = json.load(f, parse_constant=_refuse)
    except FileNotFoundError:
        raise UsageError(f"baseline {path} does not exist: make it with --update-baseline") from None
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BadReportError(f"{path} is not a gpumemdoctor baseline ({exc})") from None
    except OSError as exc:
        raise UsageError(f"cannot read the baseline {path}: {exc.strerror or exc}") from None
    try:
        obj = need_dict(obj, "baseline")
        if obj.get("schema") != BASELINE_SCHEMA:
            raise BadReportError(f"schema {obj.get('schema')!r}, expected {BASELINE_SCHEMA!r}")
        need_str(obj.get("tool_version"), "tool_version")
        figs = need_dict(obj.get("figures"), "figures")
        return {key: opt_int(figs.get(key), key) for key in (
            "peak_allocated_bytes", "peak_reserved_bytes", "peak_nvml_bytes", "live_tensor_bytes",
            "retained_bytes")}
    except BadReportError as exc:
        raise BadReportError(f"{path} is not a valid baseline: {exc}") from None


def _refuse(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")
