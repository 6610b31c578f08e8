# expect: leak
# expect-holder: __main__.history[*]
# needs: transformers
"""The GPT-2 loop of hf_gpt2_clean.py, keeping every step's model output "to look at later": each
output holds its logits (8 x 256 x 8192 in bf16, 32 MiB) on the GPU, so memory grows every step."""
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
history = []
for step in range(scaled(150)):
    ids = torch.randint(0, config.vocab_size, (scaled(8, 2), scaled(256, 32)), device=dev)
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        out = model(input_ids=ids, labels=ids, use_cache=False)  # allocates
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    history.append(out)  # the whole output: its logits stay on the GPU
    out.loss.item()
    clock.tick()
print(f"kept {len(history)} outputs")
clock.report()
