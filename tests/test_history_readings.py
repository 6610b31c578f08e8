"""When history.py reads the allocator's events (gpumemdoctor/_agent/peak/history.py's check): at a new
high of the allocated peak counter that has come and gone, after the first readings only at larger
rises, once more when a smaller rise has stayed (a gathering loop's last concatenation), and again
when a reading's ring did not reach back to its peak. The reading itself is replaced here: it needs
CUDA (tests/gpu/test_allocated_peak.py)."""
from __future__ import annotations

import json
from types import SimpleNamespace

from gpumemdoctor._agent.peak import history as H, reading
from gpumemdoctor._agent.neutral import Bulk, top_up


def _in_a_fresh_interpreter(call: str):
    """`call` (an expression over this module's helpers) run in a fresh interpreter, and its result
    (JSON): the collector's count checks below, after other test modules, once moved with free
    lists that the reading does not drain."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = f"import json, tests.test_history_readings as m; print(json.dumps(eval({call!r}, vars(m))))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])

GiB = 1 << 30


def _history():
    sampler = SimpleNamespace(rows=[[0, 0, 0, 0, 0, 0, 0, 0]], live=[True], events=[None])
    shared = SimpleNamespace(run_dir="x", steps=0)
    h = H.History(shared, sampler, SimpleNamespace(mode="auto", on=False), None)
    h.forward_watch = SimpleNamespace(state=0)
    h.best, h.seen, h.ring.events = [0], [None], [0]
    h.bulk = SimpleNamespace(ready=lambda: True)  # its ballast made: a reading may be made
    h.on = True
    done = []

    def read(i, later=False):
        h.best[i] = sampler.rows[i][6]
        h.readings += 1
        done.append(sampler.rows[i][6])

    h.read = read
    return h, sampler, done


def _sample(h, sampler, counter, allocated=0):
    sampler.rows[0][6] = counter
    sampler.rows[0][1] = allocated
    h.check(0.0, "step")


def test_a_gathering_loops_last_small_rise_is_read_once_it_stays():
    h, sampler, done = _history()
    h.readings = H.MAX_READINGS  # the first readings made: only a rise of BIG_RISE is read at once
    h.best[0] = 20 * GiB
    _sample(h, sampler, int(21.3 * GiB))  # +6.5%: not at once
    assert done == []
    _sample(h, sampler, int(21.3 * GiB))  # the same high at the next sample: it stayed, read it
    assert done == [int(21.3 * GiB)]
    _sample(h, sampler, int(21.3 * GiB))  # read already
    assert done == [int(21.3 * GiB)]
    _sample(h, sampler, 25 * GiB)  # +17%: at once
    assert done == [int(21.3 * GiB), 25 * GiB]


def test_a_high_that_is_now_is_read_once_gone_and_a_reading_that_missed_its_peak_is_made_again():
    h, sampler, done = _history()
    _sample(h, sampler, 10 * GiB, allocated=10 * GiB - (1 << 20))  # the high is now: the sample has it
    assert done == [] and h.best[0] == 0
    _sample(h, sampler, 10 * GiB, allocated=GiB)  # gone at the next sample: read it then
    assert done == [10 * GiB]
    h.best[0] = 0
    done.clear()
    h.retry = 0  # (set by a reading whose ring was full and did not reach back)
    _sample(h, sampler, 10 * GiB, allocated=GiB)
    assert done == [10 * GiB] and h.retry is None


def test_a_reading_in_a_library_loop_names_it_and_the_program_line_that_called_it(tmp_path):
    """A reading made while transformers' evaluation loop runs, here inside the program's own callback
    that the loop calls: the loop is named, and the program's line is the one that called the loop,
    not the callback's."""
    library = tmp_path / "site-packages" / "transformers" / "trainer.py"
    library.parent.mkdir(parents=True)
    library.write_text("def evaluation_loop(callback):\n    return callback()\n")
    namespace: dict = {}
    exec(compile(library.read_text(), str(library), "exec"), namespace)
    program = tmp_path / "train.py"
    program.write_text("import sys\n"
                       "def on_prediction_step():\n"
                       "    return LOOP_OF(sys._getframe())\n"
                       "def main():\n"
                       "    return evaluation_loop(on_prediction_step)\n")
    code: dict = {"LOOP_OF": reading.loop_of, "evaluation_loop": namespace["evaluation_loop"]}
    exec(compile(program.read_text(), str(program), "exec"), code)
    loop, called, frame = code["main"]()
    assert (loop, called) == ("transformers.Trainer.evaluation_loop", "train.py:5 in main()")
    assert frame.f_code.co_name == "evaluation_loop"
    assert code["on_prediction_step"]() == (None, None, None)  # outside the loop


