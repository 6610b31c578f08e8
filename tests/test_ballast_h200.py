"""GPT-2 124M's allocated peak, recorded on an H200 before and after history.py's readings waited for
their ballast (tests/fixtures/ballast_h200, see its README), judged again on the CPU: before, no reading
and the peak mostly unclassified; after, the peak split as PyTorch's MemTracker split it on the same
machine. The recordings are measured; only the judgement is new."""
from __future__ import annotations

from pathlib import Path

from tests.test_issue56_h200 import rejudged

RECORDED = Path(__file__).parent / "fixtures" / "ballast_h200"
GIB = 1 << 30
# tests/gpu/test_allocated_peak.py's reference, measured with MemTracker on that H200 the same session.
MEMTRACKER = {"activations": 10_920_567_808, "parameters": 497_759_232}


def _parts(report: dict) -> dict:
    (composition,) = [c for c in report["peak_compositions"] if c["pid"] == report["target"]["pid"]]
    return {p["category"]: p["bytes"] for p in composition["parts"]}


def _readings(report: dict) -> list:
    (agent,) = report["recording"]["agents"]
    return agent["root"].get("peak_histories", [])


def test_before_no_reading_was_made_and_the_peak_was_left_unclassified():
    report = rejudged(RECORDED / "hf_gpt2_124m_adamw_before.json")
    assert _readings(report) == []
    parts = _parts(report)
    assert "activations" not in parts and parts["unclassified"] > 10 * GIB


def test_after_the_readings_split_the_peak_as_memtracker_did():
    report = rejudged(RECORDED / "hf_gpt2_124m_adamw_after.json")
    readings = _readings(report)
    assert readings and all(r["complete"] and "error" not in r for r in readings)
    parts = _parts(report)
    for name, theirs in MEMTRACKER.items():
        assert abs(parts[name] - theirs) <= 0.10 * theirs, (name, parts[name], theirs)
    assert "unclassified" not in parts
