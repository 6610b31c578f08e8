"""The contract between `gpumemdoctor run`'s supervisor and the agent inside the target.

The supervisor passes everything to the agent through these environment variables; the sampling
interval's default, its bounds and how far the agent lengthens it live here once, for `run`'s
option, the supervisor's options, the agent's reading of its variable and its sampler. Both sides,
`ps` and the pytest plugin import this module alone: it loads nothing of the agent.
(`_bootstrap/sitecustomize.py` spells ENV_RUN_DIR and ENV_PACKAGE_PARENT out, since it runs before
the package can be found; a test keeps them equal.)

The rules the agent applies while the program runs and the diagnosis applies after it (what a pause in
the steps is, the warm-up, the least growth, the least peak worth a finding) are written here once too,
so that the agent's search at a pause and the judgement's row for it cannot drift apart.
"""
from __future__ import annotations

import os
from typing import Mapping

ENV_RUN_DIR = "GPUMEMDOCTOR_RUN_DIR"  # the run folder: set, the agent starts; unset, it does nothing
ENV_PACKAGE_PARENT = "GPUMEMDOCTOR_PACKAGE_PARENT"  # where the package is, for a target that cannot see it
ENV_INTERVAL = "GPUMEMDOCTOR_INTERVAL_S"  # the agent's shortest sampling interval, in seconds
ENV_SOCKET = "GPUMEMDOCTOR_SOCKET"  # "0": no local socket for `gpumemdoctor watch`
ENV_TRACE = "GPUMEMDOCTOR_TRACE"  # allocation stacks: one of TRACE_MODES
ENV_SNAPSHOT = "GPUMEMDOCTOR_SNAPSHOT"  # "1": write the allocator snapshot to the run folder at exit
ENV_MAX_PAUSE = "GPUMEMDOCTOR_MAX_PAUSE_S"  # the longest pause a search during the run may cost the program

# The agent's sampling interval (`run --interval`): its default and the bounds a value must keep.
INTERVAL_DEFAULT_S = 0.02
INTERVAL_MIN_S = 0.001
INTERVAL_MAX_S = 60
# The agent lengthens a shorter interval as a run goes on (doubled every 1000 samples, and stretched
# so that its samples take at most 1% of the program's time), up to this; an interval asked for above
# it is kept as asked, never cut to it (interval_ceiling).
LENGTHENED_INTERVAL_MAX_S = 5.0
# The supervisor's NVML poll (`run --poll-interval`); the supervisor's own, never sent to the agent.
POLL_INTERVAL_DEFAULT_S = 0.005
POLL_INTERVAL_MIN_S = 0.001
POLL_INTERVAL_MAX_S = 10

# The longest the program may pause for a holder search during the run (`run --max-pause`): the copy of
# the process is made by fork, whose pause grows with the process (see _agent/search/forked.py). 0: no search
# during the run (the exit search still runs).
MAX_PAUSE_DEFAULT_S = 0.02
MAX_PAUSE_MIN_S = 0.0
MAX_PAUSE_MAX_S = 1.0

# Allocation stacks: "auto" (for a start-up window and when growth is seen), "on", "events" (none,
# but the allocation events that split the allocated peak, kept in every mode but "off"), "off".
# Holders are looked for in every mode once growth is seen.
TRACE_MODES = ("auto", "on", "events", "off")
# A holder search's label for a CUDA graph that holds its private memory pool (the pool's segments are
# searched as blocks of their own, held by the graph): written by the agent, read by the diagnosis.
GRAPH_POOL_LABEL = " (its CUDA graph's private memory pool)"
# The parts of the allocated memory at its peak that a `peak_history` record names (_agent/peak/replay.py),
# and the stretch of the program it fell in.
HISTORY_PARTS = ("parameters", "gradients", "optimizer-state", "activations", "temporaries", "gathered",
                 "kept-tensors", "unclassified")
HISTORY_PHASES = ("backward", "optimizer step", "outside")
# The parts of the agent whose work a step gap holds (_agent/readings/felt.py; the report names them).
AGENT_PARTS = ("step_end", "sample", "growth_watch", "phase_watch", "peak_watch", "history", "history_read",
               "peak_probe", "phase_search", "growth_search", "collector")
# How far below PyTorch's allocated peak counter the events' highest moment may be and still be called
# its peak without a word (_agent/peak/replay.py; the report says by how much where it is more).
HISTORY_COUNTER_SLACK = 16 << 20

# The rules both sides apply. A stretch without steps is a pause in the steps when it lasts
# PAUSE_STEPS median steps and PAUSE_MIN_S (a slow step is no pause): the agent's phase watch searches
# at its height, the diagnosis's phases tell its staircases and peaks.
PAUSE_STEPS = 4
PAUSE_MIN_S = 0.05
WARMUP_STEPS = 10  # a program's first steps are its warm-up: what they allocate is not growth
MIN_GROWTH_BYTES = 16 << 20  # growth below this is not called growth (a leak, a staircase's stair, a name's)
PEAK_MIN_BYTES = 256 << 20  # the least a peak's part must hold to be a finding (the judgement's row 13)
MAX_CHAIN = 32  # links of one autograd operation a probe follows: a chain this long may go on further


def python_arguments(target_args: list[str]) -> list[str]:
    """What follows `python` on the target's command line, for its script and arguments (or `-m` and a
    module): a script whose name begins with a dash after `--`, which ends Python's own options
    (`python -- -dash.py` runs the file, and its sys.argv[0] is `-dash.py`; without it Python took the
    name for its options); a script named `-` as `./-`, since Python reads `-` from standard input
    even after `--`. The report shows the target's command so, the command that ran."""
    args = list(target_args)
    if args and args[0] == "-":
        return [f"{os.curdir}{os.sep}-", *args[1:]]
    if args and args[0].startswith("-") and args[0] != "-m":
        return ["--", *args]
    return args


def reaches_counter(peak: int, counter: int | None) -> bool:
    """Whether the events' highest moment is PyTorch's allocated peak counter's: within
    HISTORY_COUNTER_SLACK or 1% of it (the agent's readings and the diagnosis of older ones)."""
    return counter is None or peak >= counter - max(HISTORY_COUNTER_SLACK, counter // 100)


def max_pause_from_env(environ: Mapping[str, str]) -> float:
    """The pause limit the supervisor asked for (see _seconds_from_env)."""
    return _seconds_from_env(environ, ENV_MAX_PAUSE, MAX_PAUSE_DEFAULT_S, MAX_PAUSE_MIN_S, MAX_PAUSE_MAX_S)


def interval_from_env(environ: Mapping[str, str]) -> float:
    """The interval the supervisor asked for (see _seconds_from_env)."""
    return _seconds_from_env(environ, ENV_INTERVAL, INTERVAL_DEFAULT_S, INTERVAL_MIN_S, INTERVAL_MAX_S)


def interval_ceiling(interval_s: float) -> float:
    """The longest interval the agent samples at, given the one asked for: LENGTHENED_INTERVAL_MAX_S,
    or the interval asked for where that is longer."""
    return interval_s if interval_s > LENGTHENED_INTERVAL_MAX_S else LENGTHENED_INTERVAL_MAX_S


def _seconds_from_env(environ: Mapping[str, str], name: str, default: float, least: float, most: float) -> float:
    """A number of seconds from the environment; the default where it is absent, not a number or out
    of bounds (the agent must start whatever its environment holds)."""
    try:
        value = float(environ.get(name, default))
    except (TypeError, ValueError):
        return default
    return value if least <= value <= most else default
