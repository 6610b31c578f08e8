"""A program that takes its own allocator snapshot (`torch.cuda.memory_snapshot()`) after a loop: under
`gpumemdoctor run` the call must cost what it costs plain. The history the tool records made PyTorch
name the snapshot's frames, and naming them imported torch._inductor: 6.75 s against 1 ms plain (H200,
2026-12-04). The program prints its ground truth: the call's seconds, whether torch._inductor got
imported, and how many segments the snapshot held."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent("""
    import sys, time, torch
    kept = []
    for i in range(40):
        kept.append(torch.empty(i + 1, 1 << 20, device="cuda"))
        torch.cuda.synchronize()
    started = time.perf_counter()
    segments = torch.cuda.memory_snapshot()
    elapsed = time.perf_counter() - started
    print(f"truth: snapshot {elapsed:.4f} s, {len(segments)} segments, inductor "
          f"{'torch._inductor' in sys.modules}", flush=True)
""")


def _truth(out: str) -> tuple[float, int, bool]:
    line = next(x for x in out.splitlines() if x.startswith("truth: snapshot"))
    words = line.replace(",", "").split()
    return float(words[2]), int(words[4]), words[-1] == "True"


def test_the_programs_own_snapshot_costs_under_the_tool_what_it_costs_plain(tmp_path):
    script = tmp_path / "own_snapshot.py"
    script.write_text(PROGRAM)
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr[-2000:]
    report = tmp_path / "r.json"
    tool = subprocess.run([sys.executable, "-m", "gpumemdoctor", "run", "-q", "-o", str(report), str(script)],
                          capture_output=True, text=True, timeout=300)
    assert tool.returncode == 0, tool.stderr[-2000:]
    (p_s, p_segments, p_inductor), (t_s, t_segments, t_inductor) = _truth(plain.stdout), _truth(tool.stdout)
    print(f"plain {p_s * 1000:.1f} ms ({p_segments} segments), tool {t_s * 1000:.1f} ms ({t_segments} segments)")
    assert not p_inductor and not t_inductor, (plain.stdout, tool.stdout)
    assert p_segments >= 1 and t_segments == p_segments
    assert t_s < p_s + 0.25, (p_s, t_s)  # the ring's frames are named, no import: milliseconds
    assert json.loads(report.read_text())["verdict"]
