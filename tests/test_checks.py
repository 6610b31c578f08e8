"""CI checks and baselines, on reports recorded on a GPU; the check options of the CLI."""
from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from gpumemdoctor.diagnosis import ci_checks as checks
from gpumemdoctor.app import baseline_file
from gpumemdoctor.errors import BadReportError, UsageError
from gpumemdoctor.app.report_file import load
from gpumemdoctor.reporters.ci_checks import junit_xml, markdown_summary

FIXTURES = Path(__file__).parent / "fixtures" / "reports"
MIB = 1 << 20


def run(name: str):
    return load(str(FIXTURES / f"{name}.json"))


def test_figures_of_a_clean_run():
    recording, diagnosis = run("clean_adam")
    figs = checks.figures(recording, diagnosis)
    assert figs["peak_allocated_bytes"] == diagnosis.peaks["allocated_bytes"]
    b = next(b for b in diagnosis.breakdowns if b.pid == recording.target_pid)
    assert figs["live_tensor_bytes"] == b.live_tensor_bytes
    assert figs["retained_bytes"] == b.nvml_bytes - b.context_bytes


def test_unchanged_run_passes_its_own_baseline():
    recording, diagnosis = run("clean_adam")
    policy = checks.Policy(baseline=checks.figures(recording, diagnosis))
    results = checks.evaluate(recording, diagnosis, policy)
    assert [r.name for r in results] == ["baseline peak_allocated_bytes", "baseline live_tensor_bytes"]
    assert all(r.passed for r in results)


def test_bigger_run_fails_the_baseline_and_says_by_how_much():
    old = checks.figures(*run("clean_adam"))
    recording, diagnosis = run("leak_training_list")
    results = checks.evaluate(recording, diagnosis, checks.Policy(baseline=old))
    peak = next(r for r in results if r.name == "baseline peak_allocated_bytes")
    assert not peak.passed and "+" in peak.message and "tolerance 5%" in peak.message


def test_tolerance_allows_growth_up_to_it():
    base = checks.figures(*run("clean_adam"))
    grown = dict(base, peak_allocated_bytes=int(base["peak_allocated_bytes"] * 1.04))
    recording, diagnosis = run("clean_adam")
    # the run is the same; judging it against a baseline 4% larger or 4% smaller
    smaller = {k: (int(v / 1.04) if isinstance(v, int) else v) for k, v in base.items()}
    assert all(r.passed for r in checks.evaluate(recording, diagnosis, checks.Policy(baseline=grown)))
    assert all(r.passed for r in checks.evaluate(recording, diagnosis, checks.Policy(baseline=smaller)))
    tight = checks.Policy(baseline=smaller, tolerance=checks.parse_tolerance("1%"))
    assert not all(r.passed for r in checks.evaluate(recording, diagnosis, tight))


def test_nvml_peak_is_compared_only_when_asked():
    recording, diagnosis = run("clean_adam")
    base = dict(checks.figures(recording, diagnosis), peak_nvml_bytes=1)
    assert all(r.passed for r in checks.evaluate(recording, diagnosis, checks.Policy(baseline=base)))
    asked = checks.Policy(baseline=base, nvml_tolerance=checks.parse_tolerance("10%"))
    assert not all(r.passed for r in checks.evaluate(recording, diagnosis, asked))


def test_fail_on_names_the_finding():
    recording, diagnosis = run("leak_training_list")
    results = checks.evaluate(recording, diagnosis, checks.Policy(fail_on=("leak", "pending-stream")))
    assert [(r.name, r.passed) for r in results] == [("fail-on leak", False), ("fail-on pending-stream", True)]
    clean = checks.evaluate(*run("clean_adam"), checks.Policy(fail_on=("leak",)))
    assert all(r.passed for r in clean)


def test_ceilings():
    recording, diagnosis = run("cache_after_matmul")
    peak = diagnosis.peaks["nvml_bytes"]
    over = checks.evaluate(recording, diagnosis, checks.Policy(max_peak_bytes=peak - 1))
    under = checks.evaluate(recording, diagnosis, checks.Policy(max_peak_bytes=peak))
    assert not over[0].passed and under[0].passed
    retained = checks.figures(recording, diagnosis)["retained_bytes"]
    assert retained >= 768 * MIB  # the cache is held at exit
    assert not checks.evaluate(recording, diagnosis, checks.Policy(max_retained_bytes=512 * MIB))[0].passed


@pytest.mark.parametrize("text, fraction, size", [("5%", 0.05, 0), ("0.5%", 0.005, 0), ("64MiB", 0, 64 * MIB)])
def test_parse_tolerance(text, fraction, size):
    t = checks.parse_tolerance(text)
    assert t.fraction == pytest.approx(fraction) and t.bytes == size


@pytest.mark.parametrize("text", ["", "five", "-5%", "5%%"])
def test_bad_tolerance(text):
    with pytest.raises(UsageError):
        checks.parse_tolerance(text)


