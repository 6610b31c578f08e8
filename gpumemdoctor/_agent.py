"""The agent that runs inside the measured program and reads PyTorch's allocator.

It starts from the bootstrap sitecustomize when GPUMEMDOCTOR_RUN_DIR is set, and
does nothing else until the program imports torch and torch initialises CUDA.
It then samples allocator statistics at cheap moments (an optimizer step, a
call to `gpumemdoctor.step()`, or a quiet timer thread when neither happens),
and runs the end-of-run probes (gc, stream reclamation, empty_cache) from an
exit hook. Records go, one JSON line each, to a file of its own process in the
run folder: a plain write that cannot block on a reader and that survives the
supervisor dying. Every entry point is guarded: a failure disables the agent,
never the program.
"""
from __future__ import annotations

import atexit
import gc
import json
import os
import sys
import threading
import time

from gpumemdoctor import _events

ENV_RUN_DIR = "GPUMEMDOCTOR_RUN_DIR"
ENV_INTERVAL = "GPUMEMDOCTOR_INTERVAL_S"
ENV_SOCKET = "GPUMEMDOCTOR_SOCKET"  # "0": no local socket for `gpumemdoctor watch`
ENV_TRACE = "GPUMEMDOCTOR_TRACE"  # allocation stacks: "auto" (when growth is seen), "on", "off";
# holders are looked for in every mode once growth is seen
ENV_SNAPSHOT = "GPUMEMDOCTOR_SNAPSHOT"  # "1": write the allocator snapshot to the run folder at exit
TRACE_MODES = ("auto", "on", "off")
TRACE_MAX_ENTRIES = 100_000  # of PyTorch's allocation history (a ring: old entries drop off)
# --trace auto records stacks for this long once growth is seen, then stops: the leak's line is
# known by then (its blocks keep their stacks), and a day-long run neither pays the history's
# cost on every allocation nor builds a snapshot of every leaked block at exit.
TRACE_WINDOW_S = 60.0
# Growth is suspected, online, when the floor of allocated memory has risen by this much
# at two checks in a row (every CHECK_EVERY samples): then the allocation stacks are
# recorded (--trace auto) and, a little later, the holders are looked for.
SUSPECT_MIN_BYTES = 4 << 20
CHECK_EVERY = 8
MAX_FLOOR_POINTS = 512  # then every other point is dropped: a check stays about 0.1 ms, on the step path
INVESTIGATE_AFTER_STEPS = 16
INVESTIGATE_AFTER_S = 3.0
WARMUP_STEPS = 10  # --trace on: what is alive after these many steps is not new
# How long one holder search may take. "live" is the exit search of a run in which no growth
# was seen (and no --trace on): the walk ends early only when every block has a holder, and
# PyTorch's own buffers (cuBLAS workspaces) never have one, so it usually runs to its budget
# or to the end of the heap (76k objects, 0.3-0.4 s, in the scenarios on an H200).
BUDGET_S = {"growth": 2.0, "exit": 5.0, "live": 1.0, "oom": 3.0}
MAX_OBJECTS = {"growth": 2_000_000, "exit": 5_000_000, "live": 1_000_000, "oom": 3_000_000}
MAX_OOM_RECORDS = 20  # out-of-memory errors recorded per process; the first is searched for holders
# A run in which no growth was seen is searched at exit when its live tensors reach this: the
# answer to "why does nvidia-smi still show the memory I freed?".
LIVE_SEARCH_MIN_BYTES = 64 << 20
MAX_THREAD_RECORDS = 1000
DEFAULT_INTERVAL_S = 0.02
MAX_INTERVAL_S = 5.0
SAMPLES_PER_DOUBLING = 1000  # long runs sample more slowly so a recording stays small
FIRST_ALLOCATION_WAIT_S = 10.0
NAP_S = 0.05  # the sampling thread's longest sleep: how soon it sees the program ending
STARVED_S = 0.25  # a time sample put off this long (no room below the collector's threshold) is taken anyway
EVERY_STEP_UNTIL = 100  # the first steps are all sampled (about 50 us each): short runs need them
COST_WINDOW_S = 60.0  # the samples' cost is also kept for the first and the last such window

# Who a process is in a distributed job, from its launcher's variables: one family per process, the
# first whose rank (or local rank) is set, since a launcher runs inside another (torchrun under srun,
# mpirun in a Slurm allocation) and the innermost one's variables are the process's own.
# (field, variable) per family; the node's rank and the run's id come from any family.
DIST_FAMILIES = (
    ("torch", (("rank", "RANK"), ("local_rank", "LOCAL_RANK"), ("world_size", "WORLD_SIZE"),
               ("local_world_size", "LOCAL_WORLD_SIZE"))),
    ("openmpi", (("rank", "OMPI_COMM_WORLD_RANK"), ("local_rank", "OMPI_COMM_WORLD_LOCAL_RANK"),
                 ("world_size", "OMPI_COMM_WORLD_SIZE"), ("local_world_size", "OMPI_COMM_WORLD_LOCAL_SIZE"))),
    ("slurm", (("rank", "SLURM_PROCID"), ("local_rank", "SLURM_LOCALID"), ("world_size", "SLURM_NTASKS"),
               ("local_world_size", "SLURM_NTASKS_PER_NODE"))),
)
DIST_NODE = ("GROUP_RANK", "SLURM_NODEID")
DIST_RUN_ID = ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID")

_agent: _Agent | None = None


