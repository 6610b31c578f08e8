# expect: clean
# needs: torchvision
"""A torchvision ResNet-18 (random weights) trained on images that a DataLoader with two worker
processes makes and pins: the shape of most vision training scripts. Nothing is kept."""
from _common import StepClock, device, need, scaled

torch = need("torch")
torchvision = need("torchvision")

dev = device(torch)


class RandomImages(torch.utils.data.Dataset):
    """Images made in the workers, as a decoding pipeline would."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.rand(3, 96, 96, generator=g), int(torch.randint(0, 100, (1,), generator=g))


def main():
    torch.manual_seed(0)
    steps = scaled(200)
    model = torchvision.models.resnet18(weights=None, num_classes=100).to(dev)
    model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = torch.utils.data.DataLoader(RandomImages(steps * 64), batch_size=64, num_workers=2,
                                       pin_memory=dev.type == "cuda", persistent_workers=True)
    clock = StepClock()
    for images, labels in data:
        images = images.to(dev, non_blocking=True).to(memory_format=torch.channels_last)
        labels = labels.to(dev, non_blocking=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss.item()
        clock.tick()
    clock.report()


if __name__ == "__main__":
    main()
