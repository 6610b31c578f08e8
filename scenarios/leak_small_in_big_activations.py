# expect: leak
"""Sensitivity: a 1 MiB-per-step leak under 1-2 GiB of activations per step.

Each step pushes a 131072-row batch through an MLP: the input is 256 MiB, the hidden
activations 512 MiB each, and backward frees them all. The loop keeps a 1 MiB slice of
the hidden activations every step (cloned, so the big tensor itself is freed): exactly
50 MiB over exactly 50 optimizer steps. The floor at step boundaries rises by 1 MiB a
step while each step's transient memory is over a thousand times that. The layers are
narrow so that a step takes about 10-15 ms: steps slower than about 30 ms would let the
agent's timer samples crowd out the step-boundary samples.
"""
from _common import need_cuda_torch

torch = need_cuda_torch()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                            torch.nn.Linear(1024, 512)).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
kept = []  # module level: every slice stays referenced until exit
for step in range(50):
    x = torch.randn(131072, 512, device="cuda")  # 256 MiB
    hidden = model[1](model[0](x))  # 131072 x 1024 floats: 512 MiB before and after the ReLU
    loss = model[2](hidden).square().mean()  # and 2 x 256 MiB more
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    kept.append(hidden[:256].detach().clone())  # 256 x 1024 floats = exactly 1 MiB, never released
    torch.cuda.synchronize()
print(f"kept {len(kept)} slices of 1 MiB: {sum(t.nbytes for t in kept) >> 20} MiB")
