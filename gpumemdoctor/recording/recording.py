"""A recording: everything measured in one run, from NVML and from the agents.

The supervisor builds it (`combine.py` reads the agents' files), the diagnosis
reads it, and reports embed it. Long series are kept bounded (`series.py`). Sizes are integers in bytes; *not available*
is None (JSON null), never 0. Times are seconds since the run started.
Loading is strict: a file that does not have this shape is refused.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from . import records
from ..contract import python_arguments
from ..errors import BadReportError
from .records import DeviceReading
from ..files.schema import (ANY, BOOL, COUNT, DICT, DURATION, EXIT_CODE, INT, PID, SECONDS, SIGNAL, SIZE, STR, WALL,
                            Shape, absent, dict_of, list_of, may, need_dict, need_int_key, one_of, opt, pair, row,
                            then)

SCHEMA = "gpumemdoctor.recording/1"
PROBE_PHASES = ("end", "gc", "sync", "empty_cache")


@dataclass
class TorchSample:
    """One reading from inside the process: a sample during the run or an exit probe."""

    t: float
    by: str  # "step", "time", or a probe phase
    step: int | None
    readings: list[DeviceReading]
    collected: int | None = None  # objects gc.collect() found, on the "gc" probe

    def reading(self, torch_index: int) -> DeviceReading | None:
        for r in self.readings:
            if r.torch_index == torch_index:
                return r
        return None

    def to_json(self) -> dict:
        return {"t": self.t, "by": self.by, "step": self.step, "collected": self.collected,
                "d": [r.to_json() for r in self.readings]}

    @classmethod
    def from_json(cls, obj: Any, what: str = "sample") -> TorchSample:
        return SAMPLE(obj, what)


@dataclass
class TorchDevice:
    """A device as torch numbers it, matched to NVML's numbering by UUID."""

    index: int
    uuid: str | None
    pci_bus_id: str | None
    name: str | None
    nvml_index: int | None

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, obj: Any, what: str = "torch device") -> TorchDevice:
        return TORCH_DEVICE(obj, what)


DIST_SOURCES = ("torch", "openmpi", "slurm")  # whose variables a process's rank was read from


@dataclass(frozen=True)
class Dist:
    """Who a process is in a distributed job, as its launcher's environment said when it started:
    torchrun's RANK, LOCAL_RANK, WORLD_SIZE... (or Open MPI's, or Slurm's). None where not set."""

    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    local_world_size: int | None = None
    node_rank: int | None = None
    run_id: str | None = None
    source: str | None = None  # one of DIST_SOURCES

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, obj: Any, what: str = "dist") -> Dist:
        return DIST(obj, what)


# Root records added since reports were first written: kept only where there are some, so that an
# older report reads back to itself.
NEW_ROOT_RECORDS = ("libraries", "groups", "peaks", "peak_probes", "declined", "pending_streams", "contexts",
                    "histories", "peak_histories", "forward_modules")


