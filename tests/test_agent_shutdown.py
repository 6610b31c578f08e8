"""The exit probes run at the start of the interpreter's shutdown (_agent/threads.py, issue 56): before
threading._shutdown joins an executor's idle workers (which lets go of their thread-local tensors), and
after the program's own non-daemon threads, where one is still at work. A real interpreter, with a
stand-in agent that records what it saw when its exit ran (no CUDA needed for the order of events)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent('''
    import atexit, os, sys, threading, time, types, weakref
    from concurrent.futures import ThreadPoolExecutor
    from gpumemdoctor._agent import threads

    freed = []

    class Agent:  # a stand-in: what the real agent's at_exit would measure, it prints
        shared = types.SimpleNamespace(pid=os.getpid(), devices=[0], finished=False)
        shutdown = None

        def at_exit(self):
            self.shared.finished = True
            print("probes", len(freed), self.shutdown, flush=True)

    agent = Agent()
    threads.install_shutdown_hook(lambda: agent)
    state = threading.local()

    class Scratch:
        pass

    def work():
        if not hasattr(state, "scratch"):
            state.scratch = Scratch()
            weakref.finalize(state.scratch, freed.append, 1)

    pools = {i: ThreadPoolExecutor(1, thread_name_prefix=f"request-{i}") for i in range(3)}
    for pool in pools.values():
        pool.submit(work).result()
    if sys.argv[1] == "busy":
        threading.Thread(target=time.sleep, args=(0.3,), name="still-working").start()
    atexit.register(lambda: print("atexit", len(freed), agent.shared.finished, flush=True))
''')


def run(mode: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_the_exit_probes_come_before_the_shutdown_joins_the_executors_workers():
    probes, after = run("idle")
    # Before: all three thread-local objects still alive, three idle workers to be joined.
    assert probes.startswith("probes 0 ") and "'before_shutdown': True" in probes and "'threads_joined': 3" in probes
    assert after == "atexit 3 True"  # the shutdown's joins freed them, after the probes


def test_a_thread_still_at_work_leaves_the_probes_to_the_atexit_hook():
    (after,) = run("busy")
    assert after == "atexit 3 False"  # the stand-in's at_exit was not called at the shutdown's start


def test_a_thread_local_tensor_is_named_through_the_thread_local():
    """A worker's attribute of a threading.local is reached by gc through the local's dict of each
    thread's own dict; the path names the local, then the attribute (leak_thread_local_executors)."""
    import gc
    import threading

    from gpumemdoctor._agent.search.edges import labels

    class Scratch:
        pass

    state = threading.local()
    ready, done = threading.Event(), threading.Event()
    kept = []

    def work():
        state.scratch = Scratch()
        kept.append(state.scratch)
        ready.set()
        done.wait(5)

    worker = threading.Thread(target=work)
    worker.start()
    ready.wait(5)
    try:
        scratch = kept.pop()
        chain = [state]
        while chain[-1] is not scratch:  # down gc's referents to the worker's scratch
            nxt = next(r for r in gc.get_referents(chain[-1])
                       if r is scratch or (type(r) is dict and (scratch in r.values() or
                                                               any(type(v) is dict and scratch in v.values()
                                                                   for v in r.values()))))
            chain.append(nxt)
        assert "".join(labels(chain, ["worker_state"])) == "worker_state (a thread's own)['scratch']"
    finally:
        done.set()
        worker.join()
