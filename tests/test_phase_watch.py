"""The search at a pause's height (gpumemdoctor/_agent/peak/phase_watch.py): a real `Agent` over the torch
test double and a clock the test advances. The allocator figures are SYNTHETIC; what is checked is
when the agent asks for the search, that it runs on the main thread (Py_AddPendingCall) in a copy
of the process, and what the program waits for."""
from __future__ import annotations

import json
import threading

import pytest

from gpumemdoctor._agent.peak import phase_watch
from tests.test_agent_long import fake_cuda, records

MiB = 1 << 20
GiB = 1 << 30

pytestmark = pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                                reason="pending calls run on the main thread")


@pytest.fixture
def agent_and_clock(tmp_path):
    yield from fake_cuda.agent_fixture(str(tmp_path))


def steps(agent, clock, n, step_s=0.005, allocated=GiB, activations=200 * MiB):
    for _ in range(n):
        clock.now += step_s
        agent.shared.torch.set(allocated + activations, 8 * GiB)  # the step's activations set the peak
        agent.shared.torch.set(allocated, 8 * GiB)
        agent.on_step(explicit=True)


def pause(agent, clock, levels, every_s=0.02):
    for level in levels:
        clock.now += every_s
        agent.shared.torch.set(level, 8 * GiB)
        # As the agent's own thread does while no step comes (never put off here); a search it asks
        # for runs on this, the main thread, while it runs the program's code (this loop).
        sampling = threading.Thread(target=agent.sampler._sample, args=("time", True), name="gpumemdoctor-agent")
        sampling.start()
        sampling.join()
        for _ in range(1000):
            pass


def phase_searches(tmp_path, agent):
    agent.growth_watch.wait_for_copies()
    found = records(tmp_path, agent)
    return [r for r in found if r["type"] == "investigation" and r["when"] == "phase"], found


def test_an_evaluation_above_the_steps_is_searched_at_its_height_in_a_copy(agent_and_clock, tmp_path):
    agent, clock = agent_and_clock
    steps(agent, clock, 150)
    pause(agent, clock, [GiB + 100 * MiB, GiB + 300 * MiB, GiB + 500 * MiB, GiB + 700 * MiB])
    steps(agent, clock, 20)
    searched, found = phase_searches(tmp_path, agent)
    assert len(searched) == 1, [r for r in found if r["type"] == "error"]
    s = searched[0]
    assert s["forked"] is True and s["all_live"] is True
    assert s["step"] == 150  # made during the pause, before the steps came back
    assert agent.phase_watch.searches == 1 and not agent.phase_watch.asked
    # What the program waited for: the roots and the fork, on its main thread.
    assert 0 < agent.shared.cost["phase_pause_s"] < 1.0
    print(f"phase search: the program paused {agent.shared.cost['phase_pause_s'] * 1000:.1f} ms")


def test_the_pause_counts_the_work_before_the_fork_and_is_within_its_parts(agent_and_clock, tmp_path):
    """cost: the longest pause includes the threads' capture before the fork (search_prep_max_s) and
    the fork (search_fork_max_s); the phase pause includes all of it."""
    agent, clock = agent_and_clock
    steps(agent, clock, 150)
    pause(agent, clock, [GiB + 100 * MiB, GiB + 300 * MiB, GiB + 500 * MiB, GiB + 700 * MiB])
    searched, _ = phase_searches(tmp_path, agent)
    assert len(searched) == 1
    cost = agent.shared.cost
    assert 0 < cost["search_prep_max_s"] < cost["search_pause_max_s"] <= cost["phase_pause_s"]
    assert cost["search_fork_max_s"] < cost["search_pause_max_s"]
    assert cost["search_pause_max_s"] >= cost["search_prep_max_s"] + cost["search_fork_max_s"]


def test_a_search_whose_copy_would_pause_the_program_past_the_limit_is_declined_with_why(
        agent_and_clock, tmp_path, monkeypatch):
    from gpumemdoctor._agent.search import forked

    monkeypatch.setattr(forked, "private_bytes", lambda: int(2.4 * GiB))  # 72 ms at 30 ms/GiB
    agent, clock = agent_and_clock
    steps(agent, clock, 150)
    pause(agent, clock, [GiB + 100 * MiB, GiB + 300 * MiB, GiB + 500 * MiB, GiB + 700 * MiB])
    searched, found = phase_searches(tmp_path, agent)
    assert searched == [] and not agent.growth_watch.copies
    (declined,) = [r for r in found if r["type"] == "declined"]
    assert declined["when"] == "phase" and declined["step"] == 150 and declined["limit_s"] == 0.020
    assert declined["private_bytes"] == int(2.4 * GiB) and 0.072 <= declined["pause_s"] < 0.08
    assert declined["why"].startswith("a copy of this process (2.4 GiB of its own memory) would pause it for "
                                      "about 7") and declined["why"].endswith("ms; the limit is 20 ms (run --max-pause)")
    assert agent.shared.cost["searches_declined"] == 1 and "search_pause_max_s" not in agent.shared.cost
    from gpumemdoctor.recording import records as shapes

    shapes.DECLINED({k: v for k, v in declined.items() if k != "type"}, "declined")  # its declared shape


