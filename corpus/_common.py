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
per line, to see where in the loop a cost falls. The longest gap's end is printed as a monotonic time
(the clock of the agent's records), to find what happened then:

    STEP_GAP_MAX_AT_MONO_S <time.monotonic() at the end of the longest gap>

With CORPUS_STALL_DUMP_S=SECONDS, a gap longer than that dumps every thread's Python stack to
standard error every SECONDS while it lasts (faulthandler's watchdog, a C thread that needs no GIL): what the
program and the tool's threads were doing in a stall. With CORPUS_GC_LOG=PATH, each garbage collection
of the loop longer than 10 ms is timed (a gc callback) and written to PATH at the end, with the
number of modules and of objects the collector tracks then, and the modules' names.
"""
import atexit
import faulthandler
import gc
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
        self.monos = []
        self.epochs = []
        self.stall_dump_s = float(os.environ.get("CORPUS_STALL_DUMP_S") or 0)
        self.gc_log = os.environ.get("CORPUS_GC_LOG")
        self.collections = []
        if self.gc_log:
            gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase, info):
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif time.perf_counter() - self._gc_started > 0.01:
            self.collections.append((len(self.ends), info["generation"], time.perf_counter() - self._gc_started,
                                     info["collected"]))

    def tick(self):
        self.ends.append(time.perf_counter())
        self.monos.append(time.monotonic())
        if self.stall_dump_s and len(self.ends) > WARMUP_STEPS:
            faulthandler.dump_traceback_later(self.stall_dump_s, repeat=True)
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
        longest = gaps.index(max(gaps))
        print(f"STEP_GAP_MAX_AT_MONO_S {self.monos[WARMUP_STEPS + 1 + longest]:.4f}")
        if self.stall_dump_s:
            faulthandler.cancel_dump_traceback_later()
        if self.gc_log:
            with open(self.gc_log, "w", encoding="utf-8") as f:
                f.write(f"modules {len(sys.modules)} tracked {len(gc.get_objects())} count {gc.get_count()}\n")
                f.writelines(f"collection at step {n}: generation {g}, {s * 1000:.1f} ms, {c} collected\n"
                             for n, g, s, c in self.collections)
                f.writelines(f"module {m}\n" for m in sorted(sys.modules))
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
