# expect: leak
# expect-finding: out-of-memory
# expect-exit: 1
# expect-cause: accumulation
# expect-holder: thread 'MainThread': evaluate() at oom_eval_without_no_grad_local.py local outputs[*]
"""oom_eval_without_no_grad.py with the list a local of the evaluation function: the accumulation
is found while it is held, at the error, although the list is gone once the error unwinds."""
from _common import need_cuda_torch

torch = need_cuda_torch()


def evaluate(model):
    outputs = []
    for step in range(10_000):
        batch = torch.randn(16384, 8192, device="cuda")
        outputs.append(model(batch))  # allocates the output; its graph keeps the input
    return outputs


evaluate(torch.nn.Linear(8192, 8192).cuda())
