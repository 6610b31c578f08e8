"""Property-based tests (Hypothesis) of everything that parses input from outside: reports, baselines,
run folders, size, rate, tolerance and finding-kind strings, and every numeric option. Whatever is
generated, the answer is a value, or the documented refusal with its exit code: never exit 70, a
traceback or a hang.

The documents are mutations of valid ones (a hand-built leak, a run without a GPU, reports recorded
on a GPU, a synthetic two-rank job): a field replaced by any JSON value, by a number at a bound, or by
another field of the same document; a field removed or added, a list item repeated; the text cut
short. The settings are derandomized, so CI sees the same cases every time; EXAMPLES says how many
each test makes (about 11,000 in all).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
from pathlib import Path
from typing import Any, Iterator

import click
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from gpumemdoctor.diagnosis import ci_checks as checks
from gpumemdoctor.diagnosis.ci_checks import FAILABLE, Tolerance, parse_kinds, parse_tolerance
from gpumemdoctor.app.checks import make_policy
from gpumemdoctor.cli._params import Seconds
from gpumemdoctor.diagnosis.diagnose import diagnose
from gpumemdoctor.errors import EXIT_INTERNAL, BadReportError, DoctorError, UsageError
from gpumemdoctor.files.inputs import loads_strict
from gpumemdoctor.app.report_file import build, load, parse
from gpumemdoctor.reporters import ci_checks as checks_reporter
from gpumemdoctor.units import MAX_SIZE_BYTES, parse_size
from gpumemdoctor.live.watch import parse_rate

from .conftest import invoke
from .synthetic_jobs import Rank, job
from .test_bad_input import no_gpu_report
from .test_report_parse import make_recording

FIXTURES = Path(__file__).parent / "fixtures" / "reports"

# Examples per test: the counts that CI runs. Together about 11,000 (see the module's docstring).
EXAMPLES = {"report_parse": 2500, "report_cli": 150, "baseline": 2500, "run_folder": 200,
            "size": 1500, "rate": 1000, "tolerance": 1000, "kinds": 700, "seconds": 700, "options": 800}


# To look further than CI does: GPUMEMDOCTOR_FUZZ=N runs N times as many cases, from a random start.
FUZZ = int(os.environ.get("GPUMEMDOCTOR_FUZZ") or 0)


def settings_for(name: str):
    return settings(max_examples=EXAMPLES[name] * max(1, FUZZ), derandomize=not FUZZ, database=None, deadline=None,
                    print_blob=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


@contextlib.contextmanager
def no_hang(seconds: float = 20) -> Iterator[None]:
    """Fail, instead of waiting forever, when one case takes longer than `seconds`."""
    def expire(signum, frame):
        raise TimeoutError(f"one case took more than {seconds} s: a hang")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def check_contract(args: list[str], allowed: set[int]) -> tuple[int, str, str]:
    """`gpumemdoctor ARGS...` ends with an exit code the table documents for this command, and with no
    traceback or internal error (when it does, the failure shows the traceback, from --debug)."""
    code, out, err = invoke(*args)
    if code == EXIT_INTERNAL or "Traceback" in err or "internal error" in err or code not in allowed:
        raise AssertionError(f"exit {code} for {args}:\n{err[-1500:]}\n{invoke('--debug', *args)[2][-3000:]}")
    if code not in (0, 10):
        errors = [line for line in err.splitlines() if line.startswith("gpumemdoctor: error: ")]
        assert len(errors) == 1, err[-2000:]
    return code, out, err


# -- documents and their mutations ------------------------------------------------------------------

# For documents, Hypothesis draws a seed and the mutations are made from it: drawing each choice
# through Hypothesis cost about 5 ms a case, more than the case itself. A failure shows the seed
# and, through note(), the mutations it made.
SEEDS = st.integers(min_value=0, max_value=2**32 - 1)

BOUNDS = [0, -1, 1, 2**31, 2**53 + 1, 2**60, 2**60 + 1, 2**63 - 1, 2**63, 2**64, -2**63, 10**30, 10**400,
          -10**400, 0.5, -0.0, 1e308, -1e308, 5e-324, 1e18, 1.5e18, math.nan, math.inf, -math.inf]
CHARACTERS = "a0 -_.:/[]\\\"'%\n\t\x00\x7f\u00e9\u2028\ud7ff\U0001f600"


# And pieces that mean something to a formatter: rich's markup, str.format, %, a path's "..".
TOKENS = [*CHARACTERS, "[/]", "[bold]", "{0}", "%s", ".."]


def random_text(rnd: random.Random, most: int = 10) -> str:
    return "".join(rnd.choice(TOKENS) for _ in range(rnd.randint(0, most)))


def random_json(rnd: random.Random, depth: int = 0) -> Any:
    """Any JSON value (NaN and Infinity included), of at most three levels."""
    kind = rnd.randrange(9 if depth < 2 else 7)
    if kind == 0:
        return None
    if kind == 1:
        return rnd.random() < 0.5
    if kind == 2:
        return rnd.choice(BOUNDS)
    if kind == 3:
        return rnd.randint(-2**70, 2**70) >> rnd.randrange(70)
    if kind == 4:
        return rnd.uniform(-1e6, 1e6)
    if kind in (5, 6):
        return random_text(rnd)
    if kind == 7:
        return [random_json(rnd, depth + 1) for _ in range(rnd.randint(0, 3))]
    return {random_text(rnd, 6): random_json(rnd, depth + 1) for _ in range(rnd.randint(0, 3))}


def nodes(doc: Any, path: tuple = ()) -> list[tuple]:
    """Every path into a document (keys and list indexes), the document itself first."""
    out, stack = [], [(doc, path)]
    while stack:
        value, where = stack.pop()
        out.append(where)
        if isinstance(value, dict):
            stack.extend((v, (*where, k)) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, (*where, i)) for i, v in enumerate(value))
    return out


def get(doc: Any, path: tuple) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def update(doc: Any, path: tuple, change) -> Any:
    """A copy of doc with change() applied at path; only the containers along the path are copied,
    so a base document is never changed and a mutation costs little."""
    if not path:
        return change(doc)
    copy_ = dict(doc) if isinstance(doc, dict) else list(doc)
    copy_[path[0]] = update(doc[path[0]], path[1:], change)
    return copy_


def _without(parent: Any, key: Any) -> Any:
    if isinstance(parent, dict):
        return {k: v for k, v in parent.items() if k != key}
    return parent[:key] + parent[key + 1:]


class Documents:
    """Valid documents to mutate, with their paths found once, by section: each top-level field, and
    each field of a report's recording (so that the small parts, findings or evidence, are hit as
    often as the long sample lists)."""

    def __init__(self, docs: list):
        self.docs = docs
        self.sections = []
        for doc in docs:
            sections: dict[tuple, list[tuple]] = {}
            for path in nodes(doc):
                sections.setdefault(path[:2] if path[:1] == ("recording",) else path[:1], []).append(path)
            self.sections.append([paths for _, paths in sorted(sections.items(), key=repr)])

    def mutated(self, rnd: random.Random) -> tuple[Any, list[str]]:
        """A document with one to three mutations: a field replaced by any JSON value, by a number at
        a bound or by another field of the document; a field removed or added; a list item repeated."""
        index = rnd.randrange(len(self.docs))
        doc, sections, done = self.docs[index], self.sections[index], [f"document {index}"]
        for _ in range(rnd.randint(1, 3)):
            path = rnd.choice(rnd.choice(sections))
            op = rnd.choice(["replace", "bound", "other", "delete", "add", "repeat"])
            try:
                here = get(doc, path)
            except (KeyError, IndexError, TypeError):  # an earlier mutation took it away
                continue
            if op in ("replace", "bound", "other"):
                if op == "other":
                    try:
                        value = get(doc, rnd.choice(rnd.choice(sections)))
                    except (KeyError, IndexError, TypeError):
                        continue
                else:
                    value = random_json(rnd) if op == "replace" else rnd.choice(BOUNDS)
                doc = update(doc, path, lambda _: value)
                done.append(f"{path} = {value!r:.200}")
            elif op == "delete" and path:
                doc = update(doc, path[:-1], lambda parent: _without(parent, path[-1]))
                done.append(f"del {path}")
            elif op == "add" and isinstance(here, dict):
                key, value = random_text(rnd, 6), random_json(rnd)
                doc = update(doc, path, lambda d: {**d, key: value})
                done.append(f"{path}[{key!r}] = {value!r:.200}")
            elif op == "repeat" and path and isinstance(get(doc, path[:-1]), list):
                doc = update(doc, path[:-1], lambda parent: parent[:path[-1]] + [here] + parent[path[-1]:])
                done.append(f"repeat {path}")
        return doc, done

    def text(self, seed: int) -> str:
        """A mutated document as a file's text: usually whole, sometimes cut short or with a character
        changed; what was done goes to Hypothesis's note, shown with a failure."""
        rnd = random.Random(seed)
        doc, done = self.mutated(rnd)
        note("; ".join(done))
        return text_of(rnd, doc)


