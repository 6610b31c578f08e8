# expect: leak
# expect-holder: __main__.keep.preds[*]
# expect-holder-kind: attribute
# needs: pytorch_lightning
"""A Lightning callback that keeps every validation batch's predictions on the GPU, to look at
them after training: on_validation_batch_end appends `outputs` (the predictions validation_step
returns, 256 x 8192 floats: 8 MiB) to a list that nothing clears. Memory is flat while the model
trains and steps up at each validation (two epochs, 100 validation batches each, the sanity check's
2 before training): a staircase, which the growth rule's steady slope does not see (issue 32: it
was `clean` with 2.3 GiB live at exit). Each validation adds a step: a leak, held by the callback."""
from _common import device, lightning_fit, need, scaled

torch = need("torch")
pl = need("pytorch_lightning")

dev = device(torch)
CLASSES = scaled(8192, 64)


class Classifier(pl.LightningModule):
    def __init__(self, width=scaled(2048, 64)):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(1024, width), torch.nn.GELU(),
                                       torch.nn.Linear(width, CLASSES))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        preds = self.net(x)  # allocates: the callback keeps it
        self.log("val_loss", torch.nn.functional.cross_entropy(preds, y))
        return preds

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


class KeepPredictions(pl.Callback):
    """Keeps every validation batch's predictions 'to look at later', on the GPU."""

    def __init__(self):
        self.preds = []

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx, dataloader_idx=0):
        self.preds.append(outputs)  # never cleared


if __name__ == "__main__":
    torch.manual_seed(0)
    keep = KeepPredictions()
    lightning_fit(torch, pl, dev, Classifier(), scaled(150), scaled(100), CLASSES, callbacks=[keep])
    print(f"kept {len(keep.preds)} predictions")
