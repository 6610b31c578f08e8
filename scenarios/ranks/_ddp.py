"""What the multi-rank scenarios share: one rank of a DDP (or FSDP) job under torch.distributed.run.

Each rank takes GPU `local_rank` when there is a GPU per rank (NCCL), else they share the GPUs
(gloo: two ranks on one GPU, which NCCL refuses). NVLink multicast stays off. A scenario that cannot
run here (no CUDA torch, fewer GPUs than it needs) exits 77 through scenarios/_common.py."""
import os
import sys

sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # scenarios/, for _common
from _common import need_cuda_torch as _need  # noqa: E402

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def need_cuda_torch(gpus: int = 1):
    torch = _need(gpus)
    for name, value in MULTICAST_OFF.items():
        os.environ.setdefault(name, value)
    return torch


def rank_and_device(torch):
    """(rank, local rank, world size, this rank's device); set_device comes first."""
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return rank, local_rank, world, device


def init(torch, world: int, device, backend=None, eager: bool = True) -> None:
    """NCCL where each rank of this node has a GPU of its own (LOCAL_WORLD_SIZE: one node's ranks),
    else gloo; `eager`: NCCL's communicator made now (device_id), not at the first collective."""
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    backend = backend or ("nccl" if torch.cuda.device_count() >= local else "gloo")
    dist.init_process_group(backend, device_id=device if backend == "nccl" and eager else None)


def model_and_optimizer(torch, device):
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 1024)).to(device)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
    return model, torch.optim.Adam(model.parameters(), lr=1e-4)


def step(torch, model, opt, device):
    x = torch.randn(256, 1024, device=device)
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


def train(torch, rank: int, model, opt, device, steps: int = 300) -> None:
    for i in range(steps):
        loss = step(torch, model, opt, device)
        if i % 100 == 0 and rank == 0:
            print(f"step {i} loss {loss.item():.4f}")


def finish(torch) -> None:
    import torch.distributed as dist

    torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()
