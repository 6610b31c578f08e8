# expect: clean
# expect-finding: temporary-peak
"""Embeddings gathered for a retrieval index: 64 batches go through an encoder under torch.no_grad(),
each batch's 64 MiB of embeddings appended to a list (4 GiB in all, built up over half a second, so
the samples see it), then one torch.cat of the 64 chunks makes the index: for the few milliseconds
of the copy the chunks and their concatenation are both allocated, 8 GiB above the model, between
two samples. The chunks are dropped once the index is made, the index is used and dropped. Nothing
leaks (clean); the peak is the concatenation, made at the marked line while its 64 pieces were
still held by the local `chunks`. The program prints its ground truth on a `peak-truth:` line: the
pieces' and the result's bytes, PyTorch's allocated peak, and what was allocated before and after."""
import json
import sys
import time

from _common import need_cuda_torch, train_steps

torch = need_cuda_torch()
encoder = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096)).cuda()
opt = torch.optim.SGD(encoder.parameters(), lr=1e-3)
truth = {}


def build_index():
    chunks = []
    with torch.no_grad():
        for _ in range(64):
            time.sleep(0.008)  # the batch's loading
            chunks.append(encoder(torch.randn(4096, 1024, device="cuda")))  # 4096 x 4096 floats: 64 MiB
        torch.cuda.synchronize()
        truth["pieces"] = sum(c.untyped_storage().nbytes() for c in chunks)
        truth["allocated_before"] = torch.cuda.memory_allocated()
        index = torch.cat(chunks)  # allocates 4 GiB while the 64 chunks are held: the peak
        torch.cuda.synchronize()
        truth["concatenated"] = index.untyped_storage().nbytes()
        truth["max_allocated"] = torch.cuda.max_memory_allocated()  # the run's: this is its peak
        del chunks
        queries = torch.randn(256, 4096, device="cuda")
        return float((queries @ index.T).max())


train_steps(torch, encoder, opt, 30, (512, 1024))
print(f"best match {build_index():.3f}")
truth["allocated_after"] = torch.cuda.memory_allocated()
train_steps(torch, encoder, opt, 30, (512, 1024))
truth["reserved_at_end"] = torch.cuda.memory_reserved()
print("peak-truth: " + json.dumps(truth), file=sys.stderr)
