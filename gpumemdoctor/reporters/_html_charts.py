"""The HTML page's charts, as plotly figures (dicts the page embeds as JSON): each process's timeline
on each GPU, the breakdown's bars at exit, and the memory over time by category around each peak.
Long series are cut down by `envelope` (each bucket's lowest and highest point) before they are drawn.
"""
from __future__ import annotations

from ..diagnosis.findings import Breakdown, Diagnosis, PeakComposition
from ..recording.recording import Recording
from ..units import GIB, MIB
from ..units import format_bytes as fb
from ._html_parts import OUTSIDE_PARTS, PARTS, bar_part, breakdown_label, breakdown_rows
from .envelope import envelope
from .vocabulary import peak_label, shown_parts

# The timeline's series and their colours; a growth's series as its mark on the timeline names it.
COLOURS = {"NVML": "#333333", "reserved": "#4c78a8", "active": "#f58518", "allocated": "#e45756",
           "steps": "#9a9a9a"}
SERIES_NAMES = {"allocated": "allocated", "non_torch": "outside PyTorch", "nvml": "NVML"}
# What made the peak: each category's colour, in PEAK_CATEGORIES' order; and the memory over time, stacked from the agent's
# samples: the context (the breakdown's, from its reading on), allocated, the cache (reserved less
# allocated) and outside PyTorch (NVML less context and reserved, floored at 0).
PEAK_COLOURS = {"parameters": "#1f77b4", "gradients": "#ff7f0e", "optimizer-state": "#d62728",
                "activations": "#2ca02c", "gathered": "#c49c94",
                "graphs-kept": "#9467bd", "temporaries": "#e377c2", "kept-tensors": "#17becf",
                "unclassified": "#bcbd22", "request": "#ff9da6", "graph-pools": "#aec7e8",
                "fragmentation": "#8c564b", "cache": "#4c78a8", "outside-pytorch": "#72b7b2", "context": "#9d9da1"}
OVER_TIME = (("CUDA context", "#9d9da1"), ("allocated", "#e45756"), ("allocator cache", "#4c78a8"),
             ("outside PyTorch", "#72b7b2"))
MAX_PEAK_CHARTS = 4  # the largest peaks get a chart; every one gets its table


def _unit(top: int) -> tuple[int, str]:
    """A chart's unit for its highest value: GiB from 4 GiB on, MiB below."""
    return (GIB, "GiB") if top >= 4 * GIB else (MIB, "MiB")


def timeline_keys(recording: Recording) -> list[tuple[int, int | None]]:
    """Every process and GPU with samples or NVML points: the target first."""
    keys = set(k for k, points in recording.nvml.items() if points)
    for agent in recording.agents:
        for sample in agent.samples:
            for r in sample.readings:
                device = agent.device(r.torch_index)
                keys.add((agent.pid, device.nvml_index if device else None))
    target = recording.target_pid
    return sorted(keys, key=lambda k: (k[0] != target, k[0], -1 if k[1] is None else k[1]))


def _timeline_series(recording: Recording, pid: int, device: int | None) -> dict[str, list]:
    """The recorded points of each series, in bytes: NVML from the supervisor's polls, the rest
    from the agent's samples (the agent's own NVML reading where there were no polls)."""
    series: dict[str, list] = {"NVML": list(recording.nvml.get((pid, device), [])),
                               "reserved": [], "active": [], "allocated": [], "steps": []}
    agent = recording.agent(pid)
    sampled_nvml = []
    for sample in agent.samples if agent else []:
        for r in sample.readings:
            d = agent.device(r.torch_index)
            if (d.nvml_index if d else None) != device:
                continue
            series["reserved"].append((sample.t, r.reserved_bytes))
            series["active"].append((sample.t, r.active_bytes))
            series["allocated"].append((sample.t, r.allocated_bytes))
            series["steps"].append((sample.t, sample.step))
            sampled_nvml.append((sample.t, r.nvml_used_bytes))
    if not series["NVML"]:
        series["NVML"] = sampled_nvml
    return series


