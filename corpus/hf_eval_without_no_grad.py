# expect: clean
# expect-finding: avoidable-peak
# expect-suspects-on: avoidable-peak
# expect-holder: thread 'MainThread': evaluate() at hf_eval_without_no_grad.py local total
# expect-holder-kind: autograd-graph
# needs: transformers
"""A Hugging Face GPT-2 (4 layers, from a config) trained with AdamW and bf16 autocast, with an
evaluation every 50 steps written as people often write it: model.eval(), the batches' losses
summed without .item(), and no torch.no_grad(). model.eval() does not stop autograd, so each
batch's graph, with every activation it saved, stays alive through `total`'s grad_fn chain until
evaluate() returns: gigabytes for a fraction of a second, three times. Nothing grows with the run
(clean), but the evaluation made the peak: an avoidable-peak warning naming the running sum, whose
remedy is torch.no_grad() and loss.item()."""
from _common import StepClock, device, need, scaled

torch = need("torch")
transformers = need("transformers")

dev = device(torch)
torch.manual_seed(0)
config = transformers.GPT2Config(n_layer=4, n_embd=512, n_head=8, vocab_size=8192, n_positions=256,
                                 bos_token_id=0, eos_token_id=0)
model = transformers.GPT2LMHeadModel(config).to(dev)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
BATCH, SEQ = scaled(8, 2), scaled(256, 32)


def evaluate(batches=scaled(40, 2)):
    model.eval()  # dropout off; autograd still on
    total = 0.0
    for _ in range(batches):
        ids = torch.randint(0, config.vocab_size, (BATCH, SEQ), device=dev)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            out = model(input_ids=ids, labels=ids, use_cache=False)  # allocates: saved for a backward never run
        total = total + out.loss  # should be out.loss.item(), under torch.no_grad()
    model.train()
    return total.item() / batches


clock = StepClock()
model.train()
for step in range(scaled(150)):
    ids = torch.randint(0, config.vocab_size, (BATCH, SEQ), device=dev)
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        out = model(input_ids=ids, labels=ids, use_cache=False)
    out.loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    clock.tick()
    if (step + 1) % scaled(50, 4) == 0:
        print(f"step {step + 1}: eval loss {evaluate():.3f}")
clock.report()
