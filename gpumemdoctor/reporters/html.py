"""The HTML report: one self-contained page, with plotly charts, drawn from a finished diagnosis.

It computes nothing about memory: the verdict, findings, suspects, breakdowns, growth and
out-of-memory moments are the diagnosis's, the series are the recording's. Here the page is put
together and its text written; its charts are `_html_charts`' (long series cut down by
`envelope.envelope`, min and max per bucket, before they are drawn), its breakdown's parts and peak
tables `_html_parts`'. plotly is an optional extra and is imported only here, when a page is drawn.
"""
from __future__ import annotations

import base64
import functools
import gzip
import html
import json
import time

from .. import __version__
from ..diagnosis.diagnose import INFORMATIVE, WARNINGS, Diagnosis, Finding
from ..errors import MissingExtraError
from ..recording.recording import Recording
from ..units import format_bytes as fb
from . import _html_page as page
from ._html_charts import MAX_PEAK_CHARTS, breakdown_figure, over_time, peak_figure, timeline_figure, timeline_keys
from ._html_parts import PARTS, breakdown_label, breakdown_rows, peak_section, within
from .vocabulary import (DECIDED_BY, VERDICT_MEANING, none_looked_for, peak_order, peaks_text, suspects_heading,
                         time_to_full_text)

# Envelope buckets for the whole page, shared among its series: a series keeps at most about twice
# its buckets in points, whatever the run's length, so the page's weight is bounded (docs/html.md).
PAGE_BUCKETS = 20_000
MIN_BUCKETS, MAX_BUCKETS = 150, 2000
# The ranks' table: one row per rank and GPU.
RANK_COLUMNS = ("rank", "local rank", "host", "PID", "GPU", "peak reserved", "peak allocated", "NVML peak",
                "verdict")


def require_plotly() -> None:
    """Fail with one line, before any work, when the html extra is not installed."""
    try:
        import plotly.offline  # noqa: F401
    except ImportError:
        raise MissingExtraError("the HTML report needs plotly: pip install plotly (from a checkout of "
                                'gpumemdoctor, pip install ".[html]" does the same)') from None


def render(recording: Recording, diagnosis: Diagnosis, source: str | None = None) -> str:
    """The whole page as one string."""
    return _page([recording], diagnosis, [source] if source else [])


def render_job(recordings: list[Recording], diagnosis: Diagnosis, sources: list[str]) -> str:
    """One page for several reports of one job (one per node): the job's verdict, each node's run,
    the rank table, every process's timeline and breakdown (named with its host), the findings."""
    return _page(recordings, diagnosis, sources)


