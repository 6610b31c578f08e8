"""What the FSDP scenarios share: a model sharded over the ranks with FSDP2's `fully_shard` (PyTorch
2.6 and later), or FSDP's `FullyShardedDataParallel` where that is all there is."""


def sharded_model_and_optimizer(torch, device):
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 1024)).to(device)
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed.fsdp import FullyShardedDataParallel

        model = FullyShardedDataParallel(model, device_id=device)
    else:
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    return model, torch.optim.Adam(model.parameters(), lr=1e-4)


def fsdp_step(torch, model, opt, device):
    """One step; returns the output (a rank that keeps it leaks 4 MiB a step)."""
    x = torch.randn(1024, 1024, device=device)
    out = model(x)
    loss = out.square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return out
