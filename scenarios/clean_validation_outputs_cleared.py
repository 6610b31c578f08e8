# expect: clean
# expect-finding: avoidable-peak
# expect-suspects-on: avoidable-peak
# expect-holder: __main__.validation_step_outputs[*]
# expect-holder-kind: global
"""Lightning's documented pattern, in plain PyTorch: each validation batch's outputs go into
`validation_step_outputs`, the epoch's metric is computed from them at the validation's end, and
the list is cleared (on_validation_epoch_end). Three epochs; each validation gathers 64 outputs of
8 MiB (512 MiB) and lets them go, reaching the same height each time: not a leak (clean), but what
made the run's peak, reported as an avoidable-peak warning with the list as its holder (found by the
search made at the validation's height)."""
import time

from _common import need_cuda_torch, train_steps

torch = need_cuda_torch()
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 2048)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
validation_step_outputs = []


def validation_epoch():
    model.eval()
    with torch.no_grad():
        for _ in range(64):
            time.sleep(0.005)  # the validation loader
            x = torch.randn(1024, 1024, device="cuda")
            validation_step_outputs.append(model(x))  # allocates: 8 MiB until the epoch's end
            torch.cuda.synchronize()
    metric = torch.cat(validation_step_outputs).abs().mean().item()
    validation_step_outputs.clear()  # on_validation_epoch_end
    model.train()
    return metric


for epoch in range(3):
    train_steps(torch, model, opt, 80, (256, 1024))
    print(f"epoch {epoch}: {validation_epoch():.4f}")
