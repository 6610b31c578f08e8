"""A recording: everything measured in one run, from NVML and from the agents.

The supervisor builds it (`combine.py` reads the agents' files), the diagnosis
reads it, and reports embed it. Long series are kept bounded (`series.py`). Sizes are integers in bytes; *not available*
is None (JSON null), never 0. Times are seconds since the run started.
Loading is strict: a file that does not have this shape is refused.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import records
from ..errors import BadReportError
from .records import DeviceReading
from ..files.schema import (ANY, BOOL, COUNT, DICT, INT, NUM, SIZE, STR, Shape, absent, dict_of, list_of, may, need_dict,
                            need_int_key, need_str, one_of, opt, pair, row)

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

SAMPLE = Shape({"t": NUM, "by": STR, "step": opt(INT), "d": list_of(DeviceReading.from_json),
                "collected": opt(INT)}, rename={"d": "readings"}).into(TorchSample)
TORCH_DEVICE = Shape({"index": INT, "uuid": opt(STR), "pci_bus_id": opt(STR), "name": opt(STR),
                      "nvml_index": opt(INT)}).into(TorchDevice)
DIST = Shape({"rank": opt(COUNT), "local_rank": opt(COUNT), "world_size": opt(COUNT),
              "local_world_size": opt(COUNT), "node_rank": opt(COUNT), "run_id": opt(STR),
              "source": opt(one_of(*DIST_SOURCES))}).into(Dist)
AGENT = Shape({
    "pid": INT, "ppid": opt(INT), "argv": absent(list_of(STR), []), "forked_from": opt(INT), "python": opt(STR),
    "torch_version": opt(STR), "cuda_t": opt(NUM), "allocator_backend": opt(STR),
    "devices": absent(list_of(TORCH_DEVICE), []), "samples": absent(list_of(SAMPLE), []),
    "probes": absent(dict_of(one_of(*PROBE_PHASES), SAMPLE), {}), "steps": opt(INT),
    "explicit_steps": absent(BOOL, False), "exited_normally": absent(BOOL, False),
    "cupy_pool": opt(dict_of(STR, opt(INT))), "errors": absent(list_of(STR), []),
    "root": absent(records.parse_root, records.empty_root), "cuda_origin": opt(records.CUDA_ORIGIN),
    "exit_info": opt(records.EXIT_INFO), "dist": opt(DIST),
    "hard_exit": opt(Shape({"t": NUM, "status": opt(INT)}))}).into(AgentRecording)
PROCESS = Shape({
    "pid": INT, "ppid": opt(INT), "cmdline": opt(list_of(STR)), "create_time": opt(NUM),
    "is_target": absent(BOOL, False), "first_seen_t": NUM, "alive_after_exit": absent(BOOL, False),
    "used_after_exit_bytes": absent(dict_of(need_int_key, opt(SIZE)), {})}).into(ProcessRecord)
# The target's own fields (argv, pid, exit_code, signal, cwd, cgroup_oom_kills...): the numbers checked.
TARGET = Shape({"argv": absent(list_of(STR), []), "pid": may(opt(INT)), "exit_code": may(opt(INT)),
                "signal": may(opt(INT)), "cgroup_oom_kills": may(opt(INT))}, rest=ANY)
NVML_SERIES = Shape({"pid": INT, "device": INT, "points": list_of(pair(NUM, opt(SIZE)))})


def _nvml(value: Any, what: str) -> dict[tuple[int, int], list[tuple[float, int | None]]]:
    return {(s["pid"], s["device"]): [(t, used) for t, used in s["points"]]
            for s in list_of(NVML_SERIES)(value, what)}


def _tool_cost(value: Any, what: str) -> dict:
    """Seconds the supervisor spent, and the bytes it held (`..._bytes`)."""
    return {need_str(k, what): (opt(SIZE) if k.endswith("_bytes") else opt(NUM))(v, f"{what} {k!r:.40}")
            for k, v in need_dict(value, what).items()}


def _host_point(value: Any, what: str) -> tuple[float, int | None, int | None]:
    """[t, target_rss_bytes, tree_rss_bytes]"""
    return tuple(row(NUM, opt(SIZE), opt(SIZE))(value, what))


DEVICE_MEMORY = Shape({"device": INT, "points": list_of(row(NUM, opt(SIZE), opt(SIZE)))})


def _device_memory(value: Any, what: str) -> dict[int, list[tuple[float, int | None, int | None]]]:
    """[{device, points: [[t, used_bytes, free_bytes]]}] -> {device: [(t, used, free)]}"""
    return {s["device"]: [tuple(p) for p in s["points"]] for s in list_of(DEVICE_MEMORY)(value, what)}


NVML_FAILURE = Shape({"device": INT, "from_t": NUM, "to_t": opt(NUM), "error": STR,
                      "failed_calls": absent(INT, 1)})
# "schema" is checked first (Recording.from_json), to say plainly when a file is no recording.
RECORDING = Shape({
    "tool_version": STR, "target": TARGET, "started_wall": NUM, "duration_s": NUM, "poll_interval_s": NUM,
    "nvml_available": absent(BOOL, False), "versions": absent(DICT, {}),
    "devices": absent(list_of(Shape({"index": INT, "total_bytes": may(opt(INT))}, rest=ANY)), []),
    "nvml": absent(_nvml, {}), "processes": absent(list_of(PROCESS), []), "agents": absent(list_of(AGENT), []),
    "notes": absent(list_of(STR), []), "tool_cost": absent(_tool_cost, {}),
    "host_rss": absent(list_of(_host_point), []), "nvml_failures": absent(list_of(NVML_FAILURE), []),
    "downsampling": absent(dict_of(STR, DICT), {}), "host": opt(STR),
    "device_memory": absent(_device_memory, {})}).into(Recording)
