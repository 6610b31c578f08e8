"""The holder search's copy of the process (gpumemdoctor/_agent/search/forked.py): it sees the heap as it
was when it was made, says nothing on the program's output, starts no agent of its own, and is
reaped or killed by the program's agent."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from gpumemdoctor._agent.search import forked

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")


def test_the_copy_sees_the_heap_as_it_was_and_prints_nothing(capfd):
    kept = ["before"]
    r, w = os.pipe()

    def search():
        print("from the copy")  # goes to /dev/null there
        os.write(w, json.dumps(kept).encode())

    copy = forked.start(search, 5.0)
    kept.append("after")  # the program goes on; the copy's heap is the one of the fork
    assert isinstance(copy, forked.Copy), copy
    while not copy.poll():
        time.sleep(0.01)
    os.close(w)
    assert json.loads(os.read(r, 1000)) == ["before"]
    os.close(r)
    assert copy.status == 0 and copy.pause_s >= 0
    assert "from the copy" not in capfd.readouterr().out


def test_a_copy_past_its_deadline_is_killed():
    copy = forked.start(lambda: time.sleep(30), 0.2)
    assert isinstance(copy, forked.Copy)
    time.sleep(0.3)
    while not copy.poll():
        time.sleep(0.01)
    assert copy.status == -9


def test_a_copy_made_on_a_thread_that_ends_goes_on_searching():
    """An out-of-memory error on a worker thread makes its copy there; the thread may end first."""
    import threading

    r, w = os.pipe()
    made = []

    def search():
        time.sleep(0.8)  # the thread that forked has ended by now
        os.write(w, b"searched")

    def on_a_worker_thread():
        made.append(forked.start(search, 5.0))
        time.sleep(0.3)  # then ends, while its copy searches

    worker = threading.Thread(target=on_a_worker_thread)
    worker.start()
    worker.join()
    (copy,) = made
    assert isinstance(copy, forked.Copy), copy
    while not copy.poll():
        time.sleep(0.01)
    os.close(w)
    assert copy.status == 0 and os.read(r, 100) == b"searched"
    os.close(r)


def test_a_copy_ends_soon_after_its_program(tmp_path):
    psutil = pytest.importorskip("psutil")
    code = textwrap.dedent("""
        import os, time
        from gpumemdoctor._agent.search import forked

        def search():  # a long search, on the CPU
            end = time.monotonic() + 30
            while time.monotonic() < end:
                pass

        copy = forked.start(search, 60.0)
        print(copy.pid, flush=True)
        os._exit(0)  # the program ends without waiting for its copy
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    pid = int(proc.stdout.split()[0])
    deadline = time.monotonic() + 5
    alive = True
    while alive and time.monotonic() < deadline:
        try:
            alive = psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            alive = False
        time.sleep(0.02)
    assert not alive, "the copy went on searching after its program ended"


def test_no_copy_when_the_fork_would_pause_the_program_too_long(monkeypatch):
    monkeypatch.setattr(forked, "_measured", [])
    monkeypatch.setattr(forked, "private_bytes", lambda: 64 << 30)
    why = forked.start(lambda: None, 1.0)
    assert isinstance(why, dict), why
    assert why["why"] == ("a copy of this process (64.0 GiB of its own memory) would pause it for about "
                          "1920 ms; the limit is 20 ms (run --max-pause)")  # 64 x PAUSE_S_PER_GIB
    assert why["private_bytes"] == 64 << 30 and why["limit_s"] == 0.020 and why["pause_s"] == 1.92


def test_the_limit_is_20_ms_and_counts_the_work_before_the_fork(monkeypatch):
    """Issue 31: no copy whose estimated pause is over 20 ms, the work already done on the
    program's thread included; one just under it is made."""
    assert forked.MAX_PAUSE_S == 0.020
    monkeypatch.setattr(forked, "_measured", [])
    gib = 1 << 30
    monkeypatch.setattr(forked, "private_bytes", lambda: int(0.7 * gib))  # 21 ms at 30 ms/GiB
    assert "about 21 ms; the limit is 20 ms" in forked.declined()["why"]
    monkeypatch.setattr(forked, "private_bytes", lambda: int(0.6 * gib))  # 18 ms
    assert forked.declined() is None
    over = forked.declined(spent_s=0.003)  # 18 + 3 ms already spent
    assert over is not None and "about 21 ms" in over["why"] and "0.6 GiB" in over["why"]
    assert isinstance(forked.start(lambda: None, 1.0, spent_s=0.003), dict)


