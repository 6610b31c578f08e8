"""A pytest plugin that fails tests which leak GPU memory or go over a VRAM limit.

Installed with gpumemdoctor (a `pytest11` entry point) and off unless asked:
`pytest --vram-check` checks every test, `@pytest.mark.vram_leak_free` one test, and
`@pytest.mark.vram_limit("2GiB")` bounds PyTorch's peak allocated memory on each GPU during
a test. Importing it loads neither torch nor pynvml, and it never starts CUDA: it reads
nothing unless the tests imported torch and CUDA is initialised.

What is measured around what: from before a test's setup to after its teardown, once pytest
has let go of its fixture values, so that a function-scoped fixture's tensors (freed at
teardown) are no leak and a leak in a fixture's setup is one. For that the plugin runs the
test's protocol itself (`runtestprotocol(log=False)`) and logs its reports after teardown,
so a leak fails the test's call report, not its teardown. What wider-scoped fixtures
allocate while set up during the test is left out: it is theirs (what one frees at the end of
its scope can hide a leak as large in that test). Each reading follows
`gc.collect()`, `torch.cuda.synchronize()` on each GPU the allocator used, and clearing
cuBLAS's workspaces (kept per stream by the allocator after the first matrix product; PyTorch's
own leak check clears them too). It has, per GPU, allocated, reserved and peak allocated bytes
(`memory_stats_as_nested_dict`) and the process's NVML figure. A test in which CUDA started
begins at 0 allocated with no NVML baseline, so the context is never counted. Growth outside
PyTorch (NVML less reserved, above max(threshold, 32 MiB)) fails a test only with
--vram-check-nvml, since libraries load kernels on first use; otherwise the summary lists it.
The reading after one test serves as the next one's "before", so each test with CUDA costs one
full `gc.collect()`: some 30-40 ms in a process that has imported torch.

Peaks: the test may read PyTorch's peak statistics, so they are not reset, but in one case.
If the peak after the test is above the peak before, the test set it. If not, the test's peak
is at most the peak before, which passes when that is within the limit. Only when the peak
before is already above the limit is the test's own peak unknown: then, for that test and GPU
only, the plugin calls `torch.cuda.reset_peak_memory_stats()` just before it, and the summary
says so.

What filled the peak: during a `vram_limit` test (where the tests have imported torch), PyTorch's
allocation events are recorded without stacks (from the test's start, or from CUDA's start during
it; a history the tests turned on is left as it is), backward() and the optimizer steps are marked,
and the optimizers' storages read at each step's end (_agent/peak/plugin_history.py; all of it undone
after the test). A failure splits the test's allocated peak as `gpumemdoctor run` does, walking the
events back to it: parameters, gradients, optimizer state, activations, temporaries, gathered, kept
tensors (reporters/plugin_peak.py). Where the events did not reach back to it, or none were kept, it
says what a global optimizer step post hook (`StepWatch`) read, per GPU, at the last step: the
unique storages of the optimizers' parameters, their gradients and their state tensors
(`optimizer_parts`), the rest of the peak unclassified; without a step, that the parts are not known.

A failure in the plugin never errors a test: checks stop, and the summary says why. Under
pytest-xdist each worker checks its own tests and the controller prints the summary.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
from typing import Any, Callable, NamedTuple

import pytest
from _pytest.runner import runtestprotocol

from .units import format_bytes, parse_size

DEFAULT_THRESHOLD_BYTES = 1 << 20
NVML_FLOOR_BYTES = 32 << 20  # NVML growth below this outside PyTorch is driver noise
MAX_NOTES = 20
_LIMIT = pytest.StashKey[int]()


class DeviceReading(NamedTuple):
    """One GPU at one moment; nvml_bytes is None where NVML cannot tell."""

    allocated: int
    reserved: int
    peak: int
    nvml_bytes: int | None = None


def judge_leak(before: int, after: int, threshold: int, device: str = "cuda:0",
               fixtures: int = 0) -> str | None:
    """The failure message when allocated bytes grew by more than threshold, else None."""
    growth = after - before - fixtures
    if growth <= threshold:
        return None
    held = f", less {format_bytes(fixtures)} held by wider-scoped fixtures" if fixtures > 0 else ""
    return (f"VRAM leak: {device} allocated grew by {format_bytes(growth)} ({growth} bytes) during "
            f"this test (before {format_bytes(before)}, after {format_bytes(after)}, after "
            f"gc.collect(){held}; threshold {format_bytes(threshold)}). Tensors made during the "
            "test are still referenced after it: look for a module-level list or global, a class "
            "attribute, a cache (a dict, functools.lru_cache), or a fixture with a wider scope "
            "that keeps them; keep numbers with .item(), and del what the test no longer needs.")


def judge_outside(nvml_growth: int, reserved_growth: int, threshold: int,
                  device: str = "cuda:0") -> str | None:
    """The message when memory outside PyTorch's allocator grew too much, else None."""
    outside = nvml_growth - reserved_growth
    if outside <= max(threshold, NVML_FLOOR_BYTES):
        return None
    return (f"VRAM outside PyTorch: on {device}, memory outside PyTorch's allocator grew by "
            f"{format_bytes(outside)} during this test (NVML {format_bytes(nvml_growth, signed=True)} "
            f"for this process, PyTorch reserved {format_bytes(reserved_growth, signed=True)}): "
            "CuPy, raw cudaMalloc, NCCL, or kernels and library state loaded on first use "
            "(cuBLAS, cuDNN: up to about 200 MiB, once per process).")