def _page(recordings: list[Recording], diagnosis: Diagnosis, sources: list[str]) -> str:
    require_plotly()
    from plotly.offline import get_plotlyjs_version

    several = len(recordings) > 1
    figures = {}
    if diagnosis.breakdowns:
        figures["breakdown"] = breakdown_figure(recordings, diagnosis.breakdowns)
    keys = [(n, pid, device) for n, rec in enumerate(recordings) for pid, device in timeline_keys(rec)]
    buckets = max(MIN_BUCKETS, min(MAX_BUCKETS, PAGE_BUCKETS // max(1, 5 * len(keys))))
    timelines = []
    for n, pid, device in keys:
        fig_id = f"timeline-{f'{n}-' if several else ''}{pid}-{device if device is not None else 'x'}"
        figures[fig_id] = timeline_figure(recordings[n], diagnosis, pid, device, buckets)
        timelines.append((fig_id, recordings[n], pid, device))
    peaks, charts = peak_order(diagnosis.peak_compositions), {}
    for i, c in enumerate(peaks[:MAX_PEAK_CHARTS]):
        n = next((k for k, rec in enumerate(recordings) if rec.host == c.host), 0)
        context = next((b.context_bytes for b in diagnosis.breakdowns
                        if (b.pid, b.device) == (c.pid, c.device) and c.host in (None, b.host)), None)
        rows = over_time(recordings[n], c.pid, c.device, context)
        if rows:
            charts[i] = f"peak-{i}"
            figures[charts[i]] = peak_figure(rows, c, buckets)
    body = "\n".join([
        *(_target(rec, diagnosis, several) for rec in recordings),
        _peaks_section(diagnosis) if several else "",
        _ranks_section(diagnosis),
        _timeline_section(recordings, timelines),
        peak_section(peaks, charts, len({c.host for c in peaks}) > 1),
        _breakdown_section(recordings, diagnosis) if diagnosis.breakdowns else "",
        _findings_section(diagnosis),
        _notes(diagnosis),
        _footer(recordings, sources, get_plotlyjs_version()),
    ])
    argv = " ".join(recordings[0].target.get("argv") or [])
    title = (f"gpumemdoctor: {diagnosis.verdict or 'no verdict'} — {argv}"
             + (f" ({len(recordings)} reports)" if several else ""))
    return page.document(title=title, header=_header(diagnosis), body=body, figures=_to_json(figures),
                         plotly_gz_b64=_plotly_js())


@functools.lru_cache(maxsize=1)
def _plotly_js() -> str:
    """plotly.js, gzipped and base64-encoded: 1.96 MB in the page instead of 4.8 MB.

    The page unpacks it with the browser's DecompressionStream; nothing is fetched.
    """
    from plotly.offline import get_plotlyjs

    return base64.b64encode(gzip.compress(get_plotlyjs().encode(), compresslevel=9, mtime=0)).decode()


def _to_json(figures: dict) -> str:
    text = json.dumps(figures, separators=(",", ":"), allow_nan=False)
    return text.replace("</", "<\\/")  # it sits in a <script> element


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _header(diagnosis: Diagnosis) -> str:
    verdict = diagnosis.verdict
    if verdict is None:
        meaning = "no NVIDIA GPU was measured"
    else:
        live = sum(f.bytes for f in diagnosis.findings if f.kind == "live-at-exit")
        meaning = (f"nothing grew; {fb(live)} of tensors still referenced at exit (see live-at-exit)"
                   if verdict == "clean" and live else VERDICT_MEANING[verdict])
    parts = [f'<header class="verdict v-{_e(verdict or "none")}"><div class="inner">',
             '<div class="label">gpumemdoctor verdict</div>',
             f'<h1 id="verdict">{_e(verdict or "none")}</h1>',
             f'<p class="meaning">{_e(meaning)}</p>']
    headline = next((f for f in diagnosis.findings if f.kind == verdict), None)
    if headline is not None:
        parts.append(f'<p class="headline">{_e(headline.summary)}</p>')
        if time_to_full_text(headline):
            parts.append(f'<p class="headline">{_e(time_to_full_text(headline))}</p>')
        decided = headline.evidence.get("decided_by")
        if decided:
            parts.append(f'<p class="decided">Decided by <b>{_e(decided)}</b>'
                         f'{": " + _e(DECIDED_BY[decided]) if decided in DECIDED_BY else ""}</p>')
    for f in diagnosis.findings:
        if f.kind in WARNINGS and f.kind != "host-memory":  # (host memory: in the findings below only)
            parts.append(f'<p class="warning">Warning: {_e(f.summary)}</p>')
    parts.append("</div></header>")
    return "\n".join(parts)


def _utc(wall: float) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(wall))
    except (OverflowError, OSError, ValueError):  # a time no clock gives (the report's own figure)
        return f"{wall:g} s after 1970"


def _target(recording: Recording, diagnosis: Diagnosis, with_host: bool = False) -> str:
    """The run: its command, process, time, GPUs (and, on a page of one report, the peaks)."""
    t = recording.target
    status = f"killed by signal {t['signal']}" if t.get("signal") else f"exit {t.get('exit_code')}"
    rows = [("Host", _e(recording.host or "not recorded"))] if with_host else []
    rows += [("Command", f"<code>{_e(recording.command)}</code>"),
            ("Process", f"{_e(t.get('pid'))}, {_e(status)}, ran {recording.duration_s:.1f} s"),
            ("Recorded", _e(_utc(recording.started_wall)))]
    for d in recording.devices:
        rows.append((f"GPU {_e(d['index'])}", f"{_e(d.get('name') or '?')}, {_e(fb(d.get('total_bytes')))}"))
    peaks = peaks_text(diagnosis)
    if peaks and not with_host:
        rows.append(("Peaks", _e(peaks)))
    versions = ", ".join(f"{k} {v}" for k, v in recording.versions.items() if v)
    if versions:
        rows.append(("Versions", _e(versions)))
    cells = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in rows)
    return f'<section class="target"><dl>{cells}</dl></section>'


def _peaks_section(diagnosis: Diagnosis) -> str:
    peaks = peaks_text(diagnosis)
    return f'<section class="target"><dl><dt>Peaks</dt><dd>{_e(peaks)}</dd></dl></section>' if peaks else ""


