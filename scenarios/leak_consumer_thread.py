# expect: leak
# expect-holder: thread 'consumer': consume() at leak_consumer_thread.py local seen[*]
# expect-holder-kind: frame-local
"""A consumer thread that keeps every batch it is handed in a local list. It is still running,
waiting for the next batch, when the program ends, so its frame keeps them all: 4 MiB a step."""
import queue
import threading

from _common import need_cuda_torch

torch = need_cuda_torch()
batches: queue.Queue = queue.Queue()


def consume():
    seen = []  # meant for a running statistic; keeps the tensors
    while True:
        seen.append(batches.get())


threading.Thread(target=consume, name="consumer", daemon=True).start()
model = torch.nn.Linear(1024, 1024).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for step in range(120):
    x = torch.randn(1024, 1024, device="cuda")  # allocates 4 MiB a step, handed to the consumer
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    batches.put(x)
    torch.cuda.synchronize()
print("done; the consumer is still waiting")
