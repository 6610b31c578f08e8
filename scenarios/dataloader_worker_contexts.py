# expect: child-contexts
"""A DataLoader whose worker_init_fn touches CUDA (set_device and a tiny tensor, meant to
"prepare" the GPU): each of the 6 spawned workers creates a CUDA context of its own, about
500 MiB each, while the main process trains a small model. persistent_workers=False, so a new
set of workers, with new contexts, is started for each of the two epochs.

With the spawn start method each worker imports this file again as `__mp_main__`, with the
parent's sys.path (so `_common` is found): the module level must only define things, and the
training runs under the __main__ guard. need_cuda_torch() at module level does not exit in a
worker: a worker only starts where the parent already found CUDA."""
from _common import need_cuda_torch

torch = need_cuda_torch()


class Samples(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = torch.randn(1024, generator=torch.Generator().manual_seed(i))
        return x, int(x[0] > 0)


def init_worker(worker_id):
    torch.cuda.set_device(0)  # the mistake: the worker now has a CUDA context of its own
    torch.zeros(1, device="cuda")


if __name__ == "__main__":
    loader = torch.utils.data.DataLoader(Samples(16384), batch_size=256, shuffle=True, num_workers=6,
                                         multiprocessing_context="spawn", persistent_workers=False,
                                         worker_init_fn=init_worker)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 2)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    for epoch in range(2):
        for x, y in loader:
            x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        torch.cuda.synchronize()
    print(f"2 epochs, loss {loss.item():.3f}")
