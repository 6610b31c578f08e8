"""The agent brought into a program that is already running (`gpumemdoctor watch --pid N --attach`),
and taken out again, leaving the program as it was.

`arrive` is what the watch's payload calls, on the program's main thread between two bytecodes,
holding the GIL (system/inject.py gets it there). It checks that the process can take an agent
(torch imported, no agent in it yet), starts the same `core.Agent` that `gpumemdoctor run`'s
bootstrap starts, pointed at the watch's run folder, and writes the outcome to STATUS_FILE there.
What the agent's start changes in the program is noted as it is changed (`Ledger`): the functions it
wraps (os._exit, threading's start-up, backward(), init_process_group). A thread of the attachment's
own (`gpumemdoctor-attach`) then waits for the watch to ask it to leave (STOP_FILE), for the watch
to end (its process gone, or the run folder), or for the program to end (its exit probes run then,
as under `run`, and write the agent's last record).

Leaving (`Attachment.leave`), in order:
1. a last sample, then the agent's sampling thread stopped;
2. on the main thread, between two bytecodes (Py_AddPendingCall, as main_thread.py asks; from the
   attachment's thread where the main thread runs no Python for MAIN_WAIT_S): a holder search in a
   copy of the process where growth was suspected and none was made (the pause limit as during the
   run), then PyTorch's memory history off (`_record_memory_history(enabled=None)`), the module hooks
   of a step being recorded removed, and the rest put back where it is still the agent's: the ledger's
   functions, the garbage collector's callback, the import watcher, the exit hook, PyTorch's optimizer
   hooks and lazy-init call; PyTorch's out-of-memory observer cannot be removed, and is left doing
   nothing;
3. on the attachment's thread: the copies waited for, the exit record (no exit probes: gc.collect(),
   synchronize and empty_cache would change the running program), the socket and the record file
   closed, and DETACHED_FILE says what was put back and what could not be.
The at-fork hook cannot be unregistered: it stays (once per interpreter), and does nothing without
an agent. The agent's objects are let go once the pending calls queued before the leave have run (a
last pending call of this module's own, `_drain`). A child forked while the agent is in gets no
agent and none of its hooks (`leave_in_child`).
"""
from __future__ import annotations

import atexit
import gc
import json
import os
import sys
import threading
import time

from . import main_thread
from .search import forked
from ..contract import INTERVAL_DEFAULT_S

PROTOCOL = 1  # what the watch and the payload agree on: the files and arrive()'s arguments
STATUS_FILE = "attach.json"
STOP_FILE = "stop"
DETACHED_FILE = "detached.json"
POLL_S = 0.1  # how often the attachment's thread looks for the stop file and the watch
MAIN_WAIT_S = 3.0  # the longest the leave waits for the main thread to run Python
FINAL_SAMPLE_S = 0.5
_MISSING = object()
# What the agent's start may wrap: (module, attribute path). Put back at the leave where unchanged since.
WRAPPED = (("os", "_exit"), ("threading", "Thread._bootstrap_inner"), ("torch.autograd", "backward"),
           ("torch.distributed.distributed_c10d", "init_process_group"), ("torch.distributed", "init_process_group"),
           ("torch._C", "_cuda_memorySnapshot"))

_retired: list = []  # attachments that left, kept until the pending calls queued before their leave ran
_drain = (None, None)  # the leave's last pending call (callback, Py_AddPendingCall): made once, kept


def arrive(run_dir: str, watcher_pid: int, interval_s: float = INTERVAL_DEFAULT_S,
           max_pause_s: float | None = None) -> None:
    """The payload's call, on the program's main thread. Never raises; the outcome goes to STATUS_FILE."""
    try:
        status = _arrive(run_dir, watcher_pid, interval_s, max_pause_s)
    except BaseException as exc:  # noqa: BLE001 - never into the program
        status = {"ok": False, "error": "internal", "message": f"{type(exc).__name__}: {exc}"[:500]}
    write_file(run_dir, STATUS_FILE, {"protocol": PROTOCOL, "pid": os.getpid(), "python": sys.version.split()[0],
                                      "executable": sys.executable, **status})


def write_file(run_dir: str, name: str, document: dict) -> None:
    """One JSON file in the watch's run folder, 0600, whole or not at all (written aside, then renamed)."""
    try:
        path = os.path.join(run_dir, name)
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(document, f)
        os.replace(tmp, path)
    except Exception:
        pass  # the watch then says that the agent did not answer


