# expect: leak
# expect-holder: thread 'MainThread': main() at vision_dataloader_metric.py local worst.batches[*]
# expect-holder-kind: frame-local
# needs: torchvision
"""The ResNet-18 run of vision_dataloader_clean.py with a hand-written metric that keeps its state on
the GPU: `WorstExamples` stores every batch's images with their per-sample losses, to show the 16
worst at the end. Each batch's images stay on the GPU (64 x 3 x 96 x 96 floats, 6.75 MiB)."""
from _common import StepClock, device, need, scaled

torch = need("torch")
torchvision = need("torchvision")

dev = device(torch)


class RandomImages(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.rand(3, 96, 96, generator=g), int(torch.randint(0, 100, (1,), generator=g))


class WorstExamples:
    """The batches seen, to pick the worst-predicted images at the end (its state grows)."""

    def __init__(self):
        self.batches = []

    def update(self, images, losses):
        self.batches.append((images, losses.detach()))

    def compute(self, k=16):
        losses = torch.cat([l for _, l in self.batches])
        return losses.topk(k).indices


def main():
    torch.manual_seed(0)
    steps = scaled(200)
    model = torchvision.models.resnet18(weights=None, num_classes=100).to(dev)
    model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = torch.utils.data.DataLoader(RandomImages(steps * 64), batch_size=64, num_workers=2,
                                       pin_memory=dev.type == "cuda", persistent_workers=True)
    worst = WorstExamples()
    clock = StepClock()
    for images, labels in data:
        images = images.to(dev, non_blocking=True)  # allocates
        labels = labels.to(dev, non_blocking=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            per_sample = torch.nn.functional.cross_entropy(
                model(images.to(memory_format=torch.channels_last)), labels, reduction="none")
        loss = per_sample.mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        worst.update(images, per_sample)  # keeps the batch's images on the GPU
        loss.item()
        clock.tick()
    print(f"worst examples: {worst.compute().tolist()[:4]}...")
    clock.report()


if __name__ == "__main__":
    main()
