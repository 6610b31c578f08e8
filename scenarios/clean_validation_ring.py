# expect: clean
"""A validation after each of three epochs keeps the last 16 predictions (32 MiB each) in a ring,
collections.deque(maxlen=16), to show them at the end. The first validation fills it (512 MiB, one
step up); the later ones replace what is in it, so memory stays at that height: filled once, not a
staircase (the other side of the line from leak_validation_staircase.py). Clean, with the ring shown
as live at exit."""
import collections
import time

from _common import need_cuda_torch, train_steps

torch = need_cuda_torch()
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 8192)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
recent_predictions = collections.deque(maxlen=16)


def validate():
    model.eval()
    with torch.no_grad():
        for _ in range(16):
            time.sleep(0.02)  # the validation loader
            x = torch.randn(1024, 1024, device="cuda")
            recent_predictions.append(model(x))  # the ring drops its oldest
            torch.cuda.synchronize()
    model.train()


for epoch in range(3):
    train_steps(torch, model, opt, 80, (256, 1024))
    validate()
print(f"ring of {len(recent_predictions)}")
