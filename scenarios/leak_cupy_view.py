# expect: leak
# expect-holder: __main__.views[*] (cupy.ndarray
# expect-holder-kind: foreign
"""Each step hands a 4 MiB tensor to CuPy (cupy.asarray, through __cuda_array_interface__) for a
post-processing step and keeps the CuPy array; the tensor itself is dropped. The CuPy array keeps
the tensor's memory alive, and nothing of PyTorch's refers to it any more."""
import sys

from _common import SKIP_EXIT, need_cuda_torch

torch = need_cuda_torch()
try:
    import cupy
except ImportError:
    print("skip: cupy is not installed", file=sys.stderr)
    sys.exit(SKIP_EXIT)

model = torch.nn.Linear(1024, 1024).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
views = []
for step in range(150):
    x = torch.randn(1024, 1024, device="cuda")  # allocates
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    views.append(cupy.asarray(x))  # shares x's memory
    del x
    torch.cuda.synchronize()
print(f"kept {len(views)} CuPy views")
