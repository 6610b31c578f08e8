# expect: clean
# expect-finding: avoidable-peak
"""An evaluation without torch.no_grad() that lasts well under 100 ms: 10 batches (about 20 ms on an
H100) whose losses are summed as tensors, so every batch's autograd graph, with what it saved, lives until the evaluation
returns. It falls between two of the tool's samples, or most of it does; PyTorch's allocated peak
counter and its allocation events see all of it. The program prints what the graphs held (allocated memory at the loop's
end, less what was allocated before it) and how long the evaluation took on a `peak-truth:` line."""
import json
import sys
import time

from _common import need_cuda_torch, train_steps

torch = need_cuda_torch()
model = torch.nn.Sequential(torch.nn.Linear(4096, 8192), torch.nn.ReLU(), torch.nn.Linear(8192, 1)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
truth = {}


def evaluate():
    torch.cuda.synchronize()
    started = time.perf_counter()
    before = torch.cuda.memory_allocated()
    total = 0.0
    for _ in range(10):
        x = torch.randn(1024, 4096, device="cuda")
        total = total + model(x).square().mean()  # keeps the graph: should be .item(), under no_grad
    torch.cuda.synchronize()
    truth["graphs_kept"] = torch.cuda.memory_allocated() - before
    result = total.item() / 10
    truth["seconds"] = time.perf_counter() - started
    return result


train_steps(torch, model, opt, 30, (1024, 4096))
print(f"evaluation: {evaluate():.4f}")
train_steps(torch, model, opt, 30, (1024, 4096))
print("peak-truth: " + json.dumps(truth), file=sys.stderr)
