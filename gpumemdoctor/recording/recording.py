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
from ..files.strict import (need_dict, need_int, need_int_key, need_list, need_num, need_str, opt_int, opt_num, opt_size,
                     opt_str)

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
    def from_json(cls, obj: Any) -> TorchSample:
        obj = need_dict(obj, "sample")
        return cls(t=need_num(obj.get("t"), "sample time"), by=need_str(obj.get("by"), "sample kind"),
                   step=opt_int(obj.get("step"), "step"),
                   readings=[DeviceReading.from_json(r) for r in need_list(obj.get("d"), "readings")],
                   collected=opt_int(obj.get("collected"), "collected"))


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
    def from_json(cls, obj: Any) -> TorchDevice:
        obj = need_dict(obj, "torch device")
        return cls(index=need_int(obj.get("index"), "device index"), uuid=opt_str(obj.get("uuid"), "uuid"),
                   pci_bus_id=opt_str(obj.get("pci_bus_id"), "pci_bus_id"),
                   name=opt_str(obj.get("name"), "name"),
                   nvml_index=opt_int(obj.get("nvml_index"), "nvml_index"))


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
    def from_json(cls, obj: Any) -> Dist:
        obj = need_dict(obj, "dist")
        numbers = {}
        for key in ("rank", "local_rank", "world_size", "local_world_size", "node_rank"):
            value = opt_int(obj.get(key), f"dist {key}")
            if value is not None and value < 0:
                raise BadReportError(f"dist {key}: expected a number of 0 or more, found {value}")
            numbers[key] = value
        source = opt_str(obj.get("source"), "dist source")
        if source is not None and source not in DIST_SOURCES:
            raise BadReportError(f"dist source: expected one of {', '.join(DIST_SOURCES)}, found {source!r:.40}")
        return cls(**numbers, run_id=opt_str(obj.get("run_id"), "dist run_id"), source=source)


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
                "errors": self.errors, "root": self.root, "cuda_origin": self.cuda_origin,
                "exit_info": self.exit_info, "dist": None if self.dist is None else self.dist.to_json(),
                "hard_exit": self.hard_exit}

    @classmethod
    def from_json(cls, obj: Any) -> AgentRecording:
        obj = need_dict(obj, "agent")
        probes = need_dict(obj.get("probes", {}), "probes")
        for phase in probes:
            if phase not in PROBE_PHASES:
                raise BadReportError(f"unknown probe phase {phase!r}")
        cupy = obj.get("cupy_pool")
        if cupy is not None:
            cupy = {k: opt_int(v, "cupy pool") for k, v in need_dict(cupy, "cupy pool").items()}
        return cls(
            pid=need_int(obj.get("pid"), "pid"), ppid=opt_int(obj.get("ppid"), "ppid"),
            argv=[need_str(a, "argv") for a in need_list(obj.get("argv", []), "argv")],
            forked_from=opt_int(obj.get("forked_from"), "forked_from"),
            python=opt_str(obj.get("python"), "python"),
            torch_version=opt_str(obj.get("torch_version"), "torch_version"),
            cuda_t=opt_num(obj.get("cuda_t"), "cuda_t"),
            allocator_backend=opt_str(obj.get("allocator_backend"), "allocator_backend"),
            devices=[TorchDevice.from_json(d) for d in need_list(obj.get("devices", []), "devices")],
            samples=[TorchSample.from_json(s) for s in need_list(obj.get("samples", []), "samples")],
            probes={k: TorchSample.from_json(v) for k, v in probes.items()},
            steps=opt_int(obj.get("steps"), "steps"),
            explicit_steps=bool(obj.get("explicit_steps", False)),
            exited_normally=bool(obj.get("exited_normally", False)),
            cupy_pool=cupy,
            errors=[need_str(e, "error") for e in need_list(obj.get("errors", []), "errors")],
            root=records.parse_root(obj.get("root", {})),
            cuda_origin=None if obj.get("cuda_origin") is None else records.CUDA_ORIGIN(
                obj["cuda_origin"], "cuda_origin"),
            exit_info=None if obj.get("exit_info") is None else records.EXIT_INFO(
                obj["exit_info"], "exit_info"),
            dist=None if obj.get("dist") is None else Dist.from_json(obj["dist"]),
            hard_exit=None if obj.get("hard_exit") is None else _hard_exit(obj["hard_exit"]),
        )


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
    def from_json(cls, obj: Any) -> ProcessRecord:
        obj = need_dict(obj, "process")
        cmdline = obj.get("cmdline")
        if cmdline is not None:
            cmdline = [need_str(a, "cmdline") for a in need_list(cmdline, "cmdline")]
        used = need_dict(obj.get("used_after_exit_bytes", {}), "used_after_exit_bytes")
        return cls(pid=need_int(obj.get("pid"), "pid"), ppid=opt_int(obj.get("ppid"), "ppid"),
                   cmdline=cmdline, create_time=opt_num(obj.get("create_time"), "create_time"),
                   is_target=bool(obj.get("is_target")),
                   first_seen_t=need_num(obj.get("first_seen_t"), "first_seen_t"),
                   alive_after_exit=bool(obj.get("alive_after_exit")),
                   used_after_exit_bytes={need_int_key(k, "device"):
                                          opt_size(v, "bytes") for k, v in used.items()})


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
        }

    @classmethod
    def from_json(cls, obj: Any) -> Recording:
        obj = need_dict(obj, "recording")
        if obj.get("schema") != SCHEMA:
            raise BadReportError(f"not a gpumemdoctor recording (schema {obj.get('schema')!r}, "
                                 f"expected {SCHEMA!r})")
        target = need_dict(obj.get("target"), "target")
        for key in ("pid", "exit_code", "signal", "cgroup_oom_kills"):
            opt_int(target.get(key), f"target {key}")
        target["argv"] = [need_str(a, "argv") for a in need_list(target.get("argv", []), "target argv")]
        nvml: dict[tuple[int, int], list[tuple[float, int | None]]] = {}
        for series in need_list(obj.get("nvml", []), "nvml"):
            series = need_dict(series, "nvml series")
            points = []
            for point in need_list(series.get("points"), "nvml points"):
                if not isinstance(point, list) or len(point) != 2:
                    raise BadReportError("an NVML point must be [t, used_bytes]")
                points.append((need_num(point[0], "t"), opt_size(point[1], "used_bytes")))
            nvml[(need_int(series.get("pid"), "pid"), need_int(series.get("device"), "device"))] = points
        devices = [need_dict(d, "device") for d in need_list(obj.get("devices", []), "devices")]
        for d in devices:
            need_int(d.get("index"), "device index")
            opt_int(d.get("total_bytes"), "total_bytes")
        return cls(
            tool_version=need_str(obj.get("tool_version"), "tool_version"), target=target,
            started_wall=need_num(obj.get("started_wall"), "started_wall"),
            duration_s=need_num(obj.get("duration_s"), "duration_s"),
            poll_interval_s=need_num(obj.get("poll_interval_s"), "poll_interval_s"),
            nvml_available=bool(obj.get("nvml_available")),
            versions=need_dict(obj.get("versions", {}), "versions"), devices=devices, nvml=nvml,
            processes=[ProcessRecord.from_json(p) for p in need_list(obj.get("processes", []), "processes")],
            agents=[AgentRecording.from_json(a) for a in need_list(obj.get("agents", []), "agents")],
            notes=[need_str(n, "note") for n in need_list(obj.get("notes", []), "notes")],
            tool_cost={need_str(k, "tool_cost"): (opt_size if k.endswith("_bytes") else opt_num)(v, f"tool_cost {k}")
                       for k, v in need_dict(obj.get("tool_cost", {}), "tool_cost").items()},
            host_rss=[_host_point(p) for p in need_list(obj.get("host_rss", []), "host_rss")],
            nvml_failures=[_nvml_failure(f) for f in need_list(obj.get("nvml_failures", []), "nvml_failures")],
            downsampling={need_str(k, "downsampling"): need_dict(v, "downsampling")
                          for k, v in need_dict(obj.get("downsampling", {}), "downsampling").items()},
            host=opt_str(obj.get("host"), "host"),
        )


def _hard_exit(obj: Any) -> dict:
    obj = need_dict(obj, "hard_exit")
    return {"t": need_num(obj.get("t"), "hard_exit t"), "status": opt_int(obj.get("status"), "hard_exit status")}


def _host_point(point: Any) -> tuple[float, int | None, int | None]:
    if not isinstance(point, list) or len(point) != 3:
        raise BadReportError("a host memory point must be [t, target_rss_bytes, tree_rss_bytes]")
    return (need_num(point[0], "t"), opt_size(point[1], "target_rss_bytes"), opt_size(point[2], "tree_rss_bytes"))


def _nvml_failure(obj: Any) -> dict:
    obj = need_dict(obj, "nvml failure")
    return {"device": need_int(obj.get("device"), "nvml failure device"),
            "from_t": need_num(obj.get("from_t"), "nvml failure from_t"),
            "to_t": opt_num(obj.get("to_t"), "nvml failure to_t"),
            "error": need_str(obj.get("error"), "nvml failure error"),
            "failed_calls": need_int(obj.get("failed_calls", 1), "nvml failure failed_calls")}
