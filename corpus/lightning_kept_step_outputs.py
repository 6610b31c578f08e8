# expect: leak
# expect-holder: __main__.model.outputs[*]
# expect-holder-kind: attribute
# needs: pytorch_lightning
"""The Lightning loop of issue 57 (where the tool once stalled it 300-400 ms on an H200): a
1024 -> 4096 -> 1024 MLP on batches of 512, 256 steps, whose training_step keeps each step's
output (not detached, with its autograd graph) in a list on the module: a leak of about 2 MiB of
output and the graph it holds each step. It prints its own ground truth at the end."""
import time

from _common import StepClock, device, need, scaled

torch = need("torch")
pl = need("pytorch_lightning")

dev = device(torch)


class Mlp(pl.LightningModule):
    def __init__(self, width=scaled(4096, 64)):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(1024, width), torch.nn.GELU(), torch.nn.Linear(width, 1024))
        self.outputs = []

    def training_step(self, batch, batch_idx):
        (x,) = batch
        out = self.net(x)  # allocates
        self.outputs.append(out)  # kept with its graph; never cleared
        return out.pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


class Timing(pl.Callback):
    def __init__(self, clock):
        self.clock = clock

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        self.clock.tick()


if __name__ == "__main__":
    torch.manual_seed(0)
    steps = scaled(256)
    clock = StepClock()
    model = Mlp()
    data = torch.utils.data.TensorDataset(torch.randn(steps * 512, 1024))
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=steps, accelerator="gpu" if dev.type == "cuda" else "cpu",
                         devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[Timing(clock)])
    started = time.perf_counter()
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=512))
    held = torch.cuda.memory_allocated() if dev.type == "cuda" else 0
    print(f"fit took {time.perf_counter() - started:.1f} s, kept {len(model.outputs)} outputs, "
          f"allocated {held / 2**20:.0f} MiB at the end")
    clock.report()
