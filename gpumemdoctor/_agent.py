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

ENV_RUN_DIR = "GPUMEMDOCTOR_RUN_DIR"
ENV_INTERVAL = "GPUMEMDOCTOR_INTERVAL_S"
ENV_SOCKET = "GPUMEMDOCTOR_SOCKET"  # "0": no local socket for `gpumemdoctor watch`
DEFAULT_INTERVAL_S = 0.02
MAX_INTERVAL_S = 5.0
SAMPLES_PER_DOUBLING = 1000  # long runs sample more slowly so a recording stays small
FIRST_ALLOCATION_WAIT_S = 10.0

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
        self.sample_lock = threading.Lock()
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.cuda_seen = False
        self.finished = False

    # -- the channel ---------------------------------------------------------
    def write(self, record: dict) -> None:
        if self.dead or self.fd is None:
            return
        try:
            os.write(self.fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())
        except Exception:
            self.dead = True  # disk full, folder gone: stop recording, keep the program

    # -- start-up ------------------------------------------------------------
    def begin(self, forked_from: int | None = None) -> None:
        self.write({"type": "hello", "pid": self.pid, "ppid": os.getppid(), "t": time.monotonic(),
                    "wall": time.time(), "argv": list(getattr(sys, "argv", [])),
                    "python": sys.version.split()[0], "executable": sys.executable,
                    "forked_from": forked_from, "interval_s": self.interval_s})
        if forked_from is None:
            atexit.register(self.at_exit)
            if hasattr(os, "register_at_fork"):
                os.register_at_fork(after_in_child=_after_fork_in_child)
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
        # Runs inside torch's lazy CUDA initialisation: it must never raise.
        try:
            if not self.cuda_seen:
                self.cuda_seen = True
                self.write({"type": "cuda", "t": time.monotonic()})
                self._start_thread()
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
                if self.stop.wait(self.interval_s):
                    return
            self._describe_devices()
            self._wait_for_first_allocation()
            while not self.stop.wait(self.interval_s):
                now = time.monotonic()
                # While the program marks steps, samples are taken at step boundaries instead.
                if now - self.last_sample_t >= self.interval_s and now - self.last_step_t >= self.interval_s:
                    self.sample("time")
        except Exception:
            pass

    def _wait_for_first_allocation(self) -> None:
        """Read the context right after the first allocation, before libraries load their kernels.

        NVML shows only part of the context until the first allocation completes
        it, so the first sample with reserved memory is the one that measures it.
        The stats call polled here costs about 10 us.
        """
        torch = self.torch
        started = time.monotonic()
        while True:
            if any(_stat(torch.cuda.memory_stats_as_nested_dict(d["index"]), "reserved_bytes", "current")
                   for d in self.devices):
                self.sample("first")
                return
            waited = time.monotonic() - started
            if waited > FIRST_ALLOCATION_WAIT_S:
                self.sample("time")
                return
            if self.stop.wait(0.001 if waited < 0.1 else 0.01):
                return

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
        """[torch index, allocated, active, reserved, requested, nvml used, alloc peak, reserved peak]."""
        rows = []
        for d in self.devices:
            row = self._read_device(d)
            if row is not None:
                rows.append(row)
        return rows

    def _read_device(self, d: dict, tries: int = 3):
        torch = self.torch
        for _ in range(tries):
            stats = torch.cuda.memory_stats_as_nested_dict(d["index"])
            reserved = _stat(stats, "reserved_bytes", "current")
            nvml_used = None
            if self.nvml is not None and d["nvml_device"] is not None:
                try:
                    nvml_used = self.nvml.used_by(d["nvml_device"], self.pid)
                except Exception:
                    nvml_used = None
            # NVML and the allocator are read one after the other: if the allocator
            # moved in between, the pair does not describe one moment; read again.
            again = torch.cuda.memory_stats_as_nested_dict(d["index"])
            if _stat(again, "reserved_bytes", "current") == reserved:
                break
        if not reserved and not nvml_used:
            return None  # a device this process has not touched
        if reserved and nvml_used == 0:
            nvml_used = None  # NVML does not list us though we hold memory: another PID namespace
        return [d["index"], _stat(stats, "allocated_bytes", "current"),
                _stat(stats, "active_bytes", "current"), reserved,
                _stat(stats, "requested_bytes", "current"), nvml_used,
                _stat(stats, "allocated_bytes", "peak"), _stat(stats, "reserved_bytes", "peak")]

    def sample(self, by: str) -> None:
        if self.dead or not self.devices or not self.sample_lock.acquire(blocking=False):
            return
        try:
            now = time.monotonic()
            self.last_sample_t = now
            rows = self._read_devices()
            for row in rows:  # [index, allocated, active, reserved, requested, nvml, ...]
                if row[3] and row[5]:
                    self.context[row[0]] = min(self.context.get(row[0], row[5] - row[3]), row[5] - row[3])
            self.write({"type": "s", "t": now, "by": by, "step": self.steps, "d": rows})
            self.samples += 1
            if self.samples % SAMPLES_PER_DOUBLING == 0:
                self.interval_s = min(self.interval_s * 2, MAX_INTERVAL_S)
        except Exception:
            pass
        finally:
            self.sample_lock.release()

    def _on_optimizer_step(self, *args, **kwargs) -> None:
        if not self.explicit_steps:
            self.on_step(explicit=False)

    def on_step(self, explicit: bool) -> None:
        try:
            if explicit and not self.explicit_steps:
                self.explicit_steps = True
                self.write({"type": "steps", "t": time.monotonic(), "source": "explicit"})
            self.steps += 1
            now = self.last_step_t = time.monotonic()
            if self.devices and now - self.last_sample_t >= self.interval_s:
                self.sample("step")
        except Exception:
            pass

    # -- the end of the run ----------------------------------------------------
    def at_exit(self) -> None:
        if self.pid != os.getpid() or self.finished:
            return
        self.finished = True
        try:
            self.stop.set()
            if self.thread is not None:
                self.thread.join(timeout=1.0)
            torch = self.torch
            if torch is not None and self.devices and torch.cuda.is_initialized():
                self._probe(torch)
        except Exception as exc:
            self.write({"type": "error", "where": "exit probes", "message": repr(exc)[:500]})
        self.write({"type": "exit", "t": time.monotonic(), "steps": self.steps,
                    "explicit_steps": self.explicit_steps, "cupy": _cupy_pool()})
        if self.server is not None:
            self.server.close()

    def _probe(self, torch) -> None:
        """Re-measure after each thing that can give memory back, to say what held it."""
        end = self._read_devices()
        self.write({"type": "p", "phase": "end", "t": time.monotonic(), "d": end})
        touched = [row[0] for row in end]  # never create a context on a device the program left alone
        collected = gc.collect()
        self.write({"type": "p", "phase": "gc", "t": time.monotonic(), "collected": collected,
                    "d": self._read_devices()})
        for index in touched:
            torch.cuda.synchronize(index)
            # Blocks held for finished side-stream work are reclaimed at the next allocation.
            torch.empty(1, device=f"cuda:{index}")
        self.write({"type": "p", "phase": "sync", "t": time.monotonic(), "d": self._read_devices()})
        torch.cuda.empty_cache()
        self.write({"type": "p", "phase": "empty_cache", "t": time.monotonic(),
                    "d": self._read_devices()})


def device_ids(props) -> tuple:
    """(UUID, PCI bus id in NVML's spelling) of torch's device properties; None where absent."""
    uuid = str(getattr(props, "uuid", "") or "") or None
    pci = None
    if hasattr(props, "pci_bus_id"):
        pci = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    return uuid, pci


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