def test_each_fork_calibrates_the_estimate(monkeypatch):
    """The estimate starts at PAUSE_S_PER_GIB; after a fork it is the highest of the latest measured
    pauses per GiB: a slower machine than the H100's makes later searches be declined sooner."""
    monkeypatch.setattr(forked, "_measured", [])
    gib = 1 << 30
    assert forked.expected_pause_s(gib) == pytest.approx(0.03)
    forked.calibrate(0.015, gib)  # a fork of 1 GiB paused the program 15 ms
    assert forked.expected_pause_s(gib) == pytest.approx(0.015)
    assert forked.expected_pause_s(2 * gib) == pytest.approx(0.030)
    forked.calibrate(0.004, gib)  # a quicker one does not hide the slow one ...
    assert forked.expected_pause_s(gib) == pytest.approx(0.015)
    for _ in range(forked.CALIBRATION_FORKS):
        forked.calibrate(0.004, gib)
    assert forked.expected_pause_s(gib) == pytest.approx(0.004)  # ... until it is no longer recent
    forked.calibrate(0.003, 1 << 20)  # a tiny process: its fork counted per MIN_GIB, not per MiB
    assert forked.pause_s_per_gib() == pytest.approx(0.012)
    # A real fork of this process updates it from its measured pause
    monkeypatch.setattr(forked, "_measured", [])
    copy = forked.start(lambda: None, 5.0)
    assert isinstance(copy, forked.Copy), copy
    while not copy.poll():
        time.sleep(0.01)
    size = max(forked.private_bytes() / gib, forked.MIN_GIB)
    assert forked._measured == [pytest.approx(copy.pause_s / size, rel=0.2)]


def test_the_copy_starts_no_agent_and_leaves_no_trace(tmp_path):
    """In a process with the agent running, the copy runs the interpreter's after-fork hooks (the
    agent's among them) but writes nothing but what its search writes."""
    code = textwrap.dedent("""
        import os, time
        from gpumemdoctor import _agent
        from gpumemdoctor._agent.search import forked
        _agent.start()
        agent = _agent._agent
        print("buffered once,", end=" ")  # in the buffer of a piped stdout when the copy is made
        copy = forked.start(lambda: agent.shared.channel.write({"type": "note", "from": "copy"}), 5.0)
        while not copy.poll():
            time.sleep(0.01)
        print(copy.status)
    """)
    env = {**os.environ, "GPUMEMDOCTOR_RUN_DIR": str(tmp_path), "GPUMEMDOCTOR_SOCKET": "0"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "buffered once, 0"  # the copy flushed nothing of the program's
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 1, files  # one agent file: the copy made none of its own
    lines = [json.loads(x) for x in (tmp_path / files[0]).read_text().splitlines()]
    assert [x["type"] for x in lines].count("hello") == 1
    assert {"type": "note", "from": "copy"} in lines


def _roots_summary(roots) -> dict:
    return {"locals": [[label, where, k, id(v)] for label, where, k, v in roots.locals
                       if not where.startswith("_roots_both_ways()")],  # (this helper's own locals differ)
            "user_modules": sorted(roots.user_modules), "user_dicts": [n for n, _ in roots.user_dicts],
            "modules": [n for n, _ in roots.modules if not n.startswith("gpumemdoctor")],
            "closed": len(roots.closed()) - sum(n.startswith("gpumemdoctor") for n, _ in roots.modules) * 2}


def _roots_both_ways() -> tuple[dict, dict]:
    """The roots as the program's thread listed them before the fork (before issue 31), and as the
    copy lists them now from the threads captured before the fork."""
    from gpumemdoctor._agent.search.roots import Roots
    from gpumemdoctor._agent.threads import Captured

    before = _roots_summary(Roots(set()))
    threads = Captured()
    r, w = os.pipe()

    def search():
        data = memoryview(json.dumps(_roots_summary(Roots(threads.own, threads))).encode())
        while data:  # a pipe takes 64 KiB at a time, and a signal can cut a write short
            data = data[os.write(w, data):]

    copy = forked.start(search, 10.0)
    assert isinstance(copy, forked.Copy), copy
    os.close(w)  # the copy has its own: the read below ends when the copy's is closed
    chunks = []
    while chunk := os.read(r, 1 << 16):  # read as the copy writes: it must not wait on a full pipe
        chunks.append(chunk)
    os.close(r)
    while not copy.poll():
        time.sleep(0.01)
    return before, json.loads(b"".join(chunks))


def test_the_copy_lists_the_same_roots_as_the_program_did_before_the_fork():
    """Issue 31: only the threads are captured on the program's thread; the other threads' frames,
    their callers and locals, and the modules are read in the copy, where those threads are gone."""
    import threading

    ready, stop = threading.Event(), threading.Event()

    def deep(n, kept):
        level = [n]  # (a list: the collector tracks it, as the search's roots require)
        if n:
            return deep(n - 1, [kept, level])
        ready.set()
        stop.wait()

    def loader():
        batch = [b"x" * 10]  # noqa: F841 - a local the search must see
        ready2.set()
        stop.wait()

    ready2 = threading.Event()
    workers = [threading.Thread(target=deep, args=(6, ["held"]), name="worker"),
               threading.Thread(target=loader, name="loader")]
    for t in workers:
        t.start()
    ready.wait()
    ready2.wait()
    in_test = ["a local of the test's frame"]  # noqa: F841
    try:
        before, after = _roots_both_ways()
    finally:
        stop.set()
        for t in workers:
            t.join()
    assert after == before
    labels = {(label, where.split(" at ")[0], k) for label, where, k, _ in after["locals"]}
    assert ("thread 'worker': ", "deep()", "level") in labels  # a thread the copy no longer has
    assert len([x for x in after["locals"] if x[0] == "thread 'worker': " and x[2] == "level"]) == 7  # every caller
    assert ("thread 'loader': ", "loader()", "batch") in labels
    assert ("thread 'MainThread': ", "test_the_copy_lists_the_same_roots_as_the_program_did_before_the_fork()",
            "in_test") in labels
