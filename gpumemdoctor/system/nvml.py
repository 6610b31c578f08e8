"""The only module that talks to NVML: devices, memory, and who holds it.

Every call of a reading goes through `_call` (or `_call_strict`, for the tree's
poll), which turns "not supported", "no permission" and "function not found" into
None (*not available*), and a missing library or driver into one NoGpuError with a
hint. Four calls do not, each on purpose: the start (`init`'s nvmlInit and
`check_available`'s, whose errors are the hint), the probe of the versioned
process-list functions (`_pick_processes_fn`: an error there says which version
works), and `ProcessMemory.used`'s call through NVML's own function pointer (a
return code, not an exception: no object is made on the agent's sampling path).
pynvml is imported on first use so that `gpumemdoctor --help` never loads it.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import NoGpuError

_lock = threading.Lock()
_nv: Any = None  # the pynvml module once NVML is initialised
_processes_fn: Callable | None = None
_SOFT_ERRORS: tuple = ()
_FATAL_ERRORS: tuple = ()
_UNAVAILABLE_ERRORS: tuple = ()  # what a call that never works here says; anything else is a failure


class CallFailed(Exception):
    """An NVML call that should have worked failed (a GPU lost, an unknown error, a timeout):
    unlike *not available*, the figure exists and could not be read."""


@dataclass(frozen=True)
class Device:
    """One GPU as NVML numbers it (PCI order)."""

    index: int
    uuid: str
    pci_bus_id: str | None
    name: str | None
    total_bytes: int | None
    handle: Any = None

    def to_json(self) -> dict:
        return {"index": self.index, "uuid": self.uuid, "pci_bus_id": self.pci_bus_id,
                "name": self.name, "total_bytes": self.total_bytes}


@dataclass(frozen=True)
class MemoryInfo:
    total_bytes: int | None
    used_bytes: int | None
    free_bytes: int | None
    reserved_bytes: int | None  # driver-reserved; None where only v1 exists


def init() -> Any:
    """Initialise NVML once; raise NoGpuError with a fix-it hint when it cannot be."""
    global _nv, _SOFT_ERRORS, _FATAL_ERRORS, _UNAVAILABLE_ERRORS
    if _nv is not None:
        return _nv
    with _lock:
        if _nv is not None:
            return _nv
        try:
            import pynvml
        except ImportError as exc:
            raise NoGpuError("the nvidia-ml-py package is not installed: "
                             "pip install nvidia-ml-py") from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NoGpuError(f"NVML is not available ({exc}): this machine has no usable "
                             "NVIDIA driver; run on a machine with an NVIDIA GPU") from exc
        except OSError as exc:  # a broken libnvidia-ml.so
            raise NoGpuError(f"NVML could not be loaded ({exc})") from exc
        _SOFT_ERRORS = tuple(
            getattr(pynvml, name) for name in (
                "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_NO_PERMISSION",
                "NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_NOT_FOUND",
                "NVML_ERROR_INVALID_ARGUMENT", "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
                "NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_UNKNOWN",
                "NVML_ERROR_INSUFFICIENT_SIZE", "NVML_ERROR_TIMEOUT")
            if hasattr(pynvml, name))
        _FATAL_ERRORS = tuple(
            getattr(pynvml, name) for name in (
                "NVML_ERROR_UNINITIALIZED", "NVML_ERROR_LIBRARY_NOT_FOUND",
                "NVML_ERROR_DRIVER_NOT_LOADED")
            if hasattr(pynvml, name))
        _UNAVAILABLE_ERRORS = tuple(
            getattr(pynvml, name) for name in (
                "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_NO_PERMISSION",
                "NVML_ERROR_FUNCTION_NOT_FOUND")
            if hasattr(pynvml, name))
        _nv = pynvml
        return pynvml


def check_available() -> None:
    """Raise NoGpuError, as init() would, where NVML cannot be used here; cheaply where it can.

    On Linux the driver's library is loaded and initialised directly (15 ms), without pynvml,
    whose import alone takes 0.1 s on an H100 machine: `run` checks this before the target
    starts and initialises pynvml while it starts. NVML counts its initialisations, so pynvml's
    later one finds it ready. Anything unexpected goes to init(), whose error is the one users know."""
    if _nv is not None:
        return
    import sys

    if not sys.platform.startswith("linux"):
        init()
        return
    try:
        import ctypes

        library = ctypes.CDLL("libnvidia-ml.so.1")  # the name pynvml loads on Linux
        answered = library.nvmlInit_v2()
    except (OSError, AttributeError):
        answered = None
    if answered != 0:  # 0 is NVML_SUCCESS
        init()  # says why, with pynvml's words for NVML's error


def available() -> bool:
    """True when NVML can be initialised here."""
    try:
        init()
        return True
    except NoGpuError:
        return False


def _call(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """Call an NVML function; *not available* becomes None."""
    try:
        return fn(*args, **kwargs)
    except _nv.NVMLError as exc:
        if exc.value in _FATAL_ERRORS:
            raise NoGpuError(f"NVML stopped working ({exc})") from exc
        return None


def _call_strict(fn: Callable, *args: Any) -> Any:
    """Like _call, but an error that is not *not available* raises CallFailed."""
    try:
        return fn(*args)
    except _nv.NVMLError as exc:
        if exc.value in _FATAL_ERRORS:
            raise NoGpuError(f"NVML stopped working ({exc})") from exc
        if exc.value in _UNAVAILABLE_ERRORS:
            return None
        raise CallFailed(str(exc)) from exc


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def devices() -> list[Device]:
    """Every GPU NVML sees, in NVML's (PCI) order."""
    nv = init()
    count = _call(nv.nvmlDeviceGetCount) or 0
    found = []
    for index in range(count):
        handle = _call(nv.nvmlDeviceGetHandleByIndex, index)
        if handle is None:
            continue
        pci = _call(nv.nvmlDeviceGetPciInfo, handle)
        mem = _call(nv.nvmlDeviceGetMemoryInfo, handle)
        found.append(Device(
            index=index,
            uuid=_text(_call(nv.nvmlDeviceGetUUID, handle)) or f"index-{index}",
            pci_bus_id=_text(pci.busId) if pci is not None else None,
            name=_text(_call(nv.nvmlDeviceGetName, handle)),
            total_bytes=int(mem.total) if mem is not None else None,
            handle=handle,
        ))
    return found


