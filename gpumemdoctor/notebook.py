"""The IPython and Jupyter extension: `%load_ext gpumemdoctor`, then `%gpumemdoctor` in a cell reports
on the kernel's own memory now (_agent/kernel.py looks, reporters/notebook.py draws). The package's
`load_ipython_extension` imports this module only when IPython loads the extension."""
from __future__ import annotations

import os


def load_ipython_extension(ipython) -> None:
    """Register the `%gpumemdoctor` line magic."""

    def gpumemdoctor(line: str = "") -> None:
        """%gpumemdoctor: PyTorch's split on each GPU now, and which names hold the largest tensors
        (the output history Out[n], the last error's frames, the globals), each with what clears it."""
        from ._agent.kernel import look
        from .reporters.notebook import render

        found = look(ipython.user_ns, ipython)
        print(render(found, os.getpid()))  # printed, not returned: a returned value would go into Out

    ipython.register_magic_function(gpumemdoctor, magic_kind="line", magic_name="gpumemdoctor")


def unload_ipython_extension(ipython) -> None:
    """Nothing is left to undo: the magic goes with the extension's module."""
