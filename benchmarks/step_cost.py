"""Issue 57: which of the tool's parts costs a launch-bound loop's every step, inside one process.

    python3 benchmarks/step_cost.py [--rounds 1] [--cycles 8] [--block 30] [--json PATH] [--keep DIR]

corpus/lightning_clean.py's classifier (a Lightning fit of 4-5 ms steps on an H200, each step
synchronized by its callback) runs plainly and under `gpumemdoctor run`, in that order, --rounds
times. After WARMUP steps (past the agent's start-up stack window and its every-step samples), the
steps go in blocks of --block, each block with one of STATES switched off, the states shuffled in
each of --cycles cycles. Each step's wall time and the main thread's CPU time (`time.thread_time`)
are kept, the first SETTLE steps after a switch left out; --keep DIR keeps them (one JSON a run).

A part's cost is the median step of the blocks with everything on less the median of the blocks
with that part off, in the same process: no drift between processes. In the plain run nothing can
be switched, and its states' differences are the method's own noise. More of the thread's CPU time
says the agent's work runs in the program's thread (hooks, PyTorch's bookkeeping); more wall time
without more CPU says the thread waits (the GIL, the driver).

STATES (what is off):
  on          nothing
  history     PyTorch's allocation history (the agent's events ring)
  sampler     the agent's sampling thread
  hooks       the optimizer step hooks (the step-end samples and watches) and backward()'s marks
  supervisor  the supervisor, which polls NVML every 5 ms (SIGSTOP)
  collector   the agent's garbage-collector callback
  all         all of the above

This reaches into the agent on purpose: benchmark code, never the tool's. Needs a CUDA GPU and
pytorch_lightning; prints a line and exits 0 without them.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _loop import cuda_torch_here  # noqa: E402
from _switch import _supervisor_pid, _wait_until_stopped, restart_sampling  # noqa: E402

STATES = ("on", "history", "sampler", "hooks", "supervisor", "collector", "all")
PARTS = ("history", "sampler", "hooks", "supervisor", "collector")
WARMUP = 120  # steps: the agent samples every step for 100, and its start-up stacks last 50 steps or 5 s
SETTLE = 3  # steps after a switch left out
SKIP_EXIT = 77


class Parts:
    """The tool's parts in this process, each switched off and on again; nothing where no agent is."""

    def __init__(self, torch):
        self.torch = torch
        module = sys.modules.get("gpumemdoctor._agent")
        self.agent = module._current() if module is not None else None
        self.supervisor = _supervisor_pid() if self.agent is not None else None
        self.off_now: set = set()
        agent = self.agent
        if agent is None:
            return
        from torch.optim import optimizer as optim_module

        self.hooks = {}
        for name in ("_global_optimizer_post_hooks", "_global_optimizer_pre_hooks"):
            table = getattr(optim_module, name, {})
            ours = {k: v for k, v in table.items() if getattr(v, "__self__", None) is agent}
            self.hooks[name] = (table, ours)
        backward = torch.autograd.backward
        self.backward = (backward, backward.__wrapped__) if getattr(backward, "__gpumemdoctor__", False) else None
        callback = agent.collections.callback if agent.collections is not None else None
        self.callback = callback if callback in gc.callbacks else None

    def describe(self) -> str:
        a = self.agent
        if a is None:
            return "no agent in this process: nothing is switched (A/A)"
        return ", ".join([
            f"agent pid {a.shared.pid}",
            f"history {'on' if a.history.on else 'OFF'}",
            f"sampling thread {'yes' if a.timer.thread is not None else 'NO'}",
            "hooks " + "+".join(f"{len(ours)}" for _, ours in self.hooks.values()),
            f"backward marks {'yes' if self.backward else 'no'}",
            f"collector callback {'yes' if self.callback else 'no'}",
            f"supervisor {self.supervisor or 'NONE'}",
        ])

    def set(self, state: str) -> None:
        want = set(PARTS) if state == "all" else ({state} if state != "on" else set())
        for part in self.off_now - want:
            self._on(part)
        for part in want - self.off_now:
            self._off(part)
        self.off_now = want

    def _off(self, part: str) -> None:
        a = self.agent
        if a is None:
            return
        if part == "history" and a.history.on:
            self.torch.cuda.memory._record_memory_history(enabled=None)
        elif part == "sampler":
            a.timer.stop()
        elif part == "hooks":
            for table, ours in self.hooks.values():
                for k in ours:
                    table.pop(k, None)
            if self.backward:
                self.torch.autograd.backward = self.backward[1]
        elif part == "supervisor" and self.supervisor:
            os.kill(self.supervisor, signal.SIGSTOP)
            _wait_until_stopped(self.supervisor)
        elif part == "collector" and self.callback and self.callback in gc.callbacks:
            gc.callbacks.remove(self.callback)

    def _on(self, part: str) -> None:
        a = self.agent
        if a is None:
            return
        if part == "history" and a.history.on:
            a.history.ring.apply(a.trace.on)
        elif part == "sampler":
            restart_sampling(a)
        elif part == "hooks":
            for table, ours in self.hooks.values():
                table.update(ours)
            if self.backward:
                self.torch.autograd.backward = self.backward[0]
        elif part == "supervisor" and self.supervisor:
            os.kill(self.supervisor, signal.SIGCONT)
        elif part == "collector" and self.callback:
            gc.callbacks.append(self.callback)


