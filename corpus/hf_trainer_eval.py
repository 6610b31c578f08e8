# expect: clean
# needs: transformers, accelerate
"""A Hugging Face `Trainer` that only evaluates: GPT-2 at its real size (124M, built from the default
config, random weights, nothing downloaded) on an in-memory dataset of 64 samples of 1024 random
token ids with their labels, in batches of 4, float32, with a `compute_metrics` (next-token
accuracy) and the evaluation's defaults: no `eval_accumulation_steps`, no
`preprocess_logits_for_metrics`. So the Trainer gathers every batch's logits on the GPU, each
batch's concatenated to the ones before (4 x 1024 x 50,257 floats, 785 MiB a batch), and moves
them to the CPU only at the end. Its peak is the last concatenation: the logits gathered before it
(11.5 GiB) and the new whole (12.3 GiB), over 475 MiB of parameters. No optimizer, nothing saved,
no report sent anywhere."""
import tempfile

from _common import StepClock, device, need, on_cpu, scaled

torch = need("torch")
transformers = need("transformers")
need("accelerate")  # the Trainer needs it
np = need("numpy")

dev = device(torch)
SAMPLES, BATCH = scaled(64, 16), scaled(4, 2)


class RandomTokens(torch.utils.data.Dataset):
    """Token ids as a tokenized text dataset gives them, the labels the ids themselves."""

    def __init__(self, n, length, vocab):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def compute_metrics(eval_pred):
    logits, labels = eval_pred
    predictions = np.argmax(logits, axis=-1)
    return {"next_token_accuracy": float((predictions[:, :-1] == labels[:, 1:]).mean())}


class Timing(transformers.TrainerCallback):
    def __init__(self, clock):
        self.clock = clock

    def on_prediction_step(self, args, state, control, **kwargs):
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
    dataset = RandomTokens(SAMPLES, config.n_positions, config.vocab_size)
    clock = StepClock()
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(output_dir=out, per_device_eval_batch_size=BATCH, report_to="none",
                                              save_strategy="no", disable_tqdm=True, use_cpu=on_cpu())
        trainer = transformers.Trainer(model=model, args=args, eval_dataset=dataset,
                                       compute_metrics=compute_metrics, callbacks=[Timing(clock)])
        metrics = trainer.evaluate()
    print(f"eval loss {metrics['eval_loss']:.3f}, next-token accuracy {metrics['eval_next_token_accuracy']:.4f}")
    clock.report()


if __name__ == "__main__":
    main()