def _recorder(takes_skip: bool):
    calls = []
    if takes_skip:
        def record(enabled, context, stacks, max_entries, skip_actions=None):
            calls.append({"context": context, "max_entries": max_entries, "skip_actions": skip_actions})
    else:  # PyTorch before skip_actions
        def record(enabled, context, stacks, max_entries):
            calls.append({"context": context, "max_entries": max_entries})
    torch = SimpleNamespace(cuda=SimpleNamespace(memory=SimpleNamespace(_record_memory_history=record)))
    shared = SimpleNamespace(torch=torch, run_dir="x")
    return H.History(shared, None, SimpleNamespace(mode="auto", on=False), None), calls


def test_the_ring_leaves_out_the_entries_no_walk_reads_and_holds_as_many_events_without_them():
    h, calls = _recorder(True)
    h.ring.apply(False)
    h.ring.apply(True)  # trace.py's window: the live blocks' stacks, the same ring
    assert [c["skip_actions"] for c in calls] == [H.SKIPPED, H.SKIPPED]
    assert calls[0]["max_entries"] == calls[1]["max_entries"] == int(H.MIN_EVENTS * H.ENTRIES_PER_EVENT[1])
    assert (calls[0]["context"], calls[1]["context"]) == (None, "state")
    assert h.ring.skips
    old, old_calls = _recorder(False)
    old.ring.apply(False)  # the first call fails on skip_actions; the second records every action
    assert not old.ring.skips and len(old_calls) == 1
    assert old_calls[0]["max_entries"] == old.ring.capacity
    # The same events either way: a free's request and its completion are 1.5 entries an event.
    assert abs(old.ring.capacity / H.ENTRIES_PER_EVENT[0] - h.ring.capacity / H.ENTRIES_PER_EVENT[1]) <= 2
    assert old.ring.capacity > 1.4 * h.ring.capacity


def test_the_ring_grows_to_twice_the_busiest_steps_events_within_its_bounds():
    h, calls = _recorder(True)
    h.ring.apply(False)
    h.ring.busiest = 4000
    h.ring.resize()
    assert h.ring.capacity == H.capacity(8000, True) and calls[-1]["max_entries"] == h.ring.capacity
    h.ring.busiest = 100_000
    h.ring.resize()
    assert h.ring.capacity == H.capacity(H.MAX_EVENTS, True)
    n = len(calls)
    h.ring.busiest = 120_000
    h.ring.resize()  # at its largest already: no new call
    assert len(calls) == n


def _reading_agent(pad: int = 0):
    """An agent whose allocator is a recorded spike: two 1 GiB blocks made and freed between two
    samples, above 2 GiB still allocated (and `pad` pairs of small blocks made and freed after); the
    real reading (reading.py) runs on it."""
    base = 2 * GiB
    trace = [{"action": "alloc", "addr": 1 << 40, "size": GiB, "time_us": 10, "stream": 0},
             {"action": "alloc", "addr": 2 << 40, "size": GiB, "time_us": 20, "stream": 0},
             {"action": "free_requested", "addr": 2 << 40, "size": GiB, "time_us": 30, "stream": 0},
             {"action": "free_requested", "addr": 1 << 40, "size": GiB, "time_us": 40, "stream": 0}]
    for k in range(pad):
        trace += [{"action": "alloc", "addr": 3 << 40, "size": 512, "time_us": 50 + 2 * k, "stream": 0},
                  {"action": "free_requested", "addr": 3 << 40, "size": 512, "time_us": 51 + 2 * k, "stream": 0}]
    stats = {"allocated_bytes": {"all": {"peak": base + 2 * GiB, "current": base}},
             "reserved_bytes": {"all": {"current": base + 2 * GiB}}}
    memory = SimpleNamespace(_record_memory_history=lambda **kw: None)
    torch = SimpleNamespace(
        _C=SimpleNamespace(_cuda_memorySnapshot=lambda pool: {"device_traces": [[dict(e) for e in trace]]}),
        cuda=SimpleNamespace(memory=memory), Tensor=type(None), nn=SimpleNamespace(Parameter=type(None)))
    sampler = SimpleNamespace(rows=[[0, base, 0, 0, 0, 0, base + 2 * GiB, 0]], live=[True], events=[None],
                              stats_fn=lambda i: stats)
    lines: list = []
    shared = SimpleNamespace(torch=torch, steps=5, cost={}, run_dir="x", finished=False, felt=None,
                             channel=SimpleNamespace(write_line=lines.append))
    h = H.History(shared, sampler, SimpleNamespace(mode="auto", on=False),
                  SimpleNamespace(optimizer_figures=lambda *a: None, optimizers=[]))
    h.forward_watch = SimpleNamespace(arm=lambda i: None, state=0)
    agent = SimpleNamespace(shared=shared, sampler=sampler, forward_watch=h.forward_watch, history=h)
    h.prepare(1)
    while top_up(h.bulk):  # (under `run` the agent's collector callback makes it, at collections' starts)
        pass
    h.on = True
    return h, agent, lines


