"""The agent of one process: its parts, and what happens when.

1. Start (`begin`): a hello record; the agent waits for the program to import torch
   (startup.py) and for torch to start CUDA (`on_cuda`, from torch's lazy-init callback).
   Under `run`, `init_process_group` is wrapped to read the context before NCCL's eager set-up
   (process_groups.py).
2. CUDA starts: the devices are read, the readings' rows made, PyTorch's out-of-memory
   observer (oom.py) and the collector's callback (events.py) attached, the sampling thread
   started.
3. Sampling (sampler.py): at each optimizer step or gpumemdoctor.step() (`on_step`), or on the
   sampling thread's timer while no step comes. Each sample goes to the growth watch (growth_watch.py);
   a change in torch.distributed's process groups is written then too (process_groups.py).
4. Growth suspected: allocation stacks on (trace.py), and a holder search (search.py) due some
   steps later, made at that step boundary (`on_step`) in a copy of the process (forked.py).
   A pause in the steps that rises above all the steps reached (an evaluation): a search at its
   height, asked of the main thread (phase_watch.py), also in a copy.
   A new high of the process's memory: what it is made of (peak.py).
5. An out-of-memory error: its record; the first one is searched too (oom.py).
6. Exit (exit.py): the exit probes (blocks held for stream work told apart: streams.py), then
   the exit record.
Threads and forks: threads.py. What the parts share (the record file, torch and its devices, the
step count, the cost) is one `Shared` (shared.py); each part is handed it and, by name, the
siblings it uses: `Agent.__init__` is the whole wiring. exit.py and attach.py are the agent's own
end and its attachment: they take the agent.
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
import time

from . import startup
from ..contract import ENV_SOCKET
from .readings.events import Collections, cuda_origin
from .readings.felt import GROWTH_SEARCH, GROWTH_WATCH, HISTORY, PEAK_WATCH, PHASE_WATCH, STEP_END as AT_STEP_END
from .exit import finish
from .neutral import quiet_gc
from .readings.oom import OomObserver
from .readings import served
from .readings.process_groups import ProcessGroups, install_context_reading
from .readings.sampler import EVERY_STEP_UNTIL, Sampler, SamplingThread
from .shared import Shared
from .threads import ThreadWatch
from .readings.trace import Trace
from .growth_watch import GrowthWatch
from .peak.phase_watch import PhaseWatch
from .peak.peak import PeakWatch
from .peak.history import History
from .peak.saved_by import ForwardWatch
from .search.blocks import quiet_program_snapshots
from .readings.step_inputs import StepInputs
from .peak.replay import STEP, STEP_END
from .readings.libraries import KNOWN, LibraryWatcher, record as library_record


class Agent:
    """This process's agent: what its parts share, and the moments they act on."""

    def __init__(self, run_dir: str | None, interval_s: float):
        # What the parts share (shared.py), then each part with the siblings it uses, by name.
        self.shared = s = Shared(run_dir)
        self.server = None
        self.cuda_seen = False
        self.collections: Collections | None = None
        self.attachment = None  # attach.Attachment, where `watch --attach` brought the agent in
        self.shutdown: dict | None = None  # how the interpreter's shutdown found the threads (threads.py)
        self.process_groups = ProcessGroups(s)
        self.sampler = Sampler(s, interval_s, self.process_groups)
        self.threads = ThreadWatch(s, self.sampler)
        self.trace = Trace(s, self.sampler, run_dir)
        self.growth_watch = GrowthWatch(s, self.sampler, self.trace, self.threads)
        self.phase_watch = PhaseWatch(s, self.sampler, self.trace, self.growth_watch)
        self.peak_watch = PeakWatch(s, self.sampler, self.phase_watch, self.growth_watch)
        self.history = History(s, self.sampler, self.trace, self.peak_watch)
        self.forward_watch = ForwardWatch(s, self.history, self.sampler)  # what saved the activations
        # Two pairs that read each other: the trace's stacks set the history's ring, and the hooked
        # step (saved_by.py) holds the history's readings off while it reads the ring.
        self.trace.history = self.history
        self.history.forward_watch = self.forward_watch
        self.oom = OomObserver(s, self.peak_watch, self.growth_watch)
        self.timer = SamplingThread(s, self.sampler, self.trace, self.phase_watch, self.start_devices)
        # What runs after each sample, in order, each counted as its part of a step gap (felt.py).
        self.sampler.after = ((GROWTH_WATCH, self.growth_watch.check), (PHASE_WATCH, self.phase_watch.check),
                              (PEAK_WATCH, self.peak_watch.check), (HISTORY, self.history.check))

    # -- start-up ------------------------------------------------------------
    def begin(self, forked_from: int | None = None) -> None:
        channel = self.shared.channel
        channel.write(startup.hello(self.shared.pid, self.sampler.interval_s, forked_from))
        if forked_from is None:
            atexit.register(self.at_exit)
            # other GPU libraries: when each is imported (libraries.py)
            for name in KNOWN:
                if name in sys.modules:
                    channel.write(library_record(name))
            sys.meta_path.insert(0, LibraryWatcher(lambda name: channel.write(library_record(name))))
        torch = sys.modules.get("torch")
        if torch is not None and hasattr(torch, "cuda"):
            self.on_torch(torch)
        elif forked_from is None:
            sys.meta_path.insert(0, startup.TorchImportWatcher(self.on_torch))

    def on_torch(self, torch) -> None:
        shared = self.shared
        try:
            if shared.step_inputs is None and shared.run_dir:
                shared.step_inputs = StepInputs(torch, shared.felt)
            shared.torch = torch
            shared.channel.write({"type": "torch", "t": time.monotonic(), "version": str(torch.__version__)})
            try:
                from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
                register_optimizer_step_post_hook(self._on_optimizer_step)
                if shared.run_dir:  # known from its first step on: a reading inside that step counts its parts
                    register_optimizer_step_pre_hook(self._on_optimizer_pre_step)
            except Exception:
                pass
            try:  # the program's own snapshots, which the history recorded makes name their frames
                quiet_program_snapshots(torch)
            except Exception:
                pass
            if shared.run_dir:
                self.history.install(torch)  # backward()'s marks (history.py)
                try:  # the context read before NCCL's eager set-up (process_groups.py)
                    install_context_reading(shared, self.sampler, torch)
                except Exception:
                    pass
            if torch.cuda.is_initialized():
                self.on_cuda()
            else:
                lazy_call = getattr(torch.cuda, "_lazy_call", None)
                if lazy_call is not None:
                    lazy_call(self.on_cuda)
                else:
                    self._start_thread()  # the thread waits for CUDA itself
        except Exception:
            pass

    def on_cuda(self) -> None:
        # Runs inside torch's lazy CUDA initialisation, on the thread that started CUDA: it must
        # never raise. Everything the agent keeps for the rest of the run is set up here, on the
        # program's thread, so that the sampling thread later allocates nothing that lasts.
        try:
            if self.cuda_seen:
                return
            self.cuda_seen = True
            started = time.perf_counter()
            origin = {}
            try:
                origin = cuda_origin()
            except Exception:
                pass
            self.shared.channel.write({"type": "cuda", "t": time.monotonic(), **origin})
            self.history.start()  # the allocator's events, for the allocated peak (history.py)
            if self.trace.mode == "on":
                self.trace.start("flag")
            elif self.trace.mode == "auto" and self.shared.run_dir:
                self.trace.start("start-up")
            self.start_devices()
            self.shared.cost["init_s"] += time.perf_counter() - started
            self._start_thread()
        except Exception:
            pass

    def start_devices(self) -> None:
        """The devices read, the readings' rows made, the observers attached: at CUDA's start (or on
        the sampling thread, where CUDA started without the lazy-init callback)."""
        try:
            self.describe_devices()
            self.prepare_reading()
        except Exception:
            self.shared.devices = []
        self.attach_observers()

    def describe_devices(self) -> None:
        shared = self.shared
        shared.nvml = startup.open_nvml()
        shared.devices = startup.read_devices(shared.torch, shared.nvml)
        shared.channel.write(startup.devices_record(shared.torch, shared.devices))

    def prepare_reading(self) -> None:
        """The sampler's rows and the growth watch's series, made once, on the program's thread."""
        self.sampler.prepare()
        devices = len(self.shared.devices)
        self.growth_watch.prepare(devices)
        self.phase_watch.prepare(devices)
        self.peak_watch.prepare(devices)
        self.history.prepare(devices)

    def attach_observers(self) -> None:
        """PyTorch's out-of-memory observer and the garbage collector's callback."""
        shared = self.shared
        if not shared.run_dir:
            return
        try:
            shared.torch._C._cuda_attach_out_of_memory_observer(self.oom.observe)
        except Exception:
            pass
        if shared.devices and self.collections is None:
            collections = Collections(self.sampler.neutral, self.sampler.read_allocated, len(shared.devices),
                                      shared.channel.write_line, lambda: shared.steps, felt=shared.felt,
                                      ballast_of=[h for h in (self.sampler.neutral, self.history.bulk) if h is not None])
            for i, d in enumerate(shared.devices):
                collections.indexes[i] = d["index"]
            self.collections = collections
            collections.install()

    def _start_thread(self) -> None:
        self.timer.start()
        if self.shared.run_dir:
            self.start_server()

    def start_server(self) -> None:
        """Answer `gpumemdoctor watch` on a local socket (see agent_socket); once per process."""
        if self.server is not None or os.environ.get(ENV_SOCKET) == "0":
            return
        from gpumemdoctor.system.agent_socket import StatsServer

        server = StatsServer(lambda: served.stats(self.shared, self.sampler))
        if server.open():
            self.server = server
            threading.Thread(target=server.serve_forever, name="gpumemdoctor-socket", daemon=True).start()

    # -- steps ---------------------------------------------------------------
    def _on_optimizer_pre_step(self, optimizer, args, kwargs) -> None:
        self.history.marks.add(STEP)
        self.peak_watch.seen(optimizer)

    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        # PyTorch calls hook(optimizer, args, kwargs): a signature with *args would make a tuple.
        if self.shared.run_dir:
            self.history.marks.add(STEP_END)
        if not self.shared.explicit_steps:
            self.on_step(False)

    def on_step(self, explicit: bool) -> None:
        started = time.perf_counter()
        shared = self.shared
        apart = 0.0  # of this step end's work, what felt counted by its own part
        try:
            if explicit and not shared.explicit_steps:
                shared.explicit_steps = True
                shared.channel.write({"type": "steps", "t": time.monotonic(), "source": "explicit"})
            shared.steps += 1
            now = shared.last_step_t = time.monotonic()
            sampler = self.sampler
            # Against the last *step* sample: the timer's samples in the middle of a long step
            # must not take the place of the step boundary's.
            if shared.devices and (shared.steps <= EVERY_STEP_UNTIL
                                   or now - sampler.last_step_sample_t >= sampler.interval_s):
                sampled = time.perf_counter()
                sampler.sample("step")
                apart += time.perf_counter() - sampled  # (the sample counts its own parts in felt)
            watch = self.growth_watch
            trace = self.trace
            if shared.step_inputs is not None:
                shared.step_inputs.at_step()
            if self.forward_watch.state:
                self.forward_watch.at_step(time.perf_counter() - started)
            if watch.copies:
                with quiet_gc():
                    watch.poll_copies()
            if watch.search_at is not None and shared.steps >= watch.search_at:
                searched = time.perf_counter()
                watch.search("growth")  # here, on the program's own thread, between steps
                searched = time.perf_counter() - searched
                apart += searched
                shared.felt.add(GROWTH_SEARCH, searched)
            elif trace.stop_at is not None and (now >= trace.stop_at or shared.steps >= trace.stop_step) \
                    and watch.search_at is None:
                trace.stop(on_program_thread=True)
        except Exception:
            pass
        # The program's pause at this step's end, all of the agent's work in it together: its longest.
        ended = time.perf_counter()
        spent = ended - started
        if spent > shared.cost["step_pause_max_s"]:
            shared.cost["step_pause_max_s"] = spent
            shared.cost["step_pause_max_step"] = shared.steps
        felt = shared.felt
        felt.add(AT_STEP_END, spent - apart if spent > apart else 0.0)
        felt.step_end(ended, shared.steps)

    # -- the end of the run ----------------------------------------------------
    def at_exit(self) -> None:
        try:
            finish(self)
        except KeyboardInterrupt:
            # A second Ctrl-C while the program ends anyway: it stops the probes, and is not raised into
            # the interpreter's exit ("Exception ignored in atexit callback" over the program's output).
            pass
