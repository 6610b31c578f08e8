# expect: clean
"""FSDP (`FullyShardedDataParallel`, NO_SHARD) on one rank, one GPU: the form a single-GPU test of an
FSDP model takes. FSDP frees its buffers with record_stream on its own streams at every step, so at
any moment, the end too, gigabytes are counted `active` whose work finished long before (on an H100,
10.2 GiB at step 50, at step 51 and at the end of such a run, and 0 after one more allocation).
Nothing is kept: clean, not pending-stream."""
import os

from _common import need_cuda_torch

for name, value in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                    "NVSHMEM_DISABLE_NVLS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29531",
                    "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
    os.environ.setdefault(name, value)

torch = need_cuda_torch()
import torch.distributed as dist  # noqa: E402
from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy  # noqa: E402

torch.cuda.set_device(0)
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
layers = []
for _ in range(4):
    layers += [torch.nn.Linear(4096, 4096), torch.nn.ReLU()]
model = FullyShardedDataParallel(torch.nn.Sequential(*layers).cuda(), sharding_strategy=ShardingStrategy.NO_SHARD,
                                 device_id=0)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(100):
    x = torch.randn(2048, 4096, device="cuda")
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if step % 25 == 0:
        print(f"step {step} loss {loss.item():.4f}")
torch.cuda.synchronize()
dist.destroy_process_group()