def _arrive(run_dir: str, watcher_pid: int, interval_s: float, max_pause_s: float | None) -> dict:
    from .. import __version__
    from .. import _agent as package

    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "cuda"):
        return {"ok": False, "error": "no-torch", "version": __version__}
    present = package._current()
    if present is not None and present.shared.pid == os.getpid():
        by = ("watch --attach" if present.attachment is not None
              else "gpumemdoctor run" if present.shared.run_dir else "gpumemdoctor.enable()")
        return {"ok": False, "error": "agent-present", "by": by, "version": __version__}
    started = time.perf_counter()
    attachment = Attachment(run_dir, watcher_pid, interval_s, max_pause_s)
    attachment.start(torch)
    agent = attachment.agent
    return {"ok": True, "version": __version__, "torch": str(getattr(torch, "__version__", "")),
            "cuda": bool(torch.cuda.is_initialized()), "devices": len(agent.shared.devices),
            "trace": agent.trace.on, "history": agent.history.on, "t": time.monotonic(),
            "start_s": round(time.perf_counter() - started, 6)}


def _resolve(module: str, path: str):
    """(owner, attribute name) of a WRAPPED entry, or None where its module is not imported."""
    owner = sys.modules.get(module)
    parts = path.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part, None)
    return (owner, parts[-1]) if owner is not None else None


class Ledger:
    """What the agent's start wrapped in the program: each function as it was, and the agent's."""

    def __init__(self):
        self.before = {}
        for module, path in WRAPPED:
            where = _resolve(module, path)
            self.before[(module, path)] = getattr(*where, _MISSING) if where else _MISSING
        self.changed: list = []  # (module, path, before, the agent's)

    def after(self) -> None:
        for (module, path), before in self.before.items():
            where = _resolve(module, path)
            now = getattr(*where, _MISSING) if where else _MISSING
            if now is not before and now is not _MISSING and before is not _MISSING:
                self.changed.append((module, path, before, now))

    def put_back(self, restored: list, left: list) -> None:
        for module, path, before, ours in self.changed:
            where = _resolve(module, path)
            name = f"{module}.{path}"
            if where is not None and getattr(*where, None) is ours:
                setattr(*where, before)
                restored.append(name)
            else:  # the program wrapped it again since: the agent's wrapper stays, and does nothing now
                left.append(f"{name} (wrapped again by the program since: the agent's wrapper stays inside, inert)")


