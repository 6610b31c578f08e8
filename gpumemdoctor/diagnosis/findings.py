"""What a diagnosis is made of: findings, breakdowns, growth, the rank table and the job, and how
the verdict is chosen among the findings. Pure data and one rule; `diagnose.py` makes them."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

VERDICTS = ("clean", "leak", "out-of-memory", "allocator-cache", "pending-stream", "garbage-cycle", "non-torch",
            "child-contexts", "stray-context", "unknown")
# "unknown": memory was held and no evidence says by what or why, because the process ended before
# its exit probes ran (os._exit, a signal): said with the reason, never replaced by a guess.
# "context", "live-at-exit" and "library-memory" (another library's preallocated pool) inform: they
# never make a verdict and never fail a CI check.
INFORMATIVE = ("context", "live-at-exit", "library-memory")
# "orphan-process", "host-memory" (the target killed by SIGKILL while its host memory rose),
# "rank-imbalance" (one rank's peak well above the others') and "avoidable-peak" (memory a pause in
# the steps gathered and let go of at its end: an evaluation without no_grad, say) warn: they never
# make a verdict, and --fail-on can fail on them.
# "fragmented-peak" (free memory inside the allocator's segments at the peak), "temporary-peak" (a
# running function's local held gigabytes at the peak) and "state-at-evaluation" (gradients and
# optimizer state held through an evaluation's peak) are peaks that could be lower (peak.py).
WARNINGS = ("orphan-process", "host-memory", "rank-imbalance", "avoidable-peak", "fragmented-peak",
            "temporary-peak", "state-at-evaluation")
FINDING_KINDS = VERDICTS[1:] + WARNINGS + INFORMATIVE
# When several causes apply at a similar size, the more specific one is named.
SPECIFICITY = ("garbage-cycle", "pending-stream", "leak", "child-contexts", "stray-context", "non-torch",
               "unknown", "allocator-cache")


@dataclass
class Finding:
    kind: str
    bytes: int
    summary: str
    evidence: dict
    remedy: str
    pid: int | None = None
    device: int | None = None  # NVML index
    suspects: list[dict] = field(default_factory=list)  # where, who holds it, which thread (suspects.py)
    host: str | None = None  # the host of the process (pid), from the recording
    # What it claims, each with its evidence and its words (claims.Claim.to_json): a cause, a remedy,
    # "would have fit", what was not seen. Reports made before claims were kept have none.
    claims: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        out = asdict(self)
        if not out["claims"]:  # written only where made: an older report reads back as it was
            del out["claims"]
        return out


@dataclass
class Breakdown:
    """Where one process's memory on one device went, at the end of the run."""

    pid: int
    device: int | None  # NVML index
    torch_index: int | None
    nvml_bytes: int | None
    context_bytes: int | None
    live_tensor_bytes: int | None = None
    garbage_bytes: int | None = None
    pending_stream_bytes: int | None = None
    cache_bytes: int | None = None
    non_torch_bytes: int | None = None
    exit_probes: bool = False  # False when the process died before its exit hook ran
    host: str | None = None
    # Within PyTorch's memory, measured at exit (None where not measured): cuBLAS workspaces, part
    # of live_tensor_bytes; CUDA graphs' private pools, part of live tensors and cache.
    cublas_workspace_bytes: int | None = None
    private_pool_bytes: int | None = None
    # non_torch_bytes itemised (non_torch.py): grown during warm-up, CuPy's pool, the rest; and NCCL's
    # part (nccl.py), where the process's process groups used NCCL.
    non_torch_warmup_bytes: int | None = None
    non_torch_cupy_bytes: int | None = None
    non_torch_rest_bytes: int | None = None
    nccl: bool | None = None  # NCCL in use (its buffers are outside PyTorch); None: not known
    non_torch_nccl_bytes: int | None = None
    nccl_env: dict | None = None  # the NCCL_* variables that size its memory, as the process had them
    # True where NCCL's process group was already up when the context was read (no reading came
    # before it): the context may hold NCCL's buffers made by then (init_process_group(device_id=...)).
    context_after_nccl: bool | None = None
    cuda_module_loading: str | None = None  # CUDA_MODULE_LOADING as the process saw it; None: not set
    # Of non_torch_bytes: other libraries' preallocated pools, [[library, bytes]] (libraries.py); None: none
    non_torch_libraries: list | None = None

    def to_json(self) -> dict:
        out = asdict(self)
        for key in ("non_torch_libraries", "non_torch_nccl_bytes", "nccl_env", "context_after_nccl"):
            if out[key] is None:  # written only where measured: an older report reads back
                del out[key]
        return out


