"""The peak's words: how each part of a peak was told (HOW), the composition's notes (peak.py), and
the holders the peak's probes named (probed.py). Pure.

The same registry as summaries.py's (summaries_registry.py): each sentence a registered function, its keyword arguments
the facts peak.py and probed.py decided; `tell(name, **facts)` makes it.
"""
from __future__ import annotations

from .summaries_registry import summary as _summary
from ..contract import MAX_CHAIN as CHAIN_CAP  # a chain this long may go on further
from ..contract import MIN_GROWTH_BYTES as MIN_BYTES  # a growth smaller than this is not said
from ..units import format_bytes as fb

MAIN_THREAD = "thread 'MainThread': "  # how a probed local's path starts (probed.py makes the paths with it)

HOW = {
    "context": "the CUDA context, read at the process's first allocation",
    "outside-pytorch": "NVML's figure for the process less the context and PyTorch's reserved memory",
    "fragmentation": "free memory inside the allocator's split segments (inactive_split_bytes), CUDA graphs' "
                     "private pools left out",
    "graph-pools": "free memory inside CUDA graphs' private pools, reserved for their replays: the graphs' own "
                   "(their pools as measured at exit)",
    "cache": "reserved by PyTorch, neither allocated nor split: free for its next allocations",
    "parameters": "the parameters of the optimizers that stepped and of modules the program's names hold",
    "gradients": "the .grad of those parameters",
    "optimizer-state": "the optimizers' state (AdamW: exp_avg and exp_avg_sq)",
    "graphs-kept": "saved by autograd graphs that the program's names hold, found by the holder search in a copy "
                   "of the process during the same pause",
    "temporaries": "held by the locals of functions running at that moment",
    "kept-tensors": "held by the main module's globals",
    "unclassified": "allocated, and held by nothing the readings name",
}

# The notes that need no figure.
NO_CONTEXT = "the CUDA context was not read: it is counted in memory outside PyTorch"
NO_PARAMETERS = "no optimizer stepped and no module was found in the program's names: parameters are unclassified"
NO_PROBE = ("no probe of the program's names was made at this moment: graphs, temporaries and kept tensors are "
            "not told apart")
READ_AT_EXIT = ("read at the program's end, by the exit's first reading: the memory rose after the last sample; "
                "the running functions' locals were gone by then")


# -- the probes' holders (probed.py) ------------------------------------------------------------

def graph_words(a: dict) -> str:
    """'an autograd graph that chains 32+ operations of one kind' (or, in older recordings, 'of N nodes')."""
    if a["chain"] > 1:
        return f"an autograd graph that chains {a['chain']}{'+' if a['chain'] >= CHAIN_CAP else ''} operations of one kind"
    return f"an autograd graph of {a['nodes']:,} nodes"


def graph_carried(graph: dict, verb: str) -> str:
    """'evaluate() at e.py:34 local total carried an autograd graph that chains 32+ operations of one kind'."""
    return f"{graph['path'].removeprefix(MAIN_THREAD)} {verb} {graph_words(graph)}"


@_summary("probed-holder")
def _probed_holder(holder: dict) -> str:
    """A probed holder in words: what it held, and how that was read."""
    a = holder
    at = f" ({a['line']})" if a.get("line") and a["line"] not in a["path"] else ""
    if a["kind"] == "autograd-graph" and a["chain"] > 1:
        text = (f"{a['path']}{at} carried {graph_words(a)} (a running sum or a concatenation: each link keeps "
                "its batch's graph; the saved tensors not measured)")
    elif a["kind"] == "autograd-graph" and a["nodes"]:
        text = f"{a['path']}{at} carried {graph_words(a)} (its saved tensors not measured)"
    else:
        text = f"{fb(a['bytes'])} in {a['count']} tensor{'s' if a['count'] != 1 else ''} held by {a['path']}{at}"
    if a.get("grew_bytes", 0) >= MIN_BYTES:
        text += f"; it grew by {fb(a['grew_bytes'])} from the probe at {a['first_t']:.1f} s to a later one"
    elif a.get("grew_chain") or a.get("grew_nodes"):
        more = f"{a['grew_chain']} links" if a.get("grew_chain") else f"{a['grew_nodes']:,} graph nodes"
        text += f"; its graph grew by {more} from the probe at {a['first_t']:.1f} s to a later one"
    return text


@_summary("exit-search-late")
def _exit_search_late(declined: str | None) -> str:
    """Why a growth's holders were not searched: the search at exit came after it was let go of."""
    return ("the search at exit came after the memory was let go of"
            f"{f'; the one during the run was not made ({declined})' if declined else ''}")


# -- how a part was told (peak.py) --------------------------------------------------------------

@_summary("outside-how")
def _outside_how(libraries: list[str]) -> str:
    """HOW's words for the memory outside PyTorch, and the libraries that have memory of their own."""
    named = f"; libraries with memory of their own in this process: {', '.join(libraries)}" if libraries else ""
    return HOW["outside-pytorch"] + named


