"""Helpers shared by the scenarios: skip cleanly where the GPU stack is missing."""
import sys

SKIP_EXIT = 77  # the scenario cannot run here (no CUDA torch, no CuPy, too few GPUs): tests skip on it


def need_cuda_torch(gpus: int = 1):
    """torch, when it sees at least `gpus` CUDA devices; else exit SKIP_EXIT with the reason."""
    try:
        import torch
    except ImportError:
        print("skip: torch is not installed", file=sys.stderr)
        sys.exit(SKIP_EXIT)
    if not torch.cuda.is_available():
        print("skip: torch sees no CUDA device", file=sys.stderr)
        sys.exit(SKIP_EXIT)
    if torch.cuda.device_count() < gpus:
        print(f"skip: this scenario needs {gpus} CUDA device(s)", file=sys.stderr)
        sys.exit(SKIP_EXIT)
    return torch
