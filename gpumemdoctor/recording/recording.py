"""A recording: everything measured in one run, from NVML and from the agents.

The supervisor builds it (`combine.py` reads the agents' files), the diagnosis
reads it, and reports embed it. Long series are kept bounded (`series.py`). Sizes are integers in bytes; *not available*
is None (JSON null), never 0. Times are seconds since the run started.
Loading is strict: a file that does not have this shape is refused. Each class is written and read by
its shape, declared at the end (`Coded`: files/schema.py's `write` and the shape's parser, one codec).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, ClassVar

from . import records
from ..contract import python_arguments
from ..errors import BadReportError
from .records import DeviceReading
from ..files.schema import (ANY, BOOL, COUNT, DICT, DURATION, EXIT_CODE, INT, PID, SECONDS, SIGNAL, SIZE, STR, WALL,
                            Shape, absent, dict_of, list_of, may, need_dict, need_int_key, one_of, opt, pair, row,
                            since, then, write)

SCHEMA = "gpumemdoctor.recording/1"
PROBE_PHASES = ("end", "gc", "sync", "empty_cache")


class Coded:
    """Written and read by the class's declared shape (`SHAPES`, at the end of this module)."""

    WHAT: ClassVar[str] = "record"  # what a refusal calls it

    def to_json(self) -> dict:
        return write(SHAPES[type(self)], self)

    @classmethod
    def from_json(cls, obj: Any, what: str | None = None):
        return SHAPES[cls](obj, what or cls.WHAT)


@dataclass
class TorchSample(Coded):
    """One reading from inside the process: a sample during the run or an exit probe."""

    WHAT: ClassVar[str] = "sample"

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


@dataclass
class TorchDevice(Coded):
    """A device as torch numbers it, matched to NVML's numbering by UUID."""

    WHAT: ClassVar[str] = "torch device"

    index: int
    uuid: str | None
    pci_bus_id: str | None
    name: str | None
    nvml_index: int | None


DIST_SOURCES = ("torch", "openmpi", "slurm")  # whose variables a process's rank was read from


@dataclass(frozen=True)
class Dist(Coded):
    """Who a process is in a distributed job, as its launcher's environment said when it started:
    torchrun's RANK, LOCAL_RANK, WORLD_SIZE... (or Open MPI's, or Slurm's). None where not set."""

    WHAT: ClassVar[str] = "dist"

    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    local_world_size: int | None = None
    node_rank: int | None = None
    run_id: str | None = None
    source: str | None = None  # one of DIST_SOURCES


@dataclass
class AgentRecording(Coded):
    """What the agent inside one Python process of the run wrote."""

    WHAT: ClassVar[str] = "agent"

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


@dataclass
class ProcessRecord(Coded):
    """A process of the run's tree (the target or a descendant) that NVML or psutil saw."""

    WHAT: ClassVar[str] = "process"

    pid: int
    ppid: int | None
    cmdline: list[str] | None
    create_time: float | None
    is_target: bool
    first_seen_t: float
    alive_after_exit: bool = False
    used_after_exit_bytes: dict[int, int | None] = field(default_factory=dict)  # NVML index -> bytes


@dataclass
class Recording(Coded):
    """One run: the target, the devices, NVML's view of each process, the agents' view."""

    WHAT: ClassVar[str] = "recording"

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
        return {"schema": SCHEMA, **super().to_json()}

    @classmethod
    def from_json(cls, obj: Any, what: str | None = None) -> Recording:
        obj = need_dict(obj, what or cls.WHAT)
        if obj.get("schema") != SCHEMA:
            raise BadReportError(f"not a gpumemdoctor recording (schema {obj.get('schema')!r}, "
                                 f"expected {SCHEMA!r})")
        return super().from_json(obj, what)


# -- the declared shapes --------------------------------------------------------------------
# Fields that versions before them did not write are `absent(...)`, with what such a recording meant.

SAMPLE = Shape({"t": SECONDS, "by": STR, "step": opt(INT), "collected": opt(COUNT),
                "d": list_of(records.DEVICE_READING)}, rename={"d": "readings"}).into(TorchSample)
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
    "hard_exit": since(opt(Shape({"t": SECONDS, "status": opt(INT)})), None)}).into(AgentRecording)
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
                                                  for s in series},
            lambda nvml: [{"pid": pid, "device": dev, "points": [[t, used] for t, used in points]}
                          for (pid, dev), points in sorted(nvml.items())])
# Seconds the supervisor spent, and the bytes it held.
TOOL_COST = Shape({"supervisor_peak_rss_bytes": may(opt(SIZE))}, rest=opt(SECONDS))
# [t, target_rss_bytes, tree_rss_bytes]
HOST_POINT = then(row(SECONDS, opt(SIZE), opt(SIZE)), tuple, list)
DEVICE_MEMORY = Shape({"device": COUNT, "points": list_of(row(SECONDS, opt(SIZE), opt(SIZE)))})
# [{device, points: [[t, used_bytes, free_bytes]]}] -> {device: [(t, used, free)]}
DEVICE_MEMORIES = then(list_of(DEVICE_MEMORY), lambda series: {s["device"]: [tuple(p) for p in s["points"]]
                                                               for s in series},
                       lambda memory: [{"device": index, "points": [list(p) for p in points]}
                                       for index, points in sorted(memory.items())])
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
    "device_memory": since(DEVICE_MEMORIES, {})}).into(Recording)
SHAPES = {TorchSample: SAMPLE, TorchDevice: TORCH_DEVICE, Dist: DIST, AgentRecording: AGENT, ProcessRecord: PROCESS,
          Recording: RECORDING}