@_summary("unclassified-how")
def _unclassified_how(cublas: bool, read: str | None, after_s: float | None = None, graph: dict | None = None,
                      own_bytes: int | None = None) -> str:
    """HOW's words for the unclassified part, then what is known of it: cuBLAS's workspaces, and where
    the rest was `read` (None: nothing said; "earlier-probe" `after_s` after one that found `graph`;
    "backward"; "optimizer-temporaries"; "optimizer-beyond" its `own_bytes`; "graph": while `graph`)."""
    out = HOW["unclassified"]
    if cublas:
        out += ("; of it, cuBLAS's workspaces, as measured at exit (kept from a stream's first matrix "
                "product on; not read at this moment)")
    rest_read = "; the rest read" if cublas else "; read"
    if read is None:
        return out
    return out + rest_read + {
        "earlier-probe": lambda: f" {after_s:.2f} s after a probe in the same pause found {graph_carried(graph, 'carrying')}",
        "backward": lambda: (" while the program was inside backward(): activations saved for backward, "
                             "gradients being made and backward's temporaries"),
        "optimizer-temporaries": lambda: " inside an optimizer's step: its temporaries",
        "optimizer-beyond": lambda: (" inside an optimizer's step, more than its parameters, gradients and state "
                                     f"together ({fb(own_bytes)}): held further than the probe reads (names, and "
                                     "one level below them)"),
        "graph": lambda: f" while {graph_carried(graph, 'carried')}",
    }[read]()


# -- the composition's notes (peak.py) -----------------------------------------------------------

@_summary("busiest-reading")
def _busiest_reading(in_use_bytes: int, total_bytes: int, t: float) -> str:
    return f"the busiest of the samples' readings had {fb(in_use_bytes)} in use ({fb(total_bytes)} in all, at {t:.1f} s)"


@_summary("optimizers-read-apart")
def _optimizers_read_apart(category: str, t: float, then_bytes: int) -> str:
    return f"{category.replace('-', ' ')}: the optimizers' figures as the reading at {t:.1f} s found them ({fb(then_bytes)} then)"


@_summary("nvml-below-pytorch")
def _nvml_below_pytorch(nvml_bytes: int, pytorch_bytes: int) -> str:
    return (f"NVML read {fb(nvml_bytes)}, less than the context and PyTorch's reserved memory "
            f"({fb(pytorch_bytes)}): the readings were not of one moment")


@_summary("graphs-read-earlier")
def _graphs_read_earlier(search_t: float, before_s: float) -> str:
    return (f"graphs kept: read by the holder search at {search_t:.1f} s, {before_s:.1f} s before this moment; "
            "what they held more by then is unclassified")


@_summary("probe-failed")
def _probe_failed(error: str) -> str:
    return f"the probe of the program's names failed ({error})"


@_summary("probe-cut")
def _probe_cut(elapsed_s: float) -> str:
    return (f"the probe ran {elapsed_s * 1000:.0f} ms after the reading and found more than its allocated memory: "
            "its parts are cut to fit")


@_summary("probe-stopped")
def _probe_stopped(stopped: str, read: int) -> str:
    return (f"the probe stopped at its budget ({stopped}, {read:,} graph nodes read): what it did not reach is "
            "unclassified")


@_summary("highest-reading")
def _highest_reading(by_nvml: bool, total_bytes: int, t: float, cache_bytes: int, counter_bytes: int,
                     seen_bytes: int) -> str:
    """NVML's highest (or the highest reading) beside the busiest; what PyTorch's allocated peak
    counter, read there, says of the moments between, where it is above the busiest's figure."""
    whose = "NVML's highest" if by_nvml else "the highest reading"
    risen = ("" if counter_bytes <= seen_bytes else
             f"; PyTorch's allocated peak counter, {fb(counter_bytes)} there, says its allocated memory rose "
             f"{fb(counter_bytes - seen_bytes)} above this reading's at a moment between the two")
    return (f"the reading with the most memory in use: {whose}, {fb(total_bytes)} at {t:.1f} s, held "
            f"{fb(cache_bytes)} of PyTorch's cache (memory freed and kept for reuse)" + risen)


@_summary("readings-at-highs")
def _readings_at_highs(captures: int, highest: bool) -> str:
    """One of (or, `highest`, the highest of) the readings made at new highs."""
    which = "the highest" if highest else "one"
    return f"{which} of {captures} readings made at new highs of this process's memory"


# What filled the cache (cache_filled.py).
@_summary("cache-unserved")
def _cache_unserved(extra: int, intervals: int) -> str:
    return (f"what filled the cache: PyTorch reserved {fb(extra)} more, over {intervals} intervals between "
            "samples up to this moment, than its allocated peak rose: sizes it could not serve from what it "
            "held free (shapes that vary from step to step, a tensor that grows, blocks split apart); a few "
            "fixed shapes (padding to set lengths) or PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True keep "
            "it down")


@_summary("cache-filled-once")
def _cache_filled_once(counter: int, reserved: int) -> str:
    return (f"what filled the cache: PyTorch's allocated memory had reached {fb(counter)} by this moment "
            f"({counter / reserved:.0%} of what it reserved) and let it go: the cache is what that "
            "moment left (a phase that freed a lot); torch.cuda.empty_cache() after it gives it back, if other "
            "processes need it")
