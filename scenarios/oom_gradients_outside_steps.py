# expect: out-of-memory
# expect-exit: 1
# expect-cause: full
# expect-fit: gradients
"""Training, then an evaluation that runs out of memory while the last step's gradients are still
held: AdamW over four large layers (sized from the GPU's free memory: parameters P a sixth of it,
gradients as much, AdamW's state twice that), zero_grad(set_to_none=True) at the start of each step
only, so the last step's .grad stay; then an evaluation, under torch.no_grad(), of a batch whose
input and two activations (0.8 P each) do not fit in the 2 P left. Freeing the gradients first
(optimizer.zero_grad(set_to_none=True) before evaluating) would have made it fit."""
from _common import need_cuda_torch

torch = need_cuda_torch()
free, _ = torch.cuda.mem_get_info()
P = free // 6  # the parameters' bytes
width = int((P // 4 // 4) ** 0.5)  # four square layers of float32
model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(4)]).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(3):
    opt.zero_grad(set_to_none=True)
    loss = model(torch.randn(16, width, device="cuda")).square().mean()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
# The evaluation: its input and two activations of 0.8 P each, at once.
rows = int(0.8 * P) // (width * 4)
with torch.no_grad():
    out = model(torch.randn(rows, width, device="cuda"))  # runs out of memory here, .grad still held
print("evaluated", out.shape)
