# expect: clean
"""Variable sequence lengths: the allocator's cache fills with blocks of many sizes.

A small language model is trained on batches of 16 sequences whose length is drawn
anew each step (16 to 512 tokens, fixed seeds). Activations and logits (up to
128 MiB) come in a different size every step, so the caching allocator keeps
splitting cached blocks and now and then adds a segment: `reserved` climbs in jumps,
while the tensors alive at each step boundary (weights, gradients, Adam state, a few
KiB of token ids) do not change. Nothing is kept across steps.
"""
import random

from _common import need_cuda_torch

torch = need_cuda_torch()
torch.manual_seed(0)
rng = random.Random(0)
VOCAB, DIM = 4096, 1024
model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, DIM), torch.nn.Linear(DIM, 4 * DIM),
                            torch.nn.GELU(), torch.nn.Linear(4 * DIM, DIM),
                            torch.nn.Linear(DIM, VOCAB)).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
for step in range(200):
    length = rng.randint(16, 512)
    tokens = torch.randint(0, VOCAB, (16, length + 1), device="cuda")
    # The logits (16 x length x 4096 floats: 4 to 128 MiB) are held only by the graph,
    # so backward frees them before the step boundary.
    logits = model(tokens[:, :-1]).flatten(0, 1)
    loss = torch.nn.functional.cross_entropy(logits, tokens[:, 1:].flatten())
    del logits
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
torch.cuda.synchronize()
print(f"{step + 1} steps of lengths 16-512: reserved {torch.cuda.memory_reserved() >> 20} MiB, "
      f"allocated {torch.cuda.memory_allocated() >> 20} MiB")
