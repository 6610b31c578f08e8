"""What PyTorch's allocation history costs and holds on a real training step (issue 40, item 3).

    python benchmarks/peak_history.py cost   [--json PATH]       # step time per history mode, snapshot cost
    python benchmarks/peak_history.py dump   --out DIR           # a recorded history of 4 steps, with marks
    python benchmarks/peak_history.py memtracker [--json PATH]   # PyTorch's MemTracker on the same steps

The program is transformers' GPT-2 at its real size (124M, batch 8 x 1024, float32, AdamW,
`zero_grad(set_to_none=True)`), the program issue 40 measured. Needs CUDA and transformers.

- `cost`: the median step time in interleaved blocks of steps, with the history off, on with events
  only ("all", no stacks), on with stacks of live blocks ("state", Python stacks: --trace's windows)
  and on with both; the events a step makes; what `torch.cuda.memory._snapshot()` costs with the
  events-only history at several ring sizes (the first call of the process apart); whether turning
  the history off, or to "state", keeps the events recorded so far.
- `dump`: the events-only history of four steps, the times at which each step's backward and
  optimizer step began and ended, and the storages of the optimizer's parameters, gradients and
  state at the end, pickled to DIR/gpt2-history.pickle, to develop the replay without a GPU.
- `memtracker`: torch.distributed._tools.mem_tracker.MemTracker's split of the peak (parameters,
  gradients, activations, temporaries, optimizer state) on the same four steps: the reference the
  tool's own split is held to. It is run here only, never inside the tool.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
import time


def build(torch):
    import transformers
    torch.manual_seed(0)
    config = transformers.GPT2Config()
    model = transformers.GPT2LMHeadModel(config).cuda()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    ids = torch.randint(0, config.vocab_size, (8, 1024), device="cuda")
    return model, opt, ids


def one_step(torch, model, opt, ids):
    opt.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    return loss.item()


def events(torch) -> int:
    s = torch.cuda.memory_stats()
    return s["allocation.all.allocated"] + s["allocation.all.freed"]


MODES = {
    "off": None,
    "events": dict(enabled="all", context=None, stacks="python"),
    "stacks_state": dict(enabled="state", context="alloc", stacks="python"),
    "stacks_events": dict(enabled="all", context="alloc", stacks="python"),
}


def cost(args) -> dict:
    import torch
    model, opt, ids = build(torch)
    for _ in range(3):
        one_step(torch, model, opt, ids)
    out: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    before = events(torch)
    one_step(torch, model, opt, ids)
    out["events_per_step"] = events(torch) - before
    times: dict = {m: [] for m in MODES}
    for _ in range(args.rounds):
        for mode, kw in MODES.items():
            torch.cuda.memory._record_memory_history(enabled=None)
            if kw:
                torch.cuda.memory._record_memory_history(max_entries=100_000, **kw)
            one_step(torch, model, opt, ids)  # the switch's own step is not timed
            for _ in range(args.block):
                t = time.perf_counter()
                one_step(torch, model, opt, ids)
                times[mode].append((time.perf_counter() - t) * 1000)
    torch.cuda.memory._record_memory_history(enabled=None)
    out["step_ms"] = {m: {"median": round(statistics.median(v), 3), "n": len(v)} for m, v in times.items()}
    # The snapshot with the events-only history, at several ring sizes (full rings).
    snap: dict = {}
    for mode, entries in (("events", 2_000), ("events", 5_000), ("events", 20_000), ("events", 100_000),
                          ("stacks_events", 5_000)):
        torch.cuda.memory._record_memory_history(enabled=None)
        torch.cuda.memory._record_memory_history(max_entries=entries, clear_history=True, **MODES[mode])
        while True:
            one_step(torch, model, opt, ids)
            s = torch.cuda.memory._snapshot()
            if len(s["device_traces"][0]) >= entries or len(s["device_traces"][0]) > 30 * out["events_per_step"]:
                break
        ms = []
        for _ in range(5):
            t = time.perf_counter()
            s = torch.cuda.memory._snapshot()
            ms.append((time.perf_counter() - t) * 1000)
        snap[f"{mode}-{entries}"] = {"entries": len(s["device_traces"][0]), "segments": len(s["segments"]),
                         "blocks": sum(len(g["blocks"]) for g in s["segments"]),
                         "median_ms": round(statistics.median(ms), 3), "max_ms": round(max(ms), 3)}
        del s
    out["snapshot"] = snap
    # Does turning the history off, or to "state", keep what it recorded?
    torch.cuda.memory._record_memory_history(enabled=None)
    torch.cuda.memory._record_memory_history(max_entries=100_000, clear_history=True, **MODES["events"])
    one_step(torch, model, opt, ids)
    n_on = len(torch.cuda.memory._snapshot()["device_traces"][0])
    torch.cuda.memory._record_memory_history(enabled=None)
    n_off = len(torch.cuda.memory._snapshot()["device_traces"][0])
    one_step(torch, model, opt, ids)
    n_off_after = len(torch.cuda.memory._snapshot()["device_traces"][0])
    torch.cuda.memory._record_memory_history(max_entries=100_000, **MODES["events"])
    one_step(torch, model, opt, ids)
    n_again = len(torch.cuda.memory._snapshot()["device_traces"][0])
    torch.cuda.memory._record_memory_history(max_entries=100_000, **MODES["stacks_state"])
    n_state = len(torch.cuda.memory._snapshot()["device_traces"][0])
    torch.cuda.memory._record_memory_history(max_entries=100_000, **MODES["stacks_events"])
    one_step(torch, model, opt, ids)
    n_stacks = len(torch.cuda.memory._snapshot()["device_traces"][0])
    torch.cuda.memory._record_memory_history(max_entries=100_000, **MODES["events"])
    n_back = len(torch.cuda.memory._snapshot()["device_traces"][0])
    t = time.perf_counter()
    torch.cuda.memory._record_memory_history(max_entries=50_000, **MODES["events"])
    resize_ms = (time.perf_counter() - t) * 1000
    n_resized = len(torch.cuda.memory._snapshot()["device_traces"][0])
    out["kept"] = {"stacks_events_one_more_step": n_stacks, "back_to_events": n_back,
                   "resized_to_50000": n_resized, "resize_ms": round(resize_ms, 3),"on_one_step": n_on, "after_off": n_off, "off_one_more_step": n_off_after,
                   "on_again_one_more_step": n_again, "switched_to_state": n_state}
    # The clock of the entries' time_us against time.time().
    torch.cuda.memory._record_memory_history(enabled=None)
    torch.cuda.memory._record_memory_history(max_entries=1000, clear_history=True, **MODES["events"])
    t0 = time.time()
    x = torch.empty(1 << 20, device="cuda")
    t1 = time.time()
    e = [e for e in torch.cuda.memory._snapshot()["device_traces"][0] if e["action"] == "alloc"][-1]
    out["clock"] = {"entry_keys": sorted(e), "time_us": e.get("time_us"), "before_us": int(t0 * 1e6),
                    "after_us": int(t1 * 1e6)}
    del x
    return out


def dump(args) -> dict:
    import torch
    marks: list = []

    def mark(name):
        marks.append((name, time.time_ns() // 1000))

    original = torch.autograd.backward

    def backward(*a, **k):
        mark("backward")
        try:
            return original(*a, **k)
        finally:
            mark("backward_end")

    torch.autograd.backward = backward
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    register_optimizer_step_pre_hook(lambda *a: mark("step"))
    register_optimizer_step_post_hook(lambda *a: mark("step_end"))
    t = time.perf_counter()
    torch.cuda.init()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, **MODES["events"])
    model, opt, ids = build(torch)
    per_step = []
    for i in range(4):
        torch.cuda.synchronize()
        start = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()  # a benchmark's own program: the reference per step
        mark("zero_grad")
        one_step(torch, model, opt, ids)
        mark("step_done")
        per_step.append({"allocated": torch.cuda.memory_allocated(),
                         "peak": torch.cuda.max_memory_allocated(), "peak_before": start})
    t_snap = time.perf_counter()
    snap = torch.cuda.memory._snapshot()
    snap_ms = (time.perf_counter() - t_snap) * 1000
    storages = {"parameters": [], "gradients": [], "state": []}
    for group in opt.param_groups:
        for p in group["params"]:
            storages["parameters"].append((p.untyped_storage().data_ptr(), p.untyped_storage().nbytes()))
            if p.grad is not None:
                storages["gradients"].append((p.grad.untyped_storage().data_ptr(), p.grad.untyped_storage().nbytes()))
            for v in opt.state.get(p, {}).values():
                if torch.is_tensor(v) and v.is_cuda:
                    storages["state"].append((v.untyped_storage().data_ptr(), v.untyped_storage().nbytes()))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "gpt2-history.pickle")
    with open(path, "wb") as f:
        pickle.dump({"snapshot": snap, "marks": marks, "storages": storages, "per_step": per_step,
                     "torch": torch.__version__, "device": torch.cuda.get_device_name(),
                     "command": "python benchmarks/peak_history.py dump --out DIR"}, f)
    return {"path": path, "entries": len(snap["device_traces"][0]), "snapshot_ms": round(snap_ms, 1),
            "per_step": per_step, "marks": len(marks), "elapsed_s": round(time.perf_counter() - t, 1)}


def memtracker(args) -> dict:
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker
    model, opt, ids = build(torch)
    mt = MemTracker()
    mt.track_external(model, opt)
    with mt:
        for i in range(4):
            one_step(torch, model, opt, ids)
            mt.reset_mod_stats()  # MemTracker tracks one iteration of a module at a time
    peak = mt.get_tracker_snapshot("peak")
    split = {}
    for dev, cats in peak.items():
        split[str(dev)] = {str(getattr(k, "value", k)): int(v) for k, v in cats.items()}
    return {"peak": split, "max_memory_allocated": torch.cuda.max_memory_allocated()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("cost", "dump", "memtracker"))
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--out", metavar="DIR", default=".")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--block", type=int, default=10)
    args = p.parse_args(argv)
    result = {"cost": cost, "dump": dump, "memtracker": memtracker}[args.what](args)
    text = json.dumps(result, indent=1, default=str)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