def test_stacks_are_recorded_from_the_pause_s_rise_to_its_next_step_then_it_is_searched(agent_and_clock, tmp_path):
    agent, clock = agent_and_clock
    steps(agent, clock, 150)
    pause(agent, clock, [GiB + 300 * MiB] * 4)  # above the steps, but not rising: stacks only
    assert [c["enabled"] for c in agent.shared.torch.cuda.memory.history_calls] == ["state"]
    assert agent.trace.on and agent.phase_watch.searches == 0
    pause(agent, clock, [GiB + 400 * MiB])  # TRACED_BYTES more, allocated with stacks: searched
    steps(agent, clock, 3)
    searched, found = phase_searches(tmp_path, agent)
    assert len(searched) == 1 and searched[0]["trace"] is True
    traces = [(r["why"], r["step"]) for r in found if r["type"] == "trace"]
    assert traces == [("phase", 150), ("stopped at the step after the pause", 151)]
    assert not agent.trace.on and agent.trace.was_on


def test_one_search_per_pause_and_at_most_two_in_a_run(agent_and_clock, tmp_path, monkeypatch):
    from gpumemdoctor._agent.search import forked

    # When searches are asked for, not what a fork costs: on a loaded machine the first fork's measured
    # pause can put the second past the 20 ms limit (tested apart, below).
    monkeypatch.setattr(forked, "MAX_PAUSE_S", 1.0)
    agent, clock = agent_and_clock
    for i in range(4):
        steps(agent, clock, 150)
        pause(agent, clock, [GiB + (400 + 400 * i + 100 * k) * MiB for k in range(6)])  # each a new peak
        agent.growth_watch.wait_for_copies()
    searched, _ = phase_searches(tmp_path, agent)
    assert len(searched) == phase_watch.MAX_PHASE_SEARCHES == 2
    assert searched[0]["step"] == 150 and searched[1]["step"] == 300


def test_slow_steps_sampled_over_time_ask_for_nothing(agent_and_clock, tmp_path):
    agent, clock = agent_and_clock
    for _ in range(60):  # steps of 0.12 s whose activations (600 MiB) the timer sees
        steps(agent, clock, 1, step_s=0.0)
        pause(agent, clock, [GiB + 600 * MiB] * 5)
    searched, _ = phase_searches(tmp_path, agent)
    assert searched == [] and agent.phase_watch.searches == 0


def test_a_pause_below_the_steps_peak_or_a_small_rise_asks_for_nothing(agent_and_clock, tmp_path):
    agent, clock = agent_and_clock
    steps(agent, clock, 150, activations=GiB)  # the steps reach 2 GiB
    pause(agent, clock, [GiB + 700 * MiB] * 6)  # 700 MiB above their level, below their peak
    steps(agent, clock, 150, allocated=2 * GiB - 100 * MiB, activations=0)
    pause(agent, clock, [2 * GiB + 100 * MiB] * 6)  # above their peak, 200 MiB above their level
    searched, _ = phase_searches(tmp_path, agent)
    assert searched == []
    steps(agent, clock, 150, allocated=2 * GiB - 100 * MiB, activations=0)
    pause(agent, clock, [2 * GiB + (300 + 50 * k) * MiB for k in range(6)])  # 400 MiB above, rising: searched
    searched, _ = phase_searches(tmp_path, agent)
    assert len(searched) == 1


def test_the_sampling_path_makes_no_container_while_it_watches(agent_and_clock):
    import gc

    agent, clock = agent_and_clock
    steps(agent, clock, 150)
    watch = agent.phase_watch

    def counted(check) -> int:
        gc.collect()
        gc.disable()
        try:
            lift = [[] for _ in range(10)]  # the count never goes below zero: start above it
            before = gc.get_count()[0]
            for _ in range(50):
                clock.now += 0.02
                check(clock.now)
            return gc.get_count()[0] - before + 0 * len(lift)
        finally:
            gc.enable()

    plain = counted(lambda now: None)  # the loop's own count
    assert counted(lambda now: watch.check(now, "step")) == plain
    assert counted(lambda now: watch.check(now, "time")) == plain
    sink = []
    assert counted(lambda now: sink.append([now])) == plain + 50  # what a container kept would show
    assert json.dumps(agent.shared.cost)  # the costs stay plain numbers


def test_a_search_asked_from_the_agents_thread_runs_on_the_main_thread_between_bytecodes(agent_and_clock):
    agent, clock = agent_and_clock
    steps(agent, clock, 150)
    ran_on = []
    agent.growth_watch.search = lambda when, **_: ran_on.append((when, threading.get_ident(), loops))
    loops = 0
    asker = threading.Thread(target=agent.phase_watch.ask, name="gpumemdoctor-agent")
    asker.start()
    asker.join()
    while not ran_on and loops < 10_000_000:  # the program's own loop, in Python
        loops += 1
    assert ran_on and ran_on[0][:2] == ("phase", threading.main_thread().ident)
    assert ran_on[0][2] < 1000  # at one of the loop's next bytecodes
    assert not agent.phase_watch.asked