def text_of(rnd: random.Random, doc: Any) -> str:
    text = json.dumps(doc, allow_nan=True)  # NaN and Infinity too: the reader must refuse them
    cut = rnd.randrange(10)
    if cut == 0:
        return text[:rnd.randint(0, len(text))]
    if cut == 1 and text:
        i = rnd.randrange(len(text))
        return text[:i] + rnd.choice(["\x00", "\ufffd", "{", "]", '"', "9", "-", "e"]) + text[i + 1:]
    return text


def _report(recording) -> dict:
    return json.loads(json.dumps(build(recording, diagnose(recording))))


def _fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


REPORTS = Documents([_report(make_recording()), no_gpu_report(), _fixture("leak_then_raise"),
                     _fixture("oom_fragmentation"), _fixture("garbage_cycle"),
                     _report(job([Rank(0), Rank(1, leak_per_step=8 << 20)]))])


# -- reports ----------------------------------------------------------------------------------------

@settings_for("report_parse")
@given(seed=SEEDS)
def test_a_report_is_read_or_refused_and_what_is_read_is_judged_and_checked(seed):
    """Every mutated report, as the text of a file: read as `report.load` reads it, it gives a
    recording and a diagnosis, or a BadReportError (exit 4). What it gives is judged again and
    checked as `report` and `compare` do, without an exception. (In memory: writing thousands of
    files would cost more than the cases themselves.)"""
    text = REPORTS.text(seed)
    with no_hang():
        try:
            recording, diagnosis = parse(loads_strict(text))
        except (BadReportError, ValueError, RecursionError) as exc:  # load turns each into exit 4
            assert "\n" not in str(exc)
            return
        diagnose(recording)  # `report` judges every report again
        figures = checks.figures(recording, diagnosis)
        ranks = checks.rank_figures(recording, diagnosis)
        baseline = {**figures, "ranks": ranks} if ranks else figures
        policy = make_policy(1 << 30, 1 << 30, "leak,non-torch", "5%", "10%", baseline)
        for result in checks.evaluate(recording, diagnosis, policy):
            assert isinstance(result.passed, bool) and result.message


