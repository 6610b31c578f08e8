# expect: clean
# expect-finding: avoidable-peak
# expect-suspects-on: avoidable-peak
# expect-holder: thread 'MainThread': evaluate() at clean_eval_sum_without_no_grad.py local total
# expect-holder-kind: autograd-graph
"""An evaluation that sums its losses without .item() and without torch.no_grad(): model.eval()
does not stop autograd, so each batch's graph, with the activations it saved (20 MiB), stays alive
through `total`'s grad_fn chain until evaluate() returns: about 2.3 GiB for a third of a second,
three times, freed each time. Nothing grows with the run (clean), but the evaluation made the peak:
an avoidable-peak warning whose holder is the running sum, found by the search made at the
evaluation's height, and whose remedy is torch.no_grad() and loss.item()."""
import time

from _common import need_cuda_torch, train_steps

torch = need_cuda_torch()
model = torch.nn.Sequential(torch.nn.Linear(2048, 8192), torch.nn.ReLU(), torch.nn.Linear(8192, 1)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)


def evaluate():
    model.eval()
    total = 0.0
    for _ in range(120):
        time.sleep(0.002)  # the evaluation loader
        x = torch.randn(512, 2048, device="cuda")  # saved by the first layer's graph
        total = total + model(x).square().mean()  # allocates (what ReLU saves); should be .item(), under no_grad
    model.train()
    return total.item() / 120


for round_ in range(3):
    train_steps(torch, model, opt, 60, (512, 2048))
    print(f"evaluation {round_}: {evaluate():.4f}")
