# expect: leak
# expect-holder: __main__.views[*] (cupy.ndarray sharing its memory)
# expect-holder-kind: foreign
"""leak_cupy_view.py through DLPack (cupy.from_dlpack): the CuPy array holds the tensor's memory
through a DLPack capsule, from C++, so no Python tensor is left at all: only the CuPy array's
address says whose the memory is."""
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
    views.append(cupy.from_dlpack(x))  # shares x's memory through a DLPack capsule
    del x
    torch.cuda.synchronize()
print(f"kept {len(views)} CuPy arrays")