def _steps_parts() -> dict:
    """The three step samples of the test below, in this process: what each left."""
    import gc
    import sys

    h, agent, lines = _reading_agent()
    was = gc.isenabled()
    gc.disable()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(100)
    get = gc.get_count
    moved = [0, 0, 0]
    states = [None, None, None]
    try:
        c = get()[0]
        h.check(0.0, "step")  # the high has gone: read, the walk put off
        moved[0] = get()[0] - c
        states[0] = [h.taken is not None, len(lines), agent.shared.cost["history_reads"]]
        c = get()[0]
        h.check(0.0, "step")  # the same step: nothing more
        moved[1] = get()[0] - c
        states[1] = [h.taken is not None, len(lines)]
        agent.shared.steps = 6
        c = get()[0]
        h.check(0.0, "step")
        moved[2] = get()[0] - c
    finally:
        sys.setswitchinterval(interval)
        if was:
            gc.enable()
    return {"states": states, "moved": moved, "taken": h.taken is not None, "lines": lines,
            "read_max_s": agent.shared.cost["history_read_max_s"], "short": h.bulk.short, "ready": h.bulk.ready()}


def test_a_reading_at_a_steps_sample_walks_at_the_next_steps_and_leaves_the_collectors_count():
    """Each step pauses for one part: the snapshot at one step's sample, the walk and the record at
    the next step's; the collector's count is the same after each (collection held off, as a step's
    sample holds it).

    In a fresh interpreter: the reading drains the free lists of the kinds it makes in bulk (dicts,
    lists, 2-tuples), and a process whose earlier work left another kind's free list in another state
    (other test modules imported first) saw the count one higher after the first sample, a state that
    instrumenting the reading made vanish (NOTES.md, open questions)."""
    got = _in_a_fresh_interpreter('_steps_parts()')
    assert got["states"][0] == [True, 0, 1] and got["states"][1] == [True, 0]
    assert not got["taken"] and len(got["lines"]) == 1
    assert got["moved"] == [0, 0, 0]
    record = json.loads(got["lines"][0])
    assert record["put_off"] is True and (record["step"], record["walked_step"]) == (5, 6)
    assert record["allocated_peak"] == 4 * GiB and record["complete"]
    assert sum(p["bytes"] for p in record["parts"].values()) == 4 * GiB
    assert record["elapsed_s"] >= record["taken_s"] > 0
    assert got["read_max_s"] <= record["elapsed_s"]
    assert got["short"] == 0 and got["ready"]


def _walked_in_parts(pad: int, slice_s: float) -> dict:
    """A reading of a trace with `pad` pairs of small events after its spike, walked at later step
    samples WALK_SLICE_S at a time: the record, and how the collector's count moved at each sample."""
    import gc
    import json

    H.WALK_SLICE_S = slice_s
    h, agent, lines = _reading_agent(pad=pad)
    was = gc.isenabled()
    gc.disable()
    moved = []
    try:
        get = gc.get_count
        c = get()[0]
        h.check(0.0, "step")  # the snapshot, its walk put off
        moved.append(get()[0] - c)
        samples = 0
        while h.taken is not None and samples < 10000:
            agent.shared.steps += 1
            c = get()[0]
            h.check(0.0, "step")
            moved.append(get()[0] - c)
            samples += 1
    finally:
        if was:
            gc.enable()
    return {"record": json.loads(lines[-1]), "lines": len(lines), "samples": samples, "moved": moved,
            "short": h.bulk.short}


