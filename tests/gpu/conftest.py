"""GPU tests: skipped unless NVML and a CUDA build of torch are both here."""
from __future__ import annotations

import pytest


def _gpu_reason() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no driver, no library
        return f"no NVML here ({exc})"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None


_REASON = _gpu_reason()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
            if _REASON:
                item.add_marker(pytest.mark.skip(reason=_REASON))
