"""The terminal report: verdict first, then breakdown, peaks, timeline and findings. Fits 80 columns."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..diagnosis.diagnose import INFORMATIVE, WARNINGS, Breakdown, Diagnosis
from ..diagnosis.words import unclassified_told
from ..recording.recording import Recording
from ..units import format_bytes as fb
from .vocabulary import (AFTER_NCCL_WORDS, DECIDED_BY, VERDICT_MEANING, VERDICT_STYLE, allocated_peak_note,
                         holder_text, nccl_words, none_looked_for, or_dash, peak_label, peak_order, peak_where,
                         peaks_text, share, shown_parts, suspects_heading, time_to_full_text)

BARS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 40
CONTEXT_WORDS = "per-process overhead, read at the first allocation"
CONTEXT_AFTER_NCCL = f"{CONTEXT_WORDS}, {AFTER_NCCL_WORDS}"


def render(console: Console, recording: Recording, diagnosis: Diagnosis,
           report_path: str | None = None) -> None:
    """Draw the whole report."""
    _verdict(console, diagnosis)
    _target(console, recording)
    _ranks(console, diagnosis)
    for b in _ordered(recording, diagnosis.breakdowns):
        _breakdown(console, b)
    _peaks(console, diagnosis)
    _peak_compositions(console, diagnosis)
    _timeline(console, recording)
    _findings(console, diagnosis)
    for note in diagnosis.notes:
        console.print(f"note: {note}")
    if report_path:
        console.print(f"\nReport: {report_path}", soft_wrap=True)  # a path is copied whole, never wrapped


def render_job(console: Console, recordings: list[Recording], diagnosis: Diagnosis,
               report_paths: list[str]) -> None:
    """Draw several reports of one job (one per node) as one: the job's verdict, each node's run,
    the rank table, the peaks, the findings. Each node's breakdowns and timeline are in its own
    report (gpumemdoctor report FILE)."""
    _verdict(console, diagnosis)
    for recording in recordings:
        _target(console, recording, host=True)
    _ranks(console, diagnosis)
    _peaks(console, diagnosis)
    _peak_compositions(console, diagnosis)
    _findings(console, diagnosis, with_host=len({r.host for r in recordings}) > 1)
    for note in diagnosis.notes:
        console.print(f"note: {note}")
    console.print(f"\nReports: {', '.join(report_paths)}", soft_wrap=True)


def _verdict(console: Console, diagnosis: Diagnosis) -> None:
    line = Text("gpumemdoctor verdict: ")
    if diagnosis.verdict is None:
        line.append("none", style="bold")
        line.append(" (no NVIDIA GPU was measured)")
    else:
        line.append(diagnosis.verdict, style=VERDICT_STYLE.get(diagnosis.verdict, "bold"))
        live = sum(f.bytes for f in diagnosis.findings if f.kind == "live-at-exit")
        if diagnosis.verdict == "clean" and live:
            line.append(f" (nothing grew; {fb(live)} of tensors still referenced at exit, see live-at-exit)")
        else:
            line.append(f" ({VERDICT_MEANING[diagnosis.verdict]})")
    console.print(line)
    headline = next((f for f in diagnosis.findings if f.kind == diagnosis.verdict), None)
    if headline is not None:
        console.print(headline.summary)
        if time_to_full_text(headline):
            console.print(time_to_full_text(headline))
        decided = headline.evidence.get("decided_by")
        if decided in DECIDED_BY and decided != "growth":
            console.print(Text(f"({DECIDED_BY[decided]})", style="italic"))
    for f in diagnosis.findings:
        if f.kind in WARNINGS:
            console.print(Text("warning: ", style="bold red") + Text(f.summary))


def _target(console: Console, recording: Recording, host: bool = False) -> None:
    target = recording.target
    status = (f"killed by signal {target['signal']}" if target.get("signal")
              else f"exit {target.get('exit_code')}" if target.get("exit_code") is not None
              else "exit status not known")
    if host:  # the command line holds paths: never wrapped
        console.print(f"\nHost     {recording.host or 'not recorded'}")
        console.print(f"         {recording.command}", soft_wrap=True)
    else:
        console.print(f"\nTarget   {recording.command}", soft_wrap=True)
    console.print(f"         pid {target.get('pid')}, {status}, ran {recording.duration_s:.1f} s")
    for d in recording.devices:
        console.print(f"GPU {d['index']}    {d.get('name') or '?'}, {fb(d.get('total_bytes'))}")


def _ranks(console: Console, diagnosis: Diagnosis) -> None:
    """The ranks of a distributed job, one row per rank and GPU, with the job's line above."""
    if not diagnosis.ranks:
        return
    if diagnosis.job is not None:
        console.print(f"\nRanks    {diagnosis.job.summary}")
    table = Table(show_header=True, box=None, pad_edge=False, padding=(0, 1, 0, 0), header_style="bold")
    for name, justify in (("rank", "right"), ("local\nrank", "right"), ("host", "left"), ("PID", "right"),
                          ("GPU", "right"), ("peak\nreserved", "right"), ("peak\nallocated", "right"),
                          ("NVML\npeak", "right"), ("verdict", "left")):
        table.add_column(name, justify=justify, no_wrap=True,
                         **({"max_width": 14, "overflow": "ellipsis"} if name == "host" else {}))
    for r in diagnosis.ranks:
        table.add_row(or_dash(r.rank), or_dash(r.local_rank), r.host or "?", str(r.pid), or_dash(r.device),
                      fb(r.peak_reserved_bytes), fb(r.peak_allocated_bytes), fb(r.peak_nvml_bytes),
                      Text(r.verdict or "none", style=VERDICT_STYLE.get(r.verdict or "", "")))
    console.print(table)