def test_a_walk_put_off_goes_on_over_several_steps_and_ends_as_the_whole_walk_would():
    """GPT-2 124M's walk paused one step 4.4 ms on an H200: a walk put off now goes on at each step
    sample for WALK_SLICE_S (replay.Walk, CHUNK entries between two looks at the clock), and its
    record is the one a walk at once makes. With no time a step, each sample walks one CHUNK; the
    collector's count is left as it was at every sample. In a fresh interpreter, as the test above."""
    parts, whole = _in_a_fresh_interpreter('[_walked_in_parts(3000, 0.0), _walked_in_parts(3000, 10.0)]')
    from gpumemdoctor._agent.peak.replay import CHUNK
    entries = 4 + 2 * 3000
    assert whole["samples"] == 1 and whole["record"]["walk_parts"] == 1
    assert parts["samples"] == parts["record"]["walk_parts"] > entries // CHUNK  # (one CHUNK a sample at least)
    assert parts["lines"] == whole["lines"] == 1
    for key in ("allocated_peak", "complete", "events", "phase", "joined"):
        assert parts["record"][key] == whole["record"][key], key
    split = {run: {name: (p["bytes"], p["blocks"]) for name, p in r["record"]["parts"].items()}
             for run, r in (("parts", parts), ("whole", whole))}  # (their times are each run's clock's)
    assert split["parts"] == split["whole"] and sum(b for b, _ in split["whole"].values()) == 4 * GiB
    assert parts["record"]["allocated_peak"] == 4 * GiB and parts["record"]["complete"]
    assert parts["moved"] == [0] * len(parts["moved"]) and whole["moved"] == [0, 0]
    assert parts["short"] == whole["short"] == 0


def test_a_walk_part_waits_for_a_step_sample_whose_gap_the_agent_has_not_already_paused():
    """A step sample whose gap already holds WALK_BUSY_S of the agent's work (its other watches, a
    timer's samples) makes no part of a walk put off; after WALK_SKIPS such samples in a row it does."""
    from gpumemdoctor._agent.readings.felt import PARTS, Felt

    h, agent, lines = _reading_agent()
    felt = agent.shared.felt = Felt()
    h.check(0.0, "step")  # the snapshot, its walk put off
    assert h.taken is not None
    agent.shared.steps = 6
    felt.since_end.parts[PARTS.index("peak_watch")] = 2 * H.WALK_BUSY_S  # this gap: a capture and its probe
    for _ in range(H.WALK_SKIPS):
        h.check(0.0, "step")
        assert h.taken is not None and lines == []
    h.check(0.0, "step")  # the ninth busy sample in a row: the walk goes on all the same
    assert h.taken is None and len(lines) == 1 and h.skipped == 0
    h.read(0, 7)  # (a new reading, its walk put off)
    felt.since_end.clear()
    agent.shared.steps = 7
    assert h.taken is not None
    h.check(0.0, "step")  # a quiet gap: the walk at once
    assert h.taken is None and len(lines) == 2 and h.skipped == 0


def test_a_walk_in_parts_left_unfinished_is_finished_at_exit_and_its_snapshot_let_go(monkeypatch):
    """The program ends while a walk put off is in its parts (the walk back, then the letting go):
    the exit finishes it at once, with its record and the ballast it spent made again."""
    import json

    monkeypatch.setattr(H, "WALK_SLICE_S", 0.0)  # (a CHUNK, or a chunk let go, a part)
    for letting_go in (False, True):  # in the walk back; in the letting go
        h, agent, lines = _reading_agent(pad=3000)
        h.check(0.0, "step")
        ballast = len(h.bulk.ballast)
        parts = 0
        while parts == 0 or (letting_go and h.taken[H.reading.WALK] is not False):
            agent.shared.steps += 1
            h.check(0.0, "step")
            parts += 1
        assert h.taken is not None and lines == [] and len(h.taken[H.reading.TRACE]) > 0
        h.at_exit()
        assert h.taken is None and len(lines) == 1
        record = json.loads(lines[0])
        assert record["complete"] and record["walk_parts"] == parts + 1 and (parts > 1) == letting_go
        assert len(h.bulk.ballast) >= ballast and h.bulk.short == 0


