"""benchmarks/loop_ab.py's parts that run without a GPU: the switch that turns the tool's work off
and on inside the measured program, and the comparison of the blocks' times."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"


@pytest.fixture
def loop_ab(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import loop_ab
    return loop_ab


def test_compare_reads_on_against_off_and_each_group_of_four(loop_ab):
    blocks = [("on", 1.10), ("off", 1.00), ("off", 1.00), ("on", 1.10),
              ("on", 1.30), ("off", 1.20), ("off", 1.20), ("on", 1.20)]
    c = loop_ab.compare(blocks)
    assert c["on_ms"] == pytest.approx(1.15) and c["off_ms"] == pytest.approx(1.10)
    assert c["slowdown_pct"] == pytest.approx((1.15 / 1.10 - 1) * 100)
    assert c["group_pct"] == pytest.approx([10.0, (2.5 / 2.4 - 1) * 100])
    assert c["group_pct_min"] == pytest.approx(2.5 / 2.4 * 100 - 100)


def test_median_interval_is_the_binomial_order_statistics(loop_ab):
    values = list(range(1, 21))  # n = 20: P(B < 6) = 0.0207 <= 0.025 < P(B < 7) = 0.0577
    assert loop_ab.median_interval(values) == (6, 15)
    assert loop_ab.median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0)  # too few: the whole range


def test_summary_holds_the_target_only_by_the_interval_top(loop_ab):
    def runs(tool, plain):
        return [{"mode": "tool", "group_pct": tool}, {"mode": "plain", "group_pct": plain}]

    quiet = [-1.0, -0.5, 0.0, 0.5, 1.0] * 4
    s = loop_ab._summarise(runs([x + 1.0 for x in quiet], quiet), 5.0)
    assert s["within_target"] and s["settled"] and s["tool"]["median_pct"] == 1.0
    wide = loop_ab._summarise(runs([1.0] * 12 + [9.0] * 8, quiet), 5.0)
    assert wide["tool"]["median_pct"] == 1.0 and not wide["within_target"]  # its interval reaches 9%
    off = loop_ab._summarise(runs(quiet, [x + 3.0 for x in quiet]), 5.0)
    assert not off["settled"]  # the A/A interval misses 0


def test_switch_turns_the_agent_and_the_supervisor_off_and_on(cli, script, tmp_path):
    """Under `gpumemdoctor run` (CPU torch): the steps taken while off are not seen by the agent,
    and the supervisor, stopped while off, finishes the run once continued."""
    pytest.importorskip("torch", reason="needs torch (a CPU build will do)")
    script(tmp_path, "t.py", f"""
        import gc, sys
        sys.path.insert(0, {str(BENCHMARKS)!r})
        import torch
        from torch.optim import optimizer as o
        from _switch import ToolSwitch

        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(n):
            for _ in range(n):
                model(torch.randn(2, 4)).sum().backward()
                opt.step()

        step(3)
        switch = ToolSwitch(torch)
        print("SWITCH", switch.describe())
        hooks_on = len(o._global_optimizer_post_hooks)
        switch.off()
        print("STATE", open(f"/proc/{{switch.supervisor}}/stat").read().split(")")[1].split()[0])
        print("HOOKS", hooks_on, len(o._global_optimizer_post_hooks))
        step(5)
        switch.on()
        print("HOOKS_AGAIN", len(o._global_optimizer_post_hooks))
        step(2)
    """)
    result = cli("run", "--allow-no-gpu", "t.py", cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    out = dict(line.split(" ", 1) for line in result.stdout.splitlines() if line.split(" ", 1)[0].isupper())
    assert "step hook" in out["SWITCH"] and "supervisor pid" in out["SWITCH"], out
    assert out["STATE"] == "T"  # the supervisor was stopped while the tool was off
    hooks_on, hooks_off = map(int, out["HOOKS"].split())
    assert hooks_off == hooks_on - 1 and int(out["HOOKS_AGAIN"]) == hooks_on
    (report,) = tmp_path.glob("gpumemdoctor-*.json")
    agent = json.loads(report.read_text())["recording"]["agents"][0]
    assert agent["steps"] == 5  # 3 before and 2 after; the 5 steps while off were not seen


def test_switch_without_the_tool_switches_nothing(loop_ab, monkeypatch):
    torch = pytest.importorskip("torch", reason="needs torch (a CPU build will do)")
    monkeypatch.delitem(sys.modules, "gpumemdoctor._agent", raising=False)
    from _switch import ToolSwitch

    switch = ToolSwitch(torch)
    assert switch.agent is None and "A/A" in switch.describe()
    switch.off()
    switch.on()  # nothing to do, nothing raised


def test_summarise_pools_the_groups_of_saved_runs(loop_ab, tmp_path, capsys):
    def saved(name, tool, plain):
        path = tmp_path / name
        path.write_text(json.dumps({"workloads": {"short": {"target_pct": 5.0, "runs": [
            {"mode": "plain", "group_pct": plain}, {"mode": "tool", "group_pct": tool}]}}}))
        return str(path)

    a = saved("a.json", [1.0] * 10, [0.0] * 10)
    b = saved("b.json", [3.0] * 10, [0.5] * 10)
    assert loop_ab.main(["--summarise", a, b]) == 0
    out = capsys.readouterr().out
    assert "short     tool +2.00% [+1.00%, +3.00%] (20 groups)" in out and "target <= 5%: ok" in out
    (tmp_path / "bad.json").write_text("{}")
    assert loop_ab.main(["--summarise", str(tmp_path / "bad.json")]) == 2


def test_overhead_reads_the_ddp_loops_longest_step(monkeypatch):
    """benchmarks/overhead.py --only ddp (issue 29): workload_ddp.py's WORST_STEP_MS line is kept per
    run and summarised as the median longest step, plain against the tool."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import overhead

    out = "PHASE start 1.0\nSTEP_TIME_MS 17.21\nWORST_STEP_MS 19.5\n"
    assert overhead.WORST_LINE.findall(out) == ["19.5"] and overhead.STEP_LINE.findall(out) == ["17.21"]
    runs = [{"mode": mode, "counted": True, "step_time_ms": step, "worst_step_ms": worst, "wall_s": 30.0}
            for mode, step, worst in (("plain", 17.21, 19.0), ("tool", 17.20, 21.0), ("plain", 17.06, 18.0),
                                      ("tool", 17.08, 20.0), ("plain", 17.22, 19.5), ("tool", 17.21, 19.0))]
    summary = overhead._summarise(runs, 1.0)
    assert summary["worst_step_ms_median"] == {"plain": 19.0, "tool": 20.0}
    assert summary["plain_step_ms_median"] == 17.21 and summary["within_target"]
    for r in runs:
        del r["worst_step_ms"]  # the single-process workloads print none
    assert overhead._summarise(runs, 1.0)["worst_step_ms_median"] == {}
