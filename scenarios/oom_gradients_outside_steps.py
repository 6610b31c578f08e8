# expect: out-of-memory
# expect-exit: 1
# expect-cause: full
# expect-fit: gradients
"""Training, then an evaluation that runs out of memory while the last step's gradients are still
held: AdamW over four large layers (sized from the GPU's free memory: parameters a fifth of it,
gradients as much, AdamW's state twice that), zero_grad(set_to_none=True) at the start of each step
only, so the last step's .grad stay; then an evaluation, under torch.no_grad(), of a batch whose
activations do not fit in what is left. Freeing the gradients first (optimizer.zero_grad(
set_to_none=True) before evaluating) would have made it fit."""
from _common import need_cuda_torch

torch = need_cuda_torch()
free, _ = torch.cuda.mem_get_info()
width = int((free // 5 // 4 // 4) ** 0.5)  # four square layers of float32: parameters = free / 5
model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(4)]).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(3):
    opt.zero_grad(set_to_none=True)
    loss = model(torch.randn(16, width, device="cuda")).square().mean()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
# The evaluation: two activations of a fifth of the first free memory each, at once.
rows = (free // 5) // (width * 4)
with torch.no_grad():
    out = model(torch.randn(rows, width, device="cuda"))  # runs out of memory here, .grad still held
print("evaluated", out.shape)
