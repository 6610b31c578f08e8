"""The optimizers' parts of a peak (gpumemdoctor/_agent/peak/peak.py's optimizer_figures, issue 40 item 2):
every optimizer that stepped, with all its parameter groups, each storage counted once, in the first
of parameters, gradients and optimizer state it belongs to. CPU tensors stand in for one device's
(index -1, as `Tensor.get_device()` gives them)."""
from __future__ import annotations

import json
import weakref
from types import SimpleNamespace

import pytest

from gpumemdoctor._agent.peak.peak import PeakWatch

torch = pytest.importorskip("torch")
CPU = -1


def _watch(*optimizers) -> PeakWatch:
    watch = PeakWatch(SimpleNamespace(), None, None, None)
    watch.optimizers = [weakref.ref(o) for o in optimizers]
    return watch


def _nbytes(tensors) -> int:
    return sum(t.untyped_storage().nbytes() for t in tensors)


def test_several_optimizers_and_parameter_groups_are_all_counted_once():
    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.LayerNorm(32))
    b = torch.nn.Linear(32, 8)
    shared = a[0].weight  # also trained by the second optimizer: counted once, as the first's
    decay = [a[0].weight]
    no_decay = [a[0].bias, a[1].weight, a[1].bias]
    adamw = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}])
    sgd = torch.optim.SGD([{"params": list(b.parameters())}, {"params": [shared], "lr": 0.01}], momentum=0.9)
    b(a(torch.randn(4, 64))).sum().backward()
    adamw.step()
    sgd.step()
    watch = _watch(adamw, sgd)
    figures, seen, sizes = [0, 0, 0], {}, {}
    rows = json.loads(f"[{watch.optimizer_figures(CPU, figures, seen, sizes)}]")

    params_a, params_b = list(a.parameters()), list(b.parameters())
    adam_state = [v for p in params_a for v in adamw.state[p].values()]  # exp_avg, exp_avg_sq, step
    sgd_state = [sgd.state[p]["momentum_buffer"] for p in params_b + [shared]]
    assert figures == [_nbytes(params_a + params_b), _nbytes(p.grad for p in params_a + params_b),
                       _nbytes(adam_state + sgd_state)]
    # Each optimizer's row: the second counts only what the first did not (the shared parameter's
    # weight and gradient are the first's; its momentum is the second's own state).
    assert rows == [["AdamW", _nbytes(params_a), _nbytes(p.grad for p in params_a), _nbytes(adam_state)],
                    ["SGD", _nbytes(params_b), _nbytes(p.grad for p in params_b), _nbytes(sgd_state)]]
    assert seen[shared.untyped_storage().data_ptr()] == 1
    assert {seen[t.untyped_storage().data_ptr()] for t in sgd_state} == {3}
    assert sum(sizes.values()) == sum(figures)


def test_a_wrapped_optimizer_adds_nothing_twice():
    """A wrapper whose param_groups and state are its optimizer's (accelerate's AcceleratedOptimizer
    is one), seen stepping after it: its row is empty, the figures those of the optimizer."""

    class Wrapped(torch.optim.Optimizer):
        def __init__(self, optimizer):  # as accelerate's: no Optimizer.__init__ of its own
            self.optimizer = optimizer

        @property
        def param_groups(self):
            return self.optimizer.param_groups

        @property
        def state(self):
            return self.optimizer.state

    model = torch.nn.Linear(16, 16)
    inner = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 16)).sum().backward()
    inner.step()
    wrapped = Wrapped(inner)  # (the watch keeps weak references only)
    figures = [0, 0, 0]
    rows = json.loads(f"[{_watch(inner, wrapped).optimizer_figures(CPU, figures)}]")
    assert rows[1] == ["Wrapped", 0, 0, 0] and rows[0][1:] == figures
    assert figures[0] == _nbytes(model.parameters()) and figures[2] > 2 * figures[0]  # exp_avg, exp_avg_sq, step


def test_a_tensor_on_another_device_is_not_counted():
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    figures = [0, 0, 0]
    _watch(opt).optimizer_figures(0, figures)  # device 0: these tensors are on the CPU
    assert figures == [0, 0, 0]


def test_a_reading_put_off_reads_the_gradients_then_the_rest_and_finds_what_one_pass_finds():
    """history.py's reading put off to later steps reads the gradients at its moment (they are set to
    None and made again each step) and the parameters and state at its walk (they stay while an
    optimizer steps), of the optimizers that had stepped at its moment: the two passes together find
    the storages and categories one pass finds."""
    from gpumemdoctor._agent.peak.peak import ALL_STORAGES, GRADIENTS, PARAMETERS, STATE

    torch.manual_seed(0)
    a, b = torch.nn.Linear(16, 8), torch.nn.Linear(8, 4)
    first, second = torch.optim.AdamW(a.parameters()), torch.optim.SGD(b.parameters(), momentum=0.9)
    b(a(torch.randn(4, 16))).sum().backward()
    first.step()
    second.step()
    watch = _watch(first, second)
    one_seen, one_sizes = {}, {}
    watch.optimizer_figures(CPU, [0, 0, 0], one_seen, one_sizes, ALL_STORAGES)
    seen, sizes = {}, {}
    watch.optimizer_figures(CPU, [0, 0, 0], seen, sizes, GRADIENTS)
    assert set(seen.values()) == {2} and len(seen) == 4
    watch.optimizer_figures(CPU, [0, 0, 0], seen, sizes, PARAMETERS | STATE, 2)
    assert seen == one_seen and sizes == one_sizes and set(seen.values()) == {1, 2, 3}
    # Only the optimizers that had stepped at the reading's moment: the first one here.
    seen = {}
    watch.optimizer_figures(CPU, [0, 0, 0], seen, {}, PARAMETERS, 1)
    assert len(seen) == 2 and set(seen.values()) == {1}
