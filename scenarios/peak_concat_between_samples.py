# expect: clean
# expect-finding: temporary-peak
"""A single concatenation between two samples: eight 512 MiB feature chunks are joined with torch.cat
into one 4 GiB tensor, the chunks dropped, the result reduced and dropped, all within a few
milliseconds. For that moment the chunks and their concatenation are both allocated: 8 GiB above the
model. No sample sees it; PyTorch's allocated peak counter and its allocation events do. The tool names
it a concatenation (`temporary-peak`, its evidence `joined`). The program prints the chunks' and the
result's sizes on a `peak-truth:` line."""
import json
import sys

from _common import need_cuda_torch, train_steps

torch = need_cuda_torch()
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
truth = {}


def features():
    with torch.no_grad():
        chunks = [torch.randn(1 << 27, device="cuda") for _ in range(8)]  # 8 x 512 MiB
        truth["chunks"] = sum(c.untyped_storage().nbytes() for c in chunks)
        whole = torch.cat(chunks)  # the spike: the chunks and their copy at once
        truth["concatenated"] = whole.untyped_storage().nbytes()
        del chunks
        return whole.mean().item()


train_steps(torch, model, opt, 30, (512, 1024))
print(f"features: {features():.4f}")
train_steps(torch, model, opt, 30, (512, 1024))
print("peak-truth: " + json.dumps(truth), file=sys.stderr)