def needs_peak_reset(peak_before: int, limit: int) -> bool:
    """Whether the test's peak can only be known by resetting the peak statistics first."""
    return peak_before > limit


def judge_limit(peak_before: int, peak_after: int, limit: int, device: str = "cuda:0",
                was_reset: bool = False, start: int = 0) -> str | None:
    """The failure message when the test's peak allocated bytes exceed limit, else None.

    Without a new high (and no reset) the test's peak is at most peak_before,
    which needs_peak_reset has kept within the limit.
    """
    if not (peak_after > peak_before or was_reset) or peak_after <= limit:
        return None
    already = f"; {format_bytes(start)} was allocated when it started" if start > 0 else ""
    return (f"VRAM limit: {device} peak allocated during this test was {format_bytes(peak_after)} "
            f"({peak_after} bytes), above its vram_limit of {format_bytes(limit)} ({limit} bytes)"
            f"{already}.")


PARTS_READ = ("parameters", "gradients", "optimizer state")


def optimizer_parts(optimizers: Any) -> dict[str, dict[str, int]]:
    """Per device ("cuda:0", "cpu"): the bytes of the optimizers' parameters, their gradients and their
    state's tensors (PARTS_READ). Each storage is counted once, in the first of these where it is
    found (a parameter shared by two optimizers, a state tensor that views a parameter)."""
    seen: set = set()
    out: dict[str, dict[str, int]] = {}

    def add(tensor: Any, part: str) -> None:
        if not hasattr(tensor, "untyped_storage"):
            return
        storage = tensor.untyped_storage()
        device = str(tensor.device)
        key = (device, storage.data_ptr())
        size = storage.nbytes()
        if size and key not in seen:
            seen.add(key)
            out.setdefault(device, dict.fromkeys(PARTS_READ, 0))[part] += size

    optimizers = list(optimizers)
    params = [p for o in optimizers for group in o.param_groups for p in group["params"]]
    for p in params:
        add(p, "parameters")
    for p in params:
        add(getattr(p, "grad", None), "gradients")
    for o in optimizers:
        for state in list(o.state.values()):
            for value in list(state.values()) if isinstance(state, dict) else []:
                add(value, "optimizer state")
    return out


def judge_limit_parts(peak: int, parts: dict[str, int] | None, steps: int) -> str:
    """What filled a test's peak, as far as the plugin knows: the parts read at the last optimizer step
    (`steps` of them during the test), the rest of the peak unclassified."""
    if not steps:
        return ("What filled it is not known here: no optimizer stepped during the test (gpumemdoctor run "
                "tells the parts of a peak).")
    parts = parts or dict.fromkeys(PARTS_READ, 0)
    said = ", ".join(f"{name} {format_bytes(parts.get(name, 0))}" for name in PARTS_READ)
    rest = max(0, peak - sum(parts.values()))
    nth = "the only one" if steps == 1 else f"step {steps} of the test"
    return (f"What filled it, read at the last optimizer step ({nth}), not at the peak itself: {said}; the rest "
            f"of the peak, {format_bytes(rest)}, unclassified (activations, temporaries).")