@dataclass
class Growth:
    pid: int
    device: int | None
    series: str  # "allocated", "non_torch" or "nvml"
    by: str  # "step" or "time"
    grown_bytes: int
    rate_bytes_per_step: float | None
    rate_bytes_per_s: float | None
    start_step: int | None
    start_t: float | None
    host: str | None = None

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class RankRow:
    """One rank of a distributed job on one GPU it used (`device` None: a rank that held no GPU)."""

    host: str | None
    rank: int | None
    local_rank: int | None
    node_rank: int | None
    world_size: int | None
    pid: int
    device: int | None  # NVML index
    torch_index: int | None
    breakdown: int | None  # the index of its breakdown in Diagnosis.breakdowns, if it has one
    peak_reserved_bytes: int | None  # PyTorch's peaks: what running out of memory hits first
    peak_allocated_bytes: int | None
    peak_nvml_bytes: int | None
    verdict: str | None = None  # the verdict of this process's findings alone

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Job:
    """A distributed job as a whole: its ranks, where the leaks are, its verdict."""

    ranks: list[int]  # the rank numbers seen
    world_size: int | None
    hosts: list[str | None]
    missing_ranks: list[int]  # below world_size and not seen: another node's report is missing
    ranks_with_leak: list[int]
    verdict: str | None
    summary: str

    def to_json(self) -> dict:
        return asdict(self)


# The parts of a peak, in the order they are drawn (peak.py says how each is recognised).
PEAK_CATEGORIES = ("parameters", "gradients", "optimizer-state", "activations", "gathered", "graphs-kept",
                   "temporaries", "kept-tensors", "unclassified", "request", "graph-pools", "fragmentation",
                   "cache", "outside-pytorch", "context")
# Categories added after baselines first kept a peak's parts: absent from those baselines, read as 0.
LATER_PEAK_CATEGORIES = ("activations", "gathered", "graph-pools", "request")


@dataclass
class PeakPart:
    """One category of a peak: its bytes, how it was recognised, and its largest holders, each
    {"name": str, "bytes": int, "line": str or None} (a module, an optimizer, a running function's
    local, a library), largest first."""

    category: str  # one of PEAK_CATEGORIES
    bytes: int
    how: str
    holders: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class PeakComposition:
    """What one process held on one GPU at its highest observed moment (or, where that was mostly
    the cache an earlier moment left, at the reading with the most memory in use: `highest`); the
    parts add up to `total_bytes` (NVML's figure for the process then; without NVML, context plus
    reserved)."""

    pid: int
    device: int | None  # NVML index
    torch_index: int | None
    t: float | None  # when it was read (the recording's clock)
    step: int | None
    total_bytes: int
    allocated_bytes: int  # PyTorch's allocated memory at that moment
    reserved_bytes: int
    parts: list[PeakPart]
    # PyTorch's own allocated peak counter as of that moment: above allocated_bytes when tensors
    # lived and went between two readings (a step's activations), within the reserved memory.
    allocated_peak_bytes: int | None = None
    in_pause: bool = False  # read while the steps paused (an evaluation)
    where: str | None = None  # what the program's main thread was running then, its own line
    notes: list[str] = field(default_factory=list)  # where the evidence is thin, and what decided
    host: str | None = None
    # NVML's highest reading where it was mostly the cache an earlier moment left, and this one, with
    # more in use, is described instead (diagnosis/peak.py): {"t", "total_bytes", "cache_bytes"}.
    highest: dict | None = None

    @property
    def peak_bytes(self) -> int:
        """The process's highest total on this GPU: what ranks it among the others."""
        return self.highest["total_bytes"] if self.highest else self.total_bytes

    def rank(self) -> tuple:
        """The order of compositions: the largest peak first, then by host, PID and GPU."""
        return -self.peak_bytes, self.host or "", self.pid, -1 if self.device is None else self.device

    def part(self, category: str) -> PeakPart | None:
        return next((p for p in self.parts if p.category == category), None)

    def bytes_of(self, category: str) -> int:
        """A part's bytes; 0 for a part the composition does not have."""
        p = self.part(category)
        return p.bytes if p else 0

    def to_json(self) -> dict:
        out = asdict(self)
        out["parts"] = [p.to_json() for p in self.parts]
        return out


@dataclass
class Diagnosis:
    verdict: str | None  # None only when no GPU was measured
    findings: list[Finding] = field(default_factory=list)
    breakdowns: list[Breakdown] = field(default_factory=list)
    growth: list[Growth] = field(default_factory=list)
    peaks: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    evidence: list[dict] = field(default_factory=list)  # judgement.Evidence.to_json() per process and GPU
    ranks: list[RankRow] = field(default_factory=list)  # a distributed job's ranks, by rank and GPU
    job: Job | None = None  # None when no process was a rank
    peak_compositions: list[PeakComposition] = field(default_factory=list)  # per process and GPU


def choose_verdict(findings: list[Finding]) -> str:
    """An out-of-memory error decides first: `leak` when an accumulation had filled the memory,
    else `out-of-memory`. Otherwise the cause that explains most memory; near-ties go to the
    more specific cause. The allocator's cache is a cause only when nothing else is: freed memory
    kept for reuse is what garbage, a leak's frees or any loop leave behind."""
    ooms = [f for f in findings if f.kind == "out-of-memory"]
    if ooms:
        return "leak" if any(f.evidence.get("cause") == "accumulation" for f in ooms) else "out-of-memory"
    causes = [f for f in findings if f.kind in SPECIFICITY]
    if any(f.kind != "allocator-cache" for f in causes):
        causes = [f for f in causes if f.kind != "allocator-cache"]
    if not causes:
        return "clean"
    biggest = max(f.bytes for f in causes)
    close = [f for f in causes if f.bytes >= 0.8 * biggest]
    return min(close, key=lambda f: SPECIFICITY.index(f.kind)).kind
