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


def train_steps(torch, model, opt, steps, shape):
    """`steps` optimizer steps on random batches of `shape`, each synchronized: the training
    between two evaluations of the validation scenarios."""
    for _ in range(steps):
        x = torch.randn(*shape, device="cuda")
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
