# expect: leak
# expect-holder: thread 'MainThread': fit() at leak_outputs_in_cycle.py local module.outputs[*]
"""A small trainer in the shape of PyTorch Lightning's: the trainer refers to its module and the
module to its trainer (a reference cycle), and the module keeps each training step's output in a
list (4 MiB a step). After fit() returns nothing refers to either of them: they are cyclic garbage
that only the garbage collector frees. The list grows with every step (a second epoch would double
it): a leak, whatever frees it in the end."""
from _common import need_cuda_torch

torch = need_cuda_torch()


class Module(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(1024, 1024)
        self.outputs = []
        self.trainer = None

    def training_step(self, x):
        out = self.net(x)  # allocates
        return out, out.square().mean()


class Trainer:
    def __init__(self, module):
        self.module = module
        module.trainer = self  # the cycle
        self.optimizer = torch.optim.SGD(module.parameters(), lr=1e-3)

    def fit(self, steps):
        module = self.module
        for step in range(steps):
            x = torch.randn(1024, 1024, device="cuda")
            out, loss = module.training_step(x)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
            module.outputs.append(out.detach())  # for an epoch-end metric that never runs
            torch.cuda.synchronize()


def main():
    trainer = Trainer(Module().cuda())
    trainer.fit(150)
    print(f"{len(trainer.module.outputs)} outputs kept")


main()