def _inside(cycles: int, block: int, seed: int, out: str) -> int:
    """The measured program: the corpus classifier's fit, its steps switched in blocks."""
    sys.path.insert(0, os.path.join(ROOT, "corpus"))
    try:
        import lightning_clean as program  # its Classifier and loader; its main runs only as __main__
    except SystemExit as exc:  # corpus/_common.py's need(): a library is missing
        return int(exc.code or SKIP_EXIT)
    torch, pl = program.torch, program.pl
    cuda = torch.cuda.is_available()  # (the CPU only proves that the program runs: tests/test_benchmarks.py)
    order = []
    rng = random.Random(seed)
    for _ in range(cycles):
        states = list(STATES)
        rng.shuffle(states)
        order.extend(states)
    steps = WARMUP + len(order) * block
    rows: list = []  # (state, wall s, thread cpu s) a step

    class Blocks(pl.Callback):
        def __init__(self):
            self.n = 0
            self.last = self.last_cpu = None
            self.state = "on"
            self.parts = None
            self.since = 0

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if cuda:
                torch.cuda.synchronize()
            now, cpu = time.perf_counter(), time.thread_time()
            if self.last is not None and self.n > WARMUP and self.since >= SETTLE:
                rows.append((self.state, now - self.last, cpu - self.last_cpu))
            self.n += 1
            self.since += 1
            if self.n == WARMUP:
                self.parts = Parts(torch)
                print("PARTS", self.parts.describe(), flush=True)
            if self.n >= WARMUP and (self.n - WARMUP) % block == 0 and (self.n - WARMUP) // block < len(order):
                self.state = order[(self.n - WARMUP) // block]
                self.parts.set(self.state)
                self.since = 0
            self.last, self.last_cpu = time.perf_counter(), time.thread_time()

        def on_train_end(self, trainer, module):
            if self.parts is not None:
                self.parts.set("on")

    torch.manual_seed(0)
    model = program.Classifier()
    trainer = pl.Trainer(max_steps=steps, accelerator="gpu" if cuda else "cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[Blocks()])
    trainer.fit(model, program.loader(steps))
    with open(out, "w", encoding="utf-8") as f:
        json.dump(rows, f)
    return 0


def summarise(rows: list) -> dict:
    """Per state: the median step's wall and CPU milliseconds, each against "on", and the wall's 99th
    percentile and longest (the worst gap, in the same process as its "on" blocks)."""
    by_state: dict = {}
    for state, wall, cpu in rows:
        by_state.setdefault(state, ([], []))
        by_state[state][0].append(wall)
        by_state[state][1].append(cpu)
    out = {}
    for state in STATES:
        if state not in by_state:
            continue
        walls, cpus = by_state[state]
        ordered = sorted(walls)
        out[state] = {"steps": len(walls), "wall_ms": round(statistics.median(walls) * 1e3, 4),
                      "cpu_ms": round(statistics.median(cpus) * 1e3, 4),
                      "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e3, 4),
                      "max_ms": round(ordered[-1] * 1e3, 4)}
    on = out.get("on")
    if on:
        for state, figures in out.items():
            figures["wall_saved_ms"] = round(on["wall_ms"] - figures["wall_ms"], 4)
            figures["cpu_saved_ms"] = round(on["cpu_ms"] - figures["cpu_ms"], 4)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--cycles", type=int, default=8)
    p.add_argument("--block", type=int, default=30)
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--keep", metavar="DIR", help="keep each run's steps here: [state, wall s, thread cpu s] a step")
    p.add_argument("--inside", metavar="OUT", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.inside:
        return _inside(args.cycles, args.block, args.seed, args.inside)
    if cuda_torch_here("step_cost") is None:
        return 0
    results = []
    tmp = args.keep or tempfile.mkdtemp(prefix="step-cost-")
    os.makedirs(tmp, exist_ok=True)
    for r in range(1, args.rounds + 1):
        for how in ("plain", "tool"):
            out = os.path.join(tmp, f"{how}-{r}.json")
            inner = [__file__, "--inside", out, "--cycles", str(args.cycles), "--block", str(args.block),
                     "--seed", str(r)]
            if how == "plain":
                command = [sys.executable, *inner]
            else:
                command = [sys.executable, "-m", "gpumemdoctor", "run", "-q", "-o", os.path.join(tmp, f"report-{r}.json"),
                           *inner]
            started = time.monotonic()
            proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
            if proc.returncode == SKIP_EXIT:
                print(f"step_cost: skipped: {proc.stderr.strip()[-200:]}")
                return 0
            if proc.returncode != 0 or not os.path.exists(out):
                print(f"step_cost: the {how} run failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}",
                      file=sys.stderr)
                return 1
            parts = next((line[6:] for line in proc.stdout.splitlines() if line.startswith("PARTS ")), "")
            with open(out, encoding="utf-8") as f:
                rows = json.load(f)
            figures = summarise(rows)
            results.append({"round": r, "run": how, "wall_s": round(time.monotonic() - started, 2), "parts": parts,
                            "states": figures})
            print(f"{how} #{r} ({results[-1]['wall_s']} s): {parts}", flush=True)
            for state, f in figures.items():
                print(f"  {state:<11} {f['steps']:>4} steps  wall {f['wall_ms']:7.3f} ms  cpu {f['cpu_ms']:7.3f} ms"
                      f"  off saves: wall {f['wall_saved_ms']:+.3f} ms  cpu {f['cpu_saved_ms']:+.3f} ms"
                      f"  p99 {f['p99_ms']:6.2f} ms  longest {f['max_ms']:6.2f} ms", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"cycles": args.cycles, "block": args.block, "warmup": WARMUP, "settle": SETTLE,
                       "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