def test_parse_kinds():
    assert checks.parse_kinds("leak, orphan-process") == ("leak", "orphan-process")
    for bad in ("", "clean", "context", "leak,nope"):
        with pytest.raises(UsageError):
            checks.parse_kinds(bad)


def test_baseline_round_trip_and_strictness(tmp_path):
    recording, diagnosis = run("clean_adam")
    path = tmp_path / "base.json"
    baseline_file.write_baseline(str(path), checks.baseline_document(recording, diagnosis))
    # the figures, and what made the largest peak (a report from before issue 31 has no parts)
    assert baseline_file.load_baseline(str(path)) == {**checks.figures(recording, diagnosis),
                                               "peak_parts": checks.peak_parts(diagnosis)}
    assert checks.peak_parts(diagnosis)["optimizer-state"] > 0
    doc = json.loads(path.read_text())
    for broken in (dict(doc, schema="other/1"), dict(doc, figures={"peak_allocated_bytes": "1"}),
                   dict(doc, figures=[])):
        path.write_text(json.dumps(broken))
        with pytest.raises(BadReportError):
            baseline_file.load_baseline(str(path))
    path.write_text("{not json")
    with pytest.raises(BadReportError):
        baseline_file.load_baseline(str(path))
    with pytest.raises(UsageError, match="--update-baseline"):
        baseline_file.load_baseline(str(tmp_path / "missing.json"))


def test_junit_has_one_case_per_check():
    recording, diagnosis = run("leak_training_list")
    results = checks.evaluate(recording, diagnosis, checks.Policy(fail_on=("leak", "non-torch")))
    root = ET.fromstring(junit_xml(results).split("?>", 1)[1])
    cases = root.findall("./testsuite/testcase")
    assert [c.get("name") for c in cases] == ["fail-on leak", "fail-on non-torch"]
    assert cases[0].find("failure") is not None and cases[1].find("failure") is None
    assert root.find("testsuite").get("failures") == "1"


def test_markdown_summary():
    recording, diagnosis = run("leak_training_list")
    results = checks.evaluate(recording, diagnosis, checks.Policy(fail_on=("leak",)))
    text = markdown_summary("train.py", diagnosis.verdict, checks.figures(recording, diagnosis), results)
    assert "Verdict: **leak**" in text and "| fail-on leak | **FAIL** |" in text


# -- the CLI -----------------------------------------------------------------------

def test_compare_passes_a_run_against_itself(cli, tmp_path):
    same = str(FIXTURES / "clean_adam.json")
    result = cli("compare", same, same, "--fail-on", "leak", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "3 passed, 0 failed" in result.stdout


def test_compare_fails_a_regression_with_exit_10_and_junit(cli, tmp_path):
    result = cli("compare", str(FIXTURES / "clean_adam.json"), str(FIXTURES / "leak_training_list.json"),
                 "--junit", "j.xml", cwd=tmp_path, env={"GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md")})
    assert result.returncode == 10
    assert "FAIL" in result.stdout and "peak_allocated_bytes" in result.stdout
    assert (tmp_path / "j.xml").exists()
    assert "### gpumemdoctor:" in (tmp_path / "summary.md").read_text()


@pytest.mark.parametrize("args, message", [
    (["--fail-on", "bogus"], "--fail-on"),
    (["--tolerance", "lots"], "tolerance"),
    (["--max-peak", "big"], "max-peak"),
    (["--update-baseline"], "--baseline"),
    (["--baseline", "missing.json"], "--update-baseline"),
])
def test_bad_check_options_are_usage_errors_before_the_target_runs(cli, script, tmp_path, args, message):
    script(tmp_path, "t.py", "open('ran', 'w').close()\n")
    result = cli("run", "--allow-no-gpu", *args, "t.py", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "ran").exists()


def test_failed_check_exits_10_but_the_targets_failure_wins(cli, script, tmp_path):
    script(tmp_path, "ok.py", "pass\n")
    script(tmp_path, "bad.py", "raise SystemExit(3)\n")
    # without a GPU the peak is not measured, so a ceiling on it cannot pass
    result = cli("run", "--allow-no-gpu", "--max-peak", "1GiB", "ok.py", cwd=tmp_path)
    assert result.returncode == 10 and "FAIL" in result.stderr
    result = cli("run", "--allow-no-gpu", "--max-peak", "1GiB", "bad.py", cwd=tmp_path)
    assert result.returncode == 3


def test_update_baseline_writes_a_baseline(tmp_path, capsys):
    """What `run --update-baseline` does once its target has ended, on a run that measured its figures (a
    run without a GPU measures none, and is refused: tests/test_bad_input.py)."""
    from gpumemdoctor.app.pipeline import RunOutputs, after_run as _after_run

    recording, _ = run("clean_adam")
    outputs = RunOutputs(name="ok", report=str(tmp_path / "r.json"), force=False, quiet=True, html=None,
                         html_next_to_json=False, junit=None, new_baseline=str(tmp_path / "b.json"))
    assert _after_run(recording, 0, outputs, checks.Policy()) == 0
    assert f"Baseline written: {tmp_path / 'b.json'}" in capsys.readouterr().err
    assert json.loads((tmp_path / "b.json").read_text())["schema"] == checks.BASELINE_SCHEMA


