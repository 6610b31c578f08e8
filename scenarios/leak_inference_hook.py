# expect: leak
# expect-holder: __main__.seen[*]
"""Inference under no_grad with a forward hook, left over from debugging, that appends the first
layer's output to a module-level list. Each output is 1024 x 1024 floats, so the list grows by
4 MiB a batch: 320 MiB after 80 batches. No optimizer and no step marks."""
from _common import need_cuda_torch

torch = need_cuda_torch()
seen = []


def keep_output(module, args, output):
    seen.append(output)  # meant to look at one batch; keeps them all


model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).cuda().eval()
model[0].register_forward_hook(keep_output)
predictions = []
with torch.no_grad():
    for batch in range(80):
        x = torch.randn(1024, 1024, device="cuda")
        logits = model(x)  # allocates the first layer's 4 MiB output, which the hook keeps
        predictions.append(logits.argmax(dim=1).cpu())
print(f"{len(predictions)} batches predicted")
