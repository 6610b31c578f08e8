"""What made the peak, in the CI gate, `compare` and the baseline. The compositions are made up here
(tests/peak_samples.py), attached to the diagnoses of recorded fixtures: never recorded figures."""
from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from gpumemdoctor.app.checks import make_policy
from gpumemdoctor.diagnosis import ci_checks as checks
from gpumemdoctor.app import baseline_file
from gpumemdoctor.errors import BadReportError
from gpumemdoctor.units import format_bytes as fb
from gpumemdoctor.reporters import ci_checks as reporter
from gpumemdoctor.app.report_file import build, load
from tests.peak_samples import GiB, MiB, composition, training_peak

FIXTURES = Path(__file__).parent / "fixtures" / "reports"


def run(name: str = "clean_adam", compositions=None):
    recording, diagnosis = load(str(FIXTURES / f"{name}.json"))
    diagnosis.peak_compositions = list(compositions or [])
    return recording, diagnosis


def grown_peak(pid: int = 4242):
    """training_peak with 1 GiB more optimizer state and 200 MiB more parameters, 64 MiB less cache."""
    c = training_peak(pid=pid)
    for part, change in (("optimizer-state", GiB), ("parameters", 200 * MiB), ("cache", -64 * MiB)):
        c.part(part).bytes += change
        c.total_bytes += change
    return c


def test_a_failed_max_peak_says_what_filled_the_peak_largest_first():
    recording, diagnosis = run(compositions=[composition(pid=99, gradients=GiB), training_peak()])
    (peak,) = checks.evaluate(recording, diagnosis, checks.Policy(max_peak_bytes=1 << 20))
    assert not peak.passed and peak.peak.pid == 4242  # the largest composition
    assert [cat for cat, _ in peak.made_of] == ["optimizer-state", "unclassified", "context", "parameters",
                                                "gradients", "cache", "outside-pytorch"]
    text = reporter.message(peak)
    assert text.startswith(peak.message + "; what filled it (process 4242, GPU 0, 3.57 GiB): optimizer state "
                           "1.00 GiB, unclassified 768 MiB, CUDA context 520 MiB, parameters 512 MiB, and 3 more "
                           "(832 MiB)")
    # drawn the same in JUnit and GitHub's summary
    root = ET.fromstring(reporter.junit_xml([peak]).split("?>", 1)[1])
    assert root.find("./testsuite/testcase/failure").get("message") == text
    assert "optimizer state 1.00 GiB" in reporter.markdown_summary("t", "clean", {}, [peak])


def test_a_failed_max_peak_described_at_the_reading_with_the_most_in_use_says_so():
    busy = training_peak()
    busy.highest = {"t": 2.1, "total_bytes": 5 * GiB, "cache_bytes": 3 * GiB}
    other = composition(pid=99, gradients=4 * GiB)  # larger than busy's 3.57 GiB, smaller than its 5 GiB peak
    recording, diagnosis = run(compositions=[other, busy])
    (peak,) = checks.evaluate(recording, diagnosis, checks.Policy(max_peak_bytes=1 << 20))
    assert peak.peak is busy  # ranked by its peak, not by the reading described
    assert "what filled it (process 4242, GPU 0, 3.57 GiB, the reading with the most memory in use): " in \
        reporter.message(peak)


def test_a_passed_max_peak_and_a_run_without_compositions_say_no_parts():
    recording, diagnosis = run(compositions=[training_peak()])
    (ok,) = checks.evaluate(recording, diagnosis, checks.Policy(max_peak_bytes=1 << 50))
    assert ok.passed and reporter.message(ok) == ok.message
    recording, diagnosis = run()
    (failed,) = checks.evaluate(recording, diagnosis, checks.Policy(max_peak_bytes=1 << 20))
    assert not failed.passed and failed.peak is None and reporter.message(failed) == failed.message


def test_a_baseline_keeps_the_largest_peaks_parts_and_a_later_run_says_what_grew(tmp_path):
    recording, diagnosis = run(compositions=[composition(pid=99, gradients=GiB), training_peak()])
    path = tmp_path / "base.json"
    baseline_file.write_baseline(str(path), checks.baseline_document(recording, diagnosis))
    written = json.loads(path.read_text())["peak_parts"]
    assert written == {**{c: 0 for c in checks.PEAK_CATEGORIES}, **{p.category: p.bytes for p in training_peak().parts}}
    baseline = baseline_file.load_baseline(str(path))
    assert baseline["peak_parts"] == written
    policy = make_policy(None, None, None, "5%", "1MiB", baseline)
    assert policy.baseline_peak_parts == written and "peak_parts" not in policy.baseline
    recording, diagnosis = run(compositions=[grown_peak()])
    results = checks.evaluate(recording, diagnosis, policy)
    peak = next(r for r in results if r.name == "baseline peak_allocated_bytes")
    nvml = next(r for r in results if r.name == "baseline peak_nvml_bytes")
    said = ("; the largest peak's parts against the baseline: +1.13 GiB, of which optimizer state +1.00 GiB, "
            "parameters +200 MiB, allocator cache -64.0 MiB")
    assert reporter.message(peak) == peak.message + said and reporter.message(nvml) == nvml.message + said
    live = next(r for r in results if r.name == "baseline live_tensor_bytes")
    assert reporter.message(live) == live.message


