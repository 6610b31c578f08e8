# expect: leak
# expect-holder: __main__.auroc
# needs: torchmetrics
"""A metric whose state grows in a short loop: torchmetrics' exact AUROC (thresholds=None) keeps every
batch's predictions and targets, as its documentation says, to compute the exact curve at the end.
A scoring loop updates it each step with 327,680 float32 scores (1.25 MiB) and their int64 targets
(2.5 MiB, made at the marked line) for 200 steps, in about two seconds, and computes it at the end:
750 MiB held by the metric's list states (`auroc.target` 500 MiB, `auroc.preds` 250 MiB), one tensor
more in each at each step. Too short for many samples: the verdict must come from the structure
(alike allocations at one line, one more each step, held by one container) and be the same every
run. The program prints its ground truth: the number and bytes of the metric's states."""
import sys
import time

from _common import need_cuda_torch

torch = need_cuda_torch()
try:
    import torchmetrics
except ImportError:
    print("skip: torchmetrics is not installed", file=sys.stderr)
    sys.exit(77)

MiB = 1 << 20
auroc = torchmetrics.classification.BinaryAUROC(thresholds=None).cuda()  # exact: keeps every input
scorer = torch.nn.Linear(256, 1).cuda()
for step in range(200):
    features = torch.randn(4096, 256, device="cuda")
    with torch.no_grad():
        scores = torch.sigmoid(scorer(features)).flatten().repeat(80)  # 327,680 scores
    target = (torch.rand_like(scores) > 0.5).long()  # allocates the step's targets, kept by the metric
    auroc.update(scores, target)
    torch.cuda.synchronize()
    time.sleep(0.008)
held = sum(t.untyped_storage().nbytes() for t in [*auroc.preds, *auroc.target])
print(f"truth: auroc.preds {len(auroc.preds)} tensors, auroc.target {len(auroc.target)} tensors, "
      f"{held / MiB:.0f} MiB held; allocated {torch.cuda.memory_allocated() / MiB:.0f} MiB, max allocated "
      f"{torch.cuda.max_memory_allocated() / MiB:.0f} MiB", flush=True)
print(f"AUROC {float(auroc.compute()):.4f}")
