# expect: clean
# expect-finding: avoidable-peak
# expect-suspects-on: avoidable-peak
# expect-holder: __main__.model.validation_step_outputs[*]
# needs: pytorch_lightning
"""Lightning's documented pattern for an epoch-level validation metric: validation_step appends
its predictions to `self.validation_step_outputs`, on_validation_epoch_end computes the metric from
them and clears the list. Two epochs, 100 validation batches of 8 MiB: each validation gathers
800 MiB and lets it go, reaching the same height each time. Not a leak (clean), but what made the
run's peak: an avoidable-peak warning, with the list as its holder (the search at the
validation's height names it). The other side of lightning_validation_kept.py."""
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
        self.validation_step_outputs = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        preds = self.net(x)  # allocates: kept until the validation epoch ends
        self.validation_step_outputs.append(preds)
        return preds

    def on_validation_epoch_end(self):
        top1 = torch.cat(self.validation_step_outputs).argmax(1)
        self.log("val_top1_mean", top1.float().mean())
        self.validation_step_outputs.clear()  # free memory, as the Lightning docs say

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


if __name__ == "__main__":
    torch.manual_seed(0)
    model = Classifier()
    lightning_fit(torch, pl, dev, model, scaled(150), scaled(100), CLASSES)