@settings_for("report_cli")
@given(seed=SEEDS)
def test_report_and_compare_keep_the_exit_code_contract(tmp_path, seed):
    """The whole command line on mutated reports: drawn in the terminal (as saved and judged again)
    and as an HTML page, compared with a valid report both ways."""
    path = tmp_path / "r.json"
    path.write_text(REPORTS.text(seed))
    good = tmp_path / "good.json"
    if not good.exists():
        good.write_text(json.dumps(REPORTS.docs[0]))
    with no_hang():
        check_contract(["report", str(path), "--width", "80"], {0, 4})
        check_contract(["report", "--rejudge", str(path), "--width", "80"], {0, 4})
        check_contract(["report", str(path), "--html", str(tmp_path / "r.html"), "--force"], {0, 4, 5})
        check_contract(["compare", str(good), str(path), "--fail-on", "leak", "--max-peak", "1GiB"], {0, 4, 10})
        check_contract(["compare", str(path), str(good)], {0, 4, 10})


# -- baselines --------------------------------------------------------------------------------------

RECORDING = make_recording()
DIAGNOSIS = diagnose(RECORDING)
JOB = job([Rank(0), Rank(1, leak_per_step=8 << 20)])
JOB_DIAGNOSIS = diagnose(JOB)

def _with_peak_parts() -> dict:
    """A baseline that keeps a peak's parts (a composition made up in tests/peak_samples.py)."""
    from dataclasses import replace

    from tests.peak_samples import training_peak

    return checks.baseline_document(RECORDING, replace(DIAGNOSIS, peak_compositions=[training_peak()]))


