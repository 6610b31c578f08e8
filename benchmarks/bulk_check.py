"""Whether a history reading (PyTorch's allocator snapshot and the walk back, through neutral.Bulk)
leaves the collector's count and the free lists of dicts, lists and 1-, 2- and 4-tuples as it found them,
on a real snapshot of a CUDA program: `python benchmarks/bulk_check.py` prints the lengths before and
after and exits 1 where one differs. Needs CUDA."""
import gc
import sys
from types import SimpleNamespace

import torch

from gpumemdoctor._agent.peak import replay
from gpumemdoctor._agent.peak.history import History
from gpumemdoctor._agent.peak.reading import NO_POOL
from gpumemdoctor._agent.neutral import Bulk, checked_run

history = History(SimpleNamespace(run_dir=None), None, None, None)  # only its ballast and incref
history.prepare(1)


def reading(_):
    for _ in range(3):  # the same pool id three times (see history.py's _read)
        history.incref(NO_POOL[0])
        history.incref(NO_POOL[1])
        snapshot = torch._C._cuda_memorySnapshot(NO_POOL)
    found = replay.replay(snapshot["device_traces"][0], torch.cuda.memory_allocated(), [], [], {}, {})
    return f'{found["allocated_peak"]}'


torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=8192)
model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).cuda()
opt = torch.optim.AdamW(model.parameters())
for _ in range(5):
    model(torch.randn(256, 1024, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
bulk = Bulk()
gc.disable()
junk = [{} for _ in range(30)] + [[] for _ in range(20)] + [(i, -i) for i in range(500)] + [(i,) for i in range(7)]
del junk
before, after = [], []
peak, c0, c1 = checked_run(bulk, reading, None, before, after)
gc.enable()
print(f"peak {peak}; count {c0} -> {c1}; free lists (dict, list, 1-, 2- and 4-tuples) {before} -> {after}; short {bulk.short}")
sys.exit(0 if (c0 == c1 and before == after) else 1)
