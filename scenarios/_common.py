"""Helpers shared by the scenarios: skip cleanly where the GPU stack is missing."""
import sys

SKIP_EXIT = 77  # the scenario cannot run here (no CUDA torch, no CuPy): tests skip on it


def need_cuda_torch():
    try:
        import torch
    except ImportError:
        print("skip: torch is not installed", file=sys.stderr)
        sys.exit(SKIP_EXIT)
    if not torch.cuda.is_available():
        print("skip: torch sees no CUDA device", file=sys.stderr)
        sys.exit(SKIP_EXIT)
    return torch
