# expect: out-of-memory
# expect-exit: 1
# expect-cause: full
# needs: transformers
"""A Hugging Face GPT-2 (6 layers, built from a config: random weights, nothing downloaded) trained
with AdamW under a memory cap: torch.cuda.set_per_process_memory_fraction allows it 20 GiB of the
GPU. The batches are padded dynamically, each to its longest sequence, as a collate function with a
tokenizer's padding does: 30 batches of 24 sequences of 128-512 tokens train well under the cap.
Then one batch of 24 x 4096 tokens comes (a long document nobody truncated), eight times longer
than any before it, and its forward pass runs out of memory: its activations alone do not fit in
the 20 GiB allowed. Nothing leaks and nothing is kept: the step's own activations, at this step's
input shape, are what did not fit; capping or bucketing the sequence length, gradient
checkpointing or bf16 autocast would each have made it fit.

The program catches the error only to print its ground truth (the cap in force, the batch shapes
seen, PyTorch's figures at the error and before it) and raises it again."""
import sys

from _common import need_cuda_torch

torch = need_cuda_torch()
try:
    import transformers
except ImportError:
    print("skip: transformers is not installed", file=sys.stderr)
    sys.exit(77)

GiB, MiB = 1 << 30, 1 << 20
CAP = 20 * GiB
BATCH, PAD = 24, 0
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(CAP / total)  # the limit in force: 20 GiB of this GPU
torch.manual_seed(0)
config = transformers.GPT2Config(n_layer=6, n_embd=768, n_head=12, n_positions=4096, vocab_size=50257,
                                 bos_token_id=0, eos_token_id=0)
model = transformers.GPT2LMHeadModel(config).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)


def collate(sequences):
    """Pad to the longest sequence of the batch (dynamic padding), with its attention mask."""
    longest = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), longest), PAD, dtype=torch.long)
    mask = torch.zeros((len(sequences), longest), dtype=torch.long)
    for i, s in enumerate(sequences):
        ids[i, :len(s)] = s
        mask[i, :len(s)] = 1
    labels = ids.masked_fill(mask == 0, -100)
    return ids.cuda(), mask.cuda(), labels.cuda()


g = torch.Generator().manual_seed(0)
lengths = [int(torch.randint(128, 513, (1,), generator=g)) for _ in range(30)] + [4096]
shapes = []
for step, length in enumerate(lengths):
    sequences = [torch.randint(1, config.vocab_size, (int(torch.randint(length // 2, length + 1, (1,), generator=g)),),
                               generator=g) for _ in range(BATCH - 1)]
    sequences.append(torch.randint(1, config.vocab_size, (length,), generator=g))  # the batch's longest
    ids, mask, labels = collate(sequences)
    shapes.append(tuple(ids.shape))
    try:
        out = model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False)
        out.loss.backward()
    except torch.OutOfMemoryError as exc:
        before = max(s[1] for s in shapes[:-1])
        print(f"truth: the cap in force: {CAP / GiB:.1f} GiB of {total / GiB:.1f} GiB "
              f"(set_per_process_memory_fraction({CAP / total:.4f}))", file=sys.stderr)
        print(f"truth: step {step} failed on input {tuple(ids.shape)}; the longest before it was {before} tokens "
              f"({ids.shape[1] / before:.1f} times longer)", file=sys.stderr)
        print(f"truth: at the error allocated {torch.cuda.memory_allocated() / GiB:.2f} GiB, reserved "
              f"{torch.cuda.memory_reserved() / GiB:.2f} GiB; the earlier steps' max allocated "
              f"{peak_before / GiB:.2f} GiB", file=sys.stderr)
        print(f"truth: {str(exc).splitlines()[0]}", file=sys.stderr, flush=True)
        raise
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    loss = out.loss.item()
    del out
    torch.cuda.synchronize()
    peak_before = torch.cuda.max_memory_allocated()
    print(f"step {step}: input {tuple(ids.shape)}, loss {loss:.3f}, max allocated so far "
          f"{peak_before / GiB:.2f} GiB", flush=True)
print("trained")