def timeline_figure(recording: Recording, diagnosis: Diagnosis, pid: int, device: int | None,
                     buckets: int) -> dict:
    series = _timeline_series(recording, pid, device)
    top = max((v for name, pts in series.items() if name != "steps" for _, v in pts if v is not None),
              default=0)
    scale, unit = _unit(top)
    traces = []
    for name in ("NVML", "reserved", "active", "allocated"):
        points = envelope(series[name], buckets)
        if not points:
            continue
        traces.append({
            "type": "scatter", "mode": "lines", "name": name, "x": [round(t, 4) for t, _ in points],
            "y": [None if v is None else v / scale for _, v in points],
            "line": {"color": COLOURS[name], "width": 2 if name == "NVML" else 1.5,
                     "shape": "hv" if name == "NVML" else "linear"},
            "hovertemplate": f"%{{y:.1f}} {unit}<extra>{name}</extra>"})
    steps = envelope(series["steps"], buckets)
    if any(s for _, s in steps):
        traces.append({"type": "scatter", "mode": "lines", "name": "steps", "yaxis": "y2",
                       "x": [round(t, 4) for t, _ in steps], "y": [s for _, s in steps],
                       "line": {"color": COLOURS["steps"], "width": 1, "dash": "dot", "shape": "hv"},
                       "hovertemplate": "step %{y}<extra></extra>"})
    shapes, notes = _marks(diagnosis, recording.host, pid, device)
    layout = {
        "height": 360, "margin": {"l": 64, "r": 64, "t": 36, "b": 48},
        "hovermode": "x unified", "legend": {"orientation": "h", "y": 1.12, "x": 0},
        "xaxis": {"title": {"text": "seconds since the run started"}, "zeroline": False},
        "yaxis": {"title": {"text": unit}, "rangemode": "tozero"},
        "yaxis2": {"title": {"text": "steps"}, "overlaying": "y", "side": "right", "rangemode": "tozero",
                   "showgrid": False, "tickformat": "d"},
        "shapes": shapes, "annotations": notes,
        "meta": {"pid": pid, "device": device, "unit": unit, "scale": scale, "buckets": buckets},
    }
    return {"data": traces, "layout": layout}


def _marks(diagnosis: Diagnosis, host: str | None, pid: int, device: int | None) -> tuple[list, list]:
    """Vertical lines where growth was under way from, and at each out-of-memory error."""
    shapes, notes = [], []

    def mark(t: float, text: str, colour: str, dash: str, side: str) -> None:
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": t, "x1": t, "y0": 0, "y1": 1,
                       "line": {"color": colour, "width": 1.5, "dash": dash}})
        # growth's label left of its line, an error's right of it: the two are often close together
        notes.append({"xref": "x", "yref": "paper", "x": t, "y": 1, "yanchor": "bottom", "text": text,
                      "showarrow": False, "font": {"color": colour, "size": 11},
                      "xanchor": "right" if side == "left" else "left"})

    for g in diagnosis.growth:
        if g.host == host and g.pid == pid and g.device == device and g.start_t is not None:
            what = "leak" if g.series == "allocated" else f"{SERIES_NAMES.get(g.series, g.series)} growing"
            at = f"step {g.start_step}" if g.start_step is not None else f"{g.start_t:.1f} s"
            mark(g.start_t, f"{what} from {at}", "#c0392b", "dash", "left")
    for e in diagnosis.evidence:
        if e.get("host") == host and e.get("pid") == pid and e.get("device") == device:
            for oom in e.get("out_of_memory") or []:
                if isinstance(oom.get("t"), (int, float)):
                    mark(oom["t"], f"out of memory ({fb(oom.get('request_bytes'))} asked)", "#8e44ad", "solid",
                         "right")
    return shapes, notes


def breakdown_figure(recordings: list[Recording], breakdowns: list[Breakdown]) -> dict:
    rows = breakdown_rows(recordings, breakdowns)
    labels = [breakdown_label(b, len(recordings) > 1) for b in rows]
    top = max([b.nvml_bytes or 0 for b in rows] + [sum(getattr(b, key) or 0 for _, key, _ in PARTS) for b in rows])
    scale, unit = _unit(top)
    traces = []
    for name, key, colour in PARTS + OUTSIDE_PARTS:
        values = [bar_part(b, key) for b in rows]
        if not any(values):
            continue
        traces.append({"type": "bar", "orientation": "h", "name": name, "y": labels,
                       "x": [None if v is None else v / scale for v in values], "marker": {"color": colour},
                       "hovertemplate": f"%{{x:.1f}} {unit}<extra>{name}</extra>"})
    traces.append({"type": "scatter", "mode": "markers", "name": "NVML total", "y": labels,
                   "x": [None if b.nvml_bytes is None else b.nvml_bytes / scale for b in rows],
                   "marker": {"symbol": "line-ns", "size": 22, "line": {"width": 3, "color": "#222"}},
                   "hovertemplate": f"%{{x:.1f}} {unit}<extra>NVML total</extra>"})
    layout = {"barmode": "stack", "height": 110 + 34 * len(rows), "margin": {"l": 150, "r": 24, "t": 30, "b": 44},
              "xaxis": {"title": {"text": unit}}, "yaxis": {"autorange": "reversed"},
              "legend": {"orientation": "h", "y": 1.0, "yanchor": "bottom", "x": 0, "traceorder": "normal"},
              "meta": {"unit": unit, "scale": scale}}
    return {"data": traces, "layout": layout}


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
    scale, unit = _unit(top)
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
