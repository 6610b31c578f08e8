"""Issue 57: what the peak's probe (gpumemdoctor/_agent/probe.py) costs in a Lightning loop that keeps
its step outputs, and where that time goes.

    python3 benchmarks/probe_cost.py [--repeats 9] [--profile] [--cpu] [--probe-from PATH]

corpus/lightning_kept_step_outputs.py's MLP (each step's output kept in a list on the module, with
its autograd graph) is fitted for 256 steps. At steps AT, inside the program's callback (the
program's frames, as a probe at a step's end sees them), the probe runs --repeats times with a
budget it does not reach; the median and the fastest are printed with what it found (tensors,
graphs, links, the largest holder). --profile adds one probe of the last step split by its parts (each
part's own time, the timers' cost included: a profiler would make the probe skip the frames, as it
does under any tracer). --cpu runs the same on CPU tensors (the probe told that every tensor counts), to compare
a machine without a GPU with one. --probe-from PATH times that probe.py instead of the package's (an
earlier version of it, `git show REV:gpumemdoctor/_agent/probe.py > PATH`), loaded as a module of the
agent's package.

A pure-Python reference (REFERENCE: a loop of attribute reads and dict updates) is timed too: the
ratio of two machines' probes to the ratio of their references tells a slower host from a probe
that costs more on a GPU's tensors. Needs pytorch_lightning, and a CUDA GPU unless --cpu.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AT = (64, 128, 192, 250)
SKIP_EXIT = 77


def reference_us() -> float:
    """Microseconds of a fixed pure-Python loop (the median of five)."""
    def loop():
        d: dict = {}
        for i in range(20000):
            d[i & 255] = d.get(i & 255, 0) + i
        return d

    times = []
    for _ in range(5):
        started = time.perf_counter()
        loop()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def timed_probe(Probe):
    """A Probe whose parts add their own time to `parts` (seconds; _chain's inside _tensor's left out)."""
    parts = {"tensor": 0.0, "chain": 0.0, "attributes": 0.0, "module": 0.0, "frames and the rest": 0.0}
    calls = {name: 0 for name in parts}

    class Timed(Probe):
        def _tensor(self, *a):
            started = time.perf_counter()
            chained = parts["chain"]
            super()._tensor(*a)
            parts["tensor"] += time.perf_counter() - started - (parts["chain"] - chained)
            calls["tensor"] += 1

        def _chain(self, fn):
            started = time.perf_counter()
            try:
                return super()._chain(fn)
            finally:
                parts["chain"] += time.perf_counter() - started
                calls["chain"] += 1

        def _attributes(self, *a):
            started = time.perf_counter()
            inner = parts["tensor"] + parts["chain"]
            super()._attributes(*a)
            parts["attributes"] += time.perf_counter() - started - (parts["tensor"] + parts["chain"] - inner)
            calls["attributes"] += 1

        def _module(self, *a):
            started = time.perf_counter()
            super()._module(*a)
            parts["module"] += time.perf_counter() - started
            calls["module"] += 1

    return Timed, parts, calls


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--probe-from", metavar="PATH")
    args = p.parse_args(argv)
    if args.cpu:
        os.environ["CORPUS_DEVICE"] = "cpu"
    sys.path.insert(0, os.path.join(ROOT, "corpus"))
    sys.path.insert(0, ROOT)
    try:
        import lightning_kept_step_outputs as program
    except SystemExit as exc:  # corpus/_common.py's need() and device(): what is missing
        if exc.code == SKIP_EXIT:
            print("probe_cost: skipped: it needs pytorch_lightning, and a CUDA GPU unless --cpu")
            return 0
        raise
    if args.probe_from:
        import importlib.util

        spec = importlib.util.spec_from_file_location("gpumemdoctor._agent.probe_compared", args.probe_from)
        compared = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(compared)
        Probe = compared.Probe
    else:
        from gpumemdoctor._agent.probe import Probe

    torch, pl = program.torch, program.pl
    on_device = (lambda t: True) if args.cpu else None
    lines = []

    class ProbeAt(pl.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if batch_idx not in AT:
                return
            if not args.cpu:
                torch.cuda.synchronize()
            times = []
            found = None
            for _ in range(args.repeats):
                started = time.perf_counter()
                found = Probe(torch, time.perf_counter() + 1.0, on_device=on_device).run()
                times.append(time.perf_counter() - started)
            holders = [h for c in ("kept-tensors", "temporaries") for h in found[c]]
            kept = max(holders, key=lambda h: h[1]) if holders else None
            tensors = kept[3] if kept else 0
            lines.append(f"step {batch_idx}: median {statistics.median(times) * 1e3:.3f} ms, fastest "
                         f"{min(times) * 1e3:.3f} ms; the largest holder {kept[0] if kept else None} "
                         f"({tensors} tensors), graphs {found['graphs']}, links {found['graph_links']}, "
                         f"stopped {found['stopped']}; {statistics.median(times) * 1e6 / max(found['graphs'], 1):.2f} us "
                         f"a graph-carrying tensor")
            if args.profile and batch_idx == AT[-1]:
                Timed, parts, calls = timed_probe(Probe)
                started = time.perf_counter()
                Timed(torch, time.perf_counter() + 1.0, on_device=on_device).run()
                whole = time.perf_counter() - started
                parts["frames and the rest"] = whole - sum(parts.values())
                lines.append(f"  split of one timed probe ({whole * 1e3:.3f} ms): " + ", ".join(
                    f"{name} {s * 1e3:.3f} ms ({calls[name]} calls)" for name, s in parts.items()))

    torch.manual_seed(0)
    model = globals()["model"] = program.Mlp()  # a global of __main__, as in the corpus program
    steps = max(AT) + 2
    data = torch.utils.data.TensorDataset(torch.randn(steps * 512 if not args.cpu else steps * 8, 1024))
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=steps, accelerator="cpu" if args.cpu else "gpu", devices=1,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[ProbeAt()])
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=512 if not args.cpu else 8))
    where = "cpu tensors" if args.cpu else torch.cuda.get_device_name()
    print(f"probe_cost ({where}, torch {torch.__version__}, Python {sys.version.split()[0]}, "
          f"probe {args.probe_from or 'of the package'}): "
          f"reference loop {reference_us():.0f} us")
    for line in lines:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
