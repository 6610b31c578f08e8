"""The parts of a breakdown as the HTML page draws them (its rows' order and labels, its bar's parts and
its table's small print), and the table of what made each peak; the charts are `_html_charts`'."""
from __future__ import annotations

import html

from ..diagnosis.findings import Breakdown, PeakComposition
from ..recording.recording import Recording
from ..units import format_bytes as fb
from .vocabulary import (AFTER_NCCL_WORDS, allocated_peak_note, holder_text, nccl_words, peak_label, peak_where,
                         share, shown_parts)

PARTS = [("CUDA context", "context_bytes", "#9d9da1"), ("live tensors", "live_tensor_bytes", "#e45756"),
         ("garbage cycles", "garbage_bytes", "#b279a2"), ("pending stream", "pending_stream_bytes", "#eeca3b"),
         ("allocator cache", "cache_bytes", "#4c78a8"), ("outside PyTorch", "non_torch_bytes", "#72b7b2")]
# The memory outside PyTorch itemised (gpumemdoctor/diagnosis/non_torch.py): its bar is drawn in these parts
# where the breakdown has them, as one where it has not (a process seen only through NVML).
OUTSIDE_PARTS = [("outside: NCCL", "non_torch_nccl_bytes", "#b6992d"),
                 ("outside: in warm-up", "non_torch_warmup_bytes", "#9fd4cf"),
                 ("outside: CuPy's pool", "non_torch_cupy_bytes", "#54a24b"),
                 ("outside: the rest", "non_torch_rest_bytes", "#2f7f7a")]


def bar_part(b: Breakdown, key: str) -> int | None:
    """A part of the breakdown's bar: the memory outside PyTorch in its parts where it has them."""
    itemised = b.non_torch_warmup_bytes is not None
    if key == "non_torch_bytes" and itemised or key in {k for _, k, _ in OUTSIDE_PARTS} and not itemised:
        return None
    return getattr(b, key)


def within(b: Breakdown, key: str) -> str:
    """The parts measured within a cell of the breakdown's table, in small print (HTML)."""
    if key == "context_bytes" and b.context_after_nccl:
        return _small(f"read {AFTER_NCCL_WORDS}")
    if key == "live_tensor_bytes" and b.cublas_workspace_bytes:
        return _small(f"cuBLAS workspaces {fb(b.cublas_workspace_bytes)}")
    if key == "cache_bytes" and b.private_pool_bytes:
        return _small(f"CUDA graph pools {fb(b.private_pool_bytes)} (of PyTorch's memory)")
    if key == "non_torch_bytes" and b.non_torch_warmup_bytes is not None:
        parts = [f"in warm-up {fb(b.non_torch_warmup_bytes)}"]
        if b.non_torch_nccl_bytes is not None:
            parts.insert(0, f"NCCL {fb(b.non_torch_nccl_bytes)}, came with its process groups "
                            f"({nccl_words(b.nccl_env)})")
        if b.non_torch_cupy_bytes is not None:
            parts.append(f"CuPy's pool {fb(b.non_torch_cupy_bytes)}")
        parts.append(f"the rest {fb(b.non_torch_rest_bytes)}")
        in_use = b.nccl and b.non_torch_nccl_bytes is None
        return _small(" · ".join(parts) + ("; NCCL in use (not measured apart)" if in_use else ""))
    return ""


def _small(text: str) -> str:
    return f"<br><small>{html.escape(text, quote=True)}</small>"


def breakdown_rows(recordings: list[Recording], breakdowns: list[Breakdown]) -> list[Breakdown]:
    """Each host's target first, then its other processes by PID; hosts in the reports' order."""
    hosts = [r.host for r in recordings]
    targets = {r.host: r.target_pid for r in recordings}
    return sorted(breakdowns, key=lambda b: (hosts.index(b.host) if b.host in hosts else len(hosts),
                                             b.pid != targets.get(b.host), b.pid, b.device or 0))


def breakdown_label(b: Breakdown, with_host: bool) -> str:
    where = f"process {b.pid}, GPU {b.device if b.device is not None else '?'}"
    return f"{b.host or '?'}: {where}" if with_host else where


# -- what made the peak: its table -------------------------------------------------------------

def peak_section(compositions: list[PeakComposition], charts: dict[int, str], with_host: bool) -> str:
    """Each peak's chart (`charts`: its index in `compositions` to its figure's id) and its table."""
    if not compositions:
        return ""
    e = html.escape
    out = ['<section id="peak-section"><h2>What made the peak</h2><p class="hint">Each process\'s highest '
           "observed moment on each GPU, in its parts; the parts add up to the peak's total (NVML's figure "
           "for the process then, or the context and PyTorch's reserved memory without it). Where the highest "
           "moment was mostly the cache an earlier one left (an evaluation that had let its graphs go), the "
           "reading with the most memory in use is shown, and its note says so. "
           "The chart stacks the memory over time (the CUDA context, PyTorch's allocated memory, its cache, "
           "and the rest NVML sees outside PyTorch); the dotted line is the peak's moment, the bar its parts."
           "</p>"]
    for i, c in enumerate(compositions):
        out.append(f"<h3>{e(peak_where(c, with_host))}: {e(fb(c.total_bytes))}</h3>")
        if c.where:
            out.append(f'<p class="cmd">running <code>{e(c.where)}</code></p>')
        if i in charts:
            out.append(f'<div class="chart" id="{charts[i]}" data-pid="{c.pid}"></div>')
        rows = []
        for p in shown_parts(c):
            holders = "".join(f"<li><code>{e(holder_text(h))}</code></li>" for h in p.holders[:3])
            holders = f'<ol class="holders">{holders}</ol>' if holders else ""
            rows.append(f'<tr><th>{e(peak_label(p.category))}</th><td>{e(fb(p.bytes))}</td>'
                        f'<td>{e(share(p.bytes, c.total_bytes))}</td><td class="how">{e(p.how)}{holders}</td></tr>')
        out.append('<table class="figures peak"><tr><th>part</th><th>bytes</th><th>share</th>'
                   f'<th>how it was told, its largest holders</th></tr>{"".join(rows)}</table>')
        notes = [n for n in [*c.notes, allocated_peak_note(c)] if n]
        if notes:
            out.append('<ul class="peak-notes">' + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul>")
    out.append("</section>")
    return "\n".join(out)