def test_an_older_baseline_without_parts_loads_and_compares_as_before(tmp_path):
    recording, diagnosis = run(compositions=[training_peak()])
    doc = checks.baseline_document(recording, diagnosis)
    del doc["peak_parts"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    baseline = baseline_file.load_baseline(str(path))
    assert "peak_parts" not in baseline
    policy = make_policy(None, None, None, "5%", None, baseline)
    results = checks.evaluate(*run(compositions=[grown_peak()]), policy)
    before = checks.evaluate(*run(), make_policy(None, None, None, "5%", None, baseline))
    assert [reporter.message(r) for r in results] == [r.message for r in before]


def test_a_baseline_made_before_the_allocated_peaks_parts_loads_them_as_zero(tmp_path):
    recording, diagnosis = run(compositions=[training_peak()])
    doc = checks.baseline_document(recording, diagnosis)
    for category in ("activations", "gathered"):
        del doc["peak_parts"][category]
    path = tmp_path / "b.json"
    path.write_text(json.dumps(doc))
    parts = baseline_file.load_baseline(str(path))["peak_parts"]
    assert parts["activations"] == 0 and parts["gathered"] == 0
    assert parts["optimizer-state"] == doc["peak_parts"]["optimizer-state"]


@pytest.mark.parametrize("broken", [
    lambda parts: parts.pop("optimizer-state"),
    lambda parts: parts.__setitem__("parameters", -1),
    lambda parts: parts.__setitem__("gradients", "1 GiB"),
])
def test_a_baselines_parts_are_read_strictly(tmp_path, broken):
    recording, diagnosis = run(compositions=[training_peak()])
    doc = checks.baseline_document(recording, diagnosis)
    broken(doc["peak_parts"])
    path = tmp_path / "b.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(BadReportError, match="peak_parts|optimizer-state|parameters|gradients"):
        baseline_file.load_baseline(str(path))


def test_peak_growth_by_category():
    old = {"parameters": 10, "optimizer-state": 20, "cache": 5}
    new = {"parameters": 15, "optimizer-state": 60, "cache": 0}
    assert checks.peak_growth(old, new) == {"change": 40, "parts": [("optimizer-state", 40), ("parameters", 5),
                                                                    ("cache", -5)]}
    assert checks.peak_growth(None, new) is None and checks.peak_growth(old, None) is None


def _report(tmp_path: Path, name: str, compositions) -> str:
    recording, diagnosis = run(compositions=compositions)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(build(recording, diagnosis)))
    return str(path)


def test_compare_says_what_grew_by_category(cli, tmp_path):
    old = _report(tmp_path, "old", [training_peak()])
    new = _report(tmp_path, "new", [grown_peak()])
    result = cli("compare", old, new, "--max-peak", "1MiB", cwd=tmp_path)
    assert result.returncode == 10, result.stderr
    out = " ".join(result.stdout.split())
    assert ("The largest peak: +1.13 GiB, of which optimizer state +1.00 GiB, parameters +200 MiB, allocator "
            "cache -64.0 MiB") in out
    assert "peak: optimizer state 1.00 GiB 2.00 GiB +1.00 GiB (+100.0%)" in out
    assert "what filled it (process 4242, GPU 0, 4.70 GiB): optimizer state 2.00 GiB" in out
    # reports without compositions (older ones): as before, no part rows
    from tests.older import write_older

    before = write_older("clean_adam", tmp_path)
    plain = cli("compare", str(before), str(before), cwd=tmp_path)
    assert "peak:" not in plain.stdout and "largest peak" not in plain.stdout


def test_what_changed_lists_the_largest_changes_either_way_and_no_share_of_a_near_empty_part():
    """Recorded on an H100 (tests/fixtures/reports/recorded.txt): a peak that fell a little (76 MiB in
    one recording, 74 MiB in the next) while its optimizer state grew by a GiB says both."""
    import io

    from rich.console import Console

    from gpumemdoctor.diagnosis import ci_checks as checks
    from gpumemdoctor.reporters import ci_checks as drawn
    from gpumemdoctor.app.report_file import load

    fixtures = Path(__file__).parent / "fixtures" / "reports"
    old = checks.peak_parts(load(str(fixtures / "peak_temporary.json"))[1])
    new = checks.peak_parts(load(str(fixtures / "peak_adamw.json"))[1])
    grew = checks.peak_growth(old, new)
    assert [c for c, _ in grew["parts"][:3]] == ["temporaries", "optimizer-state", "kept-tensors"]
    text = drawn.growth_text(grew)
    change = sum(new.values()) - sum(old.values())
    assert -256 * MiB < change < 0, (old, new)  # the recordings' own totals
    assert text.startswith(f"-{fb(-change)}, of which temporaries -2.00 GiB, optimizer state +1.00 GiB"), text
    out = io.StringIO()
    drawn.render_comparison(Console(file=out, width=100), "clean", "clean", {}, {}, grew=grew,
                            old_parts=old, new_parts=new)
    row = next(line for line in out.getvalue().splitlines() if "unclassified" in line)
    assert row.split()[-1] == "MiB" and "%" not in row, row  # 1016 bytes before: no share
