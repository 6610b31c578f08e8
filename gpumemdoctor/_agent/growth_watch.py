"""When a holder search runs: the online growth watch, its schedule, and each search's budget.

Every sample at a step boundary (or on the timer, in a program that marks no steps) adds a
point to the allocated floor's series; every CHECK_EVERY points `growth.floor_growth` looks at
it. Growth is suspected when the floor has risen by SUSPECT_MIN_BYTES at two checks in a row.
Then, once:
- by steps: allocation stacks are turned on (--trace auto, until the search), a
  baseline is taken (what is alive now is not new), and a search is due
  INVESTIGATE_AFTER_STEPS steps later, run at that step boundary on the program's own thread
  (core.Agent.on_step);
- by time only: stacks are turned on, and the holders are looked for at exit.
A search also runs at the first out-of-memory error (oom.py), at a pause's height (phase_watch.py)
and at exit (exit.py). During the
run (growth, out of memory) a search is made in a copy of the process (forked.py): the program
pauses only for the fork, and the copy writes its record itself; one growth search at a time (an
out-of-memory error's is made even while one runs), polled at each step and waited for at exit. At exit the search runs in the process, with automatic
collection held off. Each stops at its budget (BUDGET_S); the search itself is search.py.
"""
from __future__ import annotations

import gc
import threading
import time

from .search import forked
from .threads import Captured
from .readings.events import import_in_progress
from .neutral import quiet_gc
from ..contract import WARMUP_STEPS  # --trace on: what is alive after these many steps is not new

# Growth is suspected, online, when the floor of allocated memory has risen by this much
# at two checks in a row (every CHECK_EVERY samples): then the allocation stacks are
# recorded (--trace auto) and, a little later, the holders are looked for.
SUSPECT_MIN_BYTES = 4 << 20
CHECK_EVERY = 8
MAX_FLOOR_POINTS = 512  # then every other point is dropped: a check stays about 0.1 ms, on the step path
INVESTIGATE_AFTER_STEPS = 16
# How long one holder search may take. The searches made in a copy of the process cost the
# program nothing but the fork; the exit searches delay the end of the run by what they take.
# "live" is the exit search of a run in which no growth was seen (and no --trace on).
BUDGET_S = {"growth": 5.0, "oom": 5.0, "phase": 5.0, "exit": 1.0, "live": 1.0}
# ... and "live" at most this share of the run so far (no less than LIVE_MIN_S): it names what a
# clean program still holds, which is worth less than a run's end 4% later (a Trainer's 25 s run on
# an H100: the 1 s search reached 4 of 151 allocations in a heap of 478,000 objects).
LIVE_SHARE = 0.01
LIVE_MIN_S = 0.25  # (a heap scan of 300,000-500,000 objects takes 50-100 ms: a smaller budget is overrun)
COPY_SLACK_S = 10.0  # a copy is killed this long after its budget: the snapshot, the record


def budget_for(kind: str, ran_s: float) -> float:
    """A search's budget in seconds (BUDGET_S); "live" also at most LIVE_SHARE of the run so far."""
    if kind == "live":
        return min(BUDGET_S["live"], max(LIVE_MIN_S, LIVE_SHARE * ran_s))
    return BUDGET_S[kind]


