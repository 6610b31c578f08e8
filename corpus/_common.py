"""Helpers shared by the corpus: skip where a library is missing, time the steps.

Every workload prints, on standard output, three lines the benchmark and the GPU tests read:

    STEPS <number of steps timed>
    STEP_TIME_MS <median milliseconds between two step ends, after warm-up>
    STEP_GAP_MAX_MS <longest time between two step ends, after warm-up>

and two more, the wall-clock times (seconds since the epoch) of the first and the last step's end,
so the benchmark can split a process's wall time into before the loop, the loop and after it:

    LOOP_FIRST_EPOCH_S <time.time() at the first step's end>
    LOOP_LAST_EPOCH_S <time.time() at the last step's end>

and, when the interpreter exits (an atexit hook, which runs before any registered earlier; the
tool's exit probes run before atexit's hooks, at the start of the interpreter's shutdown, since
issue 56), the wall-clock time then, to split what comes after the loop into the program's own end
and its exit:

    EXIT_EPOCH_S <time.time() at the interpreter's exit>

The longest gap is what a pause of the tool would show as (a frozen training loop). With
CORPUS_STEP_TIMES=PATH, every step's time (milliseconds, after warm-up) is also written to PATH, one
per line, to see where in the loop a cost falls.
"""
import atexit
import importlib
import os
import statistics
import sys
import time

SKIP_EXIT = 77  # the workload cannot run here: the tests skip on it
WARMUP_STEPS = 5


def need(*names):
    """Import these libraries, or exit 77 saying which is missing."""
    modules = []
    for name in names:
        try:
            modules.append(importlib.import_module(name))
        except ImportError:
            print(f"skip: {name} is not installed", file=sys.stderr)
            sys.exit(SKIP_EXIT)
    return modules[0] if len(modules) == 1 else modules


def device(torch):
    """CUDA, or the CPU when CORPUS_DEVICE=cpu (to try a workload on a machine without a GPU)."""
    if os.environ.get("CORPUS_DEVICE") == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        print("skip: torch sees no CUDA device", file=sys.stderr)
        sys.exit(SKIP_EXIT)
    return torch.device("cuda")


def on_cpu() -> bool:
    return os.environ.get("CORPUS_DEVICE") == "cpu"


def scaled(n: int, small: int = 0) -> int:
    """On the CPU, fewer steps and smaller shapes (`small`): that run only proves the workload runs."""
    if not on_cpu():
        return n
    return small or max(3 + WARMUP_STEPS, n // 20)


class StepClock:
    """Marks the end of each step; prints the step figures when asked."""

    def __init__(self):
        self.ends = []
        self.epochs = []

    def tick(self):
        self.ends.append(time.perf_counter())
        if len(self.epochs) < 2:
            self.epochs.append(time.time())
        else:
            self.epochs[-1] = time.time()

    def report(self):
        gaps = [b - a for a, b in zip(self.ends[WARMUP_STEPS:], self.ends[WARMUP_STEPS + 1:])]
        if not gaps:
            return
        print(f"STEPS {len(gaps)}")
        print(f"STEP_TIME_MS {statistics.median(gaps) * 1000:.3f}")
        print(f"STEP_GAP_MAX_MS {max(gaps) * 1000:.3f}")
        if os.environ.get("CORPUS_STEP_TIMES"):
            with open(os.environ["CORPUS_STEP_TIMES"], "w", encoding="utf-8") as f:
                f.writelines(f"{gap * 1000:.3f}\n" for gap in gaps)
        print(f"LOOP_FIRST_EPOCH_S {self.epochs[0]:.4f}")
        print(f"LOOP_LAST_EPOCH_S {self.epochs[-1]:.4f}", flush=True)
        atexit.register(_exit_mark)


def _exit_mark():
    print(f"EXIT_EPOCH_S {time.time():.4f}", flush=True)


def lightning_fit(torch, pl, dev, module, steps, val_batches, classes, callbacks=()):
    """Fit a LightningModule for two epochs of `steps` batches of 256 x 1024 features, each followed
    by a validation of `val_batches` batches, with the step clock as a callback; print the clock."""
    clock = StepClock()

    class Timing(pl.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if dev.type == "cuda":
                torch.cuda.synchronize()
            clock.tick()

    def loader(batches):
        x = torch.randn(batches * 256, 1024)
        y = torch.randint(0, classes, (batches * 256,))
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=256)

    trainer = pl.Trainer(max_epochs=2, limit_train_batches=steps, limit_val_batches=val_batches,
                         accelerator="gpu" if dev.type == "cuda" else "cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[*callbacks, Timing()])
    trainer.fit(module, loader(steps), loader(val_batches))
    clock.report()