def start() -> None:
    """Start the agent in this process if the environment asks for it; twice is harmless."""
    global _agent
    if _agent is not None and _agent.pid == os.getpid():
        return
    run_dir = os.environ.get(ENV_RUN_DIR)
    if not run_dir:
        return
    try:
        agent = _Agent(run_dir, _interval_from_env())
        agent.begin()
        _agent = agent
    except Exception:
        _agent = None


def enable() -> None:
    """Start the agent and its local socket in this process (see gpumemdoctor.enable)."""
    global _agent
    try:
        if _agent is None or _agent.pid != os.getpid():
            agent = _Agent(os.environ.get(ENV_RUN_DIR), _interval_from_env())
            agent.begin()
            _agent = agent
        _agent.start_server()
    except Exception:
        pass


def step() -> None:
    """Mark the end of one step of the program's loop (see gpumemdoctor.step)."""
    agent = _agent
    if agent is not None:
        agent.on_step(explicit=True)


def _interval_from_env() -> float:
    try:
        value = float(os.environ.get(ENV_INTERVAL, DEFAULT_INTERVAL_S))
        return value if 0.001 <= value <= 60 else DEFAULT_INTERVAL_S
    except ValueError:
        return DEFAULT_INTERVAL_S


def dist_from_env(env) -> dict | None:
    """The process's rank, local rank, world size, local world size, node rank and run id from the
    launcher's variables (None for each one not set or not a whole number); None when no rank
    variable is set at all. Read once, for the hello line."""
    for source, fields in DIST_FAMILIES:
        if env.get(fields[0][1]) is None and env.get(fields[1][1]) is None:
            continue
        dist = {name: _whole(env.get(variable)) for name, variable in fields}
        dist["node_rank"] = next((_whole(env[v]) for v in DIST_NODE if env.get(v) is not None), None)
        dist["run_id"] = next((str(env[v]) for v in DIST_RUN_ID if env.get(v)), None)
        dist["source"] = source
        return dist
    return None


def _whole(text) -> int | None:
    """A whole number of 0 or more written plainly ("3", not "+3", " 3" or "3.0"), else None."""
    return int(text) if isinstance(text, str) and text.isascii() and text.isdigit() else None


def _dist() -> dict | None:
    try:
        return dist_from_env(os.environ)
    except Exception:
        return None


def _after_fork_in_child() -> None:
    global _agent
    parent = _agent
    _agent = None
    if parent is None:
        return
    try:
        if parent.fd is not None:
            os.close(parent.fd)
        if parent.server is not None:
            parent.server.forget()  # the socket is the parent's: the child neither serves nor removes it
    except Exception:
        pass
    try:
        # CUDA cannot be used in a forked child; the child records that it exists.
        child = _Agent(parent.run_dir, parent.interval_s)
        child.begin(forked_from=parent.pid)
        _agent = child
    except Exception:
        _agent = None


class _TorchImportWatcher:
    """A meta-path finder that lets the agent know when `torch` has been imported."""

    def __init__(self, on_import):
        self._on_import = on_import

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _NotifyingLoader(spec.loader, self._on_import)
                return spec
        return None


