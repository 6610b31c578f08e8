# expect: clean
"""Training in a child process started with multiprocessing's "spawn", as launchers and notebooks
do: the parent never touches CUDA; the child trains an MLP with AdamW and returns its last loss
through a queue. Nothing is kept."""
import multiprocessing as mp

from _common import StepClock, device, need, scaled

torch = need("torch")


def train(queue):
    dev = device(torch)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(scaled(2048, 64), scaled(2048, 64)), torch.nn.GELU())
                                  for _ in range(6)]).to(dev)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    clock = StepClock()
    loss = None
    for step in range(scaled(400)):
        x = torch.randn(scaled(256, 8), scaled(2048, 64), device=dev)
        loss = model(x).square().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss.item()
        clock.tick()
    clock.report()
    queue.put(loss.item())


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=train, args=(queue,))
    child.start()
    print(f"child's last loss {queue.get():.4f}")
    child.join()
