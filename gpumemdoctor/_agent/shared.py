"""What every part of the agent reads: the process, its record file, torch and its devices, the
step count, the cost so far.

core.py makes one and hands it to each part, with the siblings that part uses, by name: a part
never reaches another through it. core.py sets the fields as the run goes (torch once imported,
the devices once CUDA started, the steps at each step's end); the parts read them and add to
`cost` and `felt`.
"""
from __future__ import annotations

import os
import time

from .channel import Channel
from .readings.felt import Felt


class Shared:
    """The agent's state that its parts share (plain attributes: read on the step's path)."""
    __slots__ = ("pid", "born", "run_dir", "channel", "torch", "devices", "nvml", "steps", "explicit_steps",
                 "last_step_t", "finished", "cost", "felt", "step_inputs")

    def __init__(self, run_dir: str | None):
        self.pid = os.getpid()
        self.born = time.monotonic()  # the agent's start: about the process's (the exit search's share)
        self.run_dir = run_dir
        self.channel = Channel(run_dir, self.pid)
        self.torch = None
        self.devices: list[dict] = []  # torch index, uuid, nvml device (or None)
        self.nvml = None
        self.steps = 0
        self.explicit_steps = False
        self.last_step_t = 0.0
        self.finished = False
        self.cost = {"init_s": 0.0, "sample_s": 0.0, "step_pause_max_s": 0.0, "step_pause_max_step": 0}
        self.felt = Felt()  # the longest gap between two step ends, as the program felt it
        self.step_inputs = None  # what each step was given (step_inputs.py; made once torch is here)
