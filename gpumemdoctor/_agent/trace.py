"""PyTorch's allocation history (the stack of each live block): turned on and off, as --trace says.

"on": from CUDA's start. "auto" (the default): once growth is suspected (watch.py), for
TRACE_WINDOW_S. "off": never. Holders are looked for in every mode.
"""
from __future__ import annotations

import os
import time

from .startup import ENV_SNAPSHOT, ENV_TRACE

TRACE_MODES = ("auto", "on", "off")
TRACE_MAX_ENTRIES = 100_000  # of PyTorch's allocation history (a ring: old entries drop off)
# --trace auto records stacks for this long once growth is seen, then stops: the leak's line is
# known by then (its blocks keep their stacks), and a day-long run neither pays the history's
# cost on every allocation nor builds a snapshot of every leaked block at exit.
TRACE_WINDOW_S = 60.0


class Trace:
    """Whether allocation stacks are being recorded, were recorded, and until when."""

    def __init__(self, agent, run_dir: str | None):
        self.agent = agent
        mode = os.environ.get(ENV_TRACE, "auto" if run_dir else "off")
        self.mode = mode if mode in TRACE_MODES else "auto"
        self.on = False
        self.was_on = False  # stacks were recorded for a while (--trace auto stops after a window)
        self.stop_at: float | None = None  # monotonic time: --trace auto's window ends

    def start(self, why: str) -> None:
        """PyTorch's allocation history with Python stacks, from now on."""
        agent = self.agent
        error = None
        try:
            # "state" keeps the stack of each live block and no event history: cheaper, and the
            # snapshot stays quick to take. The event history is kept only for --snapshot.
            enabled = "all" if os.environ.get(ENV_SNAPSHOT) == "1" else "state"
            agent.torch.cuda.memory._record_memory_history(
                enabled=enabled, context="alloc", stacks="python", max_entries=TRACE_MAX_ENTRIES)
            self.on = self.was_on = True
            if why == "growth" and self.mode == "auto" and os.environ.get(ENV_SNAPSHOT) != "1":
                self.stop_at = time.monotonic() + TRACE_WINDOW_S
        except Exception as exc:  # the cudaMallocAsync backend has no history
            error = f"{type(exc).__name__}: {exc}"[:300]
        agent.channel.write({"type": "trace", "t": time.monotonic(), "step": agent.steps, "why": why,
                             "ok": self.on, "error": error})

    def stop(self) -> None:
        """The end of --trace auto's window: no more stacks for new allocations; the live
        blocks allocated meanwhile keep theirs."""
        agent = self.agent
        self.stop_at = None
        try:
            agent.torch.cuda.memory._record_memory_history(enabled=None)
            self.on = False
            error = None
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"[:300]
        agent.channel.write({"type": "trace", "t": time.monotonic(), "step": agent.steps,
                             "why": f"stopped after {TRACE_WINDOW_S:.0f} s", "ok": error is None, "error": error})
