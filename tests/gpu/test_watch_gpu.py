"""`gpumemdoctor watch` on a real GPU: a leaking torch script and a flat one get different judgements."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

SCRIPT = """
import sys, time, torch
leak = sys.argv[1] == "leak"
keep = [torch.ones(1 << 20, device="cuda")]
torch.cuda.synchronize()
print("ready", flush=True)
for _ in range(300):
    x = torch.ones(4 << 20, device="cuda")  # 16 MiB a tick
    if leak:
        keep.append(x)
    del x
    time.sleep(0.05)
"""


def watch_script(tmp_path, script: str, *args: str, duration: str):
    """Start `python -c script args`, wait for its "ready", watch it; (result, last JSON line, pid)."""
    target = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout.readline().strip() == "ready"
        result = subprocess.run([sys.executable, "-m", "gpumemdoctor", "watch", "--pid", str(target.pid),
                                 "--interval", "0.2", "--duration", duration, "--no-tui", "--jsonl", "w.jsonl"],
                                cwd=tmp_path, capture_output=True, text=True, timeout=60)
    finally:
        target.kill()
        target.wait()
    assert result.returncode == 0, result.stderr
    return result, json.loads((tmp_path / "w.jsonl").read_text().splitlines()[-1]), target.pid


@pytest.mark.parametrize("kind", ["leak", "flat"])
def test_watch_judges_the_floor(tmp_path, kind):
    _, last, _ = watch_script(tmp_path, SCRIPT, kind, duration="6")
    assert last["total_bytes"] > 500 << 20  # the context and the tensors
    (free,) = last["free_bytes"].values()
    assert 0 < free < 200 << 30  # the GPU's free memory, as NVML gives it
    if kind == "leak":
        assert last["floor_rate_bytes_per_min"] > 100 << 20  # about 320 MiB/s is planted
        full = last["time_to_full"]
        assert full["free_bytes"] == free and full["seconds"] == pytest.approx(free / full["rate_bytes_per_s"])
    else:
        assert last["floor_rate_bytes_per_min"] == 0 and last["time_to_full"] is None


ENABLED = """
import sys, time, torch, gpumemdoctor
gpumemdoctor.enable()
keep = torch.ones(64 << 20, device="cuda")  # 256 MiB of live tensors
torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(30)
"""


def test_watch_gets_the_torch_breakdown_through_the_agent_socket(tmp_path):
    result, last, pid = watch_script(tmp_path, ENABLED, duration="1.5")
    (row,) = last["torch"][str(pid)]
    assert row["allocated_bytes"] == 256 << 20
    assert 300 << 20 <= row["context_bytes"] <= 1200 << 20
    assert f"[PID {pid} cuda:0: tensors 256 MiB" in result.stdout
