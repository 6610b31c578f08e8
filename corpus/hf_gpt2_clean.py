# expect: clean
# needs: transformers
"""A Hugging Face causal language model trained as people train one: GPT-2 (4 layers, built from a
config, random weights, nothing downloaded), AdamW, bf16 autocast, the loss logged every step.
Nothing is kept from one step to the next."""
from _common import StepClock, device, need, scaled

torch = need("torch")
transformers = need("transformers")

dev = device(torch)
torch.manual_seed(0)
config = transformers.GPT2Config(n_layer=4, n_embd=512, n_head=8, vocab_size=8192, n_positions=256,
                                 bos_token_id=0, eos_token_id=0)
model = transformers.GPT2LMHeadModel(config).to(dev)
model.train()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
clock = StepClock()
losses = []
for step in range(scaled(150)):
    ids = torch.randint(0, config.vocab_size, (scaled(8, 2), scaled(256, 32)), device=dev)
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        out = model(input_ids=ids, labels=ids, use_cache=False)
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    losses.append(out.loss.item())  # a number: nothing of the graph is kept
    clock.tick()
print(f"last loss {losses[-1]:.3f}")
clock.report()
