# expect: garbage-cycle
"""Three reference cycles met in real code, each holding CUDA memory, made 24 times over with
the garbage collector left on and never called: 332 MiB a round. After each round nothing refers
to the objects, but each is in a cycle, so only a collection frees them. A round makes about a
hundred new Python objects that live on, so an automatic collection comes only every several
rounds; it frees the rounds already over, but the round it interrupts is still alive, and its
objects move to an older generation that is collected far more rarely. How much is left at the
end depends on where the collections fall; a plain run (torch 2.11, Python 3.12) ends with
1072 MiB that only gc.collect() frees, the same in every run.

(a) pytorch/pytorch#51883: an object whose attribute is a lambda closing over self, holding a
    64 MiB tensor: self -> lambda -> closure cell -> self.
(b) pytorch/pytorch#47589: a LambdaLR whose lr_lambda is a method of the object that owns the
    scheduler, the optimizer and the model: trainer -> scheduler -> bound method -> trainer.
    It keeps the model's weights, gradients and momentum, 12 MiB.
(c) pytorch/pytorch#46386: a module that registers its own bound method as a forward hook on
    itself, with a 256 MiB weight: module -> _forward_hooks -> bound method -> module."""
from _common import need_cuda_torch

torch = need_cuda_torch()


class Normalizer:
    def __init__(self):
        self.offset = torch.zeros(16 << 20, device="cuda")  # 64 MiB of running statistics
        self.apply = lambda t: t - self.offset[: t.numel()].view_as(t)


class Trainer:
    def __init__(self):
        self.model = torch.nn.Linear(1024, 1024, device="cuda")
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda=self.warmup)

    def warmup(self, epoch):
        return min(1.0, (epoch + 1) / 10)

    def train_step(self, x):
        loss = self.model(x).square().mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.sched.step()


class Probe(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8192, 8192, bias=False, device="cuda")  # 256 MiB
        self.register_buffer("sum_sq", torch.zeros(8192, device="cuda"))
        self.register_forward_hook(self.track)

    def forward(self, x):
        return self.proj(x)

    def track(self, module, args, output):
        self.sum_sq += output.detach().square().sum(dim=0)


def run_round():
    norm = Normalizer()
    trainer = Trainer()
    probe = Probe()
    x = torch.randn(256, 1024, device="cuda")
    trainer.train_step(norm.apply(x))
    with torch.no_grad():
        probe(torch.randn(256, 8192, device="cuda"))
    # All three go out of scope here, each in a reference cycle.


for _ in range(24):
    run_round()
torch.cuda.synchronize()
print("24 rounds done")
