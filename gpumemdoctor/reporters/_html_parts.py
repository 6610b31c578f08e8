"""The parts of a breakdown as the HTML page draws them (its bar's parts and its table's small print),
and what made the peak (its chart over time and its parts' table)."""
from __future__ import annotations

import html

from ..diagnosis.findings import Breakdown, PeakComposition
from ..recording.recording import Recording
from ..units import format_bytes as fb
from .envelope import envelope
from .vocabulary import (AFTER_NCCL_WORDS, allocated_peak_note, holder_text, nccl_words, peak_label, peak_where,
                         share, shown_parts)

MIB, GIB = 1 << 20, 1 << 30

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


# -- what made the peak ----------------------------------------------------------------------------
# Each category's colour, in PEAK_CATEGORIES' order; and the memory over time, stacked from the agent's
# samples: the context (the breakdown's, from its reading on), allocated, the cache (reserved less
# allocated) and outside PyTorch (NVML less context and reserved, floored at 0).
PEAK_COLOURS = {"parameters": "#1f77b4", "gradients": "#ff7f0e", "optimizer-state": "#d62728",
                "graphs-kept": "#9467bd", "temporaries": "#e377c2", "kept-tensors": "#17becf",
                "unclassified": "#bcbd22",
                "fragmentation": "#8c564b", "cache": "#4c78a8", "outside-pytorch": "#72b7b2", "context": "#9d9da1"}
OVER_TIME = (("CUDA context", "#9d9da1"), ("allocated", "#e45756"), ("allocator cache", "#4c78a8"),
             ("outside PyTorch", "#72b7b2"))
MAX_PEAK_CHARTS = 4  # the largest peaks get a chart; every one gets its table


def over_time(recording: Recording, pid: int, device: int | None, context: int | None) -> list[tuple]:
    """(t, context, allocated, cache, outside) at each of the agent's samples of that process and GPU;
    outside is None where the sample has no NVML figure."""
    agent = recording.agent(pid)
    rows = []
    for sample in agent.samples if agent else []:
        for r in sample.readings:
            d = agent.device(r.torch_index)
            if (d.nvml_index if d else None) != device or r.reserved_bytes is None or r.allocated_bytes is None:
                continue
            outside = (None if r.nvml_used_bytes is None
                       else max(0, r.nvml_used_bytes - (context or 0) - r.reserved_bytes))
            rows.append((sample.t, context or 0, r.allocated_bytes, max(0, r.reserved_bytes - r.allocated_bytes),
                         outside))
    return rows


def peak_figure(rows: list[tuple], c: PeakComposition, buckets: int) -> dict:
    """The memory over time by category, stacked, the peak's moment marked, and beside it a stacked bar
    of the peak's parts. Long runs keep each bucket's lowest and highest stacked total (envelope)."""
    totals = {t: ctx + a + cache + (out or 0) for t, ctx, a, cache, out in rows}
    kept = {t for t, _ in envelope(sorted(totals.items()), buckets)}
    rows = [row for row in rows if row[0] in kept]
    top = max([c.total_bytes, *totals.values()])
    scale, unit = (GIB, "GiB") if top >= 4 * GIB else (MIB, "MiB")
    traces = []
    for k, (name, colour) in enumerate(OVER_TIME, 1):
        if k == 1 and not any(row[1] for row in rows):
            continue
        traces.append({"type": "scatter", "mode": "lines", "name": name, "stackgroup": "over-time",
                       "x": [round(row[0], 4) for row in rows],
                       "y": [None if row[k] is None else row[k] / scale for row in rows],
                       "line": {"color": colour, "width": 0.5}, "fillcolor": colour,
                       "hovertemplate": f"%{{y:.2f}} {unit}<extra>{name}</extra>"})
    for p in shown_parts(c):
        traces.append({"type": "bar", "name": f"peak: {peak_label(p.category)}", "xaxis": "x2", "x": ["at the peak"],
                       "y": [p.bytes / scale], "marker": {"color": PEAK_COLOURS.get(p.category, "#777")},
                       "hovertemplate": f"%{{y:.2f}} {unit}<extra>{peak_label(p.category)}</extra>"})
    shapes, notes = [], []
    if c.t is not None:
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": c.t, "x1": c.t, "y0": 0, "y1": 1,
                       "line": {"color": "#c0392b", "width": 1.5, "dash": "dot"}})
        notes.append({"xref": "x", "yref": "paper", "x": c.t, "y": 1, "yanchor": "bottom", "xanchor": "right",
                      "text": f"{'most in use' if c.highest else 'peak'}, {fb(c.total_bytes)}", "showarrow": False,
                      "font": {"color": "#c0392b", "size": 11}})
    layout = {"height": 380, "margin": {"l": 64, "r": 24, "t": 36, "b": 48}, "barmode": "stack",
              "hovermode": "x unified", "legend": {"orientation": "h", "y": -0.2, "x": 0},
              "xaxis": {"domain": [0, 0.8], "title": {"text": "seconds since the run started"}, "zeroline": False},
              "xaxis2": {"domain": [0.86, 1], "anchor": "y"},
              "yaxis": {"title": {"text": unit}, "rangemode": "tozero"},
              "shapes": shapes, "annotations": notes,
              "meta": {"pid": c.pid, "device": c.device, "unit": unit, "scale": scale, "buckets": buckets}}
    return {"data": traces, "layout": layout}


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