@dataclass
class AgentRecording:
    """What the agent inside one Python process of the run wrote."""

    pid: int
    ppid: int | None = None
    argv: list[str] = field(default_factory=list)
    forked_from: int | None = None
    python: str | None = None
    torch_version: str | None = None
    cuda_t: float | None = None
    allocator_backend: str | None = None
    devices: list[TorchDevice] = field(default_factory=list)
    samples: list[TorchSample] = field(default_factory=list)
    probes: dict[str, TorchSample] = field(default_factory=dict)
    steps: int | None = None
    explicit_steps: bool = False
    exited_normally: bool = False
    cupy_pool: dict | None = None
    errors: list[str] = field(default_factory=list)
    root: dict = field(default_factory=records.empty_root)  # see records.py
    cuda_origin: dict | None = None  # where CUDA started, and what kind of process this is
    exit_info: dict | None = None  # what the agent wrote as the process ended (records.EXIT_INFO)
    dist: Dist | None = None  # its rank in a distributed job, if its environment named one
    hard_exit: dict | None = None  # it left through os._exit(): {"t", "status"}; its last reading is a sample

    def device(self, torch_index: int) -> TorchDevice | None:
        for d in self.devices:
            if d.index == torch_index:
                return d
        return None

    def to_json(self) -> dict:
        return {"pid": self.pid, "ppid": self.ppid, "argv": self.argv, "forked_from": self.forked_from,
                "python": self.python, "torch_version": self.torch_version, "cuda_t": self.cuda_t,
                "allocator_backend": self.allocator_backend,
                "devices": [d.to_json() for d in self.devices],
                "samples": [s.to_json() for s in self.samples],
                "probes": {k: v.to_json() for k, v in self.probes.items()},
                "steps": self.steps, "explicit_steps": self.explicit_steps,
                "exited_normally": self.exited_normally, "cupy_pool": self.cupy_pool,
                "errors": self.errors,
                "root": {k: v for k, v in self.root.items() if k not in NEW_ROOT_RECORDS or v},
                "cuda_origin": self.cuda_origin,
                "exit_info": self.exit_info, "dist": None if self.dist is None else self.dist.to_json(),
                # written only where there is something (an older report reads back to itself)
                **({"hard_exit": self.hard_exit} if self.hard_exit is not None else {})}

    @classmethod
    def from_json(cls, obj: Any, what: str = "agent") -> AgentRecording:
        return AGENT(obj, what)


@dataclass
class ProcessRecord:
    """A process of the run's tree (the target or a descendant) that NVML or psutil saw."""

    pid: int
    ppid: int | None
    cmdline: list[str] | None
    create_time: float | None
    is_target: bool
    first_seen_t: float
    alive_after_exit: bool = False
    used_after_exit_bytes: dict[int, int | None] = field(default_factory=dict)  # NVML index -> bytes

    def to_json(self) -> dict:
        return {"pid": self.pid, "ppid": self.ppid, "cmdline": self.cmdline,
                "create_time": self.create_time, "is_target": self.is_target,
                "first_seen_t": self.first_seen_t, "alive_after_exit": self.alive_after_exit,
                "used_after_exit_bytes": {str(k): v for k, v in self.used_after_exit_bytes.items()}}

    @classmethod
    def from_json(cls, obj: Any, what: str = "process") -> ProcessRecord:
        return PROCESS(obj, what)


