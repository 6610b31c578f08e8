# expect: leak
# expect-holder: __main__.model.step_logits[*]
# expect-holder-kind: attribute
# needs: pytorch_lightning
"""The Lightning run of lightning_clean.py with a common mistake: training_step keeps each batch's
logits (not detached) in a list on the module, for a metric computed at the end of the epoch. The
list is never cleared, so it grows by 64 x 4096 floats (1 MiB) each step."""
import time

from _common import StepClock, device, need, scaled

torch = need("torch")
pl = need("pytorch_lightning")

dev = device(torch)


class Classifier(pl.LightningModule):
    def __init__(self, width=scaled(2048, 64), classes=4096):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(1024, width), torch.nn.GELU(),
                                       torch.nn.Linear(width, width), torch.nn.GELU(),
                                       torch.nn.Linear(width, classes))
        self.step_logits = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)  # allocates
        loss = torch.nn.functional.cross_entropy(logits, y)
        self.log("loss", loss)
        self.step_logits.append(logits)  # for an epoch-end metric; never cleared
        return loss

    def on_train_epoch_end(self):
        top1 = torch.cat(self.step_logits).argmax(1)  # the metric; the list is never cleared
        self.log("top1_mean", top1.float().mean())

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


class Timing(pl.Callback):
    def __init__(self, clock):
        self.clock = clock

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        self.clock.tick()


def loader(steps):
    x = torch.randn(steps * 64, 1024)
    y = torch.randint(0, 4096, (steps * 64,))
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64)


if __name__ == "__main__":
    torch.manual_seed(0)
    steps = scaled(300)
    clock = StepClock()
    model = Classifier()
    trainer = pl.Trainer(max_steps=steps + 1000, accelerator="gpu" if dev.type == "cuda" else "cpu", devices=1,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[Timing(clock)], max_epochs=1,
                         limit_train_batches=steps)
    started = time.perf_counter()
    trainer.fit(model, loader(steps + 1))
    print(f"fit took {time.perf_counter() - started:.1f} s, kept {len(model.step_logits)} logits")
    clock.report()
