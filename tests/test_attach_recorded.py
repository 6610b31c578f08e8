"""The two programs attached to on the H200 (tests/fixtures/attach, see its README), judged again on
the CPU: the leak through a list named with its holder and allocating line, the filled cache not a
leak, both attached through ptrace alone and taken out on the main thread."""
from __future__ import annotations

import json
from pathlib import Path

from gpumemdoctor.app import report_file
from gpumemdoctor.diagnosis.diagnose import diagnose_job
from tests.gpu.test_attach_gpu import LEAK_LINE
from tests.test_claims import problems

RECORDED = Path(__file__).parent / "fixtures" / "attach"


def _again(name: str) -> dict:
    rec, _ = report_file.parse(json.loads((RECORDED / f"attach_{name}.json").read_text()))
    return json.loads(json.dumps(report_file.build(rec, diagnose_job([rec]))))


def test_the_attached_leak_is_named_with_its_holder_and_line():
    report = _again("leak")
    assert report["verdict"] == "leak"
    leak = next(f for f in report["findings"] if f["kind"] == "leak")
    top = leak["suspects"][0]
    assert any("kept" in h["path"] for h in top["holders"]), top
    assert top["where"][0].endswith("train.py") and top["where"][1] == LEAK_LINE, top
    attached = report["recording"]["target"]["attached"]
    assert attached["method"] == "ptrace" and attached["detached"]["where"] == "the main thread"
    assert "starts at the attach" in " ".join(report["notes"])
    assert not [p for f in report["findings"] for p in problems(f)]


def test_the_attached_cache_is_cache_not_a_leak():
    report = _again("cache")
    assert report["verdict"] != "leak"
    (b,) = [b for b in report["breakdown"] if b["torch_index"] == 0]
    assert b["cache_bytes"] >= 900 << 20 and b["live_tensor_bytes"] < 256 << 20, b