def _ranks_section(diagnosis: Diagnosis) -> str:
    """The ranks of a distributed job, one row per rank and GPU, with the job's line."""
    if not diagnosis.ranks:
        return ""
    head = "".join(f"<th>{_e(c)}</th>" for c in RANK_COLUMNS)
    body = []
    for r in diagnosis.ranks:
        cells = [r.rank, r.local_rank, r.host or "?", r.pid, r.device, fb(r.peak_reserved_bytes),
                 fb(r.peak_allocated_bytes), fb(r.peak_nvml_bytes)]
        body.append("<tr>" + "".join(f"<td>{_e('-' if c is None else c)}</td>" for c in cells)
                    + f'<td class="verdict v-{_e(r.verdict or "none")}">{_e(r.verdict or "none")}</td></tr>')
    job = f'<p class="job">{_e(diagnosis.job.summary)}</p>' if diagnosis.job is not None else ""
    return (f'<section id="ranks"><h2>Ranks</h2>{job}<p class="hint">Peaks of each rank on each GPU it used: '
            "PyTorch's reserved and allocated memory (what running out of memory hits first), and NVML's "
            "figure for the process; the verdict of that process's own findings.</p>"
            f'<table class="figures"><tr>{head}</tr>{"".join(body)}</table></section>')


def _breakdown_section(recordings: list[Recording], diagnosis: Diagnosis) -> str:
    rows = breakdown_rows(recordings, diagnosis.breakdowns)
    head = "".join(f"<th>{_e(name)}</th>" for name, _, _ in PARTS)
    body = []
    for b in rows:
        when = "" if b.exit_probes else " <small>(when last sampled)</small>"
        cells = "".join(f"<td>{_e(fb(getattr(b, key)))}{within(b, key)}</td>" for _, key, _ in PARTS)
        body.append(f"<tr><th>{_e(breakdown_label(b, len(recordings) > 1))}{when}</th>"
                    f"{cells}<td><b>{_e(fb(b.nvml_bytes))}</b></td></tr>")
    return ('<section id="breakdown-section"><h2>Where the memory was at exit</h2>'
            '<p class="hint">NVML total = CUDA context + live tensors + garbage cycles + pending stream + '
            'allocator cache + outside PyTorch. The black tick is NVML\'s total. Outside PyTorch: what '
            'grew in warm-up (kernels and libraries loaded on first use), CuPy\'s pool, and the rest '
            '(what grew after warm-up: cudaMalloc, other libraries).</p>'
            '<div class="chart" id="breakdown"></div>'
            f'<table class="figures"><tr><th></th>{head}<th>NVML total</th></tr>{"".join(body)}</table>'
            '</section>')


def _findings_section(diagnosis: Diagnosis) -> str:
    if not diagnosis.findings:
        return '<section id="findings"><h2>Findings</h2><p>None.</p></section>'
    return ('<section id="findings"><h2>Findings</h2>'
            + "".join(_finding(f) for f in diagnosis.findings) + "</section>")


def _finding(f: Finding) -> str:
    where = []
    if f.pid is not None:
        where.append(f"process {f.pid}")
    if f.device is not None:
        where.append(f"GPU {f.device}")
    mark = "•" if f.kind in INFORMATIVE else "✗"
    out = [f'<article class="finding k-{_e(f.kind)}" data-kind="{_e(f.kind)}">',
           f'<h3><span class="mark">{mark}</span> {_e(f.kind)} <span class="bytes">{_e(fb(f.bytes))}</span>'
           f' <span class="where">{_e(", ".join(where))}</span></h3>',
           f'<p class="summary">{_e(f.summary)}</p>']
    if time_to_full_text(f):
        out.append(f'<p class="time-to-full">{_e(time_to_full_text(f))}</p>')
    out.append(_suspects(f))
    out.append(f'<p class="remedy"><b>What to do:</b> {_e(f.remedy)}</p>')
    out.append('<details class="evidence"><summary>Evidence</summary>'
               f'<pre>{_e(json.dumps(f.evidence, indent=1))}</pre></details>')
    out.append("</article>")
    return "\n".join(out)


def _suspects(f: Finding) -> str:
    out = []
    why = none_looked_for(f)
    if why is not None:
        return f'<p class="searched">Suspects: none looked for: {_e(why)}.</p>'
    garbage = f.evidence.get("garbage")
    if f.kind == "garbage-cycle" and isinstance(garbage, dict) and garbage.get("types"):
        types = ", ".join(f"{name} ×{count}" for name, count in garbage["types"][:8])
        out.append(f'<p>gc.collect() freed {_e(garbage.get("objects_freed"))} objects; types in the cycles: '
                   f'{_e(types)}</p>')
    if not f.suspects:
        return "".join(out)
    out.append(f'<h4>{_e(suspects_heading(f.evidence.get("root_cause")))}</h4><div class="suspects">')
    for i, s in enumerate(f.suspects, 1):
        out.append(_suspect(i, s, f.remedy))
    out.append("</div>")
    return "".join(out)


