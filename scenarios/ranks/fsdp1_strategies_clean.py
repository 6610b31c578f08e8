# expect: clean
# launch: 2
# needs-gpus: 2
"""FSDP1 (`FullyShardedDataParallel`) on two ranks, with each sharding strategy in turn: FULL_SHARD,
SHARD_GRAD_OP, NO_SHARD and HYBRID_SHARD (one node: sharded over its GPUs), 40 AdamW steps each, the
model and optimizer dropped before the next. FSDP frees its gathered parameters and its buffers with
record_stream on its own streams at every step; nothing is kept: clean on every rank."""
from _ddp import finish, init, need_cuda_torch, rank_and_device

torch = need_cuda_torch(gpus=2)
from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy  # noqa: E402

rank, local_rank, world, device = rank_and_device(torch)
init(torch, world, device, backend="nccl")
for strategy in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"):
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(2048, 2048), torch.nn.ReLU()]
    model = FullyShardedDataParallel(torch.nn.Sequential(*layers).to(device), device_id=device,
                                     sharding_strategy=getattr(ShardingStrategy, strategy))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for i in range(40):
        x = torch.randn(1024, 2048, device=device)
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    if rank == 0:
        print(f"{strategy}: loss {loss.item():.4f}")
    del model, opt, x, loss
finish(torch)
