"""What the agent's local socket answers `gpumemdoctor watch` (system/agent_socket.py): the latest
figures of each device, read when asked, on the socket's thread."""
from __future__ import annotations


def stats(shared, sampler) -> dict:
    """The process, its steps, and each device's allocator and NVML figures, read now."""
    from gpumemdoctor.system.agent_socket import STATS_SCHEMA

    torch = shared.torch
    rows = []
    if torch is not None and shared.devices and torch.cuda.is_initialized():
        for row in sampler.read_devices():
            d = next((d for d in shared.devices if d["index"] == row[0]), None)
            nvml_device = d["nvml_device"] if d else None
            rows.append({"torch_index": row[0], "nvml_index": nvml_device.index if nvml_device else None,
                         "allocated_bytes": row[1], "active_bytes": row[2], "reserved_bytes": row[3],
                         "nvml_bytes": row[5], "context_bytes": sampler.context.get(row[0])})
    return {"schema": STATS_SCHEMA, "pid": shared.pid, "steps": shared.steps,
            "torch_version": str(torch.__version__) if torch is not None else None,
            "cuda": bool(torch is not None and torch.cuda.is_initialized()), "devices": rows}
