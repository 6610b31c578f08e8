# expect: clean
"""A plain PyTorch training loop, no library but torch: a small decoder-only language model made of
nn modules (token and position embeddings, an `nn.TransformerEncoder` of 8 pre-norm layers, 768
wide, run with a causal mask, and a vocabulary head of 32,000 tokens), AdamW, cross-entropy on the
next token, batches of 8 x 512 random token ids, float32, `zero_grad(set_to_none=True)`, the loss
read as a number every step, 40 steps. Its peak comes in a step's backward: the activations the
forward saved (a few GiB) and the loss's float32 logits and their gradient, over 405 MiB of
parameters and 810 MiB of AdamW state. Nothing is kept from one step to the next."""
from _common import StepClock, device, need, scaled

torch = need("torch")
nn = torch.nn
F = torch.nn.functional

dev = device(torch)
VOCAB, WIDTH, HEADS, LAYERS = scaled(32000, 512), scaled(768, 64), scaled(12, 4), scaled(8, 2)
SEQ, BATCH = scaled(512, 32), scaled(8, 2)


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, WIDTH)
        self.positions = nn.Embedding(SEQ, WIDTH)
        layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, dropout=0.1, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.body = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, ids, mask):
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))
        x = self.body(x, mask=mask, is_causal=True)
        return self.head(self.norm(x))


torch.manual_seed(0)
model = TinyLM().to(dev)
model.train()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
mask = nn.Transformer.generate_square_subsequent_mask(SEQ, device=dev)
clock = StepClock()
for step in range(scaled(40)):
    ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1), device=dev)
    inputs, targets = ids[:, :-1], ids[:, 1:]
    optimizer.zero_grad(set_to_none=True)
    logits = model(inputs, mask)
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    last = loss.item()
    clock.tick()
print(f"last loss {last:.3f}")
clock.report()