def _ordered(recording: Recording, breakdowns: list[Breakdown]) -> list[Breakdown]:
    target = recording.target_pid
    return sorted(breakdowns, key=lambda b: (b.pid != target, b.pid, b.device or 0))


def _breakdown(console: Console, b: Breakdown) -> None:
    where = f"process {b.pid}, GPU {b.device if b.device is not None else '?'}"
    when = "at exit" if b.exit_probes else "when last sampled"
    table = Table(title=f"Where the memory was {when} ({where})", title_justify="left",
                  show_header=False, box=None, pad_edge=False, padding=(0, 2, 0, 2))
    table.add_column("part")
    table.add_column("bytes", justify="right")
    table.add_column("what it is", overflow="fold")
    itemised = b.non_torch_warmup_bytes is not None
    rows = [
        ("CUDA context", b.context_bytes, CONTEXT_AFTER_NCCL if b.context_after_nccl else CONTEXT_WORDS),
        ("live tensors", b.live_tensor_bytes, "tensors your program still references"),
        *([("  cuBLAS workspaces", b.cublas_workspace_bytes, "of the live tensors: kept by cuBLAS")]
          if b.cublas_workspace_bytes else []),
        ("garbage cycles", b.garbage_bytes, "freed only by gc.collect()"),
        ("pending stream", b.pending_stream_bytes, "freed, held for unfinished stream work"),
        ("allocator cache", b.cache_bytes, "freed, kept by PyTorch for reuse"),
        *([("  CUDA graph pools", b.private_pool_bytes, "of PyTorch's memory: CUDA graphs' pools")]
          if b.private_pool_bytes else []),
        ("outside PyTorch", b.non_torch_bytes,
         "not from PyTorch's allocator:" if itemised and b.non_torch_bytes
         else "CuPy, cudaMalloc, NCCL, loaded kernels"),
        *(_outside_rows(b) if itemised and b.non_torch_bytes else []),
    ]
    if b.torch_index is None:
        rows = [("first seen", b.context_bytes, "includes the CUDA context"),
                ("grown since", b.non_torch_bytes, "no PyTorch allocator in this process")]
    for name, size, meaning in rows:
        table.add_row(name, fb(size), meaning)
    table.add_row("NVML total", fb(b.nvml_bytes), "what nvidia-smi shows for the process")
    console.print()
    console.print(table)


def _outside_rows(b: Breakdown) -> list[tuple[str, int | None, str]]:
    """The memory outside PyTorch, itemised (see gpumemdoctor/diagnosis/non_torch.py)."""
    eager = (b.cuda_module_loading or "").upper() == "EAGER"  # kernels then load with the context
    what = ("libraries" if eager else "kernels, libraries") + (", NCCL" if b.nccl and b.non_torch_nccl_bytes is None else "")
    rows = []
    if b.non_torch_nccl_bytes is not None:
        rows.append(("  NCCL", b.non_torch_nccl_bytes, f"came with its process groups ({nccl_words(b.nccl_env)})"))
    rows.append(("  in warm-up", b.non_torch_warmup_bytes, f"{what}: loaded on first use"))
    if b.non_torch_cupy_bytes is not None:
        rows.append(("  CuPy's pool", b.non_torch_cupy_bytes, "CuPy's default memory pool"))
    for library, size in b.non_torch_libraries or []:
        rows.append((f"  {library}", size, "its own preallocated pool (library-memory)"))
    rows.append(("  the rest", b.non_torch_rest_bytes, "grew after warm-up: cudaMalloc, libraries"))
    return rows


def _peaks(console: Console, diagnosis: Diagnosis) -> None:
    text = peaks_text(diagnosis)
    if text:
        console.print("\nPeaks    " + text)


