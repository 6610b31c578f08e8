"""The agent's sampling path over a simulated day: a real `Agent` over the torch test double
(tests/doubles/fake_cuda.py) and a clock the test advances. The allocator figures are
SYNTHETIC (a formula); what is checked is the agent's own bookkeeping: what it keeps in
memory, how fast its file grows, and --trace auto's window."""
from __future__ import annotations

import gc
import importlib.util
import json
import sys
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import pytest

# Loaded from its file: putting tests/doubles on sys.path would also make `import pynvml` find the
# NVML test double in every test module collected after this one.
_spec = importlib.util.spec_from_file_location("fake_cuda", Path(__file__).parent / "doubles" / "fake_cuda.py")
fake_cuda = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake_cuda)

from gpumemdoctor import contract
from gpumemdoctor._agent.readings import sampler, trace
from gpumemdoctor._agent import growth_watch as watch

MiB = 1 << 20
HOUR = 3600


@pytest.fixture
def agent_and_clock(tmp_path):
    yield from fake_cuda.agent_fixture(str(tmp_path))


def records(tmp_path, agent) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / f"agent-{agent.shared.pid}.jsonl").read_text().splitlines()]


def run_steps(agent, clock, steps: int, step_s: float, allocated) -> None:
    for _ in range(steps):
        clock.now += step_s
        agent.shared.torch.set(allocated(agent.shared.steps, clock.now), 8 << 30)
        agent.on_step(explicit=True)


def test_a_day_keeps_the_agents_memory_flat_and_its_file_to_a_bounded_rate(agent_and_clock, tmp_path):
    agent, clock = agent_and_clock

    def noisy_flat(step, now):  # no leak: the online check keeps running all day
        return (1 << 30) + (step * 7919 % 13) * 20 * MiB

    run_steps(agent, clock, 4 * HOUR, 1.0, noisy_flat)  # four hours at one step a second: the ramp
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        lines_before = len(records(tmp_path, agent))
        run_steps(agent, clock, 20 * HOUR, 1.0, noisy_flat)
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not agent.growth_watch.suspected
    assert after - before < 64 * 1024  # nothing kept per step or per sample
    floor_xs = agent.growth_watch.floor_xs
    assert all(len(xs) <= watch.MAX_FLOOR_POINTS + 1 for per_device in floor_xs.values() for xs in per_device)
    assert any(per_device[0] for per_device in floor_xs.values())  # the check ran
    assert agent.sampler.interval_s == contract.LENGTHENED_INTERVAL_MAX_S
    lines_per_hour = (len(records(tmp_path, agent)) - lines_before) / 20
    assert lines_per_hour <= HOUR / contract.LENGTHENED_INTERVAL_MAX_S + 1  # at most one sample line per 5 s
    costs = agent.sampler.cost.windows()
    assert costs["first_window_samples"] > costs["last_window_samples"] > 0


def test_trace_auto_records_stacks_for_a_window_then_stops(agent_and_clock, tmp_path):
    agent, clock = agent_and_clock

    def leak(step, now):  # 1 MiB every 10 steps, under 100 MiB of activations
        return (1 << 30) + step // 10 * MiB + (step % 3) * 50 * MiB

    run_steps(agent, clock, 3000, 0.1, leak)  # 300 s
    agent.growth_watch.wait_for_copies()  # the search was made in a copy of the process
    calls = agent.shared.torch.cuda.memory.history_calls
    assert [c["enabled"] for c in calls] == ["state", None]
    traces = [r for r in records(tmp_path, agent) if r["type"] == "trace"]
    # growth seen between steps: stacks until the growth search, made INVESTIGATE_AFTER_STEPS later
    assert [t["why"] for t in traces] == ["growth", "stopped after the growth search"]
    assert traces[1]["step"] - traces[0]["step"] == watch.INVESTIGATE_AFTER_STEPS + 1
    found = records(tmp_path, agent)
    (investigation,) = [r for r in found if r["type"] == "investigation"] or [
        [r for r in found if r["type"] == "error"]]  # the copy's errors, when it wrote no search
    assert investigation["when"] == "growth" and investigation["trace"] is True
    assert not agent.trace.on and agent.trace.was_on


