# expect: clean
# expect-finding: library-memory
"""JAX starts first and XLA preallocates its pool (15% of the GPU here, set below, against 75% by
default: the test must not hold the GPU for long), then a PyTorch loop trains. The pool is XLA's,
not the CUDA context: the report names it with its switch (XLA_PYTHON_CLIENT_PREALLOCATE=false)."""
import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", ".15")

from _common import SKIP_EXIT, need_cuda_torch

torch = need_cuda_torch()
try:
    import jax
    import jax.numpy as jnp
except ImportError:
    print("skip: JAX is not installed", file=sys.stderr)
    sys.exit(SKIP_EXIT)
try:
    gpus = jax.devices("gpu")
except RuntimeError:
    gpus = []
if not gpus:
    print("skip: JAX has no GPU backend here", file=sys.stderr)
    sys.exit(SKIP_EXIT)

total = float(jnp.ones((1024, 1024), device=gpus[0]).sum().block_until_ready())  # XLA's pool now
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024)).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
for step in range(100):
    loss = model(torch.randn(256, 1024, device="cuda")).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
torch.cuda.synchronize()
print(f"jax sum {total:.0f}, trained 100 steps")
