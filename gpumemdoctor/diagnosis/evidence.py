"""The evidence about one process on one GPU that the judgement weighs (judgement.py), how it is
gathered from a recording (`gather`, `exit_state`), what a row finds (`Judged`), and what the rows
share (`shortness`, why the samples could not judge growth: summaries.py words it). Pure."""
from __future__ import annotations

from dataclasses import dataclass, field

from . import phases, probed, suspects
from .findings import Breakdown
from .phases import Pause
from .accumulations import accumulations as accumulations_in
from .remedies import LIBRARY_LOOPS
from .stacks import at, user_line
from ..growth import MIN_POINTS
from ..recording.recording import AgentRecording, TorchSample
from ..recording.records import DeviceReading

SIGNIFICANT_BYTES = 64 << 20
MIN_WATCHED_AFTER = 4  # samples at (nearly) the final level before growth over time may decide


@dataclass
class Evidence:
    """Everything observed about one process on one GPU that bears on the verdict."""

    pid: int
    device: int | None  # NVML index
    torch_index: int
    where: str  # "process 123 on GPU 0"
    samples: int  # readings in the series that growth is judged on
    by: str  # "step" or "time"
    enough_samples: bool  # at least MIN_POINTS, they saw what is alive at exit, and for long enough after
    unseen_bytes: int  # what was allocated after the last sample and is alive at exit
    growth: dict | None  # the allocated floor's growth, when seen: grown, retained, rate text, figures
    live_bytes: int | None  # tensors still referenced at exit (None without exit probes)
    garbage_bytes: int | None  # freed by gc.collect() at exit
    accumulations: list[dict] = field(default_factory=list)  # accumulations.accumulations at exit
    unheld: list[dict] = field(default_factory=list)
    exit_search: dict = field(default_factory=dict)  # what the exit search was, or why there was none
    collections: dict | None = None  # the garbage collector's callbacks: what collections freed
    ooms: list[dict] = field(default_factory=list)  # out-of-memory errors on this device
    oom_accumulations: list[dict] = field(default_factory=list)  # held at the first error
    oom_suspects: list[dict] = field(default_factory=list)
    oom_search: dict = field(default_factory=dict)
    uncaught: dict | None = None  # the exception the program died of
    exited_normally: bool = False  # its exit hook ran
    watched_after: int = 0  # samples from the first that saw (nearly) what is alive at exit, to the end
    pauses: list[Pause] = field(default_factory=list)  # pauses in the steps (phases.py)
    phase_accumulations: list[dict] = field(default_factory=list)  # at a pause's height, gone at exit
    phase_search: dict = field(default_factory=dict)
    context_bytes: int | None = None
    cuda_t: float | None = None
    pending_stream_bytes: int | None = None  # held for another stream's unfinished work at exit
    pending_after_sync_bytes: int | None = None
    # How pending was told apart from finished work's blocks (diagnosis/streams.py `evidence`)
    pending: dict = field(default_factory=dict)
    # What held the memory, asked for by the rows that name suspects (holders.Holders); None: no
    # recording behind this evidence (the judgement's own tests), and no suspects
    holders: object = None
    active_bytes: int | None = None  # at exit (end probe)
    allocated_bytes: int | None = None
    cache_bytes: int | None = None  # PyTorch's cache at exit
    reserved_bytes: int | None = None
    after_empty_cache: tuple | None = None  # (reserved, NVML) after empty_cache()
    # How the process ended when its exit probes did not run (ends.how_ended): None when they ran.
    ended: dict | None = None
    last_allocated_bytes: int | None = None  # at its last reading (the end, or the last sample)
    last_t: float | None = None
    collector: dict | None = None  # the garbage collector's state (exit record): disabled, off samples
    # The limit in force on the process's memory on this GPU (limits.py): its bytes, and "device" or
    # "memory-fraction"; None where neither was read.
    limit_bytes: int | None = None
    limit_source: str | None = None
    # PyTorch's allocated peak counter at the last sample before the first out-of-memory error's step
    peak_before_error: int | None = None
    steps: int = 0  # the steps the program marked (optimizer steps, gpumemdoctor.step())
    allocated_values: list[int] = field(default_factory=list)  # the series' allocated readings, in order
    allocated_times: list[float] = field(default_factory=list)  # when each was read (seconds)
    shutdown: dict | None = None  # when the exit probes ran (the exit record's `shutdown`): before its joins
    graph_pools: list | None = None  # CUDA graphs' private pools at exit: [pools, reserved, allocated]
    # The readings of the allocator's events made inside a library loop (remedies.LIBRARY_LOOPS): t,
    # loop, loop_called_at
    loop_readings: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        """What the report keeps of it: the facts, not the suspects (those are on the findings)."""
        return {"pid": self.pid, "device": self.device, "samples": self.samples, "by": self.by,
                "enough_samples_for_growth": self.enough_samples, "unseen_bytes": self.unseen_bytes,
                "watched_after": self.watched_after,
                "growth": self.growth, "live_at_exit_bytes": self.live_bytes,
                "pauses": [p.to_json() for p in self.pauses],
                "garbage_at_exit_bytes": self.garbage_bytes,
                "accumulations": [brief(a) for a in self.accumulations],
                "unheld": [brief(u) for u in self.unheld],
                "collections": self.collections,
                "out_of_memory": [oom_brief(o) for o in self.ooms],
                "uncaught": None if self.uncaught is None else
                {"exc_type": self.uncaught["exc_type"], "at": line_of(self.uncaught["stack"])}}


