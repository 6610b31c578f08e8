"""The CI gate on a real GPU: a bigger model fails against the original's baseline, an unchanged
one passes; --fail-on leak fails a leaking scenario and passes a clean one."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL = """
import sys
import torch
hidden = int(sys.argv[1])
model = torch.nn.Sequential(torch.nn.Linear(1024, hidden), torch.nn.ReLU(),
                            torch.nn.Linear(hidden, 1024)).cuda()
opt = torch.optim.AdamW(model.parameters())
for _ in range(50):
    model(torch.randn(256, 1024, device="cuda")).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
"""


def gate(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpumemdoctor", "run", "-q", "--force", "-o", "r.json", *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)


def test_baseline_gate_catches_a_bigger_model(tmp_path):
    (tmp_path / "model.py").write_text(MODEL)
    made = gate(tmp_path, "--baseline", "base.json", "--update-baseline", "model.py", "4096")
    assert made.returncode == 0, made.stderr
    base = json.loads((tmp_path / "base.json").read_text())["figures"]
    assert base["peak_allocated_bytes"] > 0

    same = gate(tmp_path, "--baseline", "base.json", "--junit", "same.xml", "model.py", "4096")
    assert same.returncode == 0, same.stderr

    bigger = gate(tmp_path, "--baseline", "base.json", "--junit", "bigger.xml", "model.py", "8192")
    assert bigger.returncode == 10, bigger.stderr
    assert "baseline peak_allocated_bytes" in bigger.stderr and "FAIL" in bigger.stderr
    assert "<failure" in (tmp_path / "bigger.xml").read_text()
    assert "<failure" not in (tmp_path / "same.xml").read_text()


def test_fail_on_leak(tmp_path):
    leak = gate(tmp_path, "--fail-on", "leak", str(ROOT / "scenarios" / "leak_training_list.py"))
    assert leak.returncode == 10, leak.stderr
    clean = gate(tmp_path, "--fail-on", "leak", str(ROOT / "scenarios" / "clean_adam.py"))
    assert clean.returncode == 0, clean.stderr
