"""NVML test double (ring 2 only): a stand-in for the `pynvml` module that serves a state
read from the JSON file named by GPUMEMDOCTOR_TEST_NVML. It answers only the calls
gpumemdoctor makes. It never stands in for a real GPU in tests/gpu.

Faults, for the tests of a run whose NVML breaks: `"error": N` in the state makes every
call raise NVMLError(N); `"lost": [index, ...]` makes every call on those devices raise
NVML_ERROR_GPU_IS_LOST. The state is read afresh on every call, so a test (or the target
itself) can break NVML mid-run by rewriting the file (write a copy, then rename it).
"""
import json
import os
from types import SimpleNamespace

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
nvmlMemory_v2 = 0x02000028


class NVMLError(Exception):
    def __init__(self, value):
        super().__init__(f"NVML test double error {value}")
        self.value = value


def _state():
    with open(os.environ["GPUMEMDOCTOR_TEST_NVML"]) as f:
        state = json.load(f)
    if state.get("error"):
        raise NVMLError(state["error"])
    return state


def _gpu(handle):
    state = _state()
    if handle in state.get("lost", []):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return state["gpus"][handle]


def nvmlInit():
    _state()


def nvmlDeviceGetCount():
    return len(_state()["gpus"])


def nvmlDeviceGetHandleByIndex(index):
    return index


def nvmlDeviceGetPciInfo(handle):
    _gpu(handle)
    return SimpleNamespace(busId=f"00000000:{handle:02x}:00.0")


def nvmlDeviceGetUUID(handle):
    return _gpu(handle)["uuid"]


def nvmlDeviceGetName(handle):
    return _gpu(handle)["name"]


def nvmlDeviceGetMemoryInfo(handle, version=None):
    g = _gpu(handle)
    reserved = g.get("reserved", 0)
    if version is None:  # v1: used holds the driver's reservation
        return SimpleNamespace(total=g["total"], used=g["used"] + reserved, free=g["total"] - g["used"] - reserved)
    return SimpleNamespace(total=g["total"], used=g["used"], free=g["total"] - g["used"] - reserved,
                           reserved=reserved)


def nvmlDeviceGetComputeRunningProcesses(handle):
    return [SimpleNamespace(pid=p["pid"], usedGpuMemory=p["used"]) for p in _gpu(handle)["processes"]]


nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses


def nvmlSystemGetDriverVersion():
    _state()
    return "000.00 (NVML test double)"


def nvmlSystemGetNVMLVersion():
    _state()
    return "0.0 (NVML test double)"


def nvmlSystemGetCudaDriverVersion():
    _state()
    return 13000