@dataclass
class Recording:
    """One run: the target, the devices, NVML's view of each process, the agents' view."""

    tool_version: str
    target: dict  # argv, pid, exit_code, signal, cwd
    started_wall: float
    duration_s: float
    poll_interval_s: float
    nvml_available: bool
    versions: dict = field(default_factory=dict)
    devices: list[dict] = field(default_factory=list)  # NVML devices: index, uuid, pci_bus_id, name, total_bytes
    nvml: dict[tuple[int, int], list[tuple[float, int | None]]] = field(default_factory=dict)
    processes: list[ProcessRecord] = field(default_factory=list)
    agents: list[AgentRecording] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what went wrong while recording
    tool_cost: dict = field(default_factory=dict)  # seconds the supervisor spent outside the target
    # The host memory (RSS) of the target, and of the target with its descendants: (t, target, tree).
    host_rss: list[tuple[float, int | None, int | None]] = field(default_factory=list)
    # Times NVML failed while the run went on: device, from_t, to_t (None: to the end), error.
    nvml_failures: list[dict] = field(default_factory=list)
    # How each long series was kept (series.Series.summary): points seen and kept, marked events.
    downsampling: dict = field(default_factory=dict)
    host: str | None = None  # the supervisor's host name (None in reports of versions before it)
    # Each GPU's memory, all its processes together, as NVML says: NVML index -> [(t, used, free)].
    # Empty in recordings of versions before it.
    device_memory: dict[int, list[tuple[float, int | None, int | None]]] = field(default_factory=dict)

    @property
    def target_pid(self) -> int | None:
        return self.target.get("pid")

    @property
    def gpu_models(self) -> list[str]:
        """The models of the machine's GPUs, as NVML named them (none where NVML was not used)."""
        return sorted({d["name"] for d in self.devices if d.get("name")})

    @property
    def program(self) -> str | None:
        """What the target ran, without its arguments: the script's file name (`train.py`, wherever it
        was), or `-m` and the module; None where the recording does not say."""
        argv = self.target.get("argv") or []
        if argv[:1] == ["-m"]:
            return f"-m {argv[1]}" if len(argv) > 1 else None
        return os.path.basename(argv[0]) if argv else None

    @property
    def command(self) -> str:
        """The target's command line as it ran: `python train.py --epochs 1` (`python -- -dash.py`)."""
        return " ".join(["python", *python_arguments(self.target.get("argv") or [])])

    def agent(self, pid: int) -> AgentRecording | None:
        for a in self.agents:
            if a.pid == pid:
                return a
        return None

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA, "tool_version": self.tool_version, "target": self.target,
            "started_wall": self.started_wall, "duration_s": self.duration_s,
            "poll_interval_s": self.poll_interval_s, "nvml_available": self.nvml_available,
            "versions": self.versions, "devices": self.devices,
            "nvml": [{"pid": pid, "device": dev, "points": [[t, used] for t, used in points]}
                     for (pid, dev), points in sorted(self.nvml.items())],
            "processes": [p.to_json() for p in self.processes],
            "agents": [a.to_json() for a in self.agents],
            "notes": self.notes,
            "tool_cost": self.tool_cost,
            "host_rss": [list(p) for p in self.host_rss],
            "nvml_failures": self.nvml_failures,
            "downsampling": self.downsampling,
            "host": self.host,
            # written only where there is something (an older report reads back to itself)
            **({"device_memory": [{"device": index, "points": [list(p) for p in points]}
                                  for index, points in sorted(self.device_memory.items())]}
               if self.device_memory else {}),
        }

    @classmethod
    def from_json(cls, obj: Any, what: str = "recording") -> Recording:
        obj = need_dict(obj, what)
        if obj.get("schema") != SCHEMA:
            raise BadReportError(f"not a gpumemdoctor recording (schema {obj.get('schema')!r}, "
                                 f"expected {SCHEMA!r})")
        return RECORDING(obj, what)


# -- the declared shapes --------------------------------------------------------------------
# Fields that versions before them did not write are `absent(...)`, with what such a recording meant.

SAMPLE = Shape({"t": SECONDS, "by": STR, "step": opt(INT), "d": list_of(records.DEVICE_READING),
                "collected": opt(COUNT)}, rename={"d": "readings"}).into(TorchSample)
TORCH_DEVICE = Shape({"index": COUNT, "uuid": opt(STR), "pci_bus_id": opt(STR), "name": opt(STR),
                      "nvml_index": opt(COUNT)}).into(TorchDevice)
DIST = Shape({"rank": opt(COUNT), "local_rank": opt(COUNT), "world_size": opt(COUNT),
              "local_world_size": opt(COUNT), "node_rank": opt(COUNT), "run_id": opt(STR),
              "source": opt(one_of(*DIST_SOURCES))}).into(Dist)
AGENT = Shape({
    "pid": PID, "ppid": opt(PID), "argv": absent(list_of(STR), []), "forked_from": opt(PID), "python": opt(STR),
    "torch_version": opt(STR), "cuda_t": opt(SECONDS), "allocator_backend": opt(STR),
    "devices": absent(list_of(TORCH_DEVICE), []), "samples": absent(list_of(SAMPLE), []),
    "probes": absent(dict_of(one_of(*PROBE_PHASES), SAMPLE), {}), "steps": opt(COUNT),
    "explicit_steps": absent(BOOL, False), "exited_normally": absent(BOOL, False),
    "cupy_pool": opt(dict_of(STR, opt(INT))), "errors": absent(list_of(STR), []),
    "root": absent(records.ROOT, records.empty_root), "cuda_origin": opt(records.CUDA_ORIGIN),
    "exit_info": opt(records.EXIT_INFO), "dist": opt(DIST),
    "hard_exit": opt(Shape({"t": SECONDS, "status": opt(INT)}))}).into(AgentRecording)