class _NotifyingLoader:
    def __init__(self, loader, on_import):
        self._loader = loader
        self._on_import = on_import

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        # Put the real loader back before torch's own code can look at it.
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        self._on_import(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _Agent:
    def __init__(self, run_dir: str | None, interval_s: float):
        self.pid = os.getpid()
        self.run_dir = run_dir
        self.interval_s = interval_s
        self.fd = None  # without a run folder (gpumemdoctor.enable() alone) nothing is recorded
        if run_dir:
            path = os.path.join(run_dir, f"agent-{self.pid}.jsonl")
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
            self.fd = os.open(path, flags, 0o600)
        self.dead = False
        self.server = None
        self.context: dict[int, int] = {}  # torch index -> smallest NVML - reserved after an allocation
        self.torch = None
        self.devices: list[dict] = []  # torch index, uuid, nvml device (or None)
        self.nvml = None
        self.steps = 0
        self.explicit_steps = False
        self.samples = 0
        self.last_sample_t = 0.0
        self.last_step_t = 0.0
        self.last_step_sample_t = 0.0
        self.sample_lock = threading.Lock()
        self.stopping = False  # the sampling thread sleeps in short naps and looks at this
        self.neutral: _events.Neutral | None = None  # made at CUDA's start, on the program's thread
        self.stats_fn = None  # torch index -> PyTorch's nested allocator stats
        self.rows: list[list] = []  # one reading per device, filled in place (see _read_rows)
        self.live: list[bool] = []  # which rows the last reading filled
        self.nvml_readers: list = []  # nvml.ProcessMemory per device, or None
        self.floor_xs: dict = {}  # by -> per device slot, the online floor check's series
        self.floor_ys: dict = {}
        self.floor_growth = None
        self.thread: threading.Thread | None = None
        self.cuda_seen = False
        self.finished = False
        mode = os.environ.get(ENV_TRACE, "auto" if run_dir else "off")
        self.trace_mode = mode if mode in TRACE_MODES else "auto"
        self.trace_on = False
        self.trace_was_on = False  # stacks were recorded for a while (--trace auto stops after a window)
        self.trace_stop_at: float | None = None  # monotonic time: --trace auto's window ends
        self.kind = None  # _inspect.TensorKind, made when first needed
        self.baseline: dict | None = None
        self.first_alloc_t: float | None = None
        self.positive_checks = 0
        self.suspected = False
        self.investigate_at: tuple | None = None  # (step, monotonic time)
        self.thread_entries: dict = {}  # (file, function) -> names of the threads that ran it
        self.thread_records = 0
        self.collections: _events.Collections | None = None
        self.oom_records = 0
        self.samples_skipped = 0  # time samples put off because the collector was near its threshold
        self.cost = {"init_s": 0.0, "sample_s": 0.0}
        # The sampling cost early and late in a long run: samples and seconds of the current
        # COST_WINDOW_S, of the first one completed and of the last. Plain ints and floats, so
        # that counting allocates nothing the garbage collector tracks.
        self.window_start = 0.0
        self.window_samples = self.first_samples = self.last_samples = 0
        self.window_s = self.first_s = self.last_s = 0.0

    # -- the channel ---------------------------------------------------------
    def write(self, record: dict) -> None:
        if self.dead or self.fd is None:
            return
        try:
            os.write(self.fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())
        except Exception:
            self.dead = True  # disk full, folder gone: stop recording, keep the program

    def write_line(self, text: str) -> None:
        """One record already written as JSON text: what the sampling path uses, since
        json.dumps and a record's dict would come from the program's free lists."""
        if self.dead or self.fd is None:
            return
        try:
            os.write(self.fd, f"{text}\n".encode())
        except Exception:
            self.dead = True

    # -- start-up ------------------------------------------------------------
    def begin(self, forked_from: int | None = None) -> None:
        self.write({"type": "hello", "pid": self.pid, "ppid": os.getppid(), "t": time.monotonic(),
                    "wall": time.time(), "argv": list(getattr(sys, "argv", [])),
                    "python": sys.version.split()[0], "executable": sys.executable,
                    "forked_from": forked_from, "interval_s": self.interval_s, "dist": _dist()})
        if forked_from is None:
            atexit.register(self.at_exit)
            if hasattr(os, "register_at_fork"):
                os.register_at_fork(after_in_child=_after_fork_in_child)
            _install_thread_hook()
        torch = sys.modules.get("torch")
        if torch is not None and hasattr(torch, "cuda"):
            self.on_torch(torch)
        elif forked_from is None:
            sys.meta_path.insert(0, _TorchImportWatcher(self.on_torch))

    def on_torch(self, torch) -> None:
        try:
            self.torch = torch
            self.write({"type": "torch", "t": time.monotonic(), "version": str(torch.__version__)})
            try:
                from torch.optim.optimizer import register_optimizer_step_post_hook
                register_optimizer_step_post_hook(self._on_optimizer_step)
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
                origin = _events.cuda_origin()
            except Exception:
                pass
            self.write({"type": "cuda", "t": time.monotonic(), **origin})
            if self.trace_mode == "on":
                self._start_trace("flag")
            try:
                self._describe_devices()
                self._prepare_reading()
            except Exception:
                self.devices = []
            self._watch_events()
            self.cost["init_s"] += time.perf_counter() - started
            self._start_thread()
        except Exception:
            pass

    def _watch_events(self) -> None:
        """PyTorch's out-of-memory observer and the garbage collector's callbacks."""
        if not self.run_dir:
            return
        torch = self.torch
        try:
            torch._C._cuda_attach_out_of_memory_observer(self._on_oom)
        except Exception:
            pass
        if self.devices and self.collections is None:
            collections = _events.Collections(self.neutral, self._read_allocated, len(self.devices),
                                              self.write_line, lambda: self.steps)
            for i, d in enumerate(self.devices):
                collections.indexes[i] = d["index"]
            self.collections = collections
            collections.install()

    def _prepare_reading(self) -> None:
        """What every later reading fills in place, made once here on the program's thread:
        the sampling path then makes no container the program's collector would see."""
        torch = self.torch
        self.stats_fn = getattr(getattr(torch, "_C", None), "_cuda_memoryStats", None) \
            or torch.cuda.memory_stats_as_nested_dict
        self.rows = [[d["index"], None, None, None, None, None, None, None] for d in self.devices]
        self.live = [False] * len(self.devices)
        self.nvml_readers = []
        for d in self.devices:
            reader = None
            if self.nvml is not None and d["nvml_device"] is not None:
                try:
                    reader = self.nvml.ProcessMemory(d["nvml_device"], self.pid)
                    if reader.used() is None:
                        reader = None
                except Exception:
                    reader = None
            self.nvml_readers.append(reader)
        for by in ("step", "time"):
            self.floor_xs[by] = [[] for _ in self.devices]
            self.floor_ys[by] = [[] for _ in self.devices]
        from gpumemdoctor.growth import floor_growth

        self.floor_growth = floor_growth
        self.neutral = _events.Neutral()

    def _read_allocated(self, out: list) -> None:
        """out[i] = allocated bytes of device slot i (through Neutral: makes only PyTorch's dicts)."""
        stats_fn = self.stats_fn
        devices = self.devices
        for i in range(len(devices)):
            try:
                out[i] = stats_fn(devices[i]["index"])["allocated_bytes"]["all"]["current"]
            except Exception:
                out[i] = 0

    def _on_oom(self, device, request, limit, device_free) -> None:
        """PyTorch's allocator could not serve a request: the figures and who held the memory,
        now, on the allocating thread, before the stack unwinds."""
        try:
            if self.oom_records >= MAX_OOM_RECORDS or self.finished:
                return
            self.oom_records += 1
            with _events.quiet_gc():
                processes = []
                d = next((d for d in self.devices if d["index"] == device), None)
                if self.nvml is not None and d is not None and d["nvml_device"] is not None:
                    try:
                        processes = self.nvml.processes(d["nvml_device"])
                    except Exception:
                        processes = []
                record = _events.out_of_memory(self.torch, device, request, limit, device_free, processes)
                record["step"] = self.steps
                self.write(record)
                if self.oom_records == 1:
                    self._investigate("oom")
        except Exception:
            pass

    def _start_thread(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="gpumemdoctor-agent", daemon=True)
            self.thread.start()
        if self.run_dir:
            self.start_server()

    def start_server(self) -> None:
        """Answer `gpumemdoctor watch` on a local socket (see agent_socket); once per process."""
        if self.server is not None or os.environ.get(ENV_SOCKET) == "0":
            return
        from gpumemdoctor.agent_socket import StatsServer

        server = StatsServer(self.stats)
        if server.open():
            self.server = server
            threading.Thread(target=server.serve_forever, name="gpumemdoctor-socket", daemon=True).start()

    def stats(self) -> dict:
        """What the socket answers: the latest figures, read now."""
        from gpumemdoctor.agent_socket import STATS_SCHEMA

        torch = self.torch
        rows = []
        if torch is not None and self.devices and torch.cuda.is_initialized():
            for row in self._read_devices():
                d = next((d for d in self.devices if d["index"] == row[0]), None)
                nvml_device = d["nvml_device"] if d else None
                rows.append({"torch_index": row[0], "nvml_index": nvml_device.index if nvml_device else None,
                             "allocated_bytes": row[1], "active_bytes": row[2], "reserved_bytes": row[3],
                             "nvml_bytes": row[5], "context_bytes": self.context.get(row[0])})
        return {"schema": STATS_SCHEMA, "pid": self.pid, "steps": self.steps,
                "torch_version": str(torch.__version__) if torch is not None else None,
                "cuda": bool(torch is not None and torch.cuda.is_initialized()), "devices": rows}

    # -- sampling ------------------------------------------------------------
    def _run(self) -> None:
        try:
            torch = self.torch
            while not torch.cuda.is_initialized():
                if self._nap(self.interval_s):
                    return
            if not self.devices:  # CUDA started without the lazy-init callback
                self._describe_devices()
                self._prepare_reading()
                self._watch_events()
            self._wait_for_first_allocation()
            while not self._nap(self.interval_s):
                now = time.monotonic()
                # While the program marks steps, samples are taken at step boundaries instead.
                if now - self.last_sample_t >= self.interval_s and now - self.last_step_t >= self.interval_s:
                    self.sample("time")
                if (self.trace_stop_at is not None and now >= self.trace_stop_at and not self.steps
                        and not _events.import_in_progress()):
                    self._stop_trace()  # growth seen over time: the stacks are turned off from here too

        except Exception:
            pass

    def _nap(self, seconds: float) -> bool:
        """Sleep; True when the agent is stopping. Short naps with time.sleep, not
        Event.wait: a timed wait on a lock makes a tuple each time."""
        end = time.monotonic() + seconds
        while not self.stopping:
            left = end - time.monotonic()
            if left <= 0:
                return False
            time.sleep(left if left < NAP_S else NAP_S)
        return True

    def _wait_for_first_allocation(self) -> None:
        """Read the context right after the first allocation, before libraries load their kernels.

        NVML shows only part of the context until the first allocation completes
        it, so the first sample with reserved memory is the one that measures it.
        The stats call polled here costs about 10 us.
        """
        started = time.monotonic()
        while True:
            # The poll must not wait for room below the collector's threshold: a program that
            # allocated and then sleeps would never be read (seen on an H100: an idle child).
            collecting = gc.isenabled()
            if collecting:
                gc.disable()
            try:
                allocated = self.neutral.read(self._any_reserved, None)
            finally:
                if collecting:
                    gc.enable()
            if allocated:
                self.first_alloc_t = time.monotonic()
                while not self.sample("first"):  # put off while the collector is near its threshold
                    if self._nap(0.001):
                        return
                return
            waited = time.monotonic() - started
            if waited > FIRST_ALLOCATION_WAIT_S:
                self.sample("time")
                return
            if self._nap(0.001 if waited < 0.1 else 0.01):
                return

    def _any_reserved(self, _) -> bool:
        stats_fn = self.stats_fn
        devices = self.devices
        for i in range(len(devices)):
            if stats_fn(devices[i]["index"])["reserved_bytes"]["all"]["current"]:
                return True
        return False

    def _describe_devices(self) -> None:
        torch = self.torch
        try:
            from gpumemdoctor import nvml
            nvml.init()
            self.nvml = nvml
        except Exception:
            self.nvml = None
        described = []
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            uuid, pci = device_ids(props)
            nvml_device = self.nvml.find_device(uuid, pci) if self.nvml else None
            described.append({"index": index, "uuid": uuid, "pci_bus_id": pci, "name": props.name,
                              "nvml_device": nvml_device})
        self.devices = described
        try:
            backend = torch.cuda.get_allocator_backend()
        except Exception:
            backend = None
        self.write({"type": "devices", "t": time.monotonic(), "allocator_backend": backend,
                    "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                    "devices": [{k: v for k, v in d.items() if k != "nvml_device"}
                                | {"nvml_index": d["nvml_device"].index if d["nvml_device"] else None}
                                for d in described]})

    def _read_devices(self) -> list:
        """[torch index, allocated, active, reserved, requested, nvml used, alloc peak, reserved
        peak] of each device this process has touched: copies, for the paths that keep them."""
        if self.neutral is None:
            return []
        self._read_rows(False)
        return [list(self.rows[i]) for i in range(len(self.rows)) if self.live[i]]

    def _read_rows(self, room: bool):
        """Fill self.rows in place: PyTorch's figures, then NVML's, then PyTorch's reserved again
        (if the allocator moved meanwhile, the pair does not describe one moment: read again).
        PyTorch is read inside Neutral.read; NVML outside it, because the foreign call lets
        other threads run, and what the program allocates meanwhile must not be counted as
        the agent's. NO_ROOM when `room` is asked and the collector is near its threshold."""
        neutral = self.neutral
        for _ in range(3):
            if neutral.read(self._read_torch, None, room) is _events.NO_ROOM:
                return _events.NO_ROOM
            self._read_nvml()
            moved = neutral.read(self._reserved_moved, None, room)
            if moved is _events.NO_ROOM:
                return _events.NO_ROOM
            if not moved:
                break
        rows = self.rows
        for i in range(len(rows)):
            row = rows[i]
            reserved = row[3]
            nvml_used = row[5]
            if not reserved and not nvml_used:
                self.live[i] = False  # a device this process has not touched
                continue
            if reserved and nvml_used == 0:
                row[5] = None  # NVML does not list us though we hold memory: another PID namespace
            self.live[i] = True
        return True

    def _read_torch(self, _) -> None:
        """PyTorch's figures into the rows; makes only PyTorch's dicts, one device's at a time."""
        stats_fn = self.stats_fn
        rows = self.rows
        for i in range(len(rows)):
            row = rows[i]
            stats = stats_fn(row[0])
            row[1] = _stat(stats, "allocated_bytes", "current")
            row[2] = _stat(stats, "active_bytes", "current")
            row[3] = _stat(stats, "reserved_bytes", "current")
            row[4] = _stat(stats, "requested_bytes", "current")
            row[6] = _stat(stats, "allocated_bytes", "peak")
            row[7] = _stat(stats, "reserved_bytes", "peak")

    def _reserved_moved(self, _) -> bool:
        stats_fn = self.stats_fn
        rows = self.rows
        for i in range(len(rows)):
            if _stat(stats_fn(rows[i][0]), "reserved_bytes", "current") != rows[i][3]:
                return True
        return False

    def _read_nvml(self) -> None:
        rows = self.rows
        for i in range(len(rows)):
            reader = self.nvml_readers[i]
            used = None
            if reader is not None:
                try:
                    used = reader.used()
                except Exception:
                    used = None
            elif self.nvml is not None and self.devices[i]["nvml_device"] is not None:
                try:  # no direct reading on this driver: pynvml's list (makes containers)
                    used = self.nvml.used_by(self.devices[i]["nvml_device"], self.pid)
                except Exception:
                    used = None
            rows[i][5] = used

    def sample(self, by: str) -> bool:
        """One reading of every device; False when it was put off (the caller may try again).

        A step sample runs on the program's thread, with automatic collection held off
        while it reads. The agent's own thread ("time", "first") never changes the
        collector's settings: it reads only when that cannot set a collection off."""
        if self.dead or not self.devices or self.neutral is None:
            return True
        if by == "step":
            return self._sample(by, True) is not False
        done = self._sample(by, False)
        if done is None:  # no room below the collector's threshold
            self.samples_skipped += 1
            if time.monotonic() - self.last_sample_t < STARVED_S:
                return False
            # The program has not allocated for a while (it sleeps, or waits on the GPU), with its
            # collector near the threshold: read with automatic collection held off, briefly.
            done = self._sample(by, True)
        return done is not False

    def _sample(self, by: str, quiet: bool):
        """True when read, False when another reading was in progress, None when there was no
        room below the collector's threshold. Makes no container on the way (see Neutral):
        the record is written as text, into rows and series made once."""
        lock = self.sample_lock
        if by != "step" and lock.locked():
            return False  # the timer never waits; a step boundary waits for a timer sample (tens of us)
        lock.acquire()
        started = time.thread_time()  # the agent's own work, not its waits for the GIL
        collecting = quiet and gc.isenabled()
        if collecting:
            gc.disable()
        try:
            now = time.monotonic()
            if self._read_rows(not quiet) is _events.NO_ROOM:
                return None
            self.last_sample_t = now
            if by == "step":
                self.last_step_sample_t = now
            rows = self.rows
            live = self.live
            text = ""
            for i in range(len(rows)):
                if not live[i]:
                    continue
                row = rows[i]  # [index, allocated, active, reserved, requested, nvml, ...]
                if self.samples < 5 and row[3] and row[5]:  # the first readings: later ones can catch an NVML dip
                    gap = row[5] - row[3]
                    known = self.context.get(row[0])
                    if known is None or gap < known:
                        self.context[row[0]] = gap
                item = (f"[{row[0]},{_json_int(row[1])},{_json_int(row[2])},{_json_int(row[3])},"
                        f"{_json_int(row[4])},{_json_int(row[5])},{_json_int(row[6])},{_json_int(row[7])}]")
                text = f"{text},{item}" if text else item
            self.write_line(f'{{"type":"s","t":{now!r},"by":"{by}","step":{self.steps},"d":[{text}]}}')
            self.samples += 1
            if self.run_dir and (by == "step" or by == "time"):
                self._watch_growth(now, by)
            if self.samples % SAMPLES_PER_DOUBLING == 0:
                self.interval_s = min(self.interval_s * 2, MAX_INTERVAL_S)
        except Exception:
            pass
        finally:
            if collecting:
                gc.enable()
            spent = time.thread_time() - started
            self.cost["sample_s"] += spent
            self._count_cost(spent)
            lock.release()
        return True

    def _count_cost(self, spent: float) -> None:
        now = self.last_sample_t
        if not self.window_samples:
            self.window_start = now
        elif now - self.window_start >= COST_WINDOW_S:
            if not self.first_samples:
                self.first_samples, self.first_s = self.window_samples, self.window_s
            self.last_samples, self.last_s = self.window_samples, self.window_s
            self.window_start, self.window_samples, self.window_s = now, 0, 0.0
        self.window_samples += 1
        self.window_s += spent

    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        # PyTorch calls hook(optimizer, args, kwargs): a signature with *args would make a tuple.
        if not self.explicit_steps:
            self.on_step(False)

    def on_step(self, explicit: bool) -> None:
        try:
            if explicit and not self.explicit_steps:
                self.explicit_steps = True
                self.write({"type": "steps", "t": time.monotonic(), "source": "explicit"})
            self.steps += 1
            now = self.last_step_t = time.monotonic()
            # Against the last *step* sample: the timer's samples in the middle of a long step
            # must not take the place of the step boundary's.
            if self.devices and (self.steps <= EVERY_STEP_UNTIL
                                 or now - self.last_step_sample_t >= self.interval_s):
                self.sample("step")
            if self.investigate_at is not None and self.steps >= self.investigate_at[0]:
                self._investigate("growth")  # here, on the program's own thread, between steps
            elif self.trace_stop_at is not None and now >= self.trace_stop_at and self.investigate_at is None:
                self._stop_trace()
        except Exception:
            pass

    # -- root cause: growth suspected online, allocation stacks, holders ---------
    def _watch_growth(self, now: float, by: str) -> None:
        """Cheap online check of the allocated floor; see growth.floor_growth (which makes no
        container while it finds no growth)."""
        if self.suspected:
            return
        if (self.trace_mode == "on" and self.baseline is None and by == "step"
                and self.steps >= WARMUP_STEPS):
            self._take_baseline("warm-up")
        if by == "time" and self.steps:
            return  # a program that marks steps is judged at its step boundaries only
        all_xs = self.floor_xs[by]
        all_ys = self.floor_ys[by]
        x = self.steps if by == "step" else now
        for i in range(len(self.rows)):
            if not self.live[i]:
                continue
            xs = all_xs[i]
            ys = all_ys[i]
            xs.append(x)
            ys.append(self.rows[i][1])
            if len(xs) % CHECK_EVERY == 0 and len(xs) >= 2 * CHECK_EVERY:
                fit = self.floor_growth(xs, ys, SUSPECT_MIN_BYTES)
                if fit is not None:
                    self.positive_checks += 1
                    if self.positive_checks >= 2:
                        self._suspect(self.rows[i][0], by, fit)
                        return
                else:
                    self.positive_checks = 0
            if len(xs) > MAX_FLOOR_POINTS:  # keep every other point: the floor survives thinning
                del xs[::2], ys[::2]

    def _suspect(self, torch_index: int, by: str, fit) -> None:
        self.suspected = True
        for series in (*self.floor_xs.values(), *self.floor_ys.values()):
            for points in series:
                points.clear()
        self.write({"type": "suspect", "t": time.monotonic(), "step": self.steps, "device": torch_index,
                    "by": by, "grown_bytes": fit.grown_bytes, "rate": fit.rate_bytes_per_x})
        if by == "time":
            # Time samples come from the agent's thread. Turning PyTorch's memory history on from
            # it once raced the program's imports (torch 2.11: a circular import in torch._inductor
            # while the program imported torch._dynamo), so it is done only while no module is
            # being imported; the call itself imports nothing (probed on torch 2.11). Without
            # steps, the holders are looked for at exit.
            if self.trace_mode == "auto" and not self.trace_on and not _events.import_in_progress():
                self._start_trace("growth")
            return
        if self.baseline is None:
            self._take_baseline("growth")
        if self.trace_mode == "auto":
            self._start_trace("growth")
        self.investigate_at = (self.steps + INVESTIGATE_AFTER_STEPS, time.monotonic() + INVESTIGATE_AFTER_S)

    def _tensor_kind(self):
        if self.kind is None:
            from gpumemdoctor import _inspect

            self.kind = _inspect.TensorKind(self.torch)
        return self.kind

    def _take_baseline(self, why: str) -> None:
        from gpumemdoctor import _inspect

        started = time.monotonic()
        self.baseline = _inspect.take_baseline(self.torch, self._tensor_kind())
        self.write({"type": "baseline", "t": time.monotonic(), "step": self.steps, "why": why,
                    "blocks": len(self.baseline["blocks"]), "elapsed_s": round(time.monotonic() - started, 4)})

    def _start_trace(self, why: str) -> None:
        """PyTorch's allocation history with Python stacks, from now on."""
        error = None
        try:
            # "state" keeps the stack of each live block and no event history: cheaper, and the
            # snapshot stays quick to take. The event history is kept only for --snapshot.
            enabled = "all" if os.environ.get(ENV_SNAPSHOT) == "1" else "state"
            self.torch.cuda.memory._record_memory_history(
                enabled=enabled, context="alloc", stacks="python", max_entries=TRACE_MAX_ENTRIES)
            self.trace_on = self.trace_was_on = True
            if why == "growth" and self.trace_mode == "auto" and os.environ.get(ENV_SNAPSHOT) != "1":
                self.trace_stop_at = time.monotonic() + TRACE_WINDOW_S
        except Exception as exc:  # the cudaMallocAsync backend has no history
            error = f"{type(exc).__name__}: {exc}"[:300]
        self.write({"type": "trace", "t": time.monotonic(), "step": self.steps, "why": why,
                    "ok": self.trace_on, "error": error})

    def _stop_trace(self) -> None:
        """The end of --trace auto's window: no more stacks for new allocations; the live
        blocks allocated meanwhile keep theirs."""
        self.trace_stop_at = None
        try:
            self.torch.cuda.memory._record_memory_history(enabled=None)
            self.trace_on = False
            error = None
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"[:300]
        self.write({"type": "trace", "t": time.monotonic(), "step": self.steps,
                    "why": f"stopped after {TRACE_WINDOW_S:.0f} s", "ok": error is None, "error": error})

    def _investigate(self, when: str, budget: str | None = None) -> None:
        """Group what was allocated since the baseline and is still alive (at exit: all that is
        alive, each group marked new or not), and find its holders."""
        if when != "oom":
            self.investigate_at = None
        if self.torch is None or (self.baseline is None and when == "growth"):
            return
        # No baseline at exit or at an out-of-memory error (no growth seen, or seen by time
        # only): all of it counts as new.
        baseline = self.baseline or {"blocks": {}, "storages": set()}
        from gpumemdoctor import _inspect

        own = {t.ident for t in threading.enumerate() if t.name.startswith("gpumemdoctor-")}
        if when == "exit":
            own.add(threading.get_ident())  # our frames at exit hold nothing of the program's
        collecting = gc.isenabled()
        gc.disable()  # the search allocates: a collection now would free the program's garbage
        try:
            result = _inspect.investigate(self.torch, self._tensor_kind(), baseline,
                                          BUDGET_S[budget or when], MAX_OBJECTS[budget or when], own,
                                          self._thread_names(),
                                          all_live=when in ("exit", "oom"))
        except Exception as exc:
            self.write({"type": "error", "where": f"investigation ({when})", "message": repr(exc)[:500]})
            return
        finally:
            if collecting:
                gc.enable()
        self.write({"type": "investigation", "when": when, "t": time.monotonic(), "step": self.steps,
                    "trace": self.trace_on or self.trace_was_on, **result})

    def _thread_names(self) -> dict:
        alive = {t.name for t in threading.enumerate()}
        return {entry: [n if n in alive else f"{n} (ended)" for n in names[:4]]
                + ([f"and {len(names) - 4} more"] if len(names) > 4 else [])
                for entry, names in self.thread_entries.items()}

    def thread_started(self, thread):
        """From the thread itself, as it starts: what it runs, and the memory before it."""
        if thread.name.startswith("gpumemdoctor-"):
            return None
        entry = _thread_entry(thread)
        if entry is not None:
            names = self.thread_entries.setdefault(entry, [])
            if len(names) < 100:
                names.append(thread.name)
        if not self.devices or self.thread_records >= MAX_THREAD_RECORDS:
            return None
        with _events.quiet_gc():
            return (time.monotonic(), entry, self._read_devices())

    def thread_ended(self, thread, token) -> None:
        t0, entry, before = token
        with _events.quiet_gc():
            after = self._read_devices()
        if [r[1:4] + r[5:6] for r in before] == [r[1:4] + r[5:6] for r in after]:
            return  # the thread changed nothing on the GPU
        self.thread_records += 1
        self.write({"type": "thread", "name": thread.name, "entry": list(entry) if entry else None,
                    "t0": t0, "t": time.monotonic(), "d0": before, "d1": after})

    # -- the end of the run ----------------------------------------------------
    def at_exit(self) -> None:
        if self.pid != os.getpid() or self.finished:
            return
        self.finished = True
        if self.collections is not None:
            self.collections.paused = True  # the exit probes' own collections are not the program's
        try:
            self.stopping = True
            if self.thread is not None:
                self.thread.join(timeout=1.0)
            torch = self.torch
            if torch is not None and self.devices and torch.cuda.is_initialized():
                self._exit_probes(torch)
        except Exception as exc:
            self.write({"type": "error", "where": "exit probes", "message": repr(exc)[:500]})
        died_of = None
        try:
            died_of = _events.uncaught()
        except Exception:
            pass
        self.write({"type": "exit", "t": time.monotonic(), "steps": self.steps,
                    "explicit_steps": self.explicit_steps, "cupy": _cupy_pool(),
                    "uncaught": died_of, "samples": self.samples, "samples_skipped": self.samples_skipped,
                    "collections": self.collections.summary() if self.collections is not None else None,
                    "out_of_memory": self.oom_records,
                    "cost": {k: round(v, 6) for k, v in {**self.cost, **self._window_costs()}.items()}})
        if self.server is not None:
            self.server.close()

    def _window_costs(self) -> dict:
        """The samples' cost in the first and the last COST_WINDOW_S of sampling (the window
        under way when no full one has passed)."""
        out = {}
        current = (self.window_samples, self.window_s)
        first = (self.first_samples, self.first_s) if self.first_samples else current
        last = (self.last_samples, self.last_s) if self.last_samples else current
        for name, (samples, spent) in (("first", first), ("last", last)):
            if samples:
                out[f"{name}_window_samples"] = samples
                out[f"{name}_window_sample_us"] = spent / samples * 1e6
        return out

    def _exit_probes(self, torch) -> None:
        # No automatic collection until the garbage has been looked at: the snapshot and the
        # search allocate, and a collection they set off would free the cycles unseen.
        collecting = gc.isenabled()
        gc.disable()
        mark = time.perf_counter()

        def took(name: str) -> None:
            nonlocal mark
            now = time.perf_counter()
            self.cost[f"exit_{name}_s"] = now - mark
            mark = now

        try:
            end = self._read_devices()  # the memory as the program left it
            self.write({"type": "p", "phase": "end", "t": time.monotonic(), "d": end})
            if os.environ.get(ENV_SNAPSHOT) == "1" and self.run_dir:
                self._dump_snapshot(torch)
                took("snapshot")
            # One search at exit covers every live block, those new since the baseline (a
            # leak's) and the rest (what a program that grew nothing still holds).
            if self.suspected or self.trace_mode == "on":
                self._investigate("exit")
            elif self.fd is not None and any((row[1] or 0) >= LIVE_SEARCH_MIN_BYTES for row in end):
                self._investigate("exit", budget="live")
            took("search")
            self._probe(torch, end, took)
        finally:
            if collecting:
                gc.enable()

    def _probe(self, torch, end: list, took) -> None:
        """Re-measure after each thing that can give memory back, to say what held it."""
        touched = [row[0] for row in end]  # never create a context on a device the program left alone
        collected = self._collect_garbage(torch)
        self.write({"type": "p", "phase": "gc", "t": time.monotonic(), "collected": collected,
                    "d": self._read_devices()})
        took("garbage")
        for index in touched:
            torch.cuda.synchronize(index)
            # Blocks held for finished side-stream work are reclaimed at the next allocation.
            torch.empty(1, device=f"cuda:{index}")
        self.write({"type": "p", "phase": "sync", "t": time.monotonic(), "d": self._read_devices()})
        torch.cuda.empty_cache()
        self.write({"type": "p", "phase": "empty_cache", "t": time.monotonic(),
                    "d": self._read_devices()})
        took("release")


    def _collect_garbage(self, torch) -> int:
        """gc.collect(), having looked at what it frees: the types and the CUDA tensors in the cycles."""
        try:
            from gpumemdoctor import _inspect

            frames_of = None
            if self.trace_on or self.trace_was_on:
                frames_of = _inspect.Spans((b["address"], b["size"], b["frames"])
                                           for b in _inspect.live_blocks(torch) if b["frames"])
            report = _inspect.collect_garbage(self._tensor_kind(), frames_of)
        except Exception as exc:
            self.write({"type": "error", "where": "garbage", "message": repr(exc)[:500]})
            return gc.collect()
        self.write({"type": "garbage", "t": time.monotonic(), **report})
        return report["collected"]

    def _dump_snapshot(self, torch) -> None:
        path = os.path.join(self.run_dir, f"snapshot-{self.pid}.pickle")
        try:
            torch.cuda.memory._dump_snapshot(path)
            os.chmod(path, 0o600)
            self.write({"type": "snapshot", "t": time.monotonic(), "path": path, "trace": self.trace_on})
        except Exception as exc:
            self.write({"type": "error", "where": "snapshot", "message": repr(exc)[:500]})


