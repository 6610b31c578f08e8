"""The HTML report drawn from the GPU recordings, without a browser: its text, its chart data, its weight.

tests/test_html_browser.py opens the same pages in a real headless browser.
"""
from __future__ import annotations

import html as htmllib
import json
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("plotly", reason="the HTML report needs the html extra (plotly)")

from benchmarks.html_size import one_hour  # noqa: E402
from gpumemdoctor.diagnosis.diagnose import diagnose  # noqa: E402
from gpumemdoctor.errors import MissingExtraError  # noqa: E402
from gpumemdoctor.recording.recording import Recording  # noqa: E402
from gpumemdoctor.app.report_file import load, parse  # noqa: E402
from gpumemdoctor.reporters import html  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "reports"
ALL = sorted(p.stem for p in FIXTURES.glob("*.json"))
MB = 1_000_000


def page_of(name: str) -> tuple[str, Recording, object]:
    recording, diagnosis = load(str(FIXTURES / f"{name}.json"))
    return html.render(recording, diagnosis, f"{name}.json"), recording, diagnosis


def figures_of(page: str) -> dict:
    m = re.search(r'<script id="gmd-figures" type="application/json">(.*?)</script>', page, re.S)
    return json.loads(m.group(1))


def text_of(page: str) -> str:
    """The page's text as a reader sees it, roughly: tags dropped, entities decoded."""
    body = page.split("<script", 1)[0]
    return htmllib.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body)))


def expected_series(recording: Recording, pid: int, device: int | None) -> dict:
    """What each timeline series must hold, straight from the recording."""
    agent = recording.agent(pid)
    out = {"NVML": [tuple(p) for p in recording.nvml.get((pid, device), [])],
           "reserved": [], "active": [], "allocated": [], "steps": []}
    for sample in agent.samples if agent else []:
        for r in sample.readings:
            d = agent.device(r.torch_index)
            if (d.nvml_index if d else None) == device:
                out["reserved"].append((sample.t, r.reserved_bytes))
                out["active"].append((sample.t, r.active_bytes))
                out["allocated"].append((sample.t, r.allocated_bytes))
                out["steps"].append((sample.t, sample.step))
    return out


@pytest.mark.parametrize("name", ALL)
def test_every_recording_draws_with_its_verdict_findings_and_remedies(name):
    page, _, diagnosis = page_of(name)
    text = text_of(page)
    assert re.search(r'<h1 id="verdict">' + re.escape(diagnosis.verdict or "none") + "</h1>", page)
    for f in diagnosis.findings:
        assert f.summary in text and f.remedy in text
        for s in f.suspects:
            assert s["summary"] in text
            for h in s["holders"]:
                for link in h["path"].split(" -> "):
                    assert link in text
    # one <details> per suspect, the first one open
    suspects = sum(len(f.suspects) for f in diagnosis.findings)
    assert page.count('<details class="suspect"') == suspects
    # self-contained: nothing is fetched
    assert not re.search(r'<(script|link|img|iframe)[^>]+(src|href)=', page)


@pytest.mark.parametrize("name", ["leak_training_list", "dataloader_worker_contexts", "oom_accumulation",
                                  "non_torch_threads", "orphan_child"])
def test_each_timeline_holds_the_recorded_values(name):
    page, recording, _ = page_of(name)
    figures = figures_of(page)
    timelines = {k: v for k, v in figures.items() if k.startswith("timeline-")}
    assert timelines, "no timeline drawn"
    for fig in timelines.values():
        meta = fig["layout"]["meta"]
        expected = expected_series(recording, meta["pid"], meta["device"])
        if not expected["NVML"]:  # no polls for this process: the agent's own NVML readings
            expected["NVML"] = [(t, nv) for (t, _), nv in zip(expected["reserved"], _sampled_nvml(recording, meta))]
        drawn = {trace["name"]: trace for trace in fig["data"]}
        for name_, points in expected.items():
            if name_ == "steps" and not any(v for _, v in points):
                assert "steps" not in drawn
                continue
            if not points:
                continue
            trace = drawn[name_]
            scale = 1 if name_ == "steps" else meta["scale"]
            # small recordings are drawn whole: every recorded value, exactly
            assert [None if y is None else round(y * scale) for y in trace["y"]] == [v for _, v in points]
            assert trace["x"] == pytest.approx([t for t, _ in points], abs=1e-4)


def _sampled_nvml(recording: Recording, meta: dict) -> list:
    agent = recording.agent(meta["pid"])
    return [r.nvml_used_bytes for s in agent.samples for r in s.readings
            if (agent.device(r.torch_index).nvml_index if agent.device(r.torch_index) else None) == meta["device"]]