BASELINES = Documents([checks.baseline_document(RECORDING, DIAGNOSIS), checks.baseline_document(JOB, JOB_DIAGNOSIS),
                       _with_peak_parts()])


@settings_for("baseline")
@given(seed=SEEDS)
def test_a_baseline_is_read_or_refused_and_what_is_read_is_compared(seed):
    """Every mutated baseline, as the text of a file: its figures, each a size or null, or a
    BadReportError (exit 4); what is read is compared with a run and drawn, without an exception."""
    text = BASELINES.text(seed)
    with no_hang():
        try:
            baseline = checks.parse_baseline(loads_strict(text))
        except (BadReportError, ValueError, RecursionError) as exc:
            assert "\n" not in str(exc)
            return
        for figure in [baseline, *baseline.get("ranks", {}).values()]:
            assert set(figure) >= set(checks.RANK_FIGURES)
            assert all(v is None or (isinstance(v, int) and 0 <= v <= MAX_SIZE_BYTES) for k, v in figure.items()
                       if k not in ("ranks", "peak_parts"))
        if "peak_parts" in baseline:  # every category, each a size
            assert set(baseline["peak_parts"]) == set(checks.PEAK_CATEGORIES)
            assert all(isinstance(v, int) and 0 <= v <= MAX_SIZE_BYTES for v in baseline["peak_parts"].values())
        for recording, diagnosis in ((RECORDING, DIAGNOSIS), (JOB, JOB_DIAGNOSIS)):
            policy = make_policy(None, None, None, "5%", "1MiB", baseline)
            results = checks.evaluate(recording, diagnosis, policy)
            checks_reporter.junit_xml(results)
            checks_reporter.markdown_summary("t", diagnosis.verdict, checks.figures(recording, diagnosis), results)


# -- run folders ------------------------------------------------------------------------------------

T0 = 1000.0


def _agent_lines(recording) -> list[dict]:
    """The lines an agent writes, for each agent of a recording (times on the agents' clock)."""
    from gpumemdoctor.recording import records

    out = []
    for agent in recording.agents:
        out.append({"type": "hello", "pid": agent.pid, "ppid": agent.ppid, "t": T0, "argv": agent.argv,
                    "python": agent.python, "dist": None if agent.dist is None else agent.dist.to_json()})
        out.append({"type": "torch", "t": T0 + 0.5, "version": agent.torch_version})
        out.append({"type": "cuda", "t": T0 + (agent.cuda_t or 0)})
        out.append({"type": "devices", "t": T0 + 1, "allocator_backend": agent.allocator_backend,
                    "devices": [d.to_json() for d in agent.devices]})
        for s in agent.samples[:12]:
            out.append({"type": "s", "t": T0 + s.t, "by": s.by, "step": s.step, "d": [r.to_json() for r in s.readings]})
        for kind, (name, _) in records.RECORDS.items():
            value = agent.root.get(name)
            for item in ([value] if isinstance(value, dict) else value or []):
                out.append({"type": kind, **{k: (v + T0 if k in ("t", "t0") and isinstance(v, float) else v)
                                             for k, v in item.items()}})
        for phase, p in agent.probes.items():
            out.append({"type": "p", "phase": phase, "t": T0 + p.t, "collected": p.collected,
                        "d": [r.to_json() for r in p.readings]})
        out.append({"type": "exit", "t": T0 + recording.duration_s, "steps": agent.steps,
                    "explicit_steps": agent.explicit_steps, "cupy": agent.cupy_pool})
    return out


def _run_file(recording) -> dict:
    return {"schema": "gpumemdoctor.run/1", "tool_version": "0.1.0", "t0": T0, "started_wall": 1.7e9,
            "target_args": list(recording.target["argv"]), "pid": recording.target_pid, "create_time": 1.0,
            "cwd": "/x", "poll_interval_s": 0.005, "measure_gpu": True, "versions": {"tool": "0.1.0"},
            "devices": recording.devices, "host": "node-a"}