class Attachment:
    """One attach of the agent to this process, until it leaves."""

    def __init__(self, run_dir: str, watcher_pid: int, interval_s: float, max_pause_s: float | None):
        self.run_dir = run_dir
        self.watcher_pid = watcher_pid
        self.interval_s = interval_s
        self.max_pause_s = max_pause_s
        self.saved_max_pause_s = forked.MAX_PAUSE_S
        self.agent = None
        self.ledger = Ledger()
        self.thread: threading.Thread | None = None
        self.main_done = threading.Event()
        self.main_lock = threading.Lock()
        self.main_asked = False
        self.left_main = False
        self.restored: list = []
        self.left: list = []
        self.notes: list = []
        self.main_where = None
        self.main_pause_s = None
        self.searched = False
        self.callback = self.add_pending = None

    def start(self, torch) -> None:
        """On the main thread: the agent, as the bootstrap starts it, and the attachment's thread."""
        global _drain
        from .core import Agent
        from .. import _agent as package

        self.callback, self.add_pending = main_thread.pending_call(self._on_main_thread)
        if _drain[0] is None:
            _drain = main_thread.pending_call(_drain_one)
        agent = Agent(self.run_dir, self.interval_s)
        agent.attachment = self
        self.agent = agent
        if self.max_pause_s is not None:
            forked.MAX_PAUSE_S = self.max_pause_s
        try:
            package._begin(agent)  # the fork and thread hooks, os._exit, then agent.begin()
            package._agent = agent
            if agent.trace.on and agent.trace.window == "start-up":
                # A running program is past its start-up: its stacks come with growth (trace.py), and
                # the window's end is not a pause in its steps. The events go on (history.py).
                agent.trace.stop(on_program_thread=True)
        finally:
            self.ledger.after()
        self.thread = threading.Thread(target=self._wait, name="gpumemdoctor-attach", daemon=True)
        self.thread.start()

    # -- waiting ---------------------------------------------------------------------------
    def _wait(self) -> None:
        """The attachment's thread: until the watch asks, or is gone; then the leave. Looks with
        os.access and os.kill, which make no object the collector counts."""
        stop = os.path.join(self.run_dir, STOP_FILE)
        agent = self.agent
        why = None
        try:
            while why is None:
                time.sleep(POLL_S)
                if agent.shared.finished:
                    return  # the program is ending: its exit probes wrote the agent's last record
                if os.access(stop, os.F_OK):
                    why = "asked"
                elif not os.access(self.run_dir, os.F_OK):
                    why = "the watch's run folder is gone"
                else:
                    try:
                        os.kill(self.watcher_pid, 0)
                    except ProcessLookupError:
                        why = "the watch ended"
                    except OSError:
                        pass
            self.leave(why)
        except Exception as exc:  # noqa: BLE001
            self.notes.append(f"the leave failed: {type(exc).__name__}: {exc}"[:300])

    # -- leaving ---------------------------------------------------------------------------
    def leave(self, why: str) -> None:
        """Take the agent out (see the module's docstring), from the attachment's thread."""
        agent = self.agent
        started = time.monotonic()
        sampler = agent.sampler
        if agent.shared.devices and sampler.neutral is not None:
            end = time.monotonic() + FINAL_SAMPLE_S
            while not sampler.sample("time") and time.monotonic() < end:
                time.sleep(0.005)
        agent.timer.stop()
        deadline = time.monotonic() + MAIN_WAIT_S
        while not self.main_done.wait(0.02):
            if agent.shared.finished and not self.left_main:
                return  # the program ended meanwhile: its exit probes ran
            if time.monotonic() > deadline:
                self._leave_main(f"the attachment's own thread (the main thread ran no Python for "
                                 f"{MAIN_WAIT_S:g} s)", search=False)
                break
            if not self.main_asked:
                self.main_asked = True
                if not main_thread.ask(self.add_pending, self.callback):
                    self.main_asked = False
        agent.growth_watch.wait_for_copies()
        self._close(why, started)

    def _on_main_thread(self, _) -> int:
        """Runs on the program's main thread between two bytecodes. Never raises."""
        try:
            self.main_asked = False
            if not self.main_done.is_set() and not main_thread.interrupted(sys._getframe(1)):
                self._leave_main("the main thread")
        except BaseException:  # noqa: BLE001
            pass
        return 0

    def _leave_main(self, where: str, search: bool = True) -> None:
        with self.main_lock:
            if self.left_main:
                return
            self.left_main = True
            started = time.perf_counter()
            try:
                self.main_where = where
                agent = self.agent
                if search:
                    self._search()
                else:
                    self.notes.append("no holder search at the leave: the main thread ran no Python")
                agent.shared.finished = True  # the agent's callbacks and observers do nothing from here on
                self._put_back()
            finally:
                self.main_pause_s = round(time.perf_counter() - started, 6)
                self.main_done.set()

    def _search(self) -> None:
        """Growth suspected and no search made for it: one now, in a copy of the process, over what
        is alive (new since the baseline, or all of it where growth was seen over time)."""
        agent = self.agent
        watch = agent.growth_watch
        if not watch.suspected or agent.shared.torch is None or not agent.shared.devices:
            return
        if watch.suspected_by == "step" and watch.search_at is None:
            return  # made during the attach
        if watch.baseline is None:
            watch.baseline = {"blocks": {}, "storages": set()}
        self.searched = True
        watch.search("growth")

    def _put_back(self) -> None:
        agent = self.agent
        torch = agent.shared.torch
        restored, left = self.restored, self.left
        if agent.history.on or agent.trace.on:
            from .readings.events import import_in_progress

            if self.main_where != "the main thread" and import_in_progress():
                left.append("PyTorch's memory history (an import was under way on another thread: "
                            "torch.cuda.memory._record_memory_history(enabled=None) turns it off)")
            else:
                try:
                    torch.cuda.memory._record_memory_history(enabled=None)
                    agent.history.on = agent.trace.on = False
                    restored.append("PyTorch's memory history (off)")
                except Exception as exc:
                    left.append(f"PyTorch's memory history ({type(exc).__name__}: {exc})"[:300])
        watch = agent.forward_watch
        if any(handle is not None for handle in watch.handles):
            watch._remove()
            restored.append("PyTorch's global module hooks of the step being recorded")
        self.ledger.put_back(restored, left)
        _remove_hooks(agent, torch, restored)
        oom = agent.oom
        oom.records = 1 << 30  # PyTorch keeps its observer: it returns at once now, and holds no agent
        oom.shared = oom.peak_watch = oom.growth_watch = None
        if agent.cuda_seen and agent.shared.devices:
            left.append("PyTorch's out-of-memory observer (it cannot be removed: it does nothing now)")
        from .. import _agent as package

        if package._agent is agent:
            package._agent = None
        forked.MAX_PAUSE_S = self.saved_max_pause_s

    def _close(self, why: str, started: float) -> None:
        from .exit import collector_state, exit_record

        agent = self.agent
        channel = agent.shared.channel
        channel.write(exit_record(agent, None, None, collector_state(agent.sampler, agent.history), {}))
        if agent.server is not None:
            agent.server.close()
            self.restored.append("the agent's socket")
        if channel.fd is not None:
            try:
                os.close(channel.fd)
            except OSError:
                pass
            channel.fd, channel.dead = None, True
        agent.sampler.neutral = None  # a thread started meanwhile reads nothing at its end
        write_file(self.run_dir, DETACHED_FILE, {
            "pid": os.getpid(), "why": why, "where": self.main_where, "main_pause_s": self.main_pause_s,
            "searched": self.searched, "restored": self.restored, "left": self.left, "notes": self.notes,
            "threads": sorted(t.name for t in threading.enumerate()
                              if t.name.startswith("gpumemdoctor-") and t is not threading.current_thread()),
            "seconds": round(time.monotonic() - started, 3), "t": time.monotonic()})
        _retired.append(self)
        if not main_thread.ask(_drain[1], _drain[0]):
            pass  # the queue is full: the attachment stays referenced, harmless

    def leave_in_child(self) -> None:
        """In a child the program forked while the agent was in: no agent there, none of its hooks
        (its memory history is the parent's CUDA state, unusable in the child: left alone)."""
        from .threads import leave_parent

        agent = self.agent
        try:
            leave_parent(agent)
            agent.shared.channel.fd, agent.shared.channel.dead = None, True
            agent.shared.finished = True
            self.ledger.put_back([], [])
            _remove_hooks(agent, agent.shared.torch, [])
            agent.oom.records = 1 << 30
        except Exception:
            pass


