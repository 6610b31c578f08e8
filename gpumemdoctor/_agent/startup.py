"""The agent's start-up: its environment, the wait for torch, and the devices it finds at CUDA's start.

The supervisor sets the variables of `gpumemdoctor.contract`; a launcher's variables say who the process
is in a distributed job (`dist_from_env`, read once for the hello record). Until the program
imports torch the agent only watches for that import (`TorchImportWatcher`); when torch has
started CUDA, `read_devices` lists the devices, each matched to NVML (`nvml.torch_device_ids`).
"""
from __future__ import annotations

import os
import sys
import time

from ..system.nvml import torch_device_ids


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


def hello(pid: int, interval_s: float, forked_from: int | None) -> dict:
    """The agent's first record: who this process is."""
    return {"type": "hello", "pid": pid, "ppid": os.getppid(), "t": time.monotonic(),
            "wall": time.time(), "argv": list(getattr(sys, "argv", [])),
            "python": sys.version.split()[0], "executable": sys.executable,
            "forked_from": forked_from, "interval_s": interval_s, "dist": _dist()}


class TorchImportWatcher:
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


def open_nvml():
    """gpumemdoctor's nvml module, initialised; None where NVML cannot be had."""
    try:
        from gpumemdoctor.system import nvml
        nvml.init()
        return nvml
    except Exception:
        return None


def read_devices(torch, nvml) -> list[dict]:
    """torch index, UUID, PCI bus id, name and NVML device (or None) of each device torch sees."""
    described = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        uuid, pci = torch_device_ids(props)
        nvml_device = nvml.find_device(uuid, pci) if nvml else None
        described.append({"index": index, "uuid": uuid, "pci_bus_id": pci, "name": props.name,
                          "nvml_device": nvml_device})
    return described


def devices_record(torch, devices: list[dict]) -> dict:
    """The record of the devices found, with the allocator's backend."""
    try:
        backend = torch.cuda.get_allocator_backend()
    except Exception:
        backend = None
    return {"type": "devices", "t": time.monotonic(), "allocator_backend": backend,
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "devices": [{k: v for k, v in d.items() if k != "nvml_device"}
                        | {"nvml_index": d["nvml_device"].index if d["nvml_device"] else None}
                        for d in devices]}
