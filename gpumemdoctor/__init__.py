"""gpumemdoctor: where a Python program's GPU memory goes, whether it leaks, and what to do.

Importing this package is cheap and safe in any program: `step()` does nothing
unless the program runs under `gpumemdoctor run`.
"""
from __future__ import annotations

__version__ = "0.1.0"


def step() -> None:
    """Mark the end of one iteration of your loop, for loops without a torch optimizer.

    Once a program calls this, its optimizer steps no longer count as steps.
    Outside `gpumemdoctor run` it does nothing.
    """
    from . import _agent

    _agent.step()


def enable() -> None:
    """Let `gpumemdoctor watch --pid` see PyTorch's figures in this process, from now on.

    Starts the agent if `gpumemdoctor run` did not, and a local socket that answers
    read-only statistics to the same user only. Safe to call more than once; it never raises.
    """
    from . import _agent

    _agent.enable()


def load_ipython_extension(ipython) -> None:
    """`%load_ext gpumemdoctor` in IPython or Jupyter: adds the `%gpumemdoctor` line magic, which reports
    on the kernel's own memory (see gpumemdoctor/notebook.py). Importing the package loads neither torch
    nor IPython."""
    from . import notebook

    notebook.load_ipython_extension(ipython)


__all__ = ["__version__", "enable", "load_ipython_extension", "step"]
