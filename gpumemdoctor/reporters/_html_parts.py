"""The parts of a breakdown as the HTML page draws them: its bar's parts and its table's small print."""
from __future__ import annotations

import html

from ..diagnosis.findings import Breakdown
from ..units import format_bytes as fb
from .terminal import AFTER_NCCL_WORDS, nccl_words

PARTS = [("CUDA context", "context_bytes", "#9d9da1"), ("live tensors", "live_tensor_bytes", "#e45756"),
         ("garbage cycles", "garbage_bytes", "#b279a2"), ("pending stream", "pending_stream_bytes", "#eeca3b"),
         ("allocator cache", "cache_bytes", "#4c78a8"), ("outside PyTorch", "non_torch_bytes", "#72b7b2")]
# The memory outside PyTorch itemised (gpumemdoctor/diagnosis/non_torch.py): its bar is drawn in these parts
# where the breakdown has them, as one where it has not (a process seen only through NVML).
OUTSIDE_PARTS = [("outside: NCCL", "non_torch_nccl_bytes", "#b6992d"),
                 ("outside: in warm-up", "non_torch_warmup_bytes", "#9fd4cf"),
                 ("outside: CuPy's pool", "non_torch_cupy_bytes", "#54a24b"),
                 ("outside: the rest", "non_torch_rest_bytes", "#2f7f7a")]


def bar_part(b: Breakdown, key: str) -> int | None:
    """A part of the breakdown's bar: the memory outside PyTorch in its parts where it has them."""
    itemised = b.non_torch_warmup_bytes is not None
    if key == "non_torch_bytes" and itemised or key in {k for _, k, _ in OUTSIDE_PARTS} and not itemised:
        return None
    return getattr(b, key)


def within(b: Breakdown, key: str) -> str:
    """The parts measured within a cell of the breakdown's table, in small print (HTML)."""
    if key == "context_bytes" and b.context_after_nccl:
        return _small(f"read {AFTER_NCCL_WORDS}")
    if key == "live_tensor_bytes" and b.cublas_workspace_bytes:
        return _small(f"cuBLAS workspaces {fb(b.cublas_workspace_bytes)}")
    if key == "cache_bytes" and b.private_pool_bytes:
        return _small(f"CUDA graph pools {fb(b.private_pool_bytes)} (of PyTorch's memory)")
    if key == "non_torch_bytes" and b.non_torch_warmup_bytes is not None:
        parts = [f"in warm-up {fb(b.non_torch_warmup_bytes)}"]
        if b.non_torch_nccl_bytes is not None:
            parts.insert(0, f"NCCL {fb(b.non_torch_nccl_bytes)}, came with its process groups "
                            f"({nccl_words(b.nccl_env)})")
        if b.non_torch_cupy_bytes is not None:
            parts.append(f"CuPy's pool {fb(b.non_torch_cupy_bytes)}")
        parts.append(f"the rest {fb(b.non_torch_rest_bytes)}")
        in_use = b.nccl and b.non_torch_nccl_bytes is None
        return _small(" · ".join(parts) + ("; NCCL in use (not measured apart)" if in_use else ""))
    return ""


def _small(text: str) -> str:
    return f"<br><small>{html.escape(text, quote=True)}</small>"
