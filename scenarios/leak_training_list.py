# expect: leak
# expect-holder: __main__.kept[*]
# expect-holder-kind: global
"""A training loop that keeps every step's activations in a list: 8 MiB more per step."""
from _common import need_cuda_torch

torch = need_cuda_torch()
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                            torch.nn.Linear(4096, 1024)).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
kept = []
for step in range(200):
    x = torch.randn(512, 1024, device="cuda")
    hidden = model[1](model[0](x))  # allocates
    loss = model[2](hidden).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    kept.append(hidden.detach())  # 512 x 4096 floats = 8 MiB, never released
    torch.cuda.synchronize()
print(f"kept {len(kept)} activations")
