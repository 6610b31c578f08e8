# expect: clean
# expect-finding: avoidable-peak
# expect-args: --max-pause 0.1
"""An evaluation without torch.no_grad() that sums its losses without .item(): each batch's autograd
graph, with what it saved, stays alive through `total` until the function returns. The program
measures what the graphs held (allocated memory at the end of the loop, less what was allocated
before it and the last batch's own input) and prints it on a `peak-truth:` line; the GPU test
finds it in the peak's `graphs-kept` part, held by `evaluate() local total`."""
import json
import sys
import time

from _common import need_cuda_torch, train_steps

torch = need_cuda_torch()
model = torch.nn.Sequential(torch.nn.Linear(2048, 8192), torch.nn.ReLU(), torch.nn.Linear(8192, 1)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
truth = {}


def evaluate():
    model.eval()
    before = torch.cuda.memory_allocated()
    total = 0.0
    for _ in range(100):
        time.sleep(0.003)  # the evaluation loader
        x = torch.randn(512, 2048, device="cuda")
        total = total + model(x).square().mean()  # keeps the graph: should be .item(), under no_grad
    torch.cuda.synchronize()
    truth["graphs_kept"] = torch.cuda.memory_allocated() - before - x.untyped_storage().nbytes()
    time.sleep(0.3)  # the evaluation's end: metrics written, a checkpoint saved
    model.train()
    return total.item() / 100


train_steps(torch, model, opt, 40, (512, 2048))
print(f"evaluation: {evaluate():.4f}")
train_steps(torch, model, opt, 10, (512, 2048))
print("peak-truth: " + json.dumps(truth), file=sys.stderr)
