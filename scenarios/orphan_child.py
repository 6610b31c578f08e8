# expect: clean
# expect-finding: orphan-process
"""A child process that outlives the script while holding GPU memory. The child
frees itself after 60 s; tests kill it sooner by the PID in the report."""
import subprocess
import sys

CHILD = r"""
import sys, time
import torch
keep = torch.ones(256 << 20, device="cuda")  # 1 GiB
torch.cuda.synchronize()
print("child ready", flush=True)
sys.stdout.close()
time.sleep(60)
"""

from _common import need_cuda_torch

need_cuda_torch()
child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE,
                         start_new_session=True)
print(child.stdout.readline().decode().strip(), "pid", child.pid)
# The script ends here without waiting for its child.
