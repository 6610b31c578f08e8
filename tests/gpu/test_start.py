"""The run's start and end on a real GPU: the target is launched before the supervisor imports
pynvml and psutil, and NVML set up while the target starts still follows it from its first
context; at the end, the collection is skipped where nothing could be garbage, and made where
a tensor could be."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

LAUNCH_WATCHED = """\
import subprocess, sys
real = subprocess.Popen.__init__
def launch(self, *a, **k):
    if not hasattr(sys, "seen"):
        sys.seen = sorted(m for m in ("pynvml", "psutil", "gpumemdoctor.supervise.tree") if m in sys.modules)
        print("BEFORE THE LAUNCH", sys.seen, file=sys.stderr, flush=True)
    return real(self, *a, **k)
subprocess.Popen.__init__ = launch
from gpumemdoctor.cli import main
sys.argv = ["gpumemdoctor", "run", "-q", "--force", "-o", "r.json", *sys.argv[1:]]
main()
"""
FREED = """\
import torch
x = torch.ones(64 << 20, device="cuda")  # 256 MiB, freed before the end
torch.cuda.synchronize()
del x
"""
KEPT = """\
import torch
x = torch.ones(4 << 20, device="cuda")  # 16 MiB, still allocated at the end (no exit search under 64 MiB)
torch.cuda.synchronize()
"""


def run(tmp_path: Path, body: str) -> dict:
    (tmp_path / "launch.py").write_text(LAUNCH_WATCHED)
    (tmp_path / "t.py").write_text(body)
    done = subprocess.run([sys.executable, "launch.py", "t.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "BEFORE THE LAUNCH []" in done.stderr, done.stderr
    return json.loads((tmp_path / "r.json").read_text())


def _target(report: dict) -> dict:
    recording = report["recording"]
    return next(a for a in recording["agents"] if a["pid"] == recording["target"]["pid"])


def test_nvml_set_up_after_the_launch_follows_the_target_and_a_freed_run_skips_the_collection(tmp_path):
    report = run(tmp_path, FREED)
    recording = report["recording"]
    assert recording["devices"] and recording["nvml_available"]
    pid = recording["target"]["pid"]
    (series,) = [s for s in recording["nvml"] if s["pid"] == pid]
    assert max(used for _, used in series["points"]) >= 256 << 20  # its context and the 256 MiB tensor
    cost = recording["tool_cost"]
    assert cost["before_target_s"] is not None and cost["watch_set_up_s"] >= 0
    gc_probe = _target(report)["probes"]["gc"]
    assert gc_probe["collected"] is None  # nothing allocated at the end: no garbage could hold any


def test_a_run_that_ends_with_a_tensor_allocated_is_collected(tmp_path):
    report = run(tmp_path, KEPT)
    gc_probe = _target(report)["probes"]["gc"]
    assert gc_probe["collected"] is not None  # a cycle could hold the tensor: gc.collect() ran
