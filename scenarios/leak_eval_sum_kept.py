# expect: leak
# expect-holder: __main__.val_total
# expect-holder-kind: autograd-graph
"""The chain is a container: validation losses summed without .item() into a total that lives for
the whole run (for a log line at the end). Each evaluation's graphs join the chain and stay: memory
is flat while the model trains and steps up by about 600 MiB at each of two evaluations (the
second after the last training step). The running sum is an accumulation held by its name that
grows with the run: a leak. The other side: clean_eval_sum_without_no_grad.py, where the sum is a
local that goes when the evaluation returns."""
import time

from _common import need_cuda_torch, train_steps

torch = need_cuda_torch()
model = torch.nn.Sequential(torch.nn.Linear(2048, 8192), torch.nn.ReLU(), torch.nn.Linear(8192, 1)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
val_total = 0.0


def evaluate():
    global val_total
    model.eval()
    for _ in range(30):
        time.sleep(0.01)  # the evaluation loader
        x = torch.randn(512, 2048, device="cuda")  # saved by the first layer's graph
        val_total = val_total + model(x).square().mean()  # allocates; should be .item(): the chain keeps every graph
    torch.cuda.synchronize()
    model.train()


for round_ in range(2):
    train_steps(torch, model, opt, 80, (512, 2048))
    evaluate()
print(f"validation total {float(val_total):.3f}")