RUN_FOLDERS = Documents([{"run": _run_file(r), "lines": _agent_lines(r)}
                         for r in (make_recording(), load(str(FIXTURES / "leak_then_raise.json"))[0])])


def test_the_run_folders_here_are_valid():
    from gpumemdoctor.supervise.recovery import RUN_SCHEMA
    assert RUN_FOLDERS.docs[0]["run"]["schema"] == RUN_SCHEMA


@settings_for("run_folder")
@given(seed=SEEDS)
def test_a_run_folder_is_recovered_or_refused(tmp_path_factory, seed):
    """`report --from-run-dir` on a mutated run file and mutated agent lines (some cut short, some
    not JSON): a report, or the documented refusal; a report it writes is one `report` reads."""
    rnd = random.Random(seed)
    folder, done = RUN_FOLDERS.mutated(rnd)
    note("; ".join(done))
    run_dir = tmp_path_factory.mktemp("run")
    run = folder.get("run") if isinstance(folder, dict) else None
    (run_dir / "run.json").write_text(text_of(rnd, run))
    lines = folder.get("lines") if isinstance(folder, dict) else None
    pid = run.get("pid") if isinstance(run, dict) else None
    text = "".join((json.dumps(line, allow_nan=True) if rnd.randrange(30) else "{\"type\": \"s\", \"t") + "\n"
                   for line in (lines if isinstance(lines, list) else [lines]))
    named = pid if isinstance(pid, int) and not isinstance(pid, bool) and 0 <= pid < 1 << 32 else 7
    (run_dir / f"agent-{named}.jsonl").write_text(text)
    out = run_dir / "out.json"
    with no_hang():
        code, _, _ = check_contract(["report", "--from-run-dir", str(run_dir), "-o", str(out), "--force", "--width", "80"],
                                    {0, 2, 4})
        if code == 0:
            check_contract(["report", str(out), "--width", "80"], {0})


# -- strings: sizes, rates, tolerances, finding kinds -------------------------------------------------

UNITS = ["", "B", "b", "k", "K", "KiB", "kb", "MiB", "MB", "m", "GiB", "g", "GB", "TiB", "tb", "PiB", "p", "EiB", "eb", "e", "x", "iB"]
number_text = st.one_of(
    st.integers(min_value=-10**6, max_value=10**40).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.builds(lambda sign, whole, fraction, exponent: f"{sign}{whole}{fraction}{exponent}",
              st.sampled_from(["", "-", "+"]), st.sampled_from(["", "0", "1", "5", "60", "3600", "9" * 45]),
              st.sampled_from(["", ".", ".5", ".0001", ".99999999"]), st.sampled_from(["", "e3", "e400", "E-5", "e+18"])),
    st.sampled_from(["", " ", "nan", "inf", "-inf", "NaN", "1_000", "0x10", "١٢", "½", "1e400", "9" * 5000]))
size_text = st.one_of(st.text(max_size=16), st.builds(lambda n, s1, u, s2: f"{s1}{n}{s1}{u}{s2}", number_text,
                                                      st.sampled_from(["", " ", "\t", "\n"]), st.sampled_from(UNITS),
                                                      st.sampled_from(["", " ", "\n"])))


@settings_for("size")
@given(text=size_text)
def test_a_size_is_a_whole_number_of_bytes_up_to_an_exbibyte_or_refused(text):
    try:
        n = parse_size(text)
    except ValueError as exc:
        assert "512MiB" in str(exc) and len(str(exc)) < 300
        return
    assert isinstance(n, int) and 0 <= n <= MAX_SIZE_BYTES


@settings_for("rate")
@given(size=size_text, slash=st.sampled_from(["/", " / ", "", "//"]),
       per=st.sampled_from(["s", "sec", "second", "m", "min", "minute", "h", "hour", "day", "", "S", "ms"]))
def test_a_rate_is_finite_or_refused(size, slash, per):
    try:
        rate = parse_rate(f"{size}{slash}{per}")
    except ValueError:
        return
    assert math.isfinite(rate) and rate >= 0