def test_the_target_comes_first_and_every_process_has_its_chart():
    page, recording, _ = page_of("dataloader_worker_contexts")
    ids = re.findall(r'<div class="chart" id="(timeline-[^"]+)"', page)
    assert ids[0] == f"timeline-{recording.target_pid}-0"
    pids = {int(i.split("-")[1]) for i in ids}
    assert pids >= {pid for pid, _ in recording.nvml}


def test_the_leak_start_and_the_out_of_memory_moment_are_marked():
    page, recording, diagnosis = page_of("oom_accumulation")
    fig = figures_of(page)[f"timeline-{recording.target_pid}-0"]
    texts = [a["text"] for a in fig["layout"]["annotations"]]
    xs = [s["x0"] for s in fig["layout"]["shapes"]]
    growth = diagnosis.growth[0]
    assert f"leak from step {growth.start_step}" in texts and growth.start_t in xs
    oom = diagnosis.evidence[0]["out_of_memory"][0]
    assert "out of memory (1.00 GiB asked)" in texts and oom["t"] in xs


def test_steps_are_on_a_second_axis():
    page, recording, _ = page_of("leak_training_list")
    pid = recording.target_pid
    fig = figures_of(page)[f"timeline-{pid}-0"]
    steps = next(t for t in fig["data"] if t["name"] == "steps")
    assert steps["yaxis"] == "y2" and fig["layout"]["yaxis2"]["overlaying"] == "y"
    assert steps["y"][-1] == recording.agent(pid).samples[-1].step > 100


def test_the_breakdown_bar_is_stacked_from_the_breakdown():
    page, _, diagnosis = page_of("leak_training_list")
    fig = figures_of(page)["breakdown"]
    assert fig["layout"]["barmode"] == "stack"
    b = diagnosis.breakdowns[0]
    scale = fig["layout"]["meta"]["scale"]
    drawn = {t["name"]: round(t["x"][0] * scale) for t in fig["data"]}
    assert drawn["CUDA context"] == b.context_bytes
    assert drawn["live tensors"] == b.live_tensor_bytes
    assert drawn["allocator cache"] == b.cache_bytes
    outside = drawn.get("outside PyTorch", sum(v for k, v in drawn.items() if k.startswith("outside: ")))
    assert outside == b.non_torch_bytes
    assert drawn["NVML total"] == b.nvml_bytes


def test_the_memory_outside_pytorch_is_drawn_in_its_parts():
    """A diagnosis of the threads recording itemises the memory outside PyTorch, bar and table."""
    recording, _ = load(str(FIXTURES / "non_torch_threads.json"))
    diagnosis = diagnose(recording)
    page = html.render(recording, diagnosis, "non_torch_threads.json")
    fig = figures_of(page)["breakdown"]
    scale = fig["layout"]["meta"]["scale"]
    drawn = {t["name"]: round(t["x"][0] * scale) for t in fig["data"]}
    b = diagnosis.breakdowns[0]
    assert "outside PyTorch" not in drawn
    assert drawn["outside: in warm-up"] == b.non_torch_warmup_bytes
    assert drawn["outside: the rest"] == b.non_torch_rest_bytes
    assert drawn.get("outside: CuPy's pool", 0) == (b.non_torch_cupy_bytes or 0)
    from gpumemdoctor.units import format_bytes

    assert (f"in warm-up {format_bytes(b.non_torch_warmup_bytes)}" in text_of(page)
            and f"the rest {format_bytes(b.non_torch_rest_bytes)}" in text_of(page))


def test_the_header_says_what_decided():
    page = page_of("leak_fast_exceptions")[0]
    assert "Decided by <b>structure</b>" in page


def test_text_from_the_recording_cannot_break_out_of_the_page():
    report = json.loads((FIXTURES / "leak_training_list.json").read_text())
    report["findings"][0]["summary"] = "<script>alert(1)</script>"
    report["recording"]["target"]["argv"] = ["</script><b>x</b>"]
    recording, diagnosis = parse(report)
    page = html.render(recording, diagnosis)
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "</script><b>x</b>" not in page


def test_a_fixture_page_weighs_about_two_megabytes():
    page = page_of("leak_training_list")[0]
    assert 1.8 * MB < len(page.encode()) < 2.3 * MB  # docs/html.md states 1.99 MB