def _thread_entry(thread):
    """(file, function) of the code a thread runs: its target, or the run() of its class."""
    target = getattr(thread, "_target", None)
    target = getattr(target, "__func__", target)
    code = getattr(target, "__code__", None)
    if code is None and type(thread).run is not threading.Thread.run:
        code = getattr(type(thread).run, "__code__", None)
    return (code.co_filename, code.co_name) if code is not None else None


def _install_thread_hook() -> None:
    """Tell the agent when each thread starts and ends: names for the stacks that ran in a
    thread, and the memory a thread left behind. One wrapper around threading's own start-up."""
    original = getattr(threading.Thread, "_bootstrap_inner", None)
    if original is None or getattr(original, "_gpumemdoctor", False):
        return

    def _bootstrap_inner(self):
        agent = _agent
        token = None
        if agent is not None and agent.pid == os.getpid():
            try:
                token = agent.thread_started(self)
            except Exception:
                token = None
        try:
            original(self)
        finally:
            if token is not None:
                try:
                    agent.thread_ended(self, token)
                except Exception:
                    pass

    _bootstrap_inner._gpumemdoctor = True
    threading.Thread._bootstrap_inner = _bootstrap_inner


def device_ids(props) -> tuple:
    """(UUID, PCI bus id in NVML's spelling) of torch's device properties; None where absent."""
    uuid = str(getattr(props, "uuid", "") or "") or None
    pci = None
    if hasattr(props, "pci_bus_id"):
        pci = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    return uuid, pci


def _json_int(value) -> str:
    return "null" if value is None else str(value)


def _stat(stats: dict, name: str, field: str):
    try:
        return int(stats[name]["all"][field])
    except (KeyError, TypeError, ValueError):
        return None


def _cupy_pool():
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return None
    try:
        pool = cupy.get_default_memory_pool()
        return {"used_bytes": int(pool.used_bytes()), "total_bytes": int(pool.total_bytes())}
    except Exception:
        return None