def test_a_reading_put_off_reads_the_gradients_at_its_moment_and_the_rest_at_its_walk():
    """The reading's first part reads only the optimizers' gradients (its pause, GPT-2's 0.6-0.9 ms of
    optimizers' figures on an H200 mostly their parameters and state); its walk's first part reads the
    parameters and state of the optimizers that had stepped by then. A reading made whole reads all."""
    from gpumemdoctor._agent.peak.peak import ALL_STORAGES, GRADIENTS, PARAMETERS, STATE

    calls = []
    h, agent, lines = _reading_agent()
    h.peak_watch = SimpleNamespace(optimizers=[object(), object()],
                                   optimizer_figures=lambda *a: calls.append((a[4], a[5] if len(a) > 5 else None)))
    h.check(0.0, "step")  # the snapshot, its walk put off
    assert calls == [(GRADIENTS, None)] and h.taken is not None
    h.peak_watch.optimizers.append(object())  # an optimizer that first steps after the reading's moment
    agent.shared.steps = 6
    h.check(0.0, "step")  # the walk
    assert calls == [(GRADIENTS, None), (PARAMETERS | STATE, 2)] and len(lines) == 1
    calls.clear()
    h.bulk.run(h._whole, 0)  # both parts at once
    assert calls == [(ALL_STORAGES, None)]


def test_the_step_that_reads_the_modules_step_makes_no_reading_nor_walk_of_its_own():
    """At the step whose end reads the step recorded with module hooks (saved_by.py), a new high's
    reading, and a walk put off to that step, wait for the next step: the program pauses for one
    part a step (a GPT-2 run paused 16.9 ms where a walk and that reading fell on one step)."""
    from gpumemdoctor._agent.peak.saved_by import DONE, RECORDING

    h, agent, lines = _reading_agent()
    agent.forward_watch.state = RECORDING
    h.check(0.0, "step")  # a high to read, but this step's end reads the modules' step
    assert h.taken is None and h.readings == 0 and lines == []
    agent.forward_watch.state = DONE
    h.check(0.0, "step")  # the next step: the reading, its walk put off
    assert h.taken is not None and h.walk_at == 6 and lines == []
    agent.shared.steps = 6
    agent.forward_watch.state = RECORDING  # (as if the modules' step ended here)
    h.check(0.0, "step")
    assert h.taken is not None and lines == []  # the walk waits another step
    agent.forward_watch.state = DONE
    agent.shared.steps = 7
    h.check(0.0, "step")
    assert h.taken is None and len(lines) == 1


def test_a_walk_put_off_is_made_at_exit_and_a_reading_outside_a_steps_sample_is_whole():
    h, agent, lines = _reading_agent()
    h.check(0.0, "step")
    assert h.taken is not None
    agent.shared.finished = True
    h.at_exit()  # the program ends before another step: its walk is made there
    assert h.taken is None and len(lines) == 1
    h2, agent2, lines2 = _reading_agent()
    h2.read(0)  # (the main thread's call between two bytecodes, the exit's reading)
    assert h2.taken is None and len(lines2) == 1
    import json

    record = json.loads(lines2[0])
    assert record["put_off"] is False and record["allocated_peak"] == 4 * GiB


def test_a_reading_in_the_middle_of_a_step_walks_after_the_next_step_and_at_once_before_any():
    """A reading the timer asked of the main thread falls inside a step: that step's own sample must
    not add the walk to the same step's pause; a program that has made no step yet walks at once."""
    h, agent, lines = _reading_agent()
    h.pending = 0
    h._on_main_thread(None)  # (the main thread's call between two of its bytecodes, in step 6)
    assert h.taken is not None and h.walk_at == 7
    agent.shared.steps = 6
    h.check(0.0, "step")  # the end of the step the reading fell in
    assert h.taken is not None and lines == []
    agent.shared.steps = 7
    h.check(0.0, "step")
    assert h.taken is None and len(lines) == 1
    h2, agent2, lines2 = _reading_agent()
    agent2.shared.steps = 0
    h2.pending = 0
    h2._on_main_thread(None)
    assert h2.taken is None and len(lines2) == 1


def test_os_exit_makes_a_walk_that_was_put_off():
    """The program leaves through os._exit before the next step: exit.hard_exit makes the walk, so
    the reading's record is not lost."""
    import os
    import threading

    from gpumemdoctor._agent import exit as exit_probes

    h, agent, lines = _reading_agent()
    h.check(0.0, "step")
    assert h.taken is not None
    written: list = []
    agent.shared.pid, agent.shared.devices = os.getpid(), [{}]
    agent.sampler.neutral, agent.sampler.lock = object(), threading.Lock()
    agent.sampler.read_devices = lambda: []
    agent.shared.channel.write = written.append
    exit_probes.hard_exit(agent, 3)
    assert h.taken is None and len(lines) == 1 and '"put_off":true' in lines[0]
    assert [r["type"] for r in written] == ["hard-exit"]


