# expect: leak
# expect-holder: __main__.prefix_embedding's lru_cache
# expect-holder-kind: cache
"""The big-heap program of big_heap_clean.py with a cache that is never bounded: the embedding of
each batch's prompt prefix is memoised with functools.lru_cache(maxsize=None), keyed by the token
ids. Every batch brings new prefixes, so the cache keeps one 4 MiB tensor more per step on the GPU,
and nothing in the program's own variables refers to them."""
import functools
import os
import random

from _common import StepClock, device, need, scaled

torch = need("torch")
dev = device(torch)

VOCAB, SEQ = 4096, 64
TOKENS = range(VOCAB)
# 250,000 samples are over a million objects the garbage collector tracks (each a dict, two lists
# and a dict of metadata); CORPUS_SAMPLES=2500000 makes ten million.
SAMPLES = int(os.environ.get("CORPUS_SAMPLES", "250000"))


def tokenized_dataset(n):
    rng = random.Random(0)
    samples = []
    for i in range(n):
        ids = rng.choices(TOKENS, k=SEQ)
        samples.append({"input_ids": ids, "attention_mask": [1] * SEQ, "text": f"sample {i}",
                        "meta": {"source": "corpus", "index": i}})
    return samples


def batches(samples, batch_size):
    for i in range(0, len(samples) - batch_size + 1, batch_size):
        chunk = samples[i:i + batch_size]
        yield torch.tensor([s["input_ids"] for s in chunk]), tuple(tuple(s["input_ids"][:8]) for s in chunk)


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 256)
        layer = torch.nn.TransformerEncoderLayer(256, 8, 1024, batch_first=True)
        self.body = torch.nn.TransformerEncoder(layer, 4)
        self.head = torch.nn.Linear(256, VOCAB)

    def forward(self, ids, prefix):
        return self.head(self.body(self.embed(ids) + prefix))


samples = tokenized_dataset(scaled(SAMPLES))
model = Encoder().to(dev)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
table = torch.randn(VOCAB, 256, device=dev)


@functools.lru_cache(maxsize=None)
def prefix_embedding(prefixes):
    """The mean embedding of each sample's first 8 tokens, broadcast over the sequence."""
    ids = torch.tensor(prefixes, device=dev)
    return table[ids].mean(1, keepdim=True).expand(-1, SEQ, -1).contiguous()  # allocates


clock = StepClock()
for step, (ids, prefixes) in enumerate(batches(samples, scaled(64, 4))):
    if step == scaled(200):
        break
    ids = ids.to(dev)
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        logits = model(ids, prefix_embedding(prefixes))
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), ids.flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    loss.item()
    clock.tick()
print(f"{len(samples)} samples, {prefix_embedding.cache_info().currsize} prefixes cached")
clock.report()
