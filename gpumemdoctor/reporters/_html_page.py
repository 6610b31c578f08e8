"""The HTML report's frame: the style sheet, the loader of the embedded plotly.js, the document."""
from __future__ import annotations

import html

STYLE = """
:root { --fg: #1d1d1f; --muted: #5f6368; --line: #e3e3e6; --card: #fafafb; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg); }
main { max-width: 1120px; margin: 0 auto; padding: 0 24px 48px; }
code, pre { font: 13px/1.45 ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
h2 { font-size: 20px; margin: 32px 0 8px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 16px; margin: 18px 0 4px; }
h4 { font-size: 14px; margin: 12px 0 6px; }
.hint, small, .cmd { color: var(--muted); font-size: 13px; }
.cmd { margin: 0 0 4px; overflow-wrap: anywhere; }
header.verdict { padding: 20px 0 16px; border-bottom: 4px solid #888; background: #f4f4f5; }
header .inner { max-width: 1120px; margin: 0 auto; padding: 0 24px; }
header .label { text-transform: uppercase; letter-spacing: .08em; font-size: 12px; color: var(--muted); }
header h1 { margin: 0; font-size: 34px; line-height: 1.2; }
header .meaning { margin: 0 0 8px; color: var(--muted); }
header .headline { margin: 4px 0; font-size: 16px; max-width: 80ch; }
header .decided { margin: 4px 0; font-size: 14px; }
header .warning { margin: 6px 0; color: #a4161a; font-weight: 600; }
.v-leak, .v-out-of-memory, .v-garbage-cycle, .v-non-torch { border-color: #c0392b !important; background: #fdf0ef !important; }
.v-leak h1, .v-out-of-memory h1, .v-garbage-cycle h1, .v-non-torch h1 { color: #b03a2e; }
.v-allocator-cache, .v-pending-stream, .v-child-contexts, .v-stray-context { border-color: #d4a017 !important; background: #fdf8e8 !important; }
.v-allocator-cache h1, .v-pending-stream h1, .v-child-contexts h1, .v-stray-context h1 { color: #9a7410; }
.v-unknown { border-color: #8e44ad !important; background: #f6effa !important; }
.v-unknown h1 { color: #6c3483; }
.v-clean { border-color: #2e8b57 !important; background: #eef8f2 !important; }
.v-clean h1 { color: #237047; }
.target dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; margin: 16px 0 0; }
.target dt { color: var(--muted); }
.target dd { margin: 0; overflow-wrap: anywhere; }
table.figures { border-collapse: collapse; font-size: 13px; margin-top: 4px; width: 100%; }
table.figures th, table.figures td { border-bottom: 1px solid var(--line); padding: 3px 8px; text-align: right; }
table.figures th:first-child { text-align: left; }
.finding { border: 1px solid var(--line); border-left: 5px solid #c0392b; border-radius: 6px; padding: 4px 16px 10px;
  margin: 12px 0; background: var(--card); }
.finding.k-context, .finding.k-live-at-exit { border-left-color: #9d9da1; }
.finding.k-allocator-cache, .finding.k-pending-stream, .finding.k-child-contexts, .finding.k-stray-context,
.finding.k-rank-imbalance, .finding.k-avoidable-peak, .finding.k-fragmented-peak, .finding.k-temporary-peak,
.finding.k-state-at-evaluation { border-left-color: #d4a017; }
#ranks .job { margin: 4px 0 8px; }
#ranks td.verdict { text-align: left; }
.finding h3 .mark { color: #c0392b; }
.finding.k-context h3 .mark, .finding.k-live-at-exit h3 .mark { color: #777; }
.finding h3 .bytes { font-weight: 600; margin-left: 6px; }
.finding h3 .where { color: var(--muted); font-weight: normal; font-size: 13px; margin-left: 6px; }
.finding .summary { margin: 4px 0; }
.finding .time-to-full { margin: 4px 0; }
.remedy { margin: 8px 0 4px; padding: 6px 10px; background: #eef4fb; border-radius: 4px; }
details { margin: 6px 0; }
details > summary { cursor: pointer; }
details.suspect { border: 1px solid var(--line); border-radius: 4px; background: #fff; padding: 4px 10px; }
details.suspect > summary { font-weight: 500; }
details.suspect dl { display: grid; grid-template-columns: max-content 1fr; gap: 4px 14px; margin: 8px 0; }
details.suspect dt { color: var(--muted); font-size: 13px; }
details.suspect dd { margin: 0; min-width: 0; }
ol.stack { margin: 0; padding-left: 22px; }
ol.stack li, ol.chain li { overflow-wrap: anywhere; }
ol.chain { list-style: none; margin: 0; padding: 0; }
ol.chain li + li::before { content: "↳ "; color: var(--muted); }
ol.chain li + li { padding-left: 14px; }
.holder { margin: 0 0 8px; }
.holder .facts { color: var(--muted); font-size: 13px; }
details.evidence pre { max-height: 320px; overflow: auto; background: #f6f6f7; padding: 8px; }
.chart { width: 100%; min-height: 120px; }
table.peak td.how { text-align: left; color: var(--muted); }
ol.holders { margin: 2px 0 0; padding-left: 18px; color: var(--fg); }
.peak-notes { color: var(--muted); font-size: 13px; }
.chart .failed { color: #a4161a; padding: 12px; }
footer { margin-top: 40px; color: var(--muted); font-size: 12px; }
"""

# Unpacks the embedded plotly.js (gzip, base64) with the browser's own DecompressionStream, then
# draws every figure. Nothing is fetched; without DecompressionStream the text of the page stays.
LOADER = """
(async function () {
  const figures = JSON.parse(document.getElementById("gmd-figures").textContent);
  const fail = (why) => {
    for (const id of Object.keys(figures)) {
      const el = document.getElementById(id);
      if (el) el.innerHTML = '<p class="failed">The chart cannot be drawn here: ' + why + '</p>';
    }
    document.body.dataset.charts = "failed";
  };
  if (typeof DecompressionStream === "undefined") {
    fail("this browser has no DecompressionStream (Chrome 80, Firefox 113, Safari 16.4 or newer have it).");
    return;
  }
  try {
    const packed = document.getElementById("gmd-plotly").textContent.trim();
    const bytes = Uint8Array.from(atob(packed), (c) => c.charCodeAt(0));
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    const code = await new Response(stream).text();
    const script = document.createElement("script");
    script.textContent = code;
    document.head.appendChild(script);
    const config = { responsive: true, displaylogo: false };
    for (const [id, fig] of Object.entries(figures)) {
      await Plotly.newPlot(id, fig.data, fig.layout, config);
    }
    document.body.dataset.charts = "drawn";
  } catch (err) {
    fail(String(err));
  }
})();
"""


def document(title: str, header: str, body: str, figures: str, plotly_gz_b64: str) -> str:
    """The page: `figures` is JSON already safe inside a <script> element."""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n"
        f"<body data-charts=\"pending\">\n{header}\n<main>\n{body}\n</main>\n"
        f"<script id=\"gmd-figures\" type=\"application/json\">{figures}</script>\n"
        f"<script id=\"gmd-plotly\" type=\"application/octet-stream\">{plotly_gz_b64}</script>\n"
        f"<script>{LOADER}</script>\n</body>\n</html>\n"
    )