PROCESS = Shape({
    "pid": PID, "ppid": opt(PID), "cmdline": opt(list_of(STR)), "create_time": opt(WALL),
    "is_target": absent(BOOL, False), "first_seen_t": SECONDS, "alive_after_exit": absent(BOOL, False),
    "used_after_exit_bytes": absent(dict_of(need_int_key, opt(SIZE)), {})}).into(ProcessRecord)
# The target's own fields (argv, pid, exit_code, signal, cwd, cgroup_oom_kills...): each that is read
# checked; the report's copy of them (report_file.py) adds the run's length.
TARGET_FIELDS = {"argv": absent(list_of(STR), []), "pid": may(opt(PID)), "exit_code": may(opt(EXIT_CODE)),
                 "signal": may(opt(SIGNAL)), "cgroup_oom_kills": may(opt(COUNT)), "cwd": may(opt(STR))}
TARGET = Shape(TARGET_FIELDS, rest=ANY)
# An NVML device of the machine; the fields that are drawn are checked, the rest kept.
DEVICE = Shape({"index": COUNT, "uuid": may(opt(STR)), "pci_bus_id": may(opt(STR)), "name": may(opt(STR)),
                "total_bytes": may(opt(SIZE))}, rest=ANY)
# The versions of the tool, Python, torch, the driver, NVML and CUDA: name -> version.
VERSIONS = dict_of(STR, opt(STR))
NVML_SERIES = Shape({"pid": PID, "device": COUNT, "points": list_of(pair(SECONDS, opt(SIZE)))})
# [{pid, device, points: [[t, used_bytes]]}] -> {(pid, device): [(t, used)]}
NVML = then(list_of(NVML_SERIES), lambda series: {(s["pid"], s["device"]): [(t, used) for t, used in s["points"]]
                                                  for s in series})
# Seconds the supervisor spent, and the bytes it held.
TOOL_COST = Shape({"supervisor_peak_rss_bytes": may(opt(SIZE))}, rest=opt(SECONDS))
# [t, target_rss_bytes, tree_rss_bytes]
HOST_POINT = then(row(SECONDS, opt(SIZE), opt(SIZE)), tuple)
DEVICE_MEMORY = Shape({"device": COUNT, "points": list_of(row(SECONDS, opt(SIZE), opt(SIZE)))})
# [{device, points: [[t, used_bytes, free_bytes]]}] -> {device: [(t, used, free)]}
DEVICE_MEMORIES = then(list_of(DEVICE_MEMORY), lambda series: {s["device"]: [tuple(p) for p in s["points"]]
                                                               for s in series})
NVML_FAILURE = Shape({"device": INT, "from_t": SECONDS, "to_t": opt(SECONDS), "error": STR,
                      "failed_calls": absent(COUNT, 1)})
# "schema" is checked first (Recording.from_json), to say plainly when a file is no recording.
RECORDING = Shape({
    "tool_version": STR, "target": TARGET, "started_wall": WALL, "duration_s": DURATION, "poll_interval_s": DURATION,
    "nvml_available": absent(BOOL, False), "versions": absent(VERSIONS, {}),
    "devices": absent(list_of(DEVICE), []),
    "nvml": absent(NVML, {}), "processes": absent(list_of(PROCESS), []), "agents": absent(list_of(AGENT), []),
    "notes": absent(list_of(STR), []), "tool_cost": absent(TOOL_COST, {}),
    "host_rss": absent(list_of(HOST_POINT), []), "nvml_failures": absent(list_of(NVML_FAILURE), []),
    "downsampling": absent(dict_of(STR, DICT), {}), "host": opt(STR),
    "device_memory": absent(DEVICE_MEMORIES, {})}).into(Recording)