def _peak_compositions(console: Console, diagnosis: Diagnosis) -> None:
    """What made the peak: the largest process/GPU's parts in a table, one line for each other one."""
    if not diagnosis.peak_compositions:
        return
    ordered = peak_order(diagnosis.peak_compositions)
    with_host = len({c.host for c in ordered}) > 1
    top = ordered[0]
    console.print(f"\nWhat made the peak: {fb(top.total_bytes)} ({peak_where(top, with_host)})")
    if top.where:
        console.print(f"  running {top.where}", soft_wrap=True)  # a line is copied whole
    table = Table(show_header=True, box=None, pad_edge=False, padding=(0, 1, 0, 0), header_style="bold")
    table.add_column("  part", no_wrap=True)
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_column("share", justify="right", no_wrap=True)
    table.add_column("largest holder, its line", overflow="fold")
    for p in shown_parts(top):
        holder = (unclassified_told(p) if p.category == "unclassified"
                  else holder_text(p.holders[0]) if p.holders else "")
        table.add_row(f"  {peak_label(p.category)}", fb(p.bytes), share(p.bytes, top.total_bytes), holder)
    console.print(table)
    lines = [("  note:", note) for note in [*top.notes, allocated_peak_note(top)] if note]
    for c in ordered[1:]:
        parts = sorted(shown_parts(c), key=lambda p: -p.bytes)[:2]
        made = ", ".join(f"{peak_label(p.category)} {fb(p.bytes)}" for p in parts)
        lines.append(("  also:", f"{peak_where(c, with_host)}: {fb(c.total_bytes)}" + (f" ({made})" if made else "")))
    if lines:
        grid = Table(show_header=False, box=None, pad_edge=False, padding=(0, 1, 0, 0))
        grid.add_column("mark", width=7)
        grid.add_column("text", overflow="fold")
        for mark, text in lines:
            grid.add_row(mark, text)
        console.print(grid)


def sparkline(values: list[int], top: int, width: int = SPARK_WIDTH) -> str:
    """Highest value of each of `width` buckets, as block characters scaled to `top`."""
    if not values:
        return ""
    n = len(values)
    width = min(width, n)  # fewer values than columns: one column each
    buckets = [max(values[i * n // width:max((i + 1) * n // width, i * n // width + 1)])
               for i in range(width)]
    top = top or 1
    return "".join(BARS[min(len(BARS) - 1, v * (len(BARS) - 1) // top)] for v in buckets)


def _timeline(console: Console, recording: Recording) -> None:
    target = recording.agent(recording.target_pid) if recording.target_pid else None
    if target is None or not target.samples:
        return
    series = {"NVML": [], "reserved": [], "allocated": []}
    for sample in target.samples:
        if not sample.readings:
            continue
        r = sample.readings[0]
        for name, value in (("NVML", r.nvml_used_bytes), ("reserved", r.reserved_bytes),
                            ("allocated", r.allocated_bytes)):
            series[name].append(value or 0)
    if not series["NVML"]:
        return
    span = f"{target.samples[0].t:.1f}-{target.samples[-1].t:.1f} s"
    console.print(f"\nTimeline of process {target.pid}, first GPU ({span}, {len(series['NVML'])} samples,"
                  f" one scale)")
    top = max(max(values) for values in series.values())
    for name, values in series.items():
        console.print(f"  {name:<10} {sparkline(values, top)}  max {fb(max(values))}")


def _findings(console: Console, diagnosis: Diagnosis, with_host: bool = False) -> None:
    if not diagnosis.findings:
        return
    console.print("\nFindings")
    table = Table(show_header=False, box=None, pad_edge=False, padding=(0, 0, 0, 0))
    table.add_column("mark", width=4)
    table.add_column("text", overflow="fold")
    for f in diagnosis.findings:
        mark = "  •" if f.kind in INFORMATIVE else "  ✗"
        on = f"  on {f.host or '?'}" if with_host and f.pid is not None else ""
        table.add_row(mark, Text(f.kind, style="bold") + Text(f"  {fb(f.bytes)}{on}"))
        table.add_row("", f.summary)
        if time_to_full_text(f):
            table.add_row("", time_to_full_text(f))
        if f.kind == "host-memory" and f.evidence.get("curve"):
            values = [v for _, v in f.evidence["curve"]]
            table.add_row("", f"host memory {sparkline(values, max(values))}  max {fb(max(values))}")
        _suspects(table, f)
        table.add_row("", Text(f"→ {f.remedy}", style="dim"))
    console.print(table)


def _suspects(table: Table, f) -> None:
    """Where the memory was allocated and who holds it, biggest first."""
    why = none_looked_for(f)
    if why is not None:
        table.add_row("", Text(f"Suspects: none looked for: {why}.", style="italic"))
        return
    garbage = f.evidence.get("garbage")
    if f.kind == "garbage-cycle" and isinstance(garbage, dict) and garbage.get("types"):
        types = ", ".join(f"{name} ×{count}" for name, count in garbage["types"][:5])
        table.add_row("", f"gc.collect() freed {garbage.get('objects_freed')} objects; types in the "
                          f"cycles: {types}")
    if not f.suspects:
        return
    table.add_row("", Text(suspects_heading(f.evidence.get("root_cause")) + ":", style="bold"))
    for i, s in enumerate(f.suspects, 1):
        table.add_row("", f" {i}. {s['summary']}")