@settings_for("tolerance")
@given(text=st.one_of(size_text, st.builds(lambda n, p: f"{n}{p}", number_text, st.sampled_from(["%", " %", "%%", "% "]))))
def test_a_tolerance_is_a_percentage_or_a_size_or_refused(text):
    try:
        tolerance = parse_tolerance(text)
    except UsageError as exc:
        assert "\n" not in str(exc)
        return
    assert isinstance(tolerance, Tolerance)
    assert math.isfinite(tolerance.fraction) and tolerance.fraction >= 0 and 0 <= tolerance.bytes <= MAX_SIZE_BYTES
    assert text.strip().endswith("%") or any(c.isalpha() for c in text)  # a bare number is refused
    assert tolerance.allowed(1 << 30) >= 1 << 30


@settings_for("kinds")
@given(names=st.lists(st.one_of(st.sampled_from(FAILABLE), st.sampled_from(["", " ", "clean", "context", "LEAK"]),
                                st.text(max_size=6)), max_size=5),
       sep=st.sampled_from([",", ", ", ",,", " ,"]))
def test_fail_on_is_known_kinds_or_refused(names, sep):
    text = sep.join(names)
    try:
        kinds = parse_kinds(text)
    except UsageError:
        return
    assert kinds and all(k in FAILABLE for k in kinds)


SECONDS = [Seconds(0.001, 60), Seconds(0.001, 10), Seconds(0.05, 3600), Seconds(0.1)]


@settings_for("seconds")
@given(text=number_text, which=st.integers(0, len(SECONDS) - 1))
def test_seconds_are_finite_and_in_range_or_refused(text, which):
    kind = SECONDS[which]
    try:
        value = kind.convert(text, None, None)
    except click.BadParameter:
        return
    assert math.isfinite(value)
    assert kind.min <= value and (kind.max is None or value <= kind.max)


# -- every numeric option, through the command line -------------------------------------------------

# (the command line before the value, after it, and the exit codes allowed). Each is made so that a
# value that is accepted ends the command at once with a usage error (a script that does not exist,
# PID 0), or with the codes of what runs (ps without NVML: 3).
OPTIONS = [
    (["run", "--allow-no-gpu", "--interval"], ["/nonexistent/t.py"], {2}),
    (["run", "--allow-no-gpu", "--poll-interval"], ["/nonexistent/t.py"], {2}),
    (["run", "--allow-no-gpu", "--max-peak"], ["/nonexistent/t.py"], {2}),
    (["run", "--allow-no-gpu", "--max-retained"], ["/nonexistent/t.py"], {2}),
    (["run", "--allow-no-gpu", "--tolerance"], ["/nonexistent/t.py"], {2}),
    (["run", "--allow-no-gpu", "--nvml-tolerance"], ["/nonexistent/t.py"], {2}),
    (["report", "--width"], ["/nonexistent/r.json"], {2}),
    (["compare", "/nonexistent/a.json", "/nonexistent/b.json", "--max-peak"], [], {2}),
    (["compare", "/nonexistent/a.json", "/nonexistent/b.json", "--tolerance"], [], {2}),
    (["watch", "--pid", "0", "--interval"], [], {2}),
    (["watch", "--pid", "0", "--duration"], [], {2}),
    (["watch", "--pid", "0", "--max-vram"], [], {2}),
    (["watch", "--pid", "0", "--max-growth"], [], {2}),
    (["watch", "--duration", "0.1", "--no-tui", "--pid"], [], {0, 2, 3}),
    (["ps", "--expect-free"], [], {0, 2, 3, 11}),
]


@settings_for("options")
@given(which=st.integers(0, len(OPTIONS) - 1),
       value=st.one_of(number_text, size_text, st.builds(lambda s, p: f"{s}/{p}", size_text, st.sampled_from(["s", "min", "h"]))))
def test_every_numeric_option_keeps_the_exit_code_contract(which, value):
    before, after, allowed = OPTIONS[which]
    with no_hang():
        check_contract([*before, value, *after], allowed)


def test_the_examples_add_up_to_ten_thousand():
    assert sum(EXAMPLES.values()) >= 10_000


def test_a_doctor_error_is_what_the_parsers_raise():
    # The properties above accept BadReportError and UsageError as refusals: both are DoctorErrors,
    # which the command line turns into one line and their exit code.
    assert issubclass(BadReportError, DoctorError) and issubclass(UsageError, DoctorError)
    with pytest.raises(BadReportError):
        parse([])