@pytest.mark.parametrize("name, poll_s", [("leak_training_list", 0.005), ("dataloader_worker_contexts", 0.1)])
def test_a_one_hour_run_stays_under_5_mb_and_keeps_its_spike(name, poll_s):
    # NVML changing at every 5 ms poll for an hour; for the 14 processes of the DataLoader run, every
    # 0.1 s (benchmarks/html_size.py weighs that one at 5 ms too: 2.3 MB, 5 s to draw)
    report = one_hour(json.loads((FIXTURES / f"{name}.json").read_text()), poll_s=poll_s)
    target = report["recording"]["target"]["pid"]
    nvml = next(s for s in report["recording"]["nvml"] if s["pid"] == target)
    spike = max(v for _, v in nvml["points"]) + (3 << 30)
    nvml["points"][len(nvml["points"]) // 3][1] = spike  # one 5 ms poll, a third of the way in
    recording, diagnosis = parse(report)
    assert recording.duration_s == 3600
    page = html.render(recording, diagnosis)
    assert len(page.encode()) < 5 * MB
    fig = figures_of(page)[f"timeline-{target}-{nvml['device']}"]
    drawn = next(t for t in fig["data"] if t["name"] == "NVML")
    scale = fig["layout"]["meta"]["scale"]
    assert len(drawn["y"]) <= 2 * fig["layout"]["meta"]["buckets"] + 2
    assert round(max(drawn["y"]) * scale) == spike


def test_without_plotly_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "plotly", None)
    monkeypatch.setitem(sys.modules, "plotly.offline", None)
    with pytest.raises(MissingExtraError, match=r'pip install plotly'):
        html.require_plotly()


# -- the CLI ------------------------------------------------------------------------------------

LEAK = str(FIXTURES / "leak_training_list.json")