# -- gathered from a recording ------------------------------------------------------

def readings(samples: list[TorchSample], torch_index: int) -> list[tuple[TorchSample, DeviceReading]]:
    out = []
    for s in samples:
        r = s.reading(torch_index)
        if r is not None:
            out.append((s, r))
    return out


def gather(agent: AgentRecording, torch_index: int, nvml_index: int | None, where: str, b: Breakdown,
              series: list, by: str, growth: dict | None, held: list[dict],
              unheld: list[dict]) -> Evidence:
    """What was observed of one process on one GPU, for the judgement."""
    values = [r.allocated_bytes for _, r in series if r.allocated_bytes is not None]
    times = [s.t for s, r in series if r.allocated_bytes is not None]
    samples = len(values)
    # Samples can miss the build-up: a loop that runs between two samples, or right before exit.
    seen_most = max(values, default=0)
    unseen = max(0, (b.live_tensor_bytes or 0) - seen_most) if b.exit_probes else 0
    # Or see it only at the very end: an inference loop of 0.1 s at the end of a run, caught by
    # the last of eleven samples (H100). Growth over time decides only when the samples went on
    # for a while after they first saw what is alive at exit.
    near = max(SIGNIFICANT_BYTES, (b.live_tensor_bytes or 0) // 4)
    reached = next((i for i, v in enumerate(values) if v >= seen_most - near), samples)
    watched_after = samples - reached
    oom_search = suspects.search_of(agent.root, "oom")
    oom_held, _ = accumulations_in(oom_search, torch_index)
    oom_suspects, oom_meta = suspects.live_suspects(agent.root, torch_index, when="oom")
    _, exit_meta = suspects.live_suspects(agent.root, torch_index)
    info = agent.exit_info or {}
    collections = info.get("collections")
    if collections is not None:
        freeing = [c for c in agent.root["collections"] if any(i == torch_index for i, _ in c["freed"])]
        collections = dict(collections, records=len(freeing),
                           first_t=freeing[0]["t"] if freeing else None,
                           biggest_at=_biggest_collection(freeing, torch_index))
    in_order = [(s.by, s.t, s.step, r.allocated_bytes, r.allocated_peak_bytes)
                for s, r in readings(agent.samples, torch_index)]
    pauses = phases.pauses(in_order, b.live_tensor_bytes if b.exit_probes else None)
    phase_held, phase_meta = suspects.phase_accumulations(agent.root, torch_index, held)
    if pauses:  # what the probe named at a pause's height, where no copy searched it or one found less
        found, meta = probed.phase_holders(agent, torch_index, max(p.rise for p in pauses))
        if meta is not None and (not phase_meta["searched"] or _bytes(found) > _bytes(phase_held)):
            phase_held, phase_meta["probed"] = found, meta
    ooms = [o for o in agent.root["ooms"] if o["device"] == torch_index]
    return Evidence(
        pid=agent.pid, device=nvml_index, torch_index=torch_index, where=where, samples=samples, by=by,
        peak_before_error=_peak_before(agent, torch_index, ooms[0]) if ooms else None,
        steps=agent.steps or 0, allocated_values=values, allocated_times=times, shutdown=(agent.exit_info or {}).get("shutdown"),
        graph_pools=next((row[1:] for row in ((agent.exit_info or {}).get("parts") or {}).get("graph_pools") or []
                          if row[0] == torch_index), None),
        loop_readings=[{"t": r["t"], "loop": r["loop"], "loop_called_at": r.get("loop_called_at")}
                       for r in agent.root.get("peak_histories", [])
                       if r.get("device") == torch_index and r.get("loop") in LIBRARY_LOOPS],
        pauses=pauses,
        phase_accumulations=phase_held, phase_search=phase_meta,
        enough_samples=samples >= MIN_POINTS and unseen < near and watched_after >= MIN_WATCHED_AFTER,
        unseen_bytes=unseen, watched_after=watched_after, growth=growth,
        live_bytes=b.live_tensor_bytes if b.exit_probes else None, garbage_bytes=b.garbage_bytes,
        accumulations=held, unheld=unheld, exit_search=exit_meta, collections=collections,
        ooms=ooms,
        oom_accumulations=oom_held, oom_suspects=oom_suspects, oom_search=oom_meta,
        uncaught=info.get("uncaught"), exited_normally=agent.exited_normally)


def _peak_before(agent: AgentRecording, torch_index: int, oom: dict) -> int | None:
    """PyTorch's allocated peak counter at the last sample of an earlier step than the error's: what
    the steps before it reached at most. None in a program without steps before the error."""
    step = oom.get("step")
    if not step:
        return None
    # (a step's end sample: the timer's during the failing step would count some of it)
    seen = [r.allocated_peak_bytes for s, r in readings(agent.samples, torch_index)
            if s.t < oom["t"] and s.by == "step" and s.step is not None and s.step <= step
            and r.allocated_peak_bytes is not None]
    return max(seen) if seen else None


def _biggest_collection(freeing: list[dict], torch_index: int) -> dict | None:
    if not freeing:
        return None
    c = max(freeing, key=lambda c: sum(b for i, b in c["freed"] if i == torch_index))
    line = suspects.user_line(c["stack"])
    return {"t": c["t"], "step": c["step"], "generation": c["generation"], "thread": c["thread"],
            "freed_bytes": sum(b for i, b in c["freed"] if i == torch_index),
            "at": suspects.at(line) if line else None}


def exit_state(e: Evidence, b: Breakdown, probes: dict, end: DeviceReading, context: int | None,
                cuda_t: float | None) -> None:
    """What the exit probes read, for the judgement's rows on the context, the stream and the cache."""
    after_sync, after_empty = probes.get("sync"), probes.get("empty_cache")
    e.context_bytes, e.cuda_t = context, cuda_t
    e.pending_stream_bytes, e.cache_bytes = b.pending_stream_bytes, b.cache_bytes
    e.active_bytes, e.allocated_bytes, e.reserved_bytes = end.active_bytes, end.allocated_bytes, end.reserved_bytes
    if after_sync and after_sync.active_bytes is not None and after_sync.allocated_bytes is not None:
        e.pending_after_sync_bytes = after_sync.active_bytes - after_sync.allocated_bytes
    if after_empty is not None:
        e.after_empty_cache = (after_empty.reserved_bytes, after_empty.nvml_used_bytes)


@dataclass
class Judged:
    """A finding of the judgement, before diagnose.py makes it a Finding."""

    kind: str
    bytes: int
    summary: str
    evidence: dict
    remedy: str
    suspects: list[dict] = field(default_factory=list)
    claims: list = field(default_factory=list)  # claims.Claim: what it says, with the evidence of each


# -- what the rows share -----------------------------------------------------------------

def shortness(e: Evidence) -> dict:
    """Why the samples could not judge growth, with their figures (summaries.too_short words it):
    `few` (fewer than MIN_POINTS), `unseen` (what was alive at exit came after the last sample), or
    `late` (they saw it only at the very end)."""
    why = ("few" if e.samples < MIN_POINTS else "unseen" if e.unseen_bytes >= SIGNIFICANT_BYTES else "late")
    return {"why": why, "samples": e.samples, "by": e.by, "unseen_bytes": e.unseen_bytes,
            "watched_after": e.watched_after}


def samples_of(e: Evidence) -> dict:
    return {"samples": e.samples, "by": e.by, "enough_samples_for_growth": e.enough_samples,
            "unseen_bytes": e.unseen_bytes, "watched_after": e.watched_after}


def line_of(stack: list) -> str | None:
    frame = user_line(stack)
    return at(frame) if frame else None


def brief(a: dict) -> dict:
    return {k: v for k, v in a.items() if k in ("pattern", "path", "kind", "count", "bytes", "sizes",
                                                 "where", "thread", "same_line")}


def oom_brief(o: dict) -> dict:
    return {k: o[k] for k in ("t", "step", "device", "request_bytes", "limit_bytes", "device_free_bytes",
                              "allocated_bytes", "reserved_bytes", "largest_free_block_bytes",
                              "free_in_segments_bytes", "processes", "thread")} | {"at": line_of(o["stack"])}


def _bytes(held: list[dict]) -> int:
    """What a search's or a probe's holders held together. A search in a copy runs when the copy is
    made, as early as 26 ms into a pause (H200, peak_single_cat), before most of it is held; the probe
    reads the names at the pause's highest allocation. So of the two the one that saw more explains
    the height, the same in every run."""
    return sum(h.get("bytes") or 0 for h in held)
