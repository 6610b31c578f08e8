"""nvml.py over the NVML test double (tests/doubles/pynvml): device matching, memory, processes."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from gpumemdoctor.system import nvml

DOUBLE = Path(__file__).parent / "doubles" / "pynvml" / "__init__.py"
GIB = 1 << 30


@pytest.fixture
def double(tmp_path, monkeypatch):
    state = tmp_path / "nvml.json"
    state.write_text(json.dumps({"gpus": [
        {"uuid": "GPU-aaaa-0", "name": "first", "total": 80 * GIB, "used": 2 * GIB, "reserved": GIB // 2,
         "processes": [{"pid": 11, "used": GIB}, {"pid": 12, "used": None}]},
        {"uuid": "GPU-BBBB-1", "name": "second", "total": 80 * GIB, "used": 0, "reserved": 0, "processes": []},
    ]}))
    monkeypatch.setenv("GPUMEMDOCTOR_TEST_NVML", str(state))
    spec = importlib.util.spec_from_file_location("pynvml", DOUBLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.setattr(nvml, "_nv", None)
    monkeypatch.setattr(nvml, "_processes_fn", None)
    yield module
    monkeypatch.setattr(nvml, "_nv", None)
    monkeypatch.setattr(nvml, "_processes_fn", None)


def test_devices_and_matching_by_uuid_then_pci(double):
    found = nvml.devices()
    assert [(d.index, d.uuid, d.pci_bus_id) for d in found] == [
        (0, "GPU-aaaa-0", "00000000:00:00.0"), (1, "GPU-BBBB-1", "00000000:01:00.0")]
    # torch spells UUIDs without the prefix; case does not matter
    assert nvml.find_device("bbbb-1", None).index == 1
    assert nvml.find_device("GPU-AAAA-0", None).index == 0
    # a UUID that matches nothing falls back to the PCI bus id, as CUDA_VISIBLE_DEVICES renumbers
    assert nvml.find_device("cccc", "00000000:01:00.0").index == 1
    assert nvml.find_device("cccc", None) is None


def test_memory_info_v2_splits_the_drivers_reservation(double):
    first = nvml.devices()[0]
    mem = nvml.memory_info(first)
    assert (mem.used_bytes, mem.reserved_bytes) == (2 * GIB, GIB // 2)
    del double.nvmlMemory_v2  # a driver with only v1
    mem = nvml.memory_info(first)
    assert mem.used_bytes == 2 * GIB + GIB // 2 and mem.reserved_bytes is None


def test_processes_and_not_available(double):
    first = nvml.devices()[0]
    assert nvml.processes(first) == [(11, GIB), (12, None)]
    assert nvml.used_by(first, 11) == GIB
    assert nvml.used_by(first, 12) is None  # listed, figure not available: None, never 0
    assert nvml.used_by(first, 99) == 0  # not listed: no context on this device


def test_soft_errors_become_none(double):
    def refuse(*args, **kwargs):
        raise double.NVMLError(double.NVML_ERROR_NOT_SUPPORTED)

    nvml.devices()
    double.nvmlDeviceGetName = refuse
    assert nvml.devices()[0].name is None
