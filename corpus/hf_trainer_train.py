# expect: clean
# needs: transformers, accelerate
"""A Hugging Face `Trainer` that trains: GPT-2 at its real size (124M, built from the default config,
random weights, nothing downloaded) on an in-memory dataset of random token ids with their labels,
batches of 8 x 1024 tokens, float32, 40 steps, with the Trainer's own optimizer: its default AdamW in
two parameter groups (with and without weight decay), wrapped by accelerate (`AcceleratedOptimizer`)
and driven by the Trainer's loop, with a linear learning-rate schedule and gradient clipping. The
program never sees the optimizer. Its peak is a step's backward: the activations, over 475 MiB of
parameters and 949 MiB of AdamW state. Nothing saved, no report sent anywhere."""
import tempfile

from _common import StepClock, device, need, on_cpu, scaled

torch = need("torch")
transformers = need("transformers")
need("accelerate")  # the Trainer needs it

dev = device(torch)
STEPS, BATCH = scaled(40), scaled(8, 2)


class RandomTokens(torch.utils.data.Dataset):
    """Token ids as a tokenized text dataset gives them, the labels the ids themselves."""

    def __init__(self, n, length, vocab):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Timing(transformers.TrainerCallback):
    def __init__(self, clock):
        self.clock = clock

    def on_step_end(self, args, state, control, **kwargs):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        self.clock.tick()


def main():
    torch.manual_seed(0)
    if on_cpu():
        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=64)
    else:
        config = transformers.GPT2Config()
    model = transformers.GPT2LMHeadModel(config)
    dataset = RandomTokens(STEPS * BATCH, config.n_positions, config.vocab_size)
    clock = StepClock()
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(output_dir=out, per_device_train_batch_size=BATCH, max_steps=STEPS,
                                              learning_rate=3e-4, weight_decay=0.1, max_grad_norm=1.0,
                                              logging_steps=STEPS, report_to="none", save_strategy="no",
                                              disable_tqdm=True, use_cpu=on_cpu(), dataloader_num_workers=0)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=dataset, callbacks=[Timing(clock)])
        result = trainer.train()
    print(f"train loss {result.training_loss:.3f}, optimizer {type(trainer.optimizer).__name__}"
          f" over {type(trainer.optimizer.optimizer).__name__}")
    clock.report()


if __name__ == "__main__":
    main()