def _remove_hooks(agent, torch, restored: list) -> None:
    """The agent's callbacks in the program's and PyTorch's tables, found by identity, removed."""
    inputs = agent.shared.step_inputs
    if inputs is not None:
        if inputs.handle is not None:
            restored.append("PyTorch's global module hook that reads a step's inputs")
        inputs.remove()
    collections = agent.collections
    if collections is not None and collections.callback in gc.callbacks:
        gc.callbacks.remove(collections.callback)
        restored.append("the garbage collector's callback")
    from .readings.libraries import LibraryWatcher
    from .startup import TorchImportWatcher

    ours = [f for f in sys.meta_path if isinstance(f, (LibraryWatcher, TorchImportWatcher))]
    for finder in ours:
        sys.meta_path.remove(finder)
    if ours:
        restored.append("the import watcher")
    atexit.unregister(agent.at_exit)
    restored.append("the exit hook")
    optimizer = sys.modules.get("torch.optim.optimizer")
    removed = 0
    for table in ("_global_optimizer_pre_hooks", "_global_optimizer_post_hooks"):
        hooks = getattr(optimizer, table, None)
        if hooks is None:
            continue
        for key, hook in list(hooks.items()):
            if hook == agent._on_optimizer_step or hook == agent._on_optimizer_pre_step:
                del hooks[key]
                removed += 1
    if removed:
        restored.append("PyTorch's optimizer step hooks")
    cuda = getattr(torch, "cuda", None)
    queued = getattr(cuda, "_queued_calls", None)
    if isinstance(queued, list):
        mine = [entry for entry in queued if entry and entry[0] == agent.on_cuda]
        for entry in mine:
            queued.remove(entry)
        if mine:
            restored.append("PyTorch's lazy-init call")
    agent.cuda_seen = True  # a lazy-init call of the agent's left anywhere does nothing


def _drain_one(_) -> int:
    """The last pending call of a leave: the calls queued before it have run, so the attachment that
    left first (and its agent, whose pending-call callbacks they were) can be let go."""
    try:
        if _retired:
            del _retired[0]
    except Exception:  # noqa: BLE001
        pass
    return 0
