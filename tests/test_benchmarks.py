"""benchmarks/loop_ab.py's parts that run without a GPU: the switch that turns the tool's work off
and on inside the measured program, and the comparison of the blocks' times."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"


@pytest.fixture
def loop_ab(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import loop_ab
    return loop_ab


def _stepping(imports: str) -> str:
    """The start of a program run under the tool by the switch tests: the benchmarks importable, a
    model and its optimizer, and step(n)."""
    return f"""
        import gc, sys
        sys.path.insert(0, {str(BENCHMARKS)!r})
        import torch
        from torch.optim import optimizer as o
        {imports}

        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(n):
            for _ in range(n):
                model(torch.randn(2, 4)).sum().backward()
                opt.step()
"""


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
    script(tmp_path, "t.py", _stepping("from _switch import ToolSwitch") + f"""

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


def test_step_cost_switches_each_part_off_and_on_again_under_the_tool(cli, script, tmp_path):
    """benchmarks/step_cost.py's Parts (issue 57), under `gpumemdoctor run` on CPU torch: each state
    turns off what it names and only that (the hooks, backward()'s marks, the supervisor), and "on"
    puts everything back; the steps taken with the hooks off are not seen by the agent."""
    pytest.importorskip("torch", reason="needs torch (a CPU build will do)")
    script(tmp_path, "t.py", _stepping("from step_cost import Parts") + f"""

        def state(parts):
            stat = open(f"/proc/{{parts.supervisor}}/stat").read().split(")")[1].split()[0]
            wrapped = getattr(torch.autograd.backward, "__gpumemdoctor__", False)
            return f"{{len(o._global_optimizer_post_hooks)}} {{len(o._global_optimizer_pre_hooks)}} {{int(wrapped)}} {{stat}}"

        step(3)
        parts = Parts(torch)
        print("PARTS", parts.describe())
        print("ON", state(parts))
        parts.set("hooks")
        print("HOOKS", state(parts))
        step(5)
        parts.set("supervisor")
        print("SUPERVISOR", state(parts))
        parts.set("all")
        print("ALL", state(parts))
        parts.set("on")
        print("AGAIN", state(parts))
        step(2)
    """)
    result = cli("run", "--allow-no-gpu", "t.py", cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    out = dict(line.split(" ", 1) for line in result.stdout.splitlines() if line.split(" ", 1)[0].isupper())
    assert "hooks 1+1" in out["PARTS"] and "backward marks yes" in out["PARTS"], out
    post, pre = (int(n) for n in out["ON"].split()[:2])
    assert out["ON"] == f"{post} {pre} 1 S" or out["ON"] == f"{post} {pre} 1 R"
    assert out["HOOKS"].split()[:3] == [str(post - 1), str(pre - 1), "0"] and out["HOOKS"].split()[3] != "T"
    assert out["SUPERVISOR"].split() == [str(post), str(pre), "1", "T"]
    assert out["ALL"].split() == [str(post - 1), str(pre - 1), "0", "T"]
    assert out["AGAIN"].split()[:3] == [str(post), str(pre), "1"] and out["AGAIN"].split()[3] != "T"
    (report,) = tmp_path.glob("gpumemdoctor-*.json")
    agent = json.loads(report.read_text())["recording"]["agents"][0]
    assert agent["steps"] == 5  # 3 before and 2 after; the 5 steps with the hooks off were not seen


def test_step_cost_sums_each_state_against_everything_on(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import step_cost

    rows = [("on", 0.005, 0.004), ("on", 0.007, 0.006), ("on", 0.006, 0.005),
            ("history", 0.004, 0.003), ("history", 0.0045, 0.0035), ("history", 0.9, 0.0035)]
    out = step_cost.summarise(rows)
    assert list(out) == ["on", "history"]
    assert out["on"] == {"steps": 3, "wall_ms": 6.0, "cpu_ms": 5.0, "p99_ms": 7.0, "max_ms": 7.0, "wall_saved_ms": 0.0,
                         "cpu_saved_ms": 0.0}
    assert out["history"]["wall_ms"] == 4.5 and out["history"]["cpu_ms"] == 3.5 and out["history"]["max_ms"] == 900
    assert out["history"]["wall_saved_ms"] == 1.5 and out["history"]["cpu_saved_ms"] == 1.5


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


def test_the_phase_search_benchmark_measures_the_program_s_pause(tmp_path):
    """benchmarks/phase_search.py over the torch double: the figures it reports come out of a real
    search at a pause's height (its copy visited the heap), in a process of its own."""
    import subprocess

    out = tmp_path / "phase.json"
    subprocess.run([sys.executable, str(BENCHMARKS / "phase_search.py"), "--objects", "3000", "--repeats", "1",
                    "--json", str(out)], check=True, capture_output=True, timeout=120)
    (run,) = json.loads(out.read_text())["runs"]
    assert run["objects_visited"] > 3000 and 0 < run["fork_ms"] <= run["pause_ms"] < 1000
    assert 0 < run["check_us"] < 100 and 0 < run["check_step_us"] < 100


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


def test_corpus_flags_a_pause_over_20_ms_from_the_agents_cost_records(monkeypatch, tmp_path, capsys):
    """benchmarks/corpus.py (issue 31): each process's longest pause is the larger of its searches'
    (the work before the fork included) and the search at a pause's height; over 20 ms is flagged."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import corpus

    def report(pause_s, phase_s):
        cost = {"search_pause_max_s": pause_s, "phase_pause_s": phase_s}
        return {"verdict": "clean", "findings": [], "target": {"pid": 1},
                "recording": {"agents": [{"pid": 1, "exit_info": {"cost": cost}, "root": {
                    "investigations": [], "declined": [{"why": "a copy ... the limit is 20 ms"}]}}]}}

    path = tmp_path / "r.json"
    path.write_text(json.dumps(report(0.012, 0.027)))
    got = corpus._from_report(str(path))
    assert got["copy_pause_max_s"] == 0.027 and got["declined"] == ["a copy ... the limit is 20 ms"]
    assert got["pause_of"] == "phase_pause_s"  # which of the agent's pauses was the longest
    run = {"wall_s": 10.0, "step_time_ms": 10.0, "gap_max_ms": 20.0, "before_s": 1, "loop_s": 8, "after_s": 1}
    runs = [dict(run, mode="plain"), dict(run, mode="tool", exit_search_s=None, searches=[], verdict="clean",
                                          holder=None, **{k: got[k] for k in ("copy_pause_max_s", "declined")})]
    summary = corpus._summary(runs)
    assert not summary["within_targets"]
    corpus._table({"w": {"summary": summary}})
    out = capsys.readouterr().out
    assert "27.0!" in out and "MISSED" in out and "a search not made: a copy" in out
    runs[1]["copy_pause_max_s"] = 0.015
    assert corpus._summary(runs)["within_targets"]


def test_corpus_splits_the_tools_own_seconds_from_its_report(monkeypatch, tmp_path, capsys):
    """benchmarks/corpus.py (issue 40, item 7): where the tool's own seconds went in a run, read from
    its report (the command's start, the agents' cost records, the command's end after the target),
    so a whole-run cost is split without the plain runs' noise."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import corpus

    cost = {"bootstrap_s": 0.015, "init_s": 0.01, "sample_s": 0.05, "history_read_s": 0.02,
            "history_read_max_s": 0.01, "history_reads": 2.0, "step_pause_max_s": 0.006, "step_pause_max_step": 3,
            "exit_search_s": 0.1, "exit_peak_s": 0.004, "first_window_sample_us": 300.0, "interval_at_exit_s": 0.04}
    report = {"verdict": "clean", "findings": [], "target": {"pid": 1},
              "recording": {"started_wall": 1000.0, "duration_s": 20.0, "tool_cost": {"before_target_s": 0.13},
                            "agents": [{"pid": 1, "exit_info": {"cost": cost},
                                        "root": {"investigations": []}}]}}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    got = corpus._from_report(str(path), ended=1020.4)
    # the counts, the longest and the windows' figures are not seconds of work; exit_* are; the
    # agent's import and start (bootstrap_s) and its set-up at CUDA's start (init_s) apart
    assert got["own_s"] == {"cli_start": 0.13, "agent_start": 0.025, "agent": 0.174, "cli_end": 0.4}
    # what is always waited for: the start and the end, the agent's start and its work at exit
    assert got["serial_s"] == round(0.13 + 0.4 + 0.015 + 0.01 + 0.1 + 0.004, 4)
    # the longest pause: the whole of a step's end (step_pause_max_s) beside each part's longest
    assert (got["copy_pause_max_s"], got["pause_of"]) == (0.01, "history_read_max_s")
    assert got["pauses"] == {"history_read_max_s": 0.01, "step_pause_max_s": 0.006}
    cost["step_pause_max_s"] = 0.012
    path.write_text(json.dumps(report))
    assert corpus._from_report(str(path), ended=1020.4)["pause_of"] == "step_pause_max_s"
    assert corpus._from_report(str(path))["own_s"] is None  # no end time: nothing to split
    assert corpus._from_report(str(path))["serial_s"] is None
    run = {"wall_s": 20.0, "step_time_ms": 10.0, "gap_max_ms": 20.0}
    runs = [dict(run, mode="plain", before_s=12.0, loop_s=6.0, after_s=2.0),
            dict(run, mode="tool", exit_search_s=0.1, searches=[], verdict="clean", holder=None, before_s=12.0, loop_s=5.95,
                 after_s=2.25, copy_pause_max_s=None, own_s=got["own_s"], serial_s=got["serial_s"])]
    for r in runs:
        r["pair"] = 0
    summary = corpus._summary(runs)
    assert round(summary["own_pct"], 3) == round(0.729 / 20.0 * 100, 3)
    assert round(summary["serial_pct"], 3) == round(0.659 / 20.0 * 100, 3)
    # the command's and the agent's start, then the loop's and the end's moves in the pair
    assert round(summary["wall_split_s"], 4) == round(0.13 + 0.025 - 0.05 + 0.25, 4)
    corpus._table({"w": {"summary": summary}})
    out = capsys.readouterr().out
    assert "0.73/3.6%" in out and "+0.66/3.3%" in out and "+0.35/1.8%" in out
    assert "wall split by pair" not in out  # (one pair: no range)
    assert "the agent's start 0.025, in the target 0.17" in corpus._split(runs[1])
    # each pair against its own plain run, not median against median: the plain runs drift
    second = [dict(runs[0], pair=1, loop_s=7.0, after_s=3.0), dict(runs[1], pair=1, loop_s=7.05, after_s=3.05)]
    third = [dict(runs[0], pair=2, loop_s=5.0), dict(runs[1], pair=2, loop_s=5.3)]
    summary = corpus._summary(runs + second + third)
    assert summary["wall_split_pairs_s"] == [0.355, 0.255, 0.705]
    assert summary["wall_split_s"] == 0.355
    corpus._table({"w": {"summary": summary}})
    assert "wall split by pair: +0.26 to +0.70 s over 3 pairs" in capsys.readouterr().out
    split = dict(runs[1], before_s=12.0, loop_s=6.0, after_s=2.0, exit_s=1.4)
    assert "after 2.00 of which from the exit 1.40)" in corpus._split(split)


def test_corpus_reads_the_workloads_exit_time(monkeypatch, tmp_path):
    """The workloads print the wall-clock time of their interpreter's exit (corpus/_common.py, an
    atexit hook): the run's after-the-loop part is split at it."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import corpus

    script = tmp_path / "w.py"
    script.write_text("import sys\nsys.path.insert(0, %r)\nfrom _common import StepClock\nc = StepClock()\n"
                      "for _ in range(8):\n    c.tick()\nc.report()\n" % str(BENCHMARKS.parent / "corpus"))
    run = corpus._run("w", "plain", [sys.executable, str(script)], dict(os.environ), str(tmp_path), 60, None)
    assert 0 <= run["exit_s"] <= run["after_s"] < 60


def test_corpus_table_passes_over_a_workload_stopped_by_a_failed_run(monkeypatch, capsys):
    """A workload whose runs were kept after each run but that a failed run stopped has no summary:
    the table leaves it out instead of failing on it."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import corpus

    run = {"wall_s": 10.0, "step_time_ms": 10.0, "gap_max_ms": 20.0}
    runs = [dict(run, mode="plain"), dict(run, mode="tool", exit_search_s=None, searches=[], verdict="clean",
                                          holder=None, copy_pause_max_s=None)]
    corpus._table({"stopped": {"runs": runs[:1], "summary": None}, "done": {"summary": corpus._summary(runs)}})
    out = capsys.readouterr().out
    assert "done" in out and "stopped" not in out


@pytest.mark.parametrize("name, args", [("exit_search", ["work.py"]), ("exit_release", ["--pairs", "1"]),
                                        ("step_cost", ["--cycles", "1"])])
def test_an_in_process_gpu_benchmark_says_why_it_skips_without_a_gpu(tmp_path, name, args):
    import subprocess

    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: the benchmark measures instead")
    (tmp_path / "work.py").write_text("print('ran')\n")
    done = subprocess.run([sys.executable, str(BENCHMARKS / f"{name}.py"), *args], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{name}: skipped: no CUDA GPU for torch here; nothing to measure"


def test_step_gaps_writes_one_row_a_pair_with_the_reported_figure(monkeypatch):
    """benchmarks/step_gaps.py (issue 57): plain against tool, pair by pair, the program's worst gap
    beside the report's own figure for it; a pair inside both bounds and one outside."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import step_gaps

    felt = {"step_gap_max_s": 0.0071, "step_gap_max_step": 40, "step_gap_agent_s": 0.0011,
            "step_gap_collection_s": 0.0, "step_gap_collection_generation": None, "step_gap_typical_s": 0.006,
            "step_gaps": 250, "step_start_gap_max_s": 0.0079, "step_start_gap_max_step": 41,
            "step_start_gap_agent_s": 0.0012, "step_start_gap_agent_parts": {"sample": 0.0012},
            "step_start_gap_collection_s": 0.0}
    raw = {"workloads": {"lightning_clean": {"runs": [
        {"mode": "plain", "pair": 0, "gap_max_ms": 7.0, "step_time_ms": 4.0},
        {"mode": "tool", "pair": 0, "gap_max_ms": 8.0, "step_time_ms": 5.25, "step_gaps": felt},
        {"mode": "plain", "pair": 1, "gap_max_ms": 7.0}, {"mode": "tool", "pair": 1, "gap_max_ms": 340.0,
                                                           "step_gaps": {**felt, "step_start_gap_max_s": 0.33}}]}}}
    got = step_gaps.rows(raw)
    assert [r["pair"] for r in got] == [1, 2]
    assert got[0] == {"workload": "lightning_clean", "pair": 1, "plain_worst_gap_s": 0.007, "tool_worst_gap_s": 0.008,
                      "tool_reported_pause_s": 0.0079, "tool_reported_between": "starts",
                      "tool_reported_collection_s": 0.0, "tool_reported_agent_s": 0.0012,
                      "tool_reported_agent_parts": {"sample": 0.0012}, "tool_reported_end_gap_s": 0.0071,
                      "tool_reported_start_gap_s": 0.0079, "added_s": 0.001, "reported_minus_seen_s": -0.0001,
                      "plain_step_s": 0.004, "tool_step_s": 0.00525, "step_added_s": 0.00125,
                      "plain_spread_s": 0.0}
    assert "plain_step_s" not in got[1]  # (a run without its median step: no step columns)
    assert step_gaps.within(got[0]) and not step_gaps.within(got[1])  # 333 ms added; its figure 10 ms short
    older = step_gaps.rows({"workloads": {"w": {"runs": [  # a recording without the starts' attribution
        {"mode": "plain", "pair": 0, "gap_max_ms": 7.0},
        {"mode": "tool", "pair": 0, "gap_max_ms": 8.0, "step_gaps": {k: v for k, v in felt.items()
                                                                       if not k.startswith("step_start")}}]}}})
    assert older[0]["tool_reported_between"] == "ends" and older[0]["tool_reported_pause_s"] == 0.0071
    # --also: each pair's further tool run gets its own row against the same plain run, with its options
    also = step_gaps.rows({"workloads": {"w": {"runs": [
        {"mode": "plain", "pair": 0, "gap_max_ms": 7.0}, {"mode": "tool", "pair": 0, "gap_max_ms": 8.0},
        {"mode": "tool --trace off", "pair": 0, "gap_max_ms": 7.5}]}}})
    assert [(r.get("tool_mode"), r["added_s"]) for r in also] == [(None, 0.001), ("--trace off", 0.0005)]
    assert also[0]["plain_spread_s"] is None  # (one plain run: no spread)


def test_step_gaps_remakes_rows_from_saved_raw_files_with_the_plain_runs_spread(monkeypatch, tmp_path, capsys):
    """--from-raw: a call cut short keeps corpus.py's runs; their rows and table are made again, and the
    plain runs' own spread (a third plain run whose tool run was cut counts too) is printed."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import step_gaps

    def raw(name, plains, tools):
        runs = [{"mode": "plain", "pair": i, "gap_max_ms": g} for i, g in enumerate(plains)]
        runs += [{"mode": "tool", "pair": i, "gap_max_ms": g} for i, g in enumerate(tools)]
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"workloads": {name: {"runs": runs}}}))
        return str(path)

    out = tmp_path / "rows.json"
    paths = [raw("a", [4.6, 5.7, 5.8], [6.1, 8.2]), raw("b", [57.0], [56.8])]
    assert step_gaps.main(["--from-raw", *paths, "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["workload"], r["pair"], r["added_s"], r["plain_spread_s"]) for r in rows] == [
        ("a", 1, 0.0015, 0.0012), ("a", 2, 0.0025, 0.0012), ("b", 1, -0.0002, None)]
    text = capsys.readouterr().out
    assert "a: its plain runs' worst gaps lie 1.2 ms apart (no tool in either)" in text
    assert "b: its plain" not in text


def test_step_gaps_hands_its_further_runs_and_step_times_to_corpus_and_prints_the_step_shift(
        monkeypatch, tmp_path, capsys):
    """step_gaps.py --also, --step-times and --keep reach corpus.py's runs; its table has the median step's shift."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import step_gaps

    asked = []

    def fake_corpus(argv):
        asked.append(argv)
        raw = {"meta": {"device": "NVIDIA H200"}, "workloads": {"lightning_clean": {"runs": [
            {"mode": "plain", "pair": 0, "gap_max_ms": 5.3, "step_time_ms": 4.17},
            {"mode": "tool", "pair": 0, "gap_max_ms": 8.9, "step_time_ms": 5.46},
            {"mode": "tool --trace off", "pair": 0, "gap_max_ms": 6.0, "step_time_ms": 4.3}]}}}
        (tmp_path / "raw.json").write_text(json.dumps(raw))
        return 0

    monkeypatch.setattr(step_gaps.corpus, "main", fake_corpus)
    out = tmp_path / "rows.json"
    assert step_gaps.main(["--pairs", "1", "--only", "lightning_clean", "--also", "--trace off",
                           "--step-times", str(tmp_path / "times"), "--keep", str(tmp_path / "reports"),
                           "--raw", str(tmp_path / "raw.json"),
                           "--out", str(out)]) == 0
    argv = asked[0]
    assert argv[argv.index("--also") + 1] == "--trace off" and argv[argv.index("--step-times") + 1].endswith("times")
    assert argv[argv.index("--keep") + 1].endswith("reports")
    assert [r.get("tool_mode") for r in json.loads(out.read_text())] == [None, "--trace off"]
    table = capsys.readouterr().out
    assert "step+ ms" in table and "+1.29" in table and "lightning_clean (--trace off)" in table


def test_step_gaps_times_profile_splits_each_run_at_the_agents_start_up_windows(monkeypatch, tmp_path):
    """--times-profile: a run's median step before the stacks' window ends (step 50), before the
    every-step samples end (step 100) and after, its step numbers counted from the corpus's first step."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import step_gaps

    # the file starts after the corpus's five warm-up steps: index 0 is step 5
    times = [5.0] * 45 + [4.5] * 50 + [4.0] * 150
    times[100] = 9.0  # step 105
    (tmp_path / "w-tool-1.txt").write_text("".join(f"{t:.3f}\n" for t in times))
    (tmp_path / "w-plain-1.txt").write_text("4.0\n" * 20)  # too short to split: left out
    lines = step_gaps.profile(str(tmp_path))
    assert len(lines) == 2 and "steps 5-50" in lines[0] and "50-100" in lines[0]
    name, *figures = lines[1].split()[:4]
    assert name == "w-tool-1" and figures == ["5.00", "4.50", "4.00"]
    assert lines[1].endswith("[(105, 9.0), (5, 5.0), (6, 5.0), (7, 5.0)]")


def test_probe_cost_says_what_it_needs_where_it_cannot_run(tmp_path):
    """benchmarks/probe_cost.py without pytorch_lightning, or without a GPU and --cpu: one line, exit 0."""
    import subprocess

    torch = pytest.importorskip("torch")
    try:
        import pytorch_lightning  # noqa: F401
    except ImportError:
        pass
    else:
        if torch.cuda.is_available():
            pytest.skip("Lightning and a CUDA GPU are here: the benchmark measures instead")
    done = subprocess.run([sys.executable, str(BENCHMARKS / "probe_cost.py")], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == \
        "probe_cost: skipped: it needs pytorch_lightning, and a CUDA GPU unless --cpu"
