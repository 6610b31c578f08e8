"""Which of a process's CUDA contexts is stray: the one rule, shared by the diagnosis of a finished
run (diagnosis/ranks.py) and by what looks at a running job (live/stray.py for `ps` and `watch`).
Pure.

A process works on one GPU: the one where its PyTorch reserved the most. Memory it holds on
another GPU is a stray context when its PyTorch reserved nothing there while it did on its own
GPU, or when that GPU is another rank's and it reserved there under STRAY_SHARE of what it reserved
on its own (a tensor made before `set_device`). Where no reservation is known (a rank without an
agent, seen from outside), only the second rule can tell, on NVML's figures alone.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping

STRAY_SHARE = 0.25  # of its own GPU's reserved peak: a rank reserving less on another rank's GPU strayed there

UNRESERVED = "unreserved"  # its PyTorch reserved nothing there
OTHER_RANKS = "another-rank"  # another rank's GPU, where it reserved little or nothing


def own_gpu(reserved: Mapping[int, int | None]) -> int | None:
    """The GPU where PyTorch reserved the most (the lowest index of a tie); None where it reserved
    nothing."""
    known = [(size, -gpu, gpu) for gpu, size in reserved.items() if size]
    return max(known)[2] if known else None


def stray_reason(gpu: int, mine: int | None, reserved: Mapping[int, int | None],
                 others: Collection[int]) -> str | None:
    """Why `gpu` is a stray context of a process whose own GPU is `mine` (UNRESERVED, OTHER_RANKS),
    or None where it is not. `reserved`: GPU -> what its PyTorch reserved there (empty when not
    known); `others`: the other ranks' own GPUs (empty for a process that is no rank)."""
    if gpu == mine:
        return None
    there = reserved.get(gpu) or 0
    if reserved and not there and reserved.get(mine):
        return UNRESERVED
    if gpu in others and (not reserved or there < STRAY_SHARE * (reserved.get(mine) or 0)):
        return OTHER_RANKS
    return None
