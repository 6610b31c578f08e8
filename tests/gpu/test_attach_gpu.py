"""`watch --pid N --attach` on a real GPU, on programs started plainly (not under `run`), attached to
after they have run a while: a leak through a list is named with its holder and its allocating line, a
program that only fills PyTorch's cache has it called cache, and the program's steps are not slowed
while the agent is in (the worst gap between two steps within 2 ms of the same program's before the
attach). And `%gpumemdoctor` in an IPython shell names `Out[n]` and the failed cell's frame with CUDA
tensors (tests/test_notebook.py is its CPU twin).

On x86-64 Linux the attach needs no debugger (ptrace alone, system/ptrace.py). Elsewhere, or with
GPUMEMDOCTOR_GDB set, it needs gdb: GPUMEMDOCTOR_GDB, or `.gdb/debs` from tests/gpu/fetch_gdb.sh (unpacked
here by tests/gpu/gdb_from_debs.py), or gdb on PATH; without any, these tests skip (the notebook's does not)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
WATCH_S = 10.0
# The program runs this long before the attach: long enough that its steps before the attach span as long a
# stretch as the ones while the agent is in (the worst of twice as many gaps is no fair measure).
WARM_S = WATCH_S + 2.0

# A training loop that marks its steps with an optimizer, writes each step's end (CLOCK_MONOTONIC, which
# the test shares) to a file when it is told to stop, and leaks or fills the cache as asked.
PROGRAM = textwrap.dedent('''
    import os, sys, time, torch
    mode, control = sys.argv[1], sys.argv[2]
    model = torch.nn.Linear(1024, 1024, device="cuda")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    kept = []
    ends = []
    print("ready", flush=True)
    while not os.path.exists(os.path.join(control, "stop")):
        x = torch.randn(256, 1024, device="cuda")
        out = model(x)
        out.square().mean().backward()
        opt.step()
        opt.zero_grad()
        if mode == "leak":
            kept.append(torch.empty(1 << 20, device="cuda"))  # allocates 4 MiB a step, kept by the list
        else:
            scratch = torch.empty(256 << 20, device="cuda")  # 1 GiB, freed at once: the cache keeps it
            del scratch
        torch.cuda.synchronize()
        ends.append(time.monotonic())
        time.sleep(0.005)
    with open(os.path.join(control, "steps.json"), "w") as f:
        f.write(__import__("json").dumps(ends))
''')
LEAK_LINE = next(i for i, line in enumerate(PROGRAM.splitlines(), 1) if "# allocates" in line)


def _debugger() -> str | None:
    given = os.environ.get("GPUMEMDOCTOR_GDB")
    if given:
        return given
    debs = REPO / ".gdb" / "debs"
    if debs.is_dir() and any(debs.glob("*.deb")):
        sys.path.insert(0, str(Path(__file__).parent))
        from gdb_from_debs import wrapper

        path = wrapper(REPO / ".gdb")
        if subprocess.run([str(path), "--version"], capture_output=True).returncode == 0:
            return str(path)
    return shutil.which("gdb")


@pytest.fixture(scope="module")
def debugger():
    from gpumemdoctor.system import ptrace

    if ptrace.supported() and not os.environ.get("GPUMEMDOCTOR_GDB"):
        return None  # ptrace alone: no debugger
    path = _debugger()
    if path is None:
        pytest.skip("no gdb: run tests/gpu/fetch_gdb.sh where apt is, carry .gdb/debs, or set GPUMEMDOCTOR_GDB")
    return path


def _worst_gap(ends: list, start: float, stop: float) -> tuple[float, int]:
    """The longest gap between two step ends inside [start, stop], and how many steps there."""
    inside = [t for t in ends if start <= t <= stop]
    gaps = [b - a for a, b in zip(inside, inside[1:])]
    return (max(gaps) if gaps else float("nan")), len(inside)


def _attach(tmp_path: Path, debugger: str | None, mode: str, *options: str):
    """Run the program plainly, attach to it after WARM_S, watch WATCH_S, stop; (report, its steps' ends,
    the times around the attach, watch's output)."""
    control = tmp_path / "control"
    control.mkdir()
    script = tmp_path / "train.py"  # a file: its lines are the program's own in the stacks
    script.write_text(PROGRAM)
    program = subprocess.Popen([sys.executable, str(script), mode, str(control)], stdout=subprocess.PIPE, text=True)
    marks: dict = {}
    try:
        assert program.stdout.readline().strip() == "ready"
        marks["ready"] = time.monotonic()
        time.sleep(WARM_S)
        marks["attach"] = time.monotonic()
        watch = subprocess.Popen([sys.executable, "-m", "gpumemdoctor", "watch", "--pid", str(program.pid), "--attach",
                                  "--no-tui", "--interval", "0.5", "--duration", str(WATCH_S), "-o", "r.json",
                                  *options], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env={**os.environ, **({"GPUMEMDOCTOR_GDB": debugger} if debugger else {}),
                                      "NO_COLOR": "1"})
        err: list = []

        def read_err():
            for line in watch.stderr:
                err.append(line)
                if "the agent is in process" in line:
                    marks["in"] = time.monotonic()
                if "taking the agent out" in line:
                    marks["out"] = time.monotonic()
        reader = threading.Thread(target=read_err)
        reader.start()
        out = watch.stdout.read()
        watch.wait(timeout=180)
        reader.join()
        assert watch.returncode == 0, "".join(err)
        (control / "stop").write_text("")
        program.wait(timeout=60)
    finally:
        if program.poll() is None:
            program.kill()
    ends = json.loads((control / "steps.json").read_text())
    keep = os.environ.get("GPUMEMDOCTOR_FIXTURE_DIR")  # the recordings kept as fixtures, as the scenarios'
    if keep:
        shutil.copy(tmp_path / "r.json", Path(keep) / f"attach_{mode}.json")
    return json.loads((tmp_path / "r.json").read_text()), ends, marks, out + "".join(err)


def test_attach_names_the_leak_its_holder_and_its_line(tmp_path, debugger):
    # --max-pause 0.25: the copy of the process that searches for holders may pause this program (a
    # GiB or more of its own memory) longer than the 20 ms default; without it the probes name the holder.
    report, ends, marks, text = _attach(tmp_path, debugger, "leak", "--max-pause", "0.25")
    assert report["verdict"] == "leak", text
    leak = next(f for f in report["findings"] if f["kind"] == "leak")
    suspect = leak["suspects"][0]
    assert any("kept" in h["path"] for h in suspect["holders"]), suspect
    assert suspect["where"][0].endswith("train.py") and suspect["where"][1] == LEAK_LINE, suspect  # the allocating line, from the history since the attach
    notes = " ".join(report["notes"])
    assert "starts at the attach" in notes
    attached = report["recording"]["target"]["attached"]
    assert attached["method"] == ("gdb" if debugger else "ptrace") and attached["detached"]["where"] == "the main thread"
    assert "PyTorch's memory history (off)" in attached["detached"]["restored"]
    assert "holder on cuda:0" in text or "growth suspected" in text  # the live view saw it


def test_attach_calls_a_filled_cache_cache_and_leaves_the_steps_alone(tmp_path, debugger):
    report, ends, marks, text = _attach(tmp_path, debugger, "cache")
    assert report["verdict"] != "leak", text
    (b,) = [b for b in report["breakdown"] if b["torch_index"] == 0]
    assert b["cache_bytes"] >= 900 << 20 and b["live_tensor_bytes"] < 256 << 20, b  # 1 GiB freed each step
    assert "cache" in text
    # The steps while the agent was in (a second after it came in, until it was asked out) against the
    # same program's before the attach, over as long a stretch.
    length = marks["out"] - marks["in"] - 1.0
    plain, n_plain = _worst_gap(ends, marks["attach"] - 0.5 - length, marks["attach"] - 0.5)
    inside, n_inside = _worst_gap(ends, marks["in"] + 1.0, marks["out"])
    print(f"worst step gap: plain {plain * 1000:.2f} ms ({n_plain} steps), attached {inside * 1000:.2f} ms "
          f"({n_inside} steps)")
    window = [t for t in ends if marks["in"] + 1.0 <= t <= marks["out"]]
    worst = max(range(1, len(window)), key=lambda i: window[i] - window[i - 1], default=None)
    if worst is not None:
        print(f"the attached stretch's worst gap ends {window[worst] - marks['in']:.3f} s after the agent came in")
    for agent in report["recording"]["agents"]:  # what the agent saw in its worst gap, by its part
        print("the agent's step gaps:", json.dumps((agent.get("exit_info") or {}).get("step_gaps")))
    assert n_inside > 100 and n_plain > 100
    assert inside <= plain + 0.002


NOTEBOOK = textwrap.dedent(r'''
    import sys
    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance(colors="nocolor")
    for cell in ["%load_ext gpumemdoctor", "import sys, torch",
                 "torch.zeros(64 << 20, device='cuda')",                       # In[3]: Out[3], 256 MiB
                 "def f():\n    x = torch.zeros(128 << 20, device='cuda')\n    raise ValueError('boom')",
                 "f()",                                                         # its frame keeps 512 MiB
                 "print('=== look')", "%gpumemdoctor"]:
        shell.run_cell(cell, store_history=True)
''')


def _ipython_env() -> dict | None:
    """The environment the notebook's shell runs in: this one where IPython imports; else with the
    wheels tests/gpu/fetch_ipython.sh brought (.ipython/wheels) installed into .ipython/site and put on
    PYTHONPATH; None where neither is there."""
    try:
        import IPython  # noqa: F401

        return dict(os.environ)
    except ImportError:
        pass
    wheels, site = REPO / ".ipython" / "wheels", REPO / ".ipython" / "site"
    if not wheels.is_dir():
        return None
    if not (site / "IPython").is_dir():
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheels),
                               "--target", str(site), "ipython"], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            return None
    path = os.pathsep.join(p for p in [str(site), os.environ.get("PYTHONPATH", "")] if p)
    return {**os.environ, "PYTHONPATH": path}


def test_the_notebook_magic_names_out_and_the_traceback_frame_with_cuda_tensors(tmp_path):
    env = _ipython_env()
    if env is None:
        pytest.skip("no IPython here: run tests/gpu/fetch_ipython.sh where pip is, and carry .ipython/wheels")
    done = subprocess.run([sys.executable, "-c", NOTEBOOK], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.returncode == 0, done.stderr
    look = done.stdout.split("=== look", 1)[1]
    lines = [line.strip() for line in look.splitlines()]
    assert any(line.startswith("GPU ") and "tensors 768 MiB" in line and "cache" in line for line in lines), look
    frame = next(line for line in lines if "the last error's frame f(), local x" in line)
    assert frame.startswith("512 MiB") and "(In[4], line 3)" in frame and "sys.last_traceback" in frame
    out = next(line for line in lines if " Out[3] " in f" {line} ")
    assert out.startswith("256 MiB") and "%reset -f out" in out
    assert "CUDA tensors" in look and "does not apply" not in look
