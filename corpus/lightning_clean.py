# expect: clean
# needs: pytorch_lightning
"""A PyTorch Lightning `Trainer` fitting a small classifier, as the Lightning docs show it: a
LightningModule with training_step and configure_optimizers, a DataLoader, a callback. The loss is
logged through self.log; nothing is kept between steps."""
import time

from _common import StepClock, device, need, scaled

torch = need("torch")
pl = need("pytorch_lightning")

dev = device(torch)


class Classifier(pl.LightningModule):
    def __init__(self, width=scaled(2048, 64), classes=1000):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(1024, width), torch.nn.GELU(),
                                       torch.nn.Linear(width, width), torch.nn.GELU(),
                                       torch.nn.Linear(width, classes))

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        self.log("loss", loss)
        return loss

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
    y = torch.randint(0, 1000, (steps * 64,))
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64)


if __name__ == "__main__":
    torch.manual_seed(0)
    steps = scaled(300)
    clock = StepClock()
    model = Classifier()
    trainer = pl.Trainer(max_steps=steps, accelerator="gpu" if dev.type == "cuda" else "cpu", devices=1,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[Timing(clock)])
    started = time.perf_counter()
    trainer.fit(model, loader(steps))
    print(f"fit took {time.perf_counter() - started:.1f} s")
    clock.report()
