# expect: clean
# expect-finding: temporary-peak
# needs: transformers, accelerate
"""A Hugging Face `Trainer` that trains and evaluates at the end of each epoch, inside
`trainer.train()` (`eval_strategy="epoch"`), with a `compute_metrics` (next-token accuracy) and the
evaluation's defaults: no `eval_accumulation_steps`, no `preprocess_logits_for_metrics`. GPT-2 at its
real size (124M, built from the default config, random weights, nothing downloaded) on in-memory
datasets of random token ids: 2 epochs of 20 training steps of 8 x 1024 tokens, and after each an
evaluation of 48 samples in batches of 4. The Trainer already evaluates under torch.no_grad(); what
it does not do is let go of the logits: it concatenates every batch's (4 x 1024 x 50,257 floats, 785
MiB) to the ones before on the GPU and moves them to the CPU only at the evaluation's end. Each
larger concatenation needs new memory and the smaller ones freed before it stay in PyTorch's cache:
tens of GiB. Nothing leaks (clean, or allocator-cache); the evaluation's gathered logits made the
peak, and the Trainer's switches are the remedy (eval_accumulation_steps, preprocess_logits_for_metrics).
The program prints its ground truth: PyTorch's figures after each evaluation and at the end."""
import inspect
import sys
import tempfile

from _common import StepClock, device, need, on_cpu, scaled

torch = need("torch")
transformers = need("transformers")
need("accelerate")  # the Trainer needs it
np = need("numpy")

dev = device(torch)
STEPS, BATCH, EVAL_SAMPLES, EVAL_BATCH = scaled(20), scaled(8, 2), scaled(48, 8), scaled(4, 2)
GiB = 1 << 30


class RandomTokens(torch.utils.data.Dataset):
    """Token ids as a tokenized text dataset gives them, the labels the ids themselves."""

    def __init__(self, n, length, vocab, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def compute_metrics(eval_pred):
    logits, labels = eval_pred
    predictions = np.argmax(logits, axis=-1)
    return {"next_token_accuracy": float((predictions[:, :-1] == labels[:, 1:]).mean())}


def figures(when):
    if dev.type != "cuda":
        return
    print(f"truth: {when}: allocated {torch.cuda.memory_allocated() / GiB:.2f} GiB, reserved "
          f"{torch.cuda.memory_reserved() / GiB:.2f} GiB, max allocated {torch.cuda.max_memory_allocated() / GiB:.2f} GiB",
          file=sys.stderr, flush=True)


class Timing(transformers.TrainerCallback):
    def __init__(self, clock):
        self.clock = clock

    def on_step_end(self, args, state, control, **kwargs):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        self.clock.tick()

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        figures(f"after the evaluation at step {state.global_step} (eval_accumulation_steps "
                f"{args.eval_accumulation_steps}, grad enabled {torch.is_grad_enabled()})")


def main():
    torch.manual_seed(0)
    if on_cpu():
        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=64)
    else:
        config = transformers.GPT2Config()
    model = transformers.GPT2LMHeadModel(config)
    train = RandomTokens(STEPS * BATCH, config.n_positions, config.vocab_size, 0)
    evaluation = RandomTokens(EVAL_SAMPLES, config.n_positions, config.vocab_size, 1)
    clock = StepClock()
    # The evaluation's schedule was renamed (evaluation_strategy, then eval_strategy): whichever this has.
    names = inspect.signature(transformers.TrainingArguments).parameters
    schedule = {"eval_strategy" if "eval_strategy" in names else "evaluation_strategy": "epoch"}
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(output_dir=out, per_device_train_batch_size=BATCH,
                                              per_device_eval_batch_size=EVAL_BATCH, num_train_epochs=2,
                                              learning_rate=3e-4, logging_steps=STEPS, report_to="none",
                                              save_strategy="no", disable_tqdm=True, use_cpu=on_cpu(),
                                              dataloader_num_workers=0, **schedule)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=train, eval_dataset=evaluation,
                                       compute_metrics=compute_metrics, callbacks=[Timing(clock)])
        result = trainer.train()
    print(f"train loss {result.training_loss:.3f}")
    figures("at the end")
    clock.report()


if __name__ == "__main__":
    main()
