"""What PyTorch's allocation history with Python stacks costs a training step, in one process.

    python benchmarks/trace_cost.py [--blocks 16] [--steps 25] [--json PATH]

`--trace auto` records allocation stacks (torch.cuda.memory._record_memory_history with
enabled="state", context="alloc", stacks="python", as trace.py turns it on) for a start-up window
and for a window once growth is seen. Between two processes the step time of a real model varies
by more than this cost, so it is measured inside one process: the GPT-2 of corpus/hf_gpt2_clean.py
(4 layers, AdamW, bf16 autocast), after 20 warm-up steps, in --blocks blocks of --steps steps,
stacks off and on by turns; the median step of each. Needs a CUDA GPU and transformers; says so
and exits 0 without them.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", type=int, default=16)
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    try:
        import torch
        import transformers
    except ImportError as exc:
        print(f"trace_cost: skipped: {exc.name} is not installed")
        return 0
    if not torch.cuda.is_available():
        print("trace_cost: skipped: no CUDA GPU for torch here")
        return 0
    dev = torch.device("cuda")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=4, n_embd=512, n_head=8, vocab_size=8192, n_positions=256,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config).to(dev)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)

    def step() -> None:
        ids = torch.randint(0, config.vocab_size, (8, 256), device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=ids, labels=ids, use_cache=False)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        out.loss.item()

    for _ in range(20):
        step()
    times: dict[str, list[float]] = {"off": [], "on": []}
    for block in range(args.blocks):
        mode = "on" if block % 2 else "off"
        if mode == "on":
            torch.cuda.memory._record_memory_history(enabled="state", context="alloc", stacks="python",
                                                     max_entries=100_000)
        for _ in range(args.steps):
            start = time.perf_counter()
            step()
            times[mode].append((time.perf_counter() - start) * 1000)
        if mode == "on":
            torch.cuda.memory._record_memory_history(enabled=None)
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    for mode, values in times.items():
        print(f"stacks {mode:3s}: median {statistics.median(values):.3f} ms a step, mean "
              f"{statistics.mean(values):.3f} ms, {len(values)} steps")
    print(f"stacks cost {on - off:+.3f} ms a step ({(on / off - 1) * 100:+.1f}%)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(), "argv": sys.argv,
                       "off_ms": off, "on_ms": on, "steps": times}, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
