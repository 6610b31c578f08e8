"""Recorded reports as the tool wrote them before issue 31 (2026-11-25): no readings at the peaks,
no probes, no declined searches and no free memory of the GPUs. The fixtures were recorded again
with all of these; the tests of what a report without them draws, and of how an older report loads,
take them out here rather than keep a second set of recordings."""
from __future__ import annotations

import copy
import json
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "reports"


def older(report: dict) -> dict:
    """A copy of a report (its JSON) without what issue 31 added to recordings and reports."""
    report = copy.deepcopy(report)
    report["peak_compositions"] = []
    report["recording"].pop("device_memory", None)
    for agent in report["recording"]["agents"]:
        for key in ("peaks", "peak_probes", "declined"):
            agent["root"].pop(key, None)
    for finding in report["findings"]:
        for key in ("free_bytes", "free_t", "time_to_full_s"):
            finding["evidence"].pop(key, None)
    return report


def older_fixture(name: str) -> dict:
    return older(json.loads((FIXTURES / f"{name}.json").read_text()))


def write_older(name: str, folder: Path) -> Path:
    """The fixture `name` as an older report, written to `folder`."""
    path = folder / f"{name}.json"
    path.write_text(json.dumps(older_fixture(name)))
    return path