def _suspect(i: int, s: dict, finding_remedy: str) -> str:
    rows = []
    if s.get("stack"):
        frames = "".join(f"<li><code>{_e(file)}:{_e(line)}</code> in <code>{_e(fn)}()</code></li>"
                         for file, line, fn in s["stack"])
        rows.append(f"<dt>Allocated at</dt><dd><ol class=\"stack\">{frames}</ol>"
                    "<small>innermost frame first</small></dd>")
    elif s.get("where"):
        file, line, fn = s["where"]
        rows.append(f"<dt>Where</dt><dd><code>{_e(file)}:{_e(line)}</code> in <code>{_e(fn)}()</code></dd>")
    if s.get("thread"):
        thread = s["thread"] if isinstance(s["thread"], str) else ", ".join(s["thread"])
        rows.append(f"<dt>Thread</dt><dd>{_e(thread)}</dd>")
    if s.get("holders"):
        rows.append(f"<dt>Held by</dt><dd>{''.join(_holder(h) for h in s['holders'])}</dd>")
    if s.get("unheld_bytes"):
        rows.append(f"<dt>Held by no Python object</dt><dd>{_e(fb(s['unheld_bytes']))}</dd>")
    remedy = (f'<p class="remedy">→ {_e(s["remedy"])}</p>'
              if s.get("remedy") and s["remedy"] != finding_remedy else "")
    opened = " open" if i == 1 else ""
    return (f'<details class="suspect"{opened}><summary>{i}. {_e(s.get("summary", ""))}</summary>'
            f'<dl>{"".join(rows)}</dl>{remedy}</details>')


def _holder(h: dict) -> str:
    """A holder's reference chain, one link a line, and what it holds."""
    links = [part for part in str(h.get("path", "")).split(" -> ") if part]
    chain = "".join(f"<li><code>{_e(link)}</code></li>" for link in links)
    sizes = ", ".join(f"{count} × {fb(size)}" for size, count in (h.get("sizes") or [])[:4])
    facts = [f"{h.get('count')} tensor{'s' if h.get('count') != 1 else ''}", fb(h.get("bytes"))]
    if h.get("kind"):
        facts.append(str(h["kind"]))
    if sizes:
        facts.append(sizes)
    pattern = (f' · <span class="pattern">pattern <code>{_e(h["pattern"])}</code></span>'
               if h.get("pattern") and h.get("pattern") != h.get("path") else "")
    return (f'<div class="holder"><ol class="chain">{chain}</ol>'
            f'<div class="facts">{_e(" · ".join(facts))}{pattern}</div></div>')


def _timeline_section(recordings: list[Recording], timelines: list) -> str:
    if not timelines:
        return ""
    out = ['<section id="timelines"><h2>Timeline</h2>',
           '<p class="hint">NVML is what nvidia-smi sees (the supervisor\'s polls); reserved, active and '
           'allocated are PyTorch\'s allocator, read by the agent; steps on the right axis. Drag to zoom, '
           'double-click to zoom out; long runs are cut down to each interval\'s lowest and highest point, '
           'so spikes and floors stay.</p>']
    for fig_id, recording, pid, device in timelines:
        role = " (target)" if pid == recording.target_pid else ""
        gpu = f"GPU {device}" if device is not None else "GPU ?"
        cmd = _command(recording, pid)
        host = f"{_e(recording.host or '?')}: " if len(recordings) > 1 else ""
        out.append(f'<h3>{host}process {pid}{role}, {_e(gpu)}</h3>'
                   + (f'<p class="cmd"><code>{_e(cmd)}</code></p>' if cmd else "")
                   + f'<div class="chart" id="{fig_id}" data-pid="{pid}" data-device="{_e(device)}"></div>')
    out.append("</section>")
    return "\n".join(out)


def _notes(diagnosis: Diagnosis) -> str:
    if not diagnosis.notes:
        return ""
    items = "".join(f"<li>{_e(n)}</li>" for n in diagnosis.notes)
    return f'<section id="notes"><h2>Notes</h2><ul>{items}</ul></section>'


def _command(recording: Recording, pid: int) -> str:
    for p in recording.processes:
        if p.pid == pid and p.cmdline:
            return " ".join(p.cmdline)
    agent = recording.agent(pid)
    return " ".join(agent.argv) if agent else ""


def _footer(recordings: list[Recording], sources: list[str], plotly_js_version: str) -> str:
    made = f" from {_e(', '.join(sources))}" if sources else ""
    versions = ", ".join(sorted({r.tool_version for r in recordings}))
    return (f'<footer>Drawn by gpumemdoctor {_e(__version__)}{made} (recorded by gpumemdoctor '
            f'{_e(versions)}), with plotly.js {_e(plotly_js_version)} embedded: '
            'this page fetches nothing.</footer>')
