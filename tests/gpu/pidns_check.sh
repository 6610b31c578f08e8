#!/bin/sh
# `gpumemdoctor ps` inside a PID namespace, on a real GPU (issue 28, row 12). As root, from anywhere:
#
#     sh tests/gpu/pidns_check.sh            (PYTHON=python3 by default)
#
# PID 1 of a new PID namespace (unshare --pid --fork --mount-proc), as a container's first process is,
# starts two processes that hold 256 MiB of GPU memory each: one of its own (its parent is PID 1, which
# started it: no orphan), and one whose own parent, in a session of its own, started it and exited
# (adopted by PID 1: an orphan). `gpumemdoctor ps --json` runs inside the namespace. Prints one line,
# "PASS: ..." (exit 0) or "FAIL: ..." (exit 1); "SKIP: ..." (exit 77) without root, unshare or a GPU.
set -u
PYTHON=${PYTHON:-python3}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
[ "$(id -u)" = 0 ] || { echo "SKIP: a PID namespace needs root"; exit 77; }
command -v unshare >/dev/null 2>&1 || { echo "SKIP: no unshare here"; exit 77; }
"$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1 ||
    { echo "SKIP: no CUDA build of torch, or no GPU"; exit 77; }
exec unshare --pid --fork --mount-proc "$PYTHON" - <<'PY'
import json, os, subprocess, sys, time

HOLD = ("import time, torch; x = torch.ones(64 << 20, device='cuda'); torch.cuda.synchronize(); "
        "print('ready', flush=True); time.sleep(300)")
# The orphan's parent: starts it, waits until it holds its memory, says its PID and exits.
PARENT = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', %r], stdout=subprocess.PIPE, "
          "stdin=subprocess.DEVNULL, text=True); p.stdout.readline(); print(p.pid)" % HOLD)


def fail(why):
    print(f"FAIL: {why}", flush=True)
    sys.exit(1)


if os.getpid() != 1:
    fail(f"not PID 1 of a new PID namespace (PID {os.getpid()})")
child = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
# (its standard error is this one's: a captured one would stay open in the orphan, and run() wait for it)
parent = subprocess.run([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, timeout=300,
                        start_new_session=True)
if parent.returncode != 0 or not parent.stdout.strip():
    fail(f"the orphan's parent failed (exit {parent.returncode})")
orphan = int(parent.stdout.split()[-1])
if child.stdout.readline().strip() != "ready":
    fail("the child of PID 1 did not get its GPU memory")
time.sleep(1)
ps = subprocess.run([sys.executable, "-m", "gpumemdoctor", "ps", "--json"], capture_output=True, text=True, timeout=120)
if ps.returncode != 0:
    fail(f"gpumemdoctor ps exited {ps.returncode}: {ps.stderr.strip()[-500:]}")
holders = {h["pid"]: h for g in json.loads(ps.stdout)["gpus"] for h in g["holders"]}
problems = []
for pid, who, expected in ((child.pid, "the child PID 1 started", []), (orphan, "the orphan", ["orphaned"])):
    h = holders.get(pid)
    if h is None:
        problems.append(f"{who} (PID {pid}) is not among the holders NVML lists here ({sorted(holders)})")
        continue
    flags = [f["flag"] for f in h["flags"]]
    if h["ppid"] != 1:
        problems.append(f"{who} (PID {pid}) has parent {h['ppid']}, not PID 1")
    if flags != expected:
        problems.append(f"{who} (PID {pid}) is flagged {flags}, not {expected}")
if problems:
    fail("; ".join(problems))
print(f"PASS: PID {child.pid}, started by PID 1, is not flagged; PID {orphan}, whose parent is gone, is "
      "flagged orphaned", flush=True)
PY
