# expect: clean
"""A program with a big Python heap: a tokenized text dataset held as Python lists and dicts (over a
million objects, as a `datasets`-free preprocessing script leaves it), batches collated from it,
and a small Transformer encoder trained on them. Nothing is kept between steps."""
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
    """n samples of the shape a tokenizer leaves: ids, a mask and the text they came from."""
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
        yield torch.tensor([s["input_ids"] for s in chunk])


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 256)
        layer = torch.nn.TransformerEncoderLayer(256, 8, 1024, batch_first=True)
        self.body = torch.nn.TransformerEncoder(layer, 4)
        self.head = torch.nn.Linear(256, VOCAB)

    def forward(self, ids):
        return self.head(self.body(self.embed(ids)))


samples = tokenized_dataset(scaled(SAMPLES))
model = Encoder().to(dev)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
clock = StepClock()
for step, ids in enumerate(batches(samples, scaled(64, 4))):
    if step == scaled(200):
        break
    ids = ids.to(dev)
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        logits = model(ids)
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), ids.flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    loss.item()
    clock.tick()
print(f"{len(samples)} samples")
clock.report()
