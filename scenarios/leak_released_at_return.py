# expect: leak
# expect-holder: thread 'MainThread': train() at leak_released_at_return.py local outputs[*]
# expect-holder-kind: frame-local
"""A training function, run in a process started with multiprocessing's "spawn", keeps each step's
output in a local list (64 MiB a step, 80 steps: 5 GiB), then returns its last loss. The list is
freed only because the function returned: the same loop, run longer, runs out of memory."""
import multiprocessing as mp

from _common import need_cuda_torch


def train(queue):
    torch = need_cuda_torch()
    model = torch.nn.Linear(4096, 4096).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    outputs = []
    for step in range(80):
        x = torch.randn(4096, 4096, device="cuda")
        out = model(x)  # allocates
        loss = out.square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        outputs.append(out.detach())  # "for the plot at the end"
        torch.cuda.synchronize()
    queue.put(loss.item())


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=train, args=(queue,))
    child.start()
    print(f"last loss {queue.get():.4f}")
    child.join()