class StepWatch:
    """The optimizers that stepped during a test, and their parts at the last step (optimizer_parts);
    a global step post hook from start() to stop()."""

    def __init__(self) -> None:
        import weakref

        self.optimizers: Any = weakref.WeakSet()
        self.steps = 0
        self.parts: dict[str, dict[str, int]] = {}
        self.then: Any = None  # called at each step too, after the reading (PeakHistory.on_step)
        self._handle: Any = None

    def start(self, optimizer_module: Any) -> None:
        """`optimizer_module` is torch.optim.optimizer, where the global hooks are registered."""
        self._handle = optimizer_module.register_optimizer_step_post_hook(self._on_step)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            self.optimizers.add(optimizer)
            self.steps += 1
            self.parts = optimizer_parts(self.optimizers)
        except Exception:  # a hook never fails the program's step
            self.parts = {}
        if self.then is not None:  # (which never raises)
            self.then(optimizer, args, kwargs)


def _record_events() -> Any:
    """A vram_limit test's allocation events, marks and storages, where the tests have imported torch;
    None where they cannot be recorded. Never raises."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        from ._agent.peak.plugin_history import PeakHistory

        return PeakHistory.start(torch, sys.modules.get("torch.optim.optimizer"))  # (loaded with torch)
    except Exception:
        return None


def _stat(stats: dict, name: str, field: str = "current") -> int:
    try:
        return int(stats[name]["all"][field])
    except (KeyError, TypeError, ValueError):
        return 0


def _size_option(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _limit_of(marker: Any, nodeid: str) -> int:
    args = list(marker.args) + [marker.kwargs[k] for k in ("size",) if k in marker.kwargs]
    value = args[0] if len(args) == 1 else None
    try:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        if isinstance(value, str):
            return parse_size(value)
        raise ValueError("it takes one size, like @pytest.mark.vram_limit('2GiB')")
    except ValueError as exc:
        shown = ", ".join(map(repr, args))
        raise pytest.UsageError(f"{nodeid}: vram_limit({shown}): {exc}") from None


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpumemdoctor", "GPU memory checks (gpumemdoctor)")
    group.addoption("--vram-check", action="store_true", default=False,
                    help="fail each test after which PyTorch's allocated GPU memory has not come "
                         "back to where it was (after gc.collect())")
    group.addoption("--vram-threshold", type=_size_option, default=DEFAULT_THRESHOLD_BYTES,
                    metavar="SIZE", help="growth per test and GPU that is not a leak [default: 1MiB]")
    group.addoption("--vram-check-nvml", action="store_true", default=False,
                    help="--vram-check, and also fail tests whose memory outside PyTorch (as NVML "
                         "sees it) grew; without it, that is only reported")
    parser.addini("vram_check", "check every test for GPU memory leaks, as --vram-check does",
                  type="bool", default=False)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "vram_limit(size): fail the test if PyTorch's peak "
                            "allocated memory on a GPU during it is above size, like '2GiB'")
    config.addinivalue_line("markers", "vram_leak_free: fail the test if it leaks GPU memory, "
                            "as --vram-check does for every test")
    nvml_fails = bool(config.getoption("vram_check_nvml"))
    check_all = bool(config.getoption("vram_check") or config.getini("vram_check") or nvml_fails)
    checker = VramChecker(config, check_all, config.getoption("vram_threshold"), nvml_fails)
    config.pluginmanager.register(checker, "gpumemdoctor-vram-checker")


class VramChecker:
    """The session's checks and what they found; its methods are pytest hooks."""

    def __init__(self, config: pytest.Config, check_all: bool, threshold: int, nvml_fails: bool):
        self.config, self.check_all, self.nvml_fails = config, check_all, nvml_fails
        self.threshold = threshold
        # What a pytest-xdist worker sends its controller: tests asked to be checked, those that
        # ended with CUDA initialised, where CUDA started, why checks stopped, summary notes.
        self.found: dict[str, Any] = {"considered": 0, "measured": 0, "cuda_started_in": None,
                                      "stopped": None, "notes": []}
        self._in_test = False
        self._fixtures: dict[int, DeviceReading] = {}  # what wider-scoped fixtures took, per GPU
        self._nvml: Any = None
        self._nvml_devices: dict[int, Any] | None = None  # torch index -> NVML device
        # (next item, reading after the last checked test): nothing runs between that reading
        # and the next test's start, so it is that test's "before" without another gc.collect().
        self._last: tuple[Any, dict[int, DeviceReading] | None] = (None, None)
        self._steps: StepWatch | None = None  # a vram_limit test's optimizer steps
        self._events: Any = None  # and its allocation events (_agent/plugin_history.PeakHistory)

    def _guard(self, fn: Callable, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:
            self.found["stopped"] = self.found["stopped"] or f"{type(exc).__name__}: {exc}"[:300]
            return None

    def _read(self, settle: bool) -> dict[int, DeviceReading] | None:
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_initialized():
            return None
        cuda = torch.cuda
        if settle:
            gc.collect()
        touched = [i for i in range(cuda.device_count())
                   if _stat(cuda.memory_stats_as_nested_dict(i), "reserved_bytes", "peak")]
        if touched and not getattr(cuda, "is_current_stream_capturing", lambda: False)():
            for index in touched:
                if settle:
                    cuda.synchronize(index)
            getattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: None)()
        reading = {}
        for index in touched:
            stats = cuda.memory_stats_as_nested_dict(index)
            reading[index] = DeviceReading(
                _stat(stats, "allocated_bytes"), _stat(stats, "reserved_bytes"),
                _stat(stats, "allocated_bytes", "peak"), self._nvml_used(torch, index))
        return reading

    def _nvml_used(self, torch: Any, index: int) -> int | None:
        """This process's bytes on the GPU as NVML lists them; None where NVML cannot tell."""
        if self._nvml_devices is None:
            self._nvml_devices = {}
            try:
                from .system import nvml
                nvml.init()
                self._nvml = nvml
                for i in range(torch.cuda.device_count()):
                    self._nvml_devices[i] = nvml.find_device(*nvml.torch_device_ids(torch.cuda.get_device_properties(i)))
            except Exception:
                pass  # no NVML here: the NVML part of the checks is skipped
        device = self._nvml_devices.get(index)
        try:  # 0 means not listed: NVML sees another PID namespace
            return (self._nvml.used_by(device, os.getpid()) or None) if device is not None else None
        except Exception:
            return None

    def _before(self, item: pytest.Item, limit: int | None) -> tuple[dict | None, set[int]]:
        (nextitem, last), self._last = self._last, (None, None)
        if nextitem is item:  # read after the test just before this one
            before = dict(last) if last is not None else None
        else:
            before = self._read(settle=True)
        resets: set[int] = set()
        for index, reading in (before or {}).items():
            if limit is not None and needs_peak_reset(reading.peak, limit):
                cuda = sys.modules["torch"].cuda
                cuda.reset_peak_memory_stats(index)
                peak = _stat(cuda.memory_stats_as_nested_dict(index), "allocated_bytes", "peak")
                before[index] = reading._replace(peak=peak)
                resets.add(index)
        return before, resets

    def _judge(self, item: pytest.Item, before: dict | None, resets: set[int], leak: bool,
               limit: int | None, passed: bool, nextitem: pytest.Item | None) -> list[str]:
        after = self._read(settle=True)
        self._last = (nextitem, after)
        if after is None:
            return []
        self.found["measured"] += 1
        if before is None and self.found["cuda_started_in"] is None:
            self.found["cuda_started_in"] = item.nodeid
        if not passed:  # a test that failed, errored, was skipped or xfailed keeps its own outcome
            return []
        failures: list[str | None] = []
        for index, a in sorted(after.items()):
            b = (before or {}).get(index, DeviceReading(0, 0, 0, None))
            held = self._fixtures.get(index, DeviceReading(0, 0, 0, 0))
            device = f"cuda:{index}"
            if leak:
                failures.append(judge_leak(b.allocated, a.allocated, self.threshold, device,
                                           held.allocated))
            if limit is not None:
                over = judge_limit(b.peak, a.peak, limit, device, index in resets, b.allocated)
                failures.append(over and f"{over} {self._what_filled(index, a.peak)}".rstrip())
            if leak and before and b.nvml_bytes is not None and a.nvml_bytes is not None:
                outside = judge_outside(a.nvml_bytes - b.nvml_bytes - (held.nvml_bytes or 0),
                                        a.reserved - b.reserved - held.reserved, self.threshold, device)
                if outside and not self.nvml_fails:
                    self.found["notes"].append(
                        f"{item.nodeid}: {outside} --vram-check-nvml fails such tests.")
                else:
                    failures.append(outside)
        return [f for f in failures if f]

    def _what_filled(self, index: int, peak: int) -> str:
        """The split at the test's peak (the events), or else the parts read at the last step."""
        watch = self._steps
        said = judge_limit_parts(peak, watch.parts.get(f"cuda:{index}"), watch.steps) if watch is not None else ""
        try:
            from .reporters.plugin_peak import what_filled

            return what_filled(self._events.split(index, peak) if self._events is not None else None, said)
        except Exception:  # the words the plugin had before the events
            return said

    def _watch_steps(self) -> StepWatch | None:
        """A StepWatch started, where the tests have imported torch (the plugin never imports it)."""
        module = sys.modules.get("torch.optim.optimizer")  # loaded with torch
        if module is None or not hasattr(module, "register_optimizer_step_post_hook"):
            return None
        watch = StepWatch()
        watch.start(module)
        return watch

    # -- hooks -----------------------------------------------------------------------------
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            marker = item.get_closest_marker("vram_limit")
            if marker is not None:
                item.stash[_LIMIT] = _limit_of(marker, item.nodeid)

    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        leak = self.check_all or item.get_closest_marker("vram_leak_free") is not None
        limit = item.stash.get(_LIMIT, None)
        if self.found["stopped"] or (not leak and limit is None):
            return None  # pytest runs the test as usual
        self.found["considered"] += 1
        item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        before, resets = self._guard(self._before, item, limit) or (None, set())
        self._fixtures, self._in_test = {}, True
        self._steps = self._guard(self._watch_steps) if limit is not None else None
        self._events = _record_events() if limit is not None else None
        if self._steps is not None and self._events is not None:
            self._steps.then = self._events.on_step
        try:
            reports = runtestprotocol(item, log=False, nextitem=nextitem)
        finally:
            self._in_test = False
            if self._steps is not None:
                self._guard(self._steps.stop)
            if self._events is not None:
                self._events.unmark()
        passed = [r.when for r in reports if r.passed and not hasattr(r, "wasxfail")] == [
            "setup", "call", "teardown"]
        failures = [] if self.found["stopped"] else (
            self._guard(self._judge, item, before, resets, leak, limit, passed, nextitem) or [])
        if self._events is not None:
            self._events, events = None, self._events
            events.close()
        self.found["notes"] += [f"{item.nodeid}: reset PyTorch's peak memory statistics on cuda:{i} "
                                "before the test, to measure its vram_limit." for i in sorted(resets)]
        for report in reports:
            if report.when == "call" and failures:
                report.outcome, report.longrepr = "failed", "\n\n".join(failures)
            item.ihook.pytest_runtest_logreport(report=report)
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef: Any, request: Any) -> Any:
        wider = self._in_test and getattr(fixturedef, "scope", "function") != "function"
        before = (self._guard(self._read, False) or {}) if wider and not self.found["stopped"] else None
        yield
        if before is None:
            return
        for index, a in (self._guard(self._read, False) or {}).items():
            b = before.get(index, DeviceReading(0, 0, 0, None))
            held = self._fixtures.get(index, DeviceReading(0, 0, 0, 0))
            nvml_growth = a.nvml_bytes - b.nvml_bytes if a.nvml_bytes and b.nvml_bytes else 0
            self._fixtures[index] = DeviceReading(
                held.allocated + max(a.allocated - b.allocated, 0),
                held.reserved + max(a.reserved - b.reserved, 0), 0, held.nvml_bytes + max(nvml_growth, 0))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        workeroutput = getattr(self.config, "workeroutput", None)
        if workeroutput is not None:  # a pytest-xdist worker: its controller prints the summary
            workeroutput["gpumemdoctor"] = self.found

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        sent = (getattr(node, "workeroutput", None) or {}).get("gpumemdoctor") or {}
        for key, value in sent.items():
            if key in ("cuda_started_in", "stopped"):
                self.found[key] = self.found.get(key) or value
            else:  # counts and notes add up
                self.found[key] = self.found.get(key, type(value)()) + value

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        found = self.found
        if hasattr(self.config, "workerinput") or not found["considered"]:
            return
        if found["stopped"]:
            lines = [f"VRAM checks stopped after an error in gpumemdoctor's plugin ({found['stopped']})"]
        elif not found["measured"]:
            lines = ["no CUDA in this session; VRAM checks were skipped"]
        else:
            started = found["cuda_started_in"]
            lines = [f"VRAM checked in {found['measured']} tests, threshold "
                     f"{format_bytes(self.threshold)}"
                     + (f"; CUDA started during {started}, whose context is not counted" if started else "")]
        notes = found["notes"]
        lines += notes[:MAX_NOTES]
        if len(notes) > MAX_NOTES:
            lines.append(f"... and {len(notes) - MAX_NOTES} more")
        for line in lines:
            terminalreporter.write_line(f"gpumemdoctor: {line}")
