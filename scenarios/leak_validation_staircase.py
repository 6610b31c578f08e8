# expect: leak
# expect-holder: __main__.kept_predictions[*]
# expect-holder-kind: global
"""Training with a validation after each of two epochs that keeps every batch's predictions "to
look at later" (32 MiB each, 16 a validation) and never lets them go. Memory is flat while the
model trains and steps up by 512 MiB at each validation: a staircase, with no steady slope for the
growth rule (two steps, the second after the last training step). Each validation adds a step: a
third epoch would add a third. The other side of the line: clean_validation_ring.py (a ring filled
once) and clean_validation_outputs_cleared.py (cleared at each validation's end)."""
import time

from _common import need_cuda_torch, train_steps

torch = need_cuda_torch()
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 8192)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
kept_predictions = []


def validate():
    model.eval()
    with torch.no_grad():
        for _ in range(16):
            time.sleep(0.02)  # the validation loader
            x = torch.randn(1024, 1024, device="cuda")
            kept_predictions.append(model(x))  # allocates: 32 MiB, kept for good
            torch.cuda.synchronize()
    model.train()


for epoch in range(2):
    train_steps(torch, model, opt, 80, (256, 1024))
    validate()
print(f"kept {len(kept_predictions)} predictions")
