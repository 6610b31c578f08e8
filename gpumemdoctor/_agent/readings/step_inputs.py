"""What each step was given: the tensors passed to the first module call after a step's end (the
model's forward: `input_ids`, `args[0]`), folded into the largest shape of each name the steps were
given, so that an out-of-memory error can say its step's input against the earlier steps' (a batch
eight times longer than any before it).

At a step's end a global forward pre-hook is registered (`register_module_forward_pre_hook`); its
first call reads the inputs of that module call (oom.py's `module_inputs`: the outermost `_call_impl`
on the stack, the first call of the step) and removes the hook, so every later module call of the step
takes PyTorch's fast path again. The shapes read in a step are folded in at the next step's end: what
the out-of-memory observer sees (`earlier`) is the steps before the running one. Cost: one handle
made and one hook call of a few tensors' shapes per step (a few microseconds). Never where
torch.compile has compiled a frame (a global hook added and removed would make it recompile), and
nothing of it may break the program: every part is guarded.
"""
from __future__ import annotations

import sys
import time

from .oom import module_inputs

MAX_NAMES = 8  # inputs kept (as oom.MAX_INPUTS)


class StepInputs:
    """The largest shape of each input name the steps' first module calls were given."""

    def __init__(self, torch, felt=None):
        self.torch = torch
        self.felt = felt  # felt.py: each step's start stamped, for the gaps between steps' starts
        self.handle = None
        self.current: list | None = None  # [[name, shape, dtype]] of the running step, read by the hook
        self.largest: dict = {}  # name -> [shape, dtype, numel, steps read]
        self.off = False

    def at_step(self) -> None:
        """A step's end: fold the step's inputs in, arm the hook for the next."""
        if self.off:
            return
        try:
            if self.current:
                self._fold(self.current)
            self.current = None
            if self.handle is None:
                if _compiled():
                    self.off = True
                    return
                self.handle = self.torch.nn.modules.module.register_module_forward_pre_hook(self._read)
        except Exception:
            self.off = True

    def _read(self, module, args) -> None:
        """The first module call of the step: its inputs, then the hook is gone."""
        try:
            if self.felt is not None:
                self.felt.step_start(time.perf_counter())
            handle, self.handle = self.handle, None
            if handle is not None:
                handle.remove()
            self.current = module_inputs(self.torch, sys._getframe()) or None
        except Exception:
            pass
        return None

    def _fold(self, inputs: list) -> None:
        for name, shape, dtype in inputs:
            numel = 1
            for n in shape:
                numel *= n
            known = self.largest.get(name)
            if known is None:
                if len(self.largest) >= MAX_NAMES:
                    continue
                self.largest[name] = [shape, dtype, numel, 1]
                continue
            known[3] += 1
            if numel > known[2]:
                known[0], known[1], known[2] = shape, dtype, numel

    def earlier(self) -> list:
        """[[name, largest shape, dtype, steps read]]: what the steps before the running one were given."""
        return [[name, shape, dtype, steps] for name, (shape, dtype, _, steps) in self.largest.items()]

    def remove(self) -> None:
        """The hook taken out (the agent leaving a program it was brought into)."""
        handle, self.handle = self.handle, None
        self.off = True
        if handle is not None:
            try:
                handle.remove()
            except Exception:
                pass


def _compiled() -> bool:
    from ..peak.saved_by import _compiled as compiled

    return compiled()