class GrowthWatch:
    """The online floor check on the samples, and the searches it schedules."""

    def __init__(self, shared, sampler, trace, threads):
        self.shared = shared
        self.sampler = sampler
        self.trace = trace
        self.threads = threads  # the threads' names, for the stacks a search finds
        self.floor_xs: dict = {}  # by -> per device slot, the online floor check's series
        self.floor_ys: dict = {}
        self.floor_growth = None
        self.positive_checks = 0
        self.suspected = False
        self.suspected_by = ""
        self.search_at: int | None = None  # the step at which a growth search is due
        self.baseline: dict | None = None
        self.kind = None  # blocks.TensorKind, made when first needed
        self.copies: list = []  # copies of the process that are searching now (forked.Copy)

    def prepare(self, devices: int) -> None:
        """The floor's series, made once at CUDA's start (the check then makes no container)."""
        for by in ("step", "time"):
            self.floor_xs[by] = [[] for _ in range(devices)]
            self.floor_ys[by] = [[] for _ in range(devices)]
        from gpumemdoctor.growth import floor_growth

        self.floor_growth = floor_growth

    # -- the growth watch -------------------------------------------------------------
    def check(self, now: float, by: str) -> None:
        """Cheap online check of the allocated floor, after each sample; see growth.floor_growth
        (which makes no container while it finds no growth)."""
        if self.suspected and (self.suspected_by == "step" or by == "time"):
            return  # (growth seen over time before any step: the steps are watched all the same)
        shared = self.shared
        if (self.trace.mode == "on" and self.baseline is None and by == "step"
                and shared.steps >= WARMUP_STEPS):
            self.take_baseline("warm-up")
        if by == "time" and shared.steps:
            return  # a program that marks steps is judged at its step boundaries only
        sampler = self.sampler
        rows = sampler.rows
        live = sampler.live
        all_xs = self.floor_xs[by]
        all_ys = self.floor_ys[by]
        x = shared.steps if by == "step" else now
        for i in range(len(rows)):
            if not live[i]:
                continue
            xs = all_xs[i]
            ys = all_ys[i]
            xs.append(x)
            ys.append(rows[i][1])
            if len(xs) % CHECK_EVERY == 0 and len(xs) >= 2 * CHECK_EVERY:
                fit = self.floor_growth(xs, ys, SUSPECT_MIN_BYTES)
                if fit is not None:
                    self.positive_checks += 1
                    if self.positive_checks >= 2:
                        self._suspect(rows[i][0], by, fit)
                        return
                else:
                    self.positive_checks = 0
            if len(xs) > MAX_FLOOR_POINTS:  # keep every other point: the floor survives thinning
                del xs[::2], ys[::2]

    def _suspect(self, torch_index: int, by: str, fit) -> None:
        shared = self.shared
        self.suspected = True
        self.suspected_by = by
        for series in (*self.floor_xs.values(), *self.floor_ys.values()):
            for points in series:
                points.clear()
        shared.channel.write({"type": "suspect", "t": time.monotonic(), "step": shared.steps,
                              "device": torch_index, "by": by, "grown_bytes": fit.grown_bytes,
                             "rate": fit.rate_bytes_per_x})
        trace = self.trace
        if by == "time":
            # Time samples come from the agent's thread. Turning PyTorch's memory history on from
            # it once raced the program's imports (torch 2.11: a circular import in torch._inductor
            # while the program imported torch._dynamo), so it is done only while no module is
            # being imported; the call itself imports nothing (probed on torch 2.11). Without
            # steps, the holders are looked for at exit.
            if trace.mode == "auto" and not trace.on and not import_in_progress():
                trace.start("growth")
            return
        if self.baseline is None:
            self.take_baseline("growth")
        self.search_at = shared.steps + INVESTIGATE_AFTER_STEPS
        if trace.mode == "auto":
            trace.start("growth", until_step=self.search_at)

    # -- the searches -----------------------------------------------------------------
    def tensor_kind(self):
        if self.kind is None:
            from .search.blocks import TensorKind

            self.kind = TensorKind(self.shared.torch)
        return self.kind

    def take_baseline(self, why: str) -> None:
        from .search.blocks import take_baseline

        shared = self.shared
        started = time.monotonic()
        self.baseline = take_baseline(shared.torch, self.tensor_kind())
        shared.channel.write({"type": "baseline", "t": time.monotonic(), "step": shared.steps, "why": why,
                              "blocks": len(self.baseline["blocks"]),
                             "elapsed_s": round(time.monotonic() - started, 4)})

    def search(self, when: str, budget: str | None = None, started: float | None = None,
               hold: bool = False, first: bool = True) -> dict | None:
        """Group what was allocated since the baseline and is still alive (at exit and at an
        out-of-memory error: all that is alive, each group marked new or not), and find its
        holders: in a copy of the process during the run, in the process at exit. `started`: when
        the program's pause for it began (perf_counter), if before this call (phase_watch). At exit
        the search tries its first sweep (search.investigate's `first`) unless told not to; with
        `hold`, its record is left to the caller to write (`write_exit_search`), once what it took
        for cuBLAS's workspaces is confirmed."""
        if started is None:
            started = time.perf_counter()
        shared = self.shared
        if when in ("growth", "exit"):
            self.search_at = None
        if shared.torch is None or (self.baseline is None and when == "growth"):
            return None
        # No baseline at exit or at an out-of-memory error (no growth seen, or seen by time
        # only): all of it counts as new.
        baseline = self.baseline or {"blocks": {}, "storages": set()}
        budget_s = budget_for(budget or when, time.monotonic() - shared.born)
        if when != "exit":
            return self._search_in_copy(when, baseline, budget_s, started)
        from .search.search import Roots, investigate

        own = {t.ident for t in threading.enumerate() if t.name.startswith("gpumemdoctor-")}
        own.add(threading.get_ident())  # our frames at exit hold nothing of the program's
        self.wait_for_copies()
        collecting = gc.isenabled()
        gc.disable()  # the search allocates: a collection now would free the program's garbage
        try:
            result = investigate(shared.torch, self.tensor_kind(), baseline, budget_s, Roots(own),
                                 self.threads.names(), all_live=True, first=first)
        except Exception as exc:
            shared.channel.write({"type": "error", "where": f"investigation ({when})", "message": repr(exc)[:500]})
            return None
        finally:
            if collecting:
                gc.enable()
        result["t"] = time.monotonic()
        if not hold:
            self.write_exit_search(result)
        return result

    def write_exit_search(self, result: dict) -> None:
        shared = self.shared
        shared.channel.write({"type": "investigation", "when": "exit", "step": shared.steps,
                              "trace": self.trace.on or self.trace.was_on, **result})

    def _search_in_copy(self, when: str, baseline: dict, budget_s: float, started: float) -> None:
        """A search during the run, in a copy of the process (forked.py). The program pauses for the
        threads' capture and the fork only: the roots, the modules and the search are the copy's
        work. A copy whose pause would pass forked.MAX_PAUSE_S is not made: a `declined` record."""
        shared = self.shared
        self.poll_copies()
        if when in ("growth", "phase") and self.copies:
            return None  # one growth search at a time (an out-of-memory error's is always made)
        with quiet_gc():
            # Taken here: the copy will have only this thread, and the others' locals are roots.
            threads = Captured()
            step = shared.steps
            trace = self.trace.on or self.trace.was_on
            t = time.monotonic()

            def in_copy() -> None:
                try:
                    from .search.search import Roots, investigate

                    roots = Roots(threads.own, threads)
                    result = investigate(shared.torch, self.tensor_kind(), baseline, budget_s, roots,
                                         self.threads.names(threads.alive), all_live=when in ("oom", "phase"))
                except Exception as exc:
                    shared.channel.write({"type": "error", "where": f"investigation ({when}, in a copy)",
                                          "message": repr(exc)[:500]})
                    return
                shared.channel.write({"type": "investigation", "when": when, "t": t, "step": step,
                                      "trace": trace, "forked": True, **result})

            prep_s = time.perf_counter() - started
            copy = forked.start(in_copy, budget_s + COPY_SLACK_S, spent_s=prep_s,
                                limit_s=forked.MAX_OOM_PAUSE_S if when == "oom" else forked.MAX_PAUSE_S)
            # The capture holds this very frame (the main thread's innermost), which holds the capture:
            # a cycle that, once this returns, would keep the program's frames below, and their locals,
            # until a collection (seen on the H100: an evaluation's 2 GiB of graphs). The copy has its own.
            threads.frames = None
        cost = shared.cost
        if isinstance(copy, dict):
            cost["searches_declined"] = cost.get("searches_declined", 0) + 1
            shared.channel.write({"type": "declined", "t": t, "step": step, "when": when, **copy})
            return None
        self.copies.append(copy)
        pause_s = time.perf_counter() - started  # the program's whole pause: the capture and the fork
        cost["search_pauses"] = cost.get("search_pauses", 0) + 1
        cost["search_pause_s"] = cost.get("search_pause_s", 0.0) + pause_s
        cost["search_pause_max_s"] = max(cost.get("search_pause_max_s", 0.0), pause_s)
        cost["search_prep_max_s"] = max(cost.get("search_prep_max_s", 0.0), prep_s)
        cost["search_fork_max_s"] = max(cost.get("search_fork_max_s", 0.0), copy.pause_s)
        return None

    def poll_copies(self) -> None:
        """Reap the searching copies that are done (at a step boundary)."""
        for copy in [c for c in self.copies if c.poll()]:
            self._copy_done(copy)

    def wait_for_copies(self) -> None:
        """At exit: the copies' records must be written before the process's last one."""
        for copy in list(self.copies):
            while not copy.poll():
                time.sleep(0.005)
            self._copy_done(copy)

    def _copy_done(self, copy) -> None:
        self.copies.remove(copy)
        if copy.status:
            what = "was killed at its deadline" if copy.status == -9 else f"ended with status {copy.status}"
            self.shared.channel.write({"type": "error", "where": "investigation (copy)",
                                       "message": f"the copy of the process searching for holders {what}"})
