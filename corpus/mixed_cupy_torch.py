# expect: clean
"""PyTorch and CuPy in one process: each batch is made on the GPU with CuPy (a random projection
and a normalisation, as a CuPy-based preprocessing library does), handed to PyTorch through DLPack,
and a small MLP trains on it with AdamW. Nothing is kept between steps; CuPy's pool keeps its blocks
for reuse, and the report names that memory as CuPy's."""
from _common import StepClock, device, need, on_cpu, scaled

torch, cupy = need("torch", "cupy")
if on_cpu():
    import sys

    print("skip: this workload needs the GPU (CuPy)", file=sys.stderr)
    sys.exit(77)
dev = device(torch)
rng = cupy.random.default_rng(0)
projection = rng.standard_normal((512, 1024), dtype=cupy.float32)
model = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 10)).to(dev)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
clock = StepClock()
for step in range(scaled(300)):
    raw = rng.standard_normal((256, 512), dtype=cupy.float32)
    features = raw @ projection
    features = (features - features.mean(axis=0)) / (features.std(axis=0) + 1e-5)
    x = torch.from_dlpack(features)  # shares CuPy's memory: no copy
    y = torch.from_dlpack(cupy.argmax(features[:, :10], axis=1)).long()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    torch.cuda.synchronize()
    clock.tick()
clock.report()
