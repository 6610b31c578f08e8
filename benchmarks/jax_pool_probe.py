"""What JAX shows of XLA's preallocated pool, and when it stops showing it (issue 32's JAX row).

Prints, at PyTorch's first allocation and again from an atexit hook registered before JAX was
imported (as the agent's is), the backends xla_bridge keeps, each GPU device's platform and its
memory_stats() fields. Run on a GPU machine with JAX and torch:

    XLA_PYTHON_CLIENT_MEM_FRACTION=.15 python3 benchmarks/jax_pool_probe.py
"""
from __future__ import annotations

import atexit
import sys


def show(when: str) -> None:
    bridge = sys.modules.get("jax._src.xla_bridge")
    backends = getattr(bridge, "_backends", None)
    print(f"{when}: xla_bridge._backends = {sorted(backends) if backends is not None else None}")
    for name, backend in (backends or {}).items():
        for device in backend.local_devices():
            stats = device.memory_stats() or {}
            print(f"  {name}: device {device.id} platform {device.platform!r}: "
                  + ", ".join(f"{k}={v}" for k, v in sorted(stats.items())))


atexit.register(show, "atexit (registered before JAX)")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402

jnp.ones((1024, 1024), device=jax.devices("gpu")[0]).block_until_ready()
x = torch.ones(1 << 20, device="cuda")
torch.cuda.synchronize()
show("at PyTorch's first allocation")