def memory_info(device: Device) -> MemoryInfo:
    """Used/free/total, with driver-reserved memory split out where the driver has v2."""
    nv = init()
    if hasattr(nv, "nvmlMemory_v2"):
        mem = _call(nv.nvmlDeviceGetMemoryInfo, device.handle, version=nv.nvmlMemory_v2)
        if mem is not None:
            return MemoryInfo(int(mem.total), int(mem.used), int(mem.free), int(mem.reserved))
    mem = _call(nv.nvmlDeviceGetMemoryInfo, device.handle)
    if mem is None:
        return MemoryInfo(None, None, None, None)
    return MemoryInfo(int(mem.total), int(mem.used), int(mem.free), None)


def _pick_processes_fn(handle: Any) -> Callable:
    """Probe the versioned process-list functions once; remember the first that works."""
    global _processes_fn
    if _processes_fn is None:
        nv = init()
        for name in ("nvmlDeviceGetComputeRunningProcesses_v3",
                     "nvmlDeviceGetComputeRunningProcesses_v2",
                     "nvmlDeviceGetComputeRunningProcesses"):
            fn = getattr(nv, name, None)
            if fn is None:
                continue
            try:
                fn(handle)
            except nv.NVMLError:
                continue
            _processes_fn = fn
            break
        else:
            _processes_fn = nv.nvmlDeviceGetComputeRunningProcesses
    return _processes_fn


def processes(device: Device, strict: bool = False) -> list[tuple[int, int | None]]:
    """(pid, used bytes or None) of each process with a CUDA context on the device.

    An error gives an empty list, unless `strict`: then a failed call (a GPU lost, an
    unknown error) raises CallFailed, and only *not available* gives an empty list."""
    fn = _pick_processes_fn(device.handle)
    listed = _call_strict(fn, device.handle) if strict else _call(fn, device.handle)
    if listed is None:
        return []
    out = []
    for proc in listed:
        used = getattr(proc, "usedGpuMemory", None)
        out.append((int(proc.pid), int(used) if used is not None else None))
    return out