def test_trace_on_is_never_stopped(tmp_path):
    agent, clock = fake_cuda.make_agent(str(tmp_path), trace="on")
    try:
        agent.trace.start("flag")
        run_steps(agent, clock, 3000, 0.1, lambda step, now: (1 << 30) + step // 10 * MiB)
        assert [c["enabled"] for c in agent.shared.torch.cuda.memory.history_calls] == ["state"]
        assert agent.trace.on
    finally:
        fake_cuda.restore_clock()


def test_the_long_run_benchmark_runs_a_short_simulation(tmp_path):
    """benchmarks/long_run.py end to end, on 12 simulated minutes (its figures are checked
    on the day-long run whose results are in benchmarks/results/)."""
    import subprocess

    script = Path(__file__).parent.parent / "benchmarks" / "long_run.py"
    out = tmp_path / "long.json"
    done = subprocess.run([sys.executable, str(script), "--hours", "0.2", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    sup = result["supervisor"]
    assert sup["report_bytes"] < 5_000_000 and sup["peak_rss_bytes"] < 256 * MiB
    assert sup["nvml_points_kept"] < sup["nvml_points_seen"] and sup["spike_in_report"]["allocated_bytes"] > 20 << 30
    assert result["agent"]["step_cost_first_minute"]["sampling"]["steps"] > 0


def test_trace_auto_records_stacks_for_a_start_up_window_by_steps(agent_and_clock, tmp_path):
    """Stacks from CUDA's start (as on_cuda turns them on) until STARTUP_STEPS steps..."""
    agent, clock = agent_and_clock
    agent.trace.start("start-up")
    run_steps(agent, clock, trace.STARTUP_STEPS + 50, 0.01, lambda step, now: 1 << 30)  # 1.5 s, no growth
    assert [c["enabled"] for c in agent.shared.torch.cuda.memory.history_calls] == ["state", None]
    traces = [r for r in records(tmp_path, agent) if r["type"] == "trace"]
    assert [t["why"] for t in traces] == ["start-up", f"start-up window ended ({trace.STARTUP_WINDOW_S:g} s or "
                                          f"{trace.STARTUP_STEPS} steps)"]
    assert traces[1]["step"] == trace.STARTUP_STEPS
    assert agent.trace.was_on and not agent.trace.on


def test_growth_seen_inside_the_start_up_window_extends_it_without_a_second_call(agent_and_clock, tmp_path):
    """Issue 57: turning PyTorch's history on again while it is on costs the program's step its time for
    nothing; growth suspected while the start-up window is open only moves the window's end."""
    agent, clock = agent_and_clock
    agent.trace.start("start-up")
    agent.trace.start("growth", until_step=40)
    assert [c["enabled"] for c in agent.shared.torch.cuda.memory.history_calls] == ["state"]
    assert agent.trace.on and agent.trace.window == "growth" and agent.trace.stop_step == 40
    traces = [r for r in records(tmp_path, agent) if r["type"] == "trace"]
    assert [t["why"] for t in traces] == ["start-up", "growth"] and all(t["ok"] for t in traces)


def test_the_window_closing_at_a_step_leaves_the_collectors_count_as_it_was(agent_and_clock, tmp_path):
    """The start-up window closes in the middle of the program's loop, on its thread: the collector's
    count after that step is what it was before it (scenarios/garbage_cycles_neutral.py on the H100:
    a window closing at step 50 of 120 left one more 16 MiB cycle alive at the end than a plain run)."""
    agent, clock = agent_and_clock
    memory = agent.shared.torch.cuda.memory
    record, kept = memory._record_memory_history, []

    def keeping(*args, **kwargs):  # as PyTorch's may: it leaves an object alive
        kept.append(SimpleNamespace())
        return record(*args, **kwargs)

    memory._record_memory_history = keeping
    agent.trace.start("start-up")
    run_steps(agent, clock, trace.STARTUP_STEPS - 1, 0.01, lambda step, now: 1 << 30)
    assert agent.trace.on
    gc.disable()  # no collection in between: the count is the program's alone
    try:
        before = gc.get_count()[0]
        run_steps(agent, clock, 1, 0.01, lambda step, now: 1 << 30)  # the step that closes it
        after = gc.get_count()[0]
    finally:
        gc.enable()
    assert not agent.trace.on and memory.history_calls[-1]["enabled"] is None and len(kept) == 2
    assert after == before


def test_trace_auto_records_stacks_for_a_start_up_window_by_time(agent_and_clock, tmp_path):
    """... or STARTUP_WINDOW_S, when steps are slow; growth seen after it opens its own window."""
    agent, clock = agent_and_clock
    agent.trace.start("start-up")
    run_steps(agent, clock, 20, 1.0, lambda step, now: 1 << 30)
    traces = [r for r in records(tmp_path, agent) if r["type"] == "trace"]
    assert traces[1]["step"] == int(trace.STARTUP_WINDOW_S) and not agent.trace.on
    run_steps(agent, clock, 200, 0.1, lambda step, now: (1 << 30) + step * MiB)  # a leak: stacks again
    traces = [r for r in records(tmp_path, agent) if r["type"] == "trace"]
    assert [t["why"] for t in traces[2:]] == ["growth", "stopped after the growth search"]
    assert agent.trace.window == "growth" and not agent.trace.on  # its own window, ended by now


def test_growth_seen_over_time_before_any_step_leaves_the_steps_watched(agent_and_clock, tmp_path):
    """A vision loop's model and first batches arrive before its first step: the time samples may
    see growth then. The steps that follow are still watched, and a leak in them is searched for
    during the run (seen on an H100: the search was otherwise left to the exit, after main() had
    returned and let go of what it held)."""
    agent, clock = agent_and_clock
    gc.disable()  # as if the collector were far from its threshold: time samples are never put off
    try:
        for i in range(40):
            clock.now += 0.05
            agent.shared.torch.set((1 << 30) + i * 8 * MiB, 8 << 30)
            agent.sampler.sample("time")
    finally:
        gc.enable()
    assert agent.growth_watch.suspected and agent.growth_watch.suspected_by == "time"
    # growth over time: stacks for TRACE_WINDOW_S (no search during the run is due)
    (opened,) = [r for r in records(tmp_path, agent) if r["type"] == "trace" and r["why"] == "growth"]
    assert agent.trace.on and agent.trace.stop_at == pytest.approx(opened["t"] + trace.TRACE_WINDOW_S)
    run_steps(agent, clock, 200, 0.05, lambda step, now: (1 << 30) + 320 * MiB + step * MiB)
    assert agent.growth_watch.suspected_by == "step"
    agent.growth_watch.wait_for_copies()
    found = records(tmp_path, agent)
    assert [s["by"] for s in found if s["type"] == "suspect"] == ["time", "step"]
    assert [r["when"] for r in found if r["type"] == "investigation"] == ["growth"]


def test_dear_samples_lengthen_the_interval_to_keep_their_share(agent_and_clock, tmp_path):
    """A sample that costs 400 us (as between the steps of a launch-bound loop on an H100) is
    taken every 40 ms, not every 20: at most 1% of the program's time. Cheap ones keep the base
    interval, and the base still doubles with the samples' count."""
    agent, clock = agent_and_clock
    s = agent.sampler
    for _ in range(50):
        s._pace(400e-6)
    assert s.interval_s == pytest.approx(0.04)
    agent.shared.torch.set(64 * MiB, 64 * MiB)
    run_steps_spent(agent, clock, steps=sampler.EVERY_STEP_UNTIL, step_s=0.001)  # all sampled
    before = s.samples
    run_steps_spent(agent, clock, steps=1000, step_s=0.001)
    assert 24 <= s.samples - before <= 26  # 1 s of 1 ms steps: a sample each 40 ms
    for _ in range(50):
        s._pace(20e-6)
    assert s.interval_s == pytest.approx(0.02)
    s.base_interval_s = 0.08  # the count's doublings win over a cheaper paced interval
    s._pace(400e-6)
    assert s.interval_s == 0.08
    for _ in range(50):
        s._pace(1.0)
    assert s.interval_s == contract.LENGTHENED_INTERVAL_MAX_S


@pytest.fixture
def agent_asked_10_s(tmp_path):
    yield from fake_cuda.agent_fixture(str(tmp_path), interval_s=10.0)


def test_an_interval_asked_above_the_lengthened_ceiling_is_kept_as_asked(agent_asked_10_s):
    """`run --interval 10` (60 s at most) samples every 10 s all run long: the count's doublings and
    the samples' cost lengthen a shorter interval up to 5 s, and never cut a longer one down to it."""
    agent, clock = agent_asked_10_s
    s = agent.sampler
    agent.shared.torch.set(64 * MiB, 64 * MiB)
    s.samples = sampler.SAMPLES_PER_DOUBLING - 1
    s.sample("time")  # the 1000th sample: the base would double
    assert s.samples == sampler.SAMPLES_PER_DOUBLING
    assert s.base_interval_s == 10.0 and s.interval_s == 10.0
    for _ in range(50):
        s._pace(1.0)  # dear samples: 1 s each would ask for 100 s
    assert s.interval_s == 10.0
    assert contract.interval_ceiling(0.02) == contract.LENGTHENED_INTERVAL_MAX_S == 5.0
    assert contract.interval_ceiling(contract.INTERVAL_MAX_S) == contract.INTERVAL_MAX_S


def run_steps_spent(agent, clock, steps: int, step_s: float) -> None:
    """Steps whose samples each cost what the last _pace was told, whatever they really took."""
    s = agent.sampler
    mean = s.mean_cost_s
    for _ in range(steps):
        clock.now += step_s
        agent.on_step(explicit=True)
        s.mean_cost_s = mean
        s._pace(mean)


def test_the_first_samples_do_not_set_the_pace(agent_and_clock, monkeypatch):
    """The first reading costs what its first calls do (13.6 ms once on the H100): as the running
    mean's start it made a short program's interval 1.4 s. The pace starts after UNPACED_SAMPLES."""
    agent, clock = agent_and_clock
    s = agent.sampler
    paced = []
    monkeypatch.setattr(s, "_pace", paced.append)
    agent.shared.torch.set(64 * MiB, 64 * MiB)
    for _ in range(sampler.UNPACED_SAMPLES + 2):
        clock.now += 1
        assert s._sample("time", True)
    assert len(paced) == 2 and s.interval_s == s.base_interval_s


def test_a_time_sample_put_off_for_room_is_taken_at_once_when_the_program_is_idle(agent_and_clock, monkeypatch):
    """The timer reads only with room below the collector's threshold. A program that sleeps with its
    count near the threshold does not move it: the next try finds the same count and reads at once,
    collection held off. One that allocates is read once put off for STARVED_S (on an H100, 0.25 s
    left a sleeping program's 1.2 s leak with four samples)."""
    agent, clock = agent_and_clock
    s = agent.sampler
    counts = iter([600, 600, 610, 620, 630])
    taken = []

    def reading(by, quiet):
        if not quiet:
            s.neutral.t3 = (next(counts), 700, 0)  # what Neutral.read leaves when it finds no room
            return None
        taken.append(clock.now)
        s.last_sample_t = clock.now
        return True

    monkeypatch.setattr(s, "_sample", reading)
    s.last_sample_t = clock.now
    clock.now += 0.02
    assert s.sample("time") is False  # no room, and the count not seen before
    clock.now += 0.02
    assert s.sample("time") is True and taken == [clock.now]  # the same count: idle, read at once
    clock.now += 0.02
    assert s.sample("time") is False  # the count moved: the program allocates
    clock.now += sampler.STARVED_S
    assert s.sample("time") is True and len(taken) == 2  # put off long enough: read all the same
    assert s.samples_skipped == 4