def test_a_search_asked_while_the_main_thread_is_in_the_agent_s_own_work_waits_for_a_later_sample(agent_and_clock):
    agent, clock = agent_and_clock
    steps(agent, clock, 150)
    ran = []
    agent.growth_watch.search = lambda when, **_: ran.append(when)
    watch = agent.phase_watch
    watch.ask("search")
    watch._on_main_thread(None)  # as if it ran between two bytecodes of the agent (this test's caller is not)
    assert ran == ["phase"]
    ran.clear()
    watch.ask("search")
    # Called from a frame of the agent's own package: it declines, and the pause may ask again.
    from gpumemdoctor._agent import neutral
    neutral_code = compile("watch._on_main_thread(None)", neutral.__file__, "exec")
    exec(neutral_code, {"watch": watch})
    assert ran == [] and not watch.asked and watch.searched_step == -1


def test_a_search_or_the_stacks_asked_in_the_middle_of_an_import_wait_for_a_later_sample(agent_and_clock):
    """A pending call can land between two bytecodes of importlib's own Python: switching the stacks
    on there would import into a half-made module, so it declines as in the agent's own work."""
    agent, clock = agent_and_clock
    steps(agent, clock, 150)
    ran = []
    agent.growth_watch.search = lambda when, **_: ran.append(when)
    watch = agent.phase_watch
    for action, mark in (("search", "searched_step"), ("trace", "traced_step")):
        watch.ask(action)
        exec(compile("watch._on_main_thread(None)", "<frozen importlib._bootstrap>", "exec"), {"watch": watch})
        assert ran == [] and not watch.asked and getattr(watch, mark) == -1


def test_a_later_evaluation_as_high_as_the_first_is_searched_when_the_first_was_not(agent_and_clock, tmp_path):
    agent, clock = agent_and_clock
    steps(agent, clock, 150)
    pause(agent, clock, [GiB + 900 * MiB] * 4)  # not rising once stacks are on: its stacks only
    steps(agent, clock, 150)
    assert phase_searches(tmp_path, agent)[0] == []
    pause(agent, clock, [GiB + (500 + 100 * k) * MiB for k in range(5)])  # to the same height
    searched, _ = phase_searches(tmp_path, agent)
    assert len(searched) == 1 and searched[0]["step"] == 300


def test_a_search_keeps_none_of_the_program_s_frames_alive(agent_and_clock, tmp_path):
    """The search's capture of the threads holds the frame that makes it, which holds the capture: once
    that cycle was left behind, the program's frames below it and their locals (an evaluation's
    graphs) lived until the garbage collector ran."""
    import gc
    import weakref

    agent, clock = agent_and_clock

    class Big:
        pass

    def evaluate():
        big = Big()  # a local of the program's function, as an evaluation's running sum is
        steps(agent, clock, 150)
        pause(agent, clock, [GiB + 100 * MiB, GiB + 300 * MiB, GiB + 500 * MiB, GiB + 700 * MiB])
        return weakref.ref(big)

    was = gc.isenabled()
    gc.disable()
    try:
        gone = evaluate()
        searched, _ = phase_searches(tmp_path, agent)
        assert len(searched) == 1
        assert gone() is None  # freed when evaluate() returned, with no collection
    finally:
        if was:
            gc.enable()


def test_a_rising_pause_is_sampled_at_least_every_rising_interval(agent_and_clock, tmp_path):
    """A paced interval longer than a validation left it one sample on the H100: while a pause
    rises above the steps, the agent's thread samples at least every RISING_INTERVAL_S, and at its
    own pace again once the steps come back."""
    from gpumemdoctor._agent.readings.sampler import SamplingThread

    agent, clock = agent_and_clock
    thread = SamplingThread(agent.shared, agent.sampler, agent.trace, agent.phase_watch, agent.start_devices)
    steps(agent, clock, 150)
    agent.sampler.interval_s = 0.2  # paced long
    assert thread._interval() == 0.2
    pause(agent, clock, [GiB + 100 * MiB], every_s=0.06)  # paused, not yet above the steps
    agent.sampler.interval_s = 0.2  # (each sample paces it again)
    assert thread._interval() == 0.2
    pause(agent, clock, [GiB + 300 * MiB], every_s=0.06)
    agent.sampler.interval_s = 0.2
    assert agent.phase_watch.rising_step == agent.shared.steps
    assert thread._interval() == phase_watch.RISING_INTERVAL_S
    clock.now += phase_watch.RISING_FOR_S + 0.1  # a pause that never ends is paced again
    assert thread._interval() == 0.2
    steps(agent, clock, 1)
    agent.sampler.interval_s = 0.2
    assert thread._interval() == 0.2