# -- issue 41: compare's JUnit that cannot be written, and the step summary ----------------------------

def test_compare_whose_junit_cannot_be_written_fails(cli, tmp_path):
    """Cause 5: exit 0 with no JUnit written, and a line about "the target's" status, which compare has not."""
    same = str(FIXTURES / "clean_adam.json")
    summary = tmp_path / "summary.md"
    result = cli("compare", same, same, "--junit", "/dev/full", cwd=tmp_path, env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == ["gpumemdoctor: error: cannot write the JUnit XML to /dev/full: No space "
                                          "left on device"]
    assert "2 passed, 0 failed" in result.stdout  # the checks are still drawn
    assert "### gpumemdoctor:" in summary.read_text()  # and summed up


@pytest.mark.parametrize("which", ["old", "new", "junit"])
def test_the_step_summary_is_never_appended_to_a_file_of_compare(cli, tmp_path, which):
    """Cause 14: with GITHUB_STEP_SUMMARY pointed at the report being read, the summary went into it."""
    for name in ("old", "new"):
        (tmp_path / f"{name}.json").write_text((FIXTURES / "clean_adam.json").read_text())
    before = {p.name: p.read_text() for p in tmp_path.iterdir()}
    result = cli("compare", "old.json", "new.json", "--junit", "j.xml", "--fail-on", "leak", cwd=tmp_path,
                 env={"GITHUB_STEP_SUMMARY": str(tmp_path / f"{which}.json" if which != "junit" else tmp_path / "j.xml")})
    assert result.returncode == 0, result.stderr
    for name in ("old.json", "new.json"):
        assert (tmp_path / name).read_text() == before[name]
    assert "### gpumemdoctor" not in (tmp_path / "j.xml").read_text()
    assert result.stderr.startswith("gpumemdoctor: warning: GITHUB_STEP_SUMMARY names the ")
    assert "warning" not in result.stdout


def test_the_step_summary_is_never_appended_to_the_report_of_run(cli, script, tmp_path):
    script(tmp_path, "t.py", "pass\n")
    result = cli("run", "--allow-no-gpu", "-q", "-o", "r.json", "--max-peak", "1GiB", "t.py", cwd=tmp_path,
                 env={"GITHUB_STEP_SUMMARY": str(tmp_path / "r.json")})
    assert result.returncode == 10, result.stderr
    assert json.loads((tmp_path / "r.json").read_text())["schema"] == "gpumemdoctor.report/1"
    assert "GITHUB_STEP_SUMMARY names the report r.json" in result.stderr


def test_a_step_summary_that_cannot_be_written_is_a_warning_on_standard_error(cli, tmp_path):
    """Cause 14: its warning went to standard output, into compare's table."""
    same = str(FIXTURES / "clean_adam.json")
    result = cli("compare", same, same, cwd=tmp_path, env={"GITHUB_STEP_SUMMARY": "/dev/full"})
    assert result.returncode == 0, result.stderr
    assert "GITHUB_STEP_SUMMARY" not in result.stdout
    assert result.stderr.startswith("gpumemdoctor: warning: could not append to GITHUB_STEP_SUMMARY /dev/full")


# -- --fail-on on a run that measured nothing ----------------------------------------------------------

def test_fail_on_fails_where_the_run_could_not_show_the_finding():
    """No leak finding in a run that measured no GPU is no evidence of no leak: the check fails as not
    measured, as a figure that was not measured does (it said "ok")."""
    import dataclasses

    recording, diagnosis = run("clean_adam")
    unmeasured = dataclasses.replace(recording, nvml_available=False, host_rss=[])
    results = checks.evaluate(unmeasured, diagnosis, checks.Policy(fail_on=("leak", "host-memory")))
    assert [(r.name, r.passed) for r in results] == [("fail-on leak", False), ("fail-on host-memory", False)]
    assert results[0].message == ("leak: not measured (no NVIDIA GPU was measured), so the run cannot be said "
                                  "to have none")
    assert "no host memory was read" in results[1].message
    measured = checks.evaluate(recording, diagnosis, checks.Policy(fail_on=("leak", "host-memory")))
    assert all(r.passed for r in measured)


def test_run_without_a_gpu_fails_fail_on(cli, script, tmp_path):
    script(tmp_path, "ok.py", "pass\n")
    result = cli("run", "--allow-no-gpu", "--fail-on", "leak", "ok.py", cwd=tmp_path)
    assert result.returncode == 10, result.stderr
    assert "FAIL fail-on leak: leak: not measured" in " ".join(result.stderr.split())
