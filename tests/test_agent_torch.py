"""The agent with torch in the target (a CPU build is enough): import seen, steps counted."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch", reason="these tests need torch (a CPU build will do)")


def test_torch_import_is_seen_and_left_intact(cli, script, tmp_path):
    script(tmp_path, "t.py", """
        import importlib.machinery
        import torch
        print(type(torch.__loader__).__name__, type(torch.__spec__.loader).__name__)
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(5):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
        print("trained")
    """)
    result = cli("run", "--allow-no-gpu", "t.py", cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    loader, spec_loader = result.stdout.splitlines()[0].split()
    assert loader == spec_loader and "Notifying" not in loader
    agent = report_of(tmp_path)["recording"]["agents"][0]
    assert agent["torch_version"] == torch.__version__
    assert agent["steps"] == 5  # the optimizer step hook counted each step
    assert agent["cuda_t"] is None and agent["samples"] == []  # CUDA never started: nothing read


def test_explicit_steps_replace_optimizer_steps(cli, script, tmp_path):
    script(tmp_path, "t.py", """
        import torch, gpumemdoctor
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            gpumemdoctor.step()
    """)
    result = cli("run", "--allow-no-gpu", "t.py", cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    agent = report_of(tmp_path)["recording"]["agents"][0]
    # the first optimizer step counts before the first explicit mark; after it only marks count
    assert agent["explicit_steps"] is True and agent["steps"] == 4


def report_of(tmp_path) -> dict:
    (path,) = tmp_path.glob("gpumemdoctor-*.json")
    return json.loads(path.read_text())