def one_line_error(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpumemdoctor: error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def test_report_writes_the_page_and_keeps_it_private(cli, tmp_path):
    result = cli("report", LEAK, "--html", "leak.html", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "HTML report: leak.html (2.0 MB)"
    page = (tmp_path / "leak.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and '<h1 id="verdict">leak</h1>' in page
    assert (tmp_path / "leak.html").stat().st_mode & 0o777 == 0o600  # it holds the command line


def test_report_refuses_to_overwrite_without_force(cli, tmp_path):
    (tmp_path / "leak.html").write_text("keep me")
    result = cli("report", LEAK, "--html", "leak.html", cwd=tmp_path)
    assert result.returncode == 2 and "--force" in one_line_error(result)
    assert (tmp_path / "leak.html").read_text() == "keep me"
    assert cli("report", LEAK, "--html", "leak.html", "--force", cwd=tmp_path).returncode == 0


@pytest.mark.parametrize("where, message", [
    ("nodir/r.html", "folder .* does not exist"),
    ("/proc/gpumemdoctor-test.html", "cannot write the HTML page to /proc/gpumemdoctor-test.html"),
    (".", "is a directory"),
])
def test_report_html_to_a_place_it_cannot_write_is_one_line_and_exit_2(cli, tmp_path, where, message):
    result = cli("report", LEAK, "--html", where, cwd=tmp_path)
    assert result.returncode == 2
    assert re.search(message, one_line_error(result))


def test_report_html_into_a_read_only_folder(cli, tmp_path):
    import os

    if os.geteuid() == 0:
        pytest.skip("root may write into a read-only folder; /proc above covers the failed write")
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o555)
    result = cli("report", LEAK, "--html", "ro/r.html", cwd=tmp_path)
    assert result.returncode == 2 and "not writable" in one_line_error(result)


@pytest.mark.parametrize("content, code", [("{", 4), ('{"schema": "other"}', 4), (None, 2)])
def test_report_html_of_a_bad_file(cli, tmp_path, content, code):
    if content is not None:
        (tmp_path / "bad.json").write_text(content)
    result = cli("report", "bad.json", "--html", "out.html", cwd=tmp_path)
    assert result.returncode == code
    one_line_error(result)
    assert not (tmp_path / "out.html").exists()


@pytest.fixture(name="no_plotly")
def no_plotly_fixture(tmp_path):
    """A PYTHONPATH on which `import plotly` fails, as where the html extra is not installed."""
    fake = tmp_path / "fake" / "plotly"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named plotly')\n")
    return {"PYTHONPATH": str(tmp_path / "fake")}


def test_without_the_extra_report_html_says_what_to_install(cli, tmp_path, no_plotly):
    result = cli("report", LEAK, "--html", "out.html", cwd=tmp_path, env=no_plotly)
    assert result.returncode == 5
    assert one_line_error(result) == ('gpumemdoctor: error: the HTML report needs plotly: pip install plotly '
                                      '(from a checkout of gpumemdoctor, pip install ".[html]" does the same)')


def test_without_the_extra_run_html_stops_before_the_target(cli, script, tmp_path, no_plotly):
    script(tmp_path, "t.py", "open('ran', 'w').close()\n")
    result = cli("run", "--allow-no-gpu", "--html", "r.html", "t.py", cwd=tmp_path, env=no_plotly)
    assert result.returncode == 5 and "pip install plotly" in one_line_error(result)
    assert not (tmp_path / "ran").exists()


def test_run_writes_the_page_next_to_the_json_and_the_step_summary_names_it(cli, script, tmp_path):
    script(tmp_path, "t.py", "print('hello')\n")
    env = {"GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"), "GITHUB_SERVER_URL": "https://github.com",
           "GITHUB_REPOSITORY": "me/proj", "GITHUB_RUN_ID": "42"}
    result = cli("run", "--allow-no-gpu", "--html-next-to-json", "-o", "vram-report.json",
                 "--max-retained", "1GiB", "t.py", cwd=tmp_path, env=env)
    assert result.returncode == 10, result.stderr  # nothing measured: the check cannot pass
    assert result.stdout == "hello\n"
    assert "HTML report: vram-report.html" in result.stderr
    page = (tmp_path / "vram-report.html").read_text()
    assert '<h1 id="verdict">none</h1>' in page
    summary = (tmp_path / "summary.md").read_text()
    assert "HTML report: `vram-report.html`" in summary
    assert "(https://github.com/me/proj/actions/runs/42)" in summary


def test_run_with_the_default_report_name_puts_the_page_beside_it(cli, script, tmp_path):
    script(tmp_path, "t.py", "pass\n")
    result = cli("run", "--allow-no-gpu", "-q", "--html-next-to-json", "t.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    [json_file] = tmp_path.glob("gpumemdoctor-t.*.json")
    assert json_file.with_suffix(".html").exists()
    assert f"html: {json_file.with_suffix('.html').name}" in result.stderr.replace("\n", " ")


@pytest.mark.parametrize("args, message", [
    (["--html", "a.html", "--html-next-to-json"], "not both"),
    (["--html", "nodir/a.html"], "does not exist"),
    (["--html", "."], "is a directory"),
])
def test_run_html_mistakes_are_usage_errors_before_the_target_runs(cli, script, tmp_path, args, message):
    script(tmp_path, "t.py", "open('ran', 'w').close()\n")
    result = cli("run", "--allow-no-gpu", *args, "t.py", cwd=tmp_path)
    assert result.returncode == 2 and message in one_line_error(result)
    assert not (tmp_path / "ran").exists()


def test_run_html_keeps_an_existing_page_unless_forced(cli, script, tmp_path):
    script(tmp_path, "t.py", "open('ran', 'w').close()\n")
    (tmp_path / "r.html").write_text("keep me")
    result = cli("run", "--allow-no-gpu", "--html", "r.html", "t.py", cwd=tmp_path)
    assert result.returncode == 2 and "--force" in one_line_error(result)
    assert not (tmp_path / "ran").exists()
    result = cli("run", "--allow-no-gpu", "--force", "--html", "r.html", "t.py", cwd=tmp_path)
    assert result.returncode == 0 and (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")


def test_every_verdict_has_a_colour_on_the_page():
    from gpumemdoctor.diagnosis.diagnose import VERDICTS
    from gpumemdoctor.reporters._html_page import STYLE

    for verdict in VERDICTS:
        assert f".v-{verdict}" in STYLE, verdict


# -- what made the peak (compositions made up in tests/peak_samples.py, on recorded fixtures) ---------

def _with_peak(name: str = "leak_training_list", report: dict | None = None):
    from tests.peak_samples import composition, training_peak

    recording, diagnosis = parse(report) if report is not None else load(str(FIXTURES / f"{name}.json"))
    samples = recording.agent(recording.target_pid).samples
    top = training_peak(pid=recording.target_pid, t=samples[len(samples) // 2].t)
    diagnosis.peak_compositions = [composition(pid=99, gradients=1 << 20, context=1 << 20), top]
    return recording, diagnosis, top


def test_the_peak_is_drawn_over_time_by_category_with_its_moment_and_parts():
    recording, diagnosis, top = _with_peak()
    page = html.render(recording, diagnosis)
    fig = figures_of(page)["peak-0"]  # the largest composition's chart; the other (no samples) has none
    assert "peak-1" not in figures_of(page)
    scale = fig["layout"]["meta"]["scale"]
    areas = {t["name"]: t for t in fig["data"] if t.get("stackgroup") == "over-time"}
    assert list(areas) == ["CUDA context", "allocated", "allocator cache", "outside PyTorch"]
    b = next(b for b in diagnosis.breakdowns if b.pid == recording.target_pid)
    agent = recording.agent(recording.target_pid)
    readings = [(s.t, s.readings[0]) for s in agent.samples if s.readings]
    assert {round(y * scale) for y in areas["CUDA context"]["y"]} == {b.context_bytes}
    assert [round(y * scale) for y in areas["allocated"]["y"]] == [r.allocated_bytes for _, r in readings]
    assert [round(y * scale) for y in areas["allocator cache"]["y"]] == [r.reserved_bytes - r.allocated_bytes
                                                                      for _, r in readings]
    assert [round(y * scale) for y in areas["outside PyTorch"]["y"]] == [
        max(0, r.nvml_used_bytes - b.context_bytes - r.reserved_bytes) for _, r in readings]
    assert areas["allocated"]["x"] == pytest.approx([t for t, _ in readings], abs=1e-4)
    # the moment, and the bar of its parts beside it (parts of 0 bytes left out)
    assert [s["x0"] for s in fig["layout"]["shapes"]] == [top.t]
    assert fig["layout"]["annotations"][0]["text"] == "peak, 3.57 GiB"
    bars = [t for t in fig["data"] if t["type"] == "bar"]
    assert [(t["name"], round(t["y"][0] * scale)) for t in bars] == [
        (f"peak: {n}", p.bytes) for n, p in zip(["parameters", "gradients", "optimizer state", "unclassified",
                                                 "allocator cache", "outside PyTorch", "CUDA context"],
                                                [p for p in top.parts if p.bytes])]
    assert all(t["xaxis"] == "x2" for t in bars) and fig["layout"]["barmode"] == "stack"
    text = text_of(page)
    assert "What made the peak" in text and "process 99, GPU 0" in text
    assert "optimizer state 1.00 GiB 28% how optimizer-state was told holder of optimizer-state 1.00 GiB, train.py:12" in text
    assert top.notes[0] in text and "PyTorch's allocated peak reached" in text


def test_a_page_without_compositions_has_no_peak_section(tmp_path):
    from tests.older import write_older

    recording, diagnosis = load(str(write_older("leak_training_list", tmp_path)))
    page = html.render(recording, diagnosis, "leak_training_list.json")
    assert "What made the peak" not in page and not any(k.startswith("peak-") for k in figures_of(page))


def test_a_one_hour_run_with_a_peak_stays_under_5_mb():
    report = one_hour(json.loads((FIXTURES / "leak_training_list.json").read_text()))
    recording, diagnosis, _ = _with_peak(report=report)
    page = html.render(recording, diagnosis)
    assert len(page.encode()) < 5 * MB
    fig = figures_of(page)["peak-0"]
    assert len(fig["data"][0]["x"]) <= 2 * fig["layout"]["meta"]["buckets"] + 2


def test_a_leak_says_when_its_gpu_would_have_been_full():
    """Where the GPU's free memory was read (a SYNTHETIC 40 GiB at the last sample), the page says
    what the terminal says, under the verdict and in the finding; where it was not, nothing."""
    from gpumemdoctor.reporters.vocabulary import time_to_full_text

    recording, _ = load(str(FIXTURES / "leak_training_list.json"))
    recording.device_memory = {}  # as before the supervisor read it
    assert "would have been full" not in text_of(html.render(recording, diagnose(recording)))
    last = recording.agent(recording.target_pid).samples[-1].t
    total = recording.devices[0]["total_bytes"]
    recording.device_memory = {0: [(last, total - 40 * (1 << 30), 40 * (1 << 30))]}
    diagnosis = diagnose(recording)
    sentence = time_to_full_text(next(f for f in diagnosis.findings if f.kind == "leak"))
    assert sentence.startswith(f"At the end of the run ({last:.1f} s), GPU 0 had 40.0 GiB free: at ")
    assert text_of(html.render(recording, diagnosis)).count(sentence) == 2


@pytest.mark.parametrize("name, kind", [("peak_fragmented", "fragmented-peak"), ("peak_temporary", "temporary-peak")])
def test_a_peak_that_could_be_lower_is_a_warning_in_the_header(name, kind):
    """Recorded on an H100 (tests/fixtures/reports/recorded.txt): the peak's warnings head the page."""
    page, _, diagnosis = page_of(name)
    finding = next(f for f in diagnosis.findings if f.kind == kind)
    header = page[:page.index("</header>")]
    assert f"Warning: {htmllib.escape(finding.summary)}" in header
    assert f"k-{kind}" in page and f".finding.k-{kind}" in page
