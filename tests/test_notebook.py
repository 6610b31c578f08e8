"""`%load_ext gpumemdoctor` and `%gpumemdoctor` in a real IPython shell (InteractiveShell, in a
subprocess: no browser, no kernel), on CPU tensors: a cell's output and a failed cell keep tensors,
the magic names `Out[n]` and the traceback's frame with what clears each, and doing what it says
frees them. Its GPU twin is tests/gpu/test_attach_gpu.py's notebook test."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("IPython")
pytest.importorskip("torch")

SHELL = textwrap.dedent(r'''
    import sys, weakref
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance(colors="nocolor")
    CELLS = [
        "%load_ext gpumemdoctor",
        "import sys, weakref, torch",
        "torch.zeros(1 << 20)",                      # In[3]: its output is kept, as Out[3] (4 MiB)
        "big = torch.ones(1 << 18)",                 # a global (1 MiB)
        "def f():\n    x = torch.zeros(3 << 20)\n    raise ValueError('boom')",
        "f()",                                       # In[6]: fails, its frame keeps x (12 MiB)
        "tb = sys.last_traceback\nwhile tb.tb_frame.f_code.co_name != 'f':\n    tb = tb.tb_next\n"
        "refs = [weakref.ref(Out[3]), weakref.ref(tb.tb_frame.f_locals['x'])]\ndel tb",
        "print('=== before')",
        "%gpumemdoctor",
        # each remedy, as the magic words it
        "%reset -f out",
        "get_ipython().user_ns_hidden.update(_=None, __=None, ___=None)",
        "sys.last_traceback = sys.last_value = sys.last_type = "
        + ("sys.last_exc = " if sys.version_info >= (3, 12) else "") + "get_ipython().InteractiveTB.tb = None",
        "import gc; gc.collect(); print('=== freed', [r() is None for r in refs])",
        "print('=== after')",
        "%gpumemdoctor",
    ]
    for cell in CELLS:
        shell.run_cell(cell, store_history=True)
''')


def test_the_magic_names_the_output_history_and_the_failed_cells_frame(tmp_path):
    done = subprocess.run([sys.executable, "-c", SHELL], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    before, after = out.split("=== before", 1)[1].split("=== after", 1)
    assert "CUDA is not started in this kernel: the split of GPU memory does not apply" in before
    lines = [line.strip() for line in before.splitlines()]
    traceback = next(line for line in lines if "the last error's frame f(), local x" in line)
    assert traceback.startswith("12.0 MiB") and "(In[5], line 3)" in traceback  # f's own cell and line
    assert "clear: sys.last_traceback = sys.last_value = sys.last_type = " in traceback
    assert "get_ipython().InteractiveTB.tb = None" in traceback
    kept = next(line for line in lines if " Out[3] " in f" {line} ")
    assert kept.startswith("4.00 MiB") and "clear: %reset -f out" in kept
    hidden = next(line for line in lines if "get_ipython().user_ns_hidden['_']" in line)
    assert hidden.startswith("4.00 MiB") and "user_ns_hidden.update(_=None, __=None, ___=None)" in hidden
    assert any(line.startswith("1.00 MiB") and "global big" in line and "clear: del big" in line for line in lines)
    # The order: the largest first
    assert lines.index(traceback) < lines.index(kept)
    # Doing what it says lets the tensors go, and the magic no longer names them
    assert "=== freed [True, True]" in out
    assert "Out[3]" not in after and "last error" not in after and "global big" in after


def test_importing_the_package_loads_neither_torch_nor_ipython():
    code = ("import sys, gpumemdoctor; assert callable(gpumemdoctor.load_ipython_extension); "
            "print(sorted(m for m in ('torch', 'IPython', 'gpumemdoctor.notebook') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr
