"""The HTML report in a real headless browser: it loads offline, draws every chart with the recorded
values, and shows the findings.

Needs Playwright's Python package and a Chromium (Debian's `chromium`, at /usr/bin/chromium, or
GPUMEMDOCTOR_CHROMIUM); skipped without them. `.ci/run` installs both. With
GPUMEMDOCTOR_UPDATE_SCREENSHOT=1 the leak report's screenshot in docs/images/ is taken again.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("plotly", reason="the HTML report needs the html extra (plotly)")
sync_api = pytest.importorskip("playwright.sync_api", reason="the browser tests need playwright")

from benchmarks.html_size import one_hour  # noqa: E402
from gpumemdoctor.app.report_file import load, parse  # noqa: E402
from gpumemdoctor.reporters import html  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "reports"
LEAK_PID = json.loads((FIXTURES / "leak_training_list.json").read_text())["target"]["pid"]
OOM_PID = json.loads((FIXTURES / "oom_accumulation.json").read_text())["target"]["pid"]
SCREENSHOT = ROOT / "docs" / "images" / "leak-report.png"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium() -> str | None:
    return os.environ.get("GPUMEMDOCTOR_CHROMIUM") or next(
        (p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)


@pytest.fixture(name="browser", scope="module")
def browser_fixture():
    path = chromium()
    if path is None:
        pytest.skip("no Chromium here (apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=ARGS)
        yield browser
        browser.close()


class Opened:
    """A page of the report, loaded from a file, with every console error and page error it raised."""

    def __init__(self, browser, path: Path, width: int = 1200):
        self.errors: list[str] = []
        self.page = browser.new_page(viewport={"width": width, "height": 900})
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: r.url.startswith("file://") or self.errors.append(f"fetched {r.url}"))
        self.page.goto(path.as_uri())
        self.page.wait_for_function("document.body.dataset.charts !== 'pending'", timeout=30_000)
        self.charts = self.page.evaluate("document.body.dataset.charts")

    def traces(self, chart_id: str) -> dict:
        """The chart's series as plotly holds them in the page."""
        return self.page.evaluate(
            """id => Object.fromEntries(document.getElementById(id).data.map(
                 t => [t.name, {x: Array.from(t.x), y: Array.from(t.y), yaxis: t.yaxis || 'y'}]))""", chart_id)

    def layout(self, chart_id: str) -> dict:
        return self.page.evaluate(
            "id => JSON.parse(JSON.stringify(document.getElementById(id).layout))", chart_id)


def write_page(tmp_path: Path, name: str, report: dict | None = None) -> tuple[Path, object, object]:
    if report is None:
        recording, diagnosis = load(str(FIXTURES / f"{name}.json"))
    else:
        recording, diagnosis = parse(report)
    path = tmp_path / f"{name}.html"
    path.write_text(html.render(recording, diagnosis, f"{name}.json"), encoding="utf-8")
    return path, recording, diagnosis


def recorded(recording, pid: int, device: int) -> dict:
    agent = recording.agent(pid)
    rows = [(s, r) for s in agent.samples for r in s.readings if agent.device(r.torch_index).nvml_index == device]
    return {"NVML": [v for _, v in recording.nvml[(pid, device)]],
            "reserved": [r.reserved_bytes for _, r in rows], "active": [r.active_bytes for _, r in rows],
            "allocated": [r.allocated_bytes for _, r in rows], "steps": [s.step for s, _ in rows],
            "t": [s.t for s, _ in rows], "nvml_t": [t for t, _ in recording.nvml[(pid, device)]]}


@pytest.mark.parametrize("name", ["leak_training_list", "oom_accumulation", "dataloader_worker_contexts",
                                  "non_torch_threads", "clean_adam"])
def test_page_loads_offline_without_errors_and_draws_every_chart(browser, tmp_path, name):
    path, recording, diagnosis = write_page(tmp_path, name)
    opened = Opened(browser, path)
    assert opened.charts == "drawn"
    assert opened.errors == []
    ids = opened.page.evaluate("Array.from(document.querySelectorAll('.chart')).map(e => e.id)")
    assert "breakdown" in ids and any(i.startswith("timeline-") for i in ids)
    for chart_id in ids:  # plotly drew an SVG with a line or bar for each series
        drawn = opened.page.evaluate(
            """id => { const gd = document.getElementById(id);
                       return {svg: gd.querySelectorAll('svg.main-svg').length,
                               traces: gd.querySelectorAll('.scatterlayer .trace, .barlayer .trace').length,
                               series: gd.data.length}; }""", chart_id)
        assert drawn["svg"] >= 1 and drawn["traces"] == drawn["series"] > 0, (chart_id, drawn)
    # the findings, their remedies and the verdict are on the page
    text = opened.page.inner_text("body")
    assert opened.page.inner_text("#verdict") == diagnosis.verdict
    for f in diagnosis.findings:
        assert f.summary in text and f.remedy in text


def test_the_timeline_holds_the_recorded_values(browser, tmp_path):
    path, recording, diagnosis = write_page(tmp_path, "leak_training_list")
    opened = Opened(browser, path)
    traces = opened.traces(f"timeline-{LEAK_PID}-0")
    scale = opened.layout(f"timeline-{LEAK_PID}-0")["meta"]["scale"]
    want = recorded(recording, LEAK_PID, 0)
    for name in ("NVML", "reserved", "active", "allocated"):
        assert [round(y * scale) for y in traces[name]["y"]] == want[name], name
    assert traces["allocated"]["x"] == pytest.approx(want["t"], abs=1e-4)
    assert traces["NVML"]["x"] == pytest.approx(want["nvml_t"], abs=1e-4)
    assert traces["steps"]["y"] == want["steps"] and traces["steps"]["yaxis"] == "y2"
    # the leak's start is marked where the diagnosis says it began
    layout = opened.layout(f"timeline-{LEAK_PID}-0")
    growth = diagnosis.growth[0]
    assert any(s["x0"] == growth.start_t for s in layout["shapes"])
    assert any(a["text"] == f"leak from step {growth.start_step}" for a in layout["annotations"])
    # and the breakdown bar holds the breakdown
    bars = opened.traces("breakdown")
    b = diagnosis.breakdowns[0]
    bscale = opened.layout("breakdown")["meta"]["scale"]
    assert round(bars["live tensors"]["x"][0] * bscale) == b.live_tensor_bytes
    assert round(bars["NVML total"]["x"][0] * bscale) == b.nvml_bytes


def test_the_out_of_memory_moment_is_marked(browser, tmp_path):
    path, _, diagnosis = write_page(tmp_path, "oom_accumulation")
    opened = Opened(browser, path)
    layout = opened.layout(f"timeline-{OOM_PID}-0")
    oom_t = diagnosis.evidence[0]["out_of_memory"][0]["t"]
    assert any(s["x0"] == oom_t for s in layout["shapes"])
    assert opened.page.locator(f"#timeline-{OOM_PID}-0 .annotation-text", has_text="out of memory").count() == 1


def test_hover_shows_the_values_and_a_drag_zooms(browser, tmp_path):
    path, _, _ = write_page(tmp_path, "leak_training_list")
    opened = Opened(browser, path)
    page = opened.page
    chart = page.locator(f"#timeline-{LEAK_PID}-0 .nsewdrag").first
    box = chart.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5)
    page.wait_for_selector(f"#timeline-{LEAK_PID}-0 .hoverlayer .legend", timeout=5000)
    hover = page.text_content(f"#timeline-{LEAK_PID}-0 .hoverlayer")
    assert "MiB" in hover and "allocated" in hover
    before = opened.layout(f"timeline-{LEAK_PID}-0")["xaxis"]["range"]
    page.mouse.move(box["x"] + box["width"] * 0.4, box["y"] + box["height"] * 0.5)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.5, steps=5)
    page.mouse.up()
    page.wait_for_function(
        f"r => {{ const x = document.getElementById('timeline-{LEAK_PID}-0').layout.xaxis.range;"
        " return x[1] - x[0] < (r[1] - r[0]) / 2; }", arg=before, timeout=5000)


def test_suspects_are_collapsible_with_their_stacks_and_holders(browser, tmp_path):
    path, _, diagnosis = write_page(tmp_path, "leak_kept_exception")
    opened = Opened(browser, path)
    page = opened.page
    suspects = [s for f in diagnosis.findings for s in f.suspects]
    details = page.locator("details.suspect")
    assert details.count() == len(suspects) >= 2
    assert details.nth(0).evaluate("d => d.open") and not details.nth(1).evaluate("d => d.open")
    details.nth(1).locator("summary").click()
    assert details.nth(1).evaluate("d => d.open")
    first = details.nth(0).inner_text()
    file, line, fn = suspects[0]["stack"][0]
    assert f"{file}:{line}" in first and f"{fn}()" in first
    for link in suspects[0]["holders"][0]["path"].split(" -> "):
        assert link in first


def test_a_one_hour_page_loads_and_keeps_its_spike(browser, tmp_path):
    report = one_hour(json.loads((FIXTURES / "leak_training_list.json").read_text()))
    nvml = report["recording"]["nvml"][0]
    spike = max(v for _, v in nvml["points"]) + (3 << 30)
    nvml["points"][len(nvml["points"]) // 3][1] = spike
    path, _, _ = write_page(tmp_path, "one_hour", report)
    assert path.stat().st_size < 5_000_000
    opened = Opened(browser, path)
    assert opened.charts == "drawn" and opened.errors == []
    scale = opened.layout(f"timeline-{LEAK_PID}-0")["meta"]["scale"]
    assert round(max(opened.traces(f"timeline-{LEAK_PID}-0")["NVML"]["y"]) * scale) == spike


def test_screenshot_of_a_leak_report(browser, tmp_path):
    path, _, _ = write_page(tmp_path, "leak_training_list")
    opened = Opened(browser, path)
    opened.page.locator("details.evidence").first.evaluate("d => d.open = false")
    out = SCREENSHOT if os.environ.get("GPUMEMDOCTOR_UPDATE_SCREENSHOT") else tmp_path / "leak-report.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    opened.page.screenshot(path=str(out), full_page=True)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert SCREENSHOT.exists(), "docs/images/leak-report.png: take it with GPUMEMDOCTOR_UPDATE_SCREENSHOT=1"


def test_the_peak_chart_draws_its_areas_and_bar(browser, tmp_path):
    """A composition made up in tests/peak_samples.py on a recorded fixture: the chart is drawn offline."""
    import dataclasses

    from tests.peak_samples import training_peak

    recording, diagnosis = load(str(FIXTURES / "leak_training_list.json"))
    samples = recording.agent(recording.target_pid).samples
    diagnosis = dataclasses.replace(diagnosis, peak_compositions=[
        training_peak(pid=recording.target_pid, t=samples[len(samples) // 2].t)])
    path = tmp_path / "peak.html"
    path.write_text(html.render(recording, diagnosis, "peak.json"), encoding="utf-8")
    opened = Opened(browser, path)
    assert opened.charts == "drawn" and opened.errors == []
    drawn = opened.page.evaluate(
        """() => { const gd = document.getElementById('peak-0');
                   return {areas: gd.querySelectorAll('.scatterlayer .trace').length,
                           bars: gd.querySelectorAll('.barlayer .trace').length}; }""")
    assert drawn == {"areas": 4, "bars": 7}
    assert "What made the peak" in opened.page.inner_text("#peak-section")
