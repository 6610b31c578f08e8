"""The limit in force on one process's memory on one GPU: what every "would fit", headroom figure and
time to full is held to. Pure.

The device's total (NVML's, which a MIG slice's handle gives as the slice's), unless the program set
a per-process memory fraction (torch.cuda.set_per_process_memory_fraction): then what it allows, read
by the agent at exit (`memory_fraction`) or given by PyTorch's out-of-memory observer, whose limit is
the fraction's bytes where one is set (the error's "N GiB allowed") and the device's total where not;
the agent also reads the fraction itself at the error.
What other processes hold is in the device's free memory, which the headroom takes too (fit.headroom).
"""
from __future__ import annotations

DEVICE, FRACTION = "device", "memory-fraction"
# An observer's limit this much below NVML's total is a fraction's, in recordings that do not say the
# fraction: PyTorch's own total (cudaMemGetInfo's) is up to about 0.6% below NVML's (an H100: 85.03 GB of 85.52).
BELOW_TOTAL_SHARE = 0.98


def in_force(agent, torch_index: int, total_bytes: int | None) -> tuple[int | None, str | None]:
    """(bytes, source) of the limit on this process's memory on this device: FRACTION with what the
    fraction allows, DEVICE with the device's total, (None, None) where neither was read."""
    parts = (agent.exit_info or {}).get("parts") or {}
    for index, fraction, allowed in parts.get("memory_fraction") or []:
        if index == torch_index and fraction < 1.0:
            return allowed, FRACTION
    ooms = [o for o in agent.root.get("ooms", []) if o["device"] == torch_index]
    for o in ooms:
        if o.get("memory_fraction") is not None:
            return (o["limit_bytes"], FRACTION) if o["memory_fraction"] < 1.0 else (o["limit_bytes"], DEVICE)
    limits = [o["limit_bytes"] for o in ooms]
    if limits and total_bytes and min(limits) < BELOW_TOTAL_SHARE * total_bytes:
        return min(limits), FRACTION
    if total_bytes:
        return total_bytes, DEVICE
    if limits:
        return max(limits), DEVICE
    return None, None