def used_by(device: Device, pid: int) -> int | None:
    """Bytes the process holds on the device; 0 when it has no context there."""
    for listed_pid, used in processes(device):
        if listed_pid == pid:
            return used
    return 0


def find_device(uuid: str | None, pci_bus_id: str | None) -> Device | None:
    """The NVML device with this UUID, or else this PCI bus id (NVML counts in PCI order,
    torch in CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER order, so indexes do not match)."""
    found = devices()
    for device in found:
        if uuid and normalise_uuid(device.uuid) == normalise_uuid(uuid):
            return device
    for device in found:
        if pci_bus_id and device.pci_bus_id and device.pci_bus_id.lower() == pci_bus_id.lower():
            return device
    return None


def normalise_uuid(uuid: str) -> str:
    """NVML says 'GPU-43ff...', torch says '43ff...': compare without the prefix."""
    uuid = uuid.strip().lower()
    return uuid[4:] if uuid.startswith("gpu-") else uuid


def versions() -> dict:
    """Driver, NVML and CUDA driver versions (None where not available)."""
    nv = init()
    cuda = _call(nv.nvmlSystemGetCudaDriverVersion) if hasattr(nv, "nvmlSystemGetCudaDriverVersion") else None
    return {
        "driver": _text(_call(nv.nvmlSystemGetDriverVersion)),
        "nvml": _text(_call(nv.nvmlSystemGetNVMLVersion)),
        "cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None,
    }


class ProcessMemory:
    """One process's NVML figure on one device, read with buffers made once.

    The agent reads this inside the program it measures, many times a run: pynvml's own
    process list makes a dict and an object per process and a list each call, which come
    from free lists the program shares and move its garbage collector. This reading makes
    no container (ctypes' call takes its arguments in a tuple, from a free list that is
    never empty in practice). None when it cannot be read this way: use used_by().
    """

    def __init__(self, device: Device, pid: int, capacity: int = 64):
        import ctypes

        nv = init()
        fn = _pick_processes_fn(device.handle)
        name = getattr(fn, "__name__", "")
        struct = {"nvmlDeviceGetComputeRunningProcesses_v3": "c_nvmlProcessInfo_v3_t",
                  "nvmlDeviceGetComputeRunningProcesses_v2": "c_nvmlProcessInfo_v2_t"}.get(name)
        getter = getattr(nv, "_nvmlGetFunctionPointer", None)
        if struct is None or getter is None or not hasattr(nv, struct):
            raise NoGpuError(f"no direct process-list call for {name or fn!r}")
        self._call = getter(name)
        self._array = (getattr(nv, struct) * capacity)()
        self._count = ctypes.c_uint(0)
        self._count_ref = ctypes.byref(self._count)
        self._handle = device.handle
        self._pid = pid
        self._capacity = capacity
        self._missing = getattr(getattr(nv, "NVML_VALUE_NOT_AVAILABLE_ulonglong", None), "value", None)

    def used(self) -> int | None:
        """Bytes the process holds on the device, 0 when NVML does not list it, None when the
        list could not be read (more processes than the buffer holds, an NVML error)."""
        self._count.value = self._capacity
        if self._call(self._handle, self._count_ref, self._array) != 0:
            return None
        array = self._array
        for i in range(self._count.value):
            entry = array[i]
            if entry.pid == self._pid:
                used = entry.usedGpuMemory
                return None if used == self._missing else int(used)
        return 0


def torch_device_ids(props) -> tuple:
    """(UUID, PCI bus id in NVML's spelling) of torch's device properties, to find the device in
    NVML with `find_device`; None where absent. Pure: reads the properties object only."""
    uuid = str(getattr(props, "uuid", "") or "") or None
    pci = None
    if hasattr(props, "pci_bus_id"):
        pci = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    return uuid, pci
