# expect: clean
# needs: transformers
"""GPT-2 at its real size (124M parameters: 12 layers, 768 wide, 50,257 tokens, built from the
default config, random weights, nothing downloaded) pre-trained as its model card's recipes do:
AdamW, batches of 8 x 1024 tokens in float32, `zero_grad(set_to_none=True)`, the loss read as a
number every step. Its peak is a step's activations (about 10 GiB) and the loss's float32 logits,
over 475 MiB of parameters and 949 MiB of AdamW state: the program issue 40 measured."""
from _common import StepClock, device, need, scaled

torch = need("torch")
transformers = need("transformers")

dev = device(torch)
torch.manual_seed(0)
if dev.type == "cpu":
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=64)
else:
    config = transformers.GPT2Config()
model = transformers.GPT2LMHeadModel(config).to(dev)
model.train()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
clock = StepClock()
for step in range(scaled(40)):
    ids = torch.randint(0, config.vocab_size, (scaled(8, 2), scaled(1024, 32)), device=dev)
    optimizer.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    last = loss.item()
    clock.tick()
print(f"last loss {last:.3f}")
clock.report()