def test_trace_events_keeps_the_allocation_events_and_never_records_stacks(tmp_path):
    """--trace events: at CUDA's start the history of events (no stacks) as in auto and on, and no
    start-up window of stacks; off: neither."""
    from tests.doubles import fake_cuda

    seen = {}
    for mode in ("auto", "on", "events", "off"):
        (tmp_path / mode).mkdir()
        agent, _ = fake_cuda.make_agent(str(tmp_path / mode), trace=mode)
        try:
            agent.cuda_seen = False
            agent.on_cuda()  # (as PyTorch's lazy CUDA start calls it)
            seen[mode] = ([c.get("context") for c in agent.shared.torch.cuda.memory.history_calls], agent.history.on)
        finally:
            fake_cuda.restore_clock()
            if agent.shared.channel.fd is not None:
                import os

                os.close(agent.shared.channel.fd)
    assert seen["auto"] == ([None, "state"], True) and seen["on"] == ([None, "state"], True)
    assert seen["events"] == ([None], True)
    assert seen["off"] == ([], False)


def test_the_steps_events_are_counted_while_a_walk_waits():
    """The ring is sized by the busiest step's events: a step whose sample only waited for a walk is
    counted on its own, not as part of the next one."""
    h, agent, lines = _reading_agent()
    agent.sampler.events = [1000]
    h.check(0.0, "step")  # the reading, its walk put off
    assert h.taken is not None
    agent.sampler.events = [1300]  # the same step's sample again: 300 events
    h.check(0.0, "step")
    agent.shared.steps = 6
    agent.sampler.events = [1600]  # the next step: the walk, and 300 more
    h.check(0.0, "step")
    assert h.taken is None and h.ring.busiest == 300


def _failed_walk() -> dict:
    """A reading whose walk, put off to the next step, raises (a PyTorch whose events the walk cannot
    read): how the collector's count moved at that step, and what was left."""
    import gc
    import json

    h, agent, lines = _reading_agent(pad=1500)  # 3,004 entries kept from one step to the next
    h.check(0.0, "step")
    ballast = len(h.bulk.ballast)

    def broken(*args, **kwargs):
        raise KeyError("size")

    walk = H.reading.replay.Walk
    H.reading.replay.Walk = broken
    agent.shared.steps = 6
    was = gc.isenabled()
    gc.disable()
    try:
        c = gc.get_count()[0]
        h.check(0.0, "step")
        moved = gc.get_count()[0] - c
    finally:
        H.reading.replay.Walk = walk
        if was:
            gc.enable()
    return {"moved": moved, "taken": h.taken is not None, "last": json.loads(lines[-1]),
            "ballast_before": ballast, "ballast": len(h.bulk.ballast), "short": h.bulk.short}


def test_a_walk_put_off_that_fails_still_puts_the_collectors_count_back():
    """The walk raises: its error record is written, the kept entries are let go, and the ballast spent
    on them is made again. In a fresh interpreter, as the tests above (in the whole suite, after other
    modules, the count once moved by 5 here)."""
    got = _in_a_fresh_interpreter('_failed_walk()')
    assert abs(got["moved"]) <= 1 and not got["taken"]  # (the exception's own 1-tuple of args, which Bulk does not count)
    assert "error" in got["last"]
    assert got["ballast"] >= got["ballast_before"] + 3004 - 100 and got["short"] == 0  # (made again, less what was kept)


# (Last in this file: the Bulks these make change the free lists that the collector's-count test
# above measures a reading against.)


def test_a_high_seen_before_the_ballast_is_made_is_read_once_it_is():
    """Under `run` the readings' ballast is made at collections' starts (neutral.top_up): a high seen
    before the first one is neither read nor taken as read, and is read at the first sample after it
    (GPT-2 124M on an H200 collected twice in 40 steps; its one high, seen at step 2, was never read)."""
    h, sampler, done = _history()
    h.bulk = Bulk(ballast=0)
    _sample(h, sampler, 10 * GiB, allocated=GiB)  # gone, but nothing to read with
    _sample(h, sampler, 10 * GiB, allocated=GiB)
    assert done == [] and h.best[0] == 0 and not h.asked
    top_up(h.bulk)  # the program's first collection
    assert h.bulk.ready()
    _sample(h, sampler, 10 * GiB, allocated=GiB)
    assert done == [10 * GiB]


def test_read_takes_no_high_as_read_without_the_ballast():
    h, sampler, _ = _history()
    del h.read  # the real one
    h.bulk = Bulk(ballast=0)
    sampler.rows[0][6] = 10 * GiB
    h.read(0, 1)
    assert h.best[0] == 0 and h.readings == 0
