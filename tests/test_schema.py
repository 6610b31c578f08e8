"""The declared shapes and the one strict parser (files/schema.py), and the declarations of the
recording, the report and the baseline read through it."""
from __future__ import annotations

import copy
import io
import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from gpumemdoctor.diagnosis import ci_checks
from gpumemdoctor.diagnosis.diagnose import diagnose, diagnose_job
from gpumemdoctor.errors import BadReportError
from gpumemdoctor.files.schema import (ANY, INT, SIZE, STR, Shape, absent, dict_of, list_of, may, null_as, opt, pair,
                                       row, since, then, write, written)
from gpumemdoctor.recording import recording as recording_module
from gpumemdoctor.app import report_file
from gpumemdoctor.reporters import ci_checks as ci_reporter
from gpumemdoctor.reporters import html, terminal
from gpumemdoctor.supervise import recovery

from . import schema_walk

REPORT = Path(__file__).parent / "fixtures" / "reports" / "leak_training_list.json"


def test_a_shape_reads_each_declared_field_by_its_check():
    shape = Shape({"pid": INT, "name": opt(STR), "sizes": absent(list_of(SIZE), []), "note": may(STR),
                   "kept": written(opt(SIZE))})
    assert shape({"pid": 3, "kept": None, "extra": 1}, "x") == {"pid": 3, "name": None, "sizes": [], "kept": None}
    assert shape({"pid": 3, "kept": 5, "note": "n", "sizes": [1]}, "x") == {
        "pid": 3, "name": None, "sizes": [1], "note": "n", "kept": 5}


@pytest.mark.parametrize("obj, words", [
    ({"kept": 1}, "x pid: expected an integer"),  # missing and not optional
    ({"pid": True, "kept": 1}, "x pid: expected an integer"),  # a bool is no integer
    ({"pid": 1, "kept": -1}, "x kept: expected a size"),
    ({"pid": 1}, "x: kept missing"),  # written(...) must be there, even as null
    ({"pid": 1, "kept": 1, "sizes": None}, "x sizes: expected a list"),  # absent is not null
    ({"pid": 1, "kept": 1, "note": 3}, "x note: expected a string"),
    ([1], "x: expected an object"),
])
def test_a_shape_refuses_what_its_declaration_does_not_allow(obj, words):
    shape = Shape({"pid": INT, "sizes": absent(list_of(SIZE), []), "note": may(STR), "kept": written(opt(SIZE))})
    with pytest.raises(BadReportError) as info:
        shape(obj, "x")
    assert words in str(info.value)


def test_rest_keeps_undeclared_fields_in_the_objects_order_and_rename_names_the_result():
    shape = Shape({"pid": INT, "d": list_of(INT)}, rest=ANY, rename={"d": "readings"})
    out = shape({"z": 1, "d": [2], "pid": 3, "a": None}, "x")
    assert list(out) == ["z", "readings", "pid", "a"] and out["readings"] == [2]


def test_the_composers_check_every_part_and_say_where():
    assert row(INT, opt(SIZE), opt(SIZE), least=2)([1, None], "r") == [1, None]
    with pytest.raises(BadReportError, match="2 to 3 items"):
        row(INT, opt(SIZE), opt(SIZE), least=2)([1], "r")
    with pytest.raises(BadReportError, match="a pair"):
        pair(INT, INT)([1, 2, 3], "p")
    assert null_as([], list_of(INT))(None, "l") == []
    with pytest.raises(BadReportError) as info:
        dict_of(STR, INT)({"a\nb": "1"}, "d")
    assert "\n" not in str(info.value) and "'a\\nb'" in str(info.value)


def _report() -> dict:
    return json.loads(REPORT.read_text())


# Each declared field of a real report, with a value of the wrong type in its place: the report is
# refused, naming the field. (A declaration that forgot its check would let the value through.)
WRONG_TYPE_CASES = [
    (("verdict",), "no-such-verdict"),
    (("findings", 0, "kind"), "no-such-kind"),
    (("findings", 0, "bytes"), -1),
    (("findings", 0, "summary"), 3),
    (("findings", 0, "evidence", "decided_by"), 3),
    (("findings", 0, "pid"), "1"),
    (("breakdown", 0, "pid"), None),
    (("breakdown", 0, "context_bytes"), "512MiB"),
    (("breakdown", 0, "exit_probes"), "yes"),
    (("breakdown", 0, "nccl"), 1),
    (("growth", 0, "grown_bytes"), 1.5),
    (("growth", 0, "rate_bytes_per_s"), "fast"),
    (("peaks", "nvml_bytes"), -5),
    (("evidence", 0, "samples"), None),
    (("recording", "duration_s"), "long"),
    (("recording", "agents", 0, "pid"), None),
    (("recording", "agents", 0, "samples", 0, "d", 0), [0, "x", None, None, None, None]),
    (("recording", "agents", 0, "probes"), {"not-a-phase": {}}),
    (("recording", "agents", 0, "exited_normally"), "true"),
    (("recording", "agents", 0, "root", "investigations"), {}),
    (("recording", "processes", 0, "is_target"), 1),
    (("recording", "target", "exit_code"), "0"),
    (("recording", "nvml", 0, "points", 0), [0.0]),
]


@pytest.mark.parametrize("path, value", WRONG_TYPE_CASES, ids=lambda v: "/".join(map(str, v))
                         if isinstance(v, tuple) else None)
def test_every_declared_field_of_a_real_report_is_checked(path, value):
    report = _report()
    report_file.parse(copy.deepcopy(report))  # the report as recorded is read
    target = report
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(BadReportError):
        report_file.parse(report)


def test_a_real_report_reads_back_to_the_same_document():
    report = _report()
    recording, diagnosis = report_file.parse(copy.deepcopy(report))
    again = report_file.build(recording, diagnosis)
    assert again["recording"] == report["recording"]
    assert again["findings"] == report["findings"] and again["breakdown"] == report["breakdown"]


@pytest.mark.parametrize("cls", list(recording_module.SHAPES), ids=lambda c: c.__name__)
@settings(max_examples=25, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rnd=st.randoms(use_true_random=False))
def test_each_class_of_the_recording_is_written_as_its_declaration_reads_it(cls, rnd):
    """The one codec: what a class's shape reads from a document made from the shape, written by
    `to_json` and read again, is the same record, and the written document is plain JSON."""
    declared = recording_module.SHAPES[cls]
    document = schema_walk.make(declared.check, rnd)
    if cls is recording_module.Recording:
        document["schema"] = recording_module.SCHEMA
    read = cls.from_json(copy.deepcopy(document))
    written_out = read.to_json()
    assert json.loads(json.dumps(written_out)) == written_out  # no tuple, no number as a key
    assert cls.from_json(written_out) == read


def test_write_inverts_each_composer_and_leaves_a_later_field_out_at_its_default():
    points = then(list_of(pair(INT, INT)), lambda rows: {a: b for a, b in rows}, lambda d: [[a, b] for a, b in d.items()])
    shape = Shape({"a": INT, "points": absent(points, {}), "new": since(opt(STR), None), "rest": may(STR)})
    read = shape({"a": 1, "points": [[2, 3]]}, "x")
    assert read == {"a": 1, "points": {2: 3}, "new": None}
    assert write(shape, read) == {"a": 1, "points": [[2, 3]]}  # "new" at its default is not written
    assert write(shape, {**read, "new": "n", "rest": "r"}) == {"a": 1, "points": [[2, 3]], "new": "n", "rest": "r"}
    keyed = dict_of(schema_walk.schema.need_int_key, INT)
    assert write(keyed, keyed({"7": 1}, "x")) == {"7": 1}


def test_a_recording_with_a_shared_default_root_gets_its_own():
    """`absent(..., empty_root)` makes a fresh root per agent: filling one never fills another."""
    document = _report()["recording"]
    for agent in document["agents"]:
        agent.pop("root", None)
    document["agents"].append(copy.deepcopy(document["agents"][0]) | {"pid": 99})
    rec = recording_module.Recording.from_json(document)
    rec.agents[0].root["suspicions"].append({"t": 0})
    assert rec.agents[1].root["suspicions"] == []


def test_a_baseline_names_each_figure_and_every_rank():
    figures = {key: 1 for key in ci_checks.RANK_FIGURES}
    doc = {"schema": ci_checks.BASELINE_SCHEMA, "tool_version": "0.1.0", "figures": figures,
           "ranks": {"0": figures, "1": dict(figures)}}
    out = ci_checks.parse_baseline(copy.deepcopy(doc))
    assert out["ranks"][1] == figures and {k: out[k] for k in figures} == figures
    missing = copy.deepcopy(doc)
    del missing["ranks"]["1"][next(iter(figures))]
    with pytest.raises(BadReportError, match="missing"):
        ci_checks.parse_baseline(missing)
    with pytest.raises(BadReportError, match="number as the key"):
        ci_checks.parse_baseline(doc | {"ranks": {"one": figures}})


# -- every field, strictly (issue 61) ---------------------------------------------------------
# The report and the recording in it are read by their declarations alone (report_file.REPORT,
# recording.RECORDING): what the reporters, `compare` and the CI checks read must be declared
# there, and each declared field must refuse what no run can write.

FIXTURES = Path(__file__).parent / "fixtures"
# Every report recorded on a GPU, under tests/fixtures (reports, corpus, ranks, caught, ...).
RECORDED = sorted(p for p in FIXTURES.rglob("*.json")
                  if json.loads(p.read_text()).__class__ is dict
                  and json.loads(p.read_text()).get("schema") == report_file.SCHEMA)
# The whole document as parse reads it: the report's fields, and the recording's.
WHOLE = Shape({**report_file.REPORT.fields, "recording": recording_module.RECORDING})


def test_the_fixtures_hold_the_reports_recorded_on_gpus():
    assert len(RECORDED) >= 120 and {p.parent.name for p in RECORDED} >= {"reports", "corpus", "ranks", "caught"}


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_recorded_report_is_read_by_the_strict_parser(path):
    recording, diagnosis = report_file.load(str(path))
    assert recording.target_pid is not None and recording.devices and diagnosis.findings


def _located_once() -> dict[tuple, tuple]:
    """Each field that the recorded reports hold, by its place in the declaration: the smallest report
    that has it, and where it is in that report."""
    first: dict[tuple, tuple] = {}
    for path in sorted(RECORDED, key=lambda p: p.stat().st_size):
        doc = json.loads(path.read_text())
        for where, general, check, name in schema_walk.located(WHOLE, doc):
            first.setdefault(general, (path, where, check, name))
    return first


LOCATED = _located_once()


def test_the_recorded_reports_hold_most_declared_fields():
    """What the field-by-field test below covers; the declarations the reports do not reach are the
    Hypothesis test's (test_every_declared_shape_refuses_a_wrong_value_in_any_field)."""
    declared = {general for general, _ in schema_walk.leaves(WHOLE)}
    assert len(LOCATED) >= 500 and len(set(LOCATED) & declared) / len(declared) > 0.6


def test_every_field_of_the_recorded_reports_refuses_what_no_run_writes():
    """Each field the recorded reports hold, set to each wrong value of its kind (a PID as a string or
    of 2**70, a time of 1e308, a negative size, a list where an object goes...): the report is refused,
    one BadReportError that names the field, never another error."""
    docs: dict[Path, dict] = {}
    tried = 0
    for general, (path, where, check, name) in sorted(LOCATED.items(), key=lambda item: str(item[0])):
        doc = docs.setdefault(path, json.loads(path.read_text()))
        *above, last = where
        parent = doc
        for key in above:
            parent = parent[key]
        saved = parent[last]
        for wrong in schema_walk.wrong_values(check):
            parent[last] = wrong
            try:
                report_file.parse(doc)
            except BadReportError as exc:
                assert re.search(rf"(^|\W){re.escape(name)}(\W|$)", str(exc)), (general, wrong, str(exc))
            else:
                raise AssertionError(f"{path.name}: {'/'.join(map(str, where))} = {wrong!r} was read")
            finally:
                parent[last] = saved
            tried += 1
    assert tried > 2000


# Every declared object, from the report down to each record of the recording, and the baseline's and
# the run file's (`report --from-run-dir`).
SHAPES = sorted({id(c): c for root in (WHOLE, ci_checks.BASELINE, recovery.RUN_INFO)
                 for c in schema_walk.composers(root) if isinstance(c, Shape)}.values(), key=lambda s: sorted(s.fields))


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: ",".join(list(s.fields)[:3])[:40])
@settings(max_examples=25, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rnd=st.randoms(use_true_random=False))
def test_every_declared_shape_refuses_a_wrong_value_in_any_field(shape, rnd):
    """Hypothesis over the declarations: an object made from its declaration is read; the same object
    with one field (any, at any depth) set to a wrong value of its kind is refused, naming the field."""
    value = schema_walk.make(shape, rnd)
    shape(copy.deepcopy(value), "x")
    fields = [f for f in schema_walk.located(shape, value) if schema_walk.wrong_values(f[2])]
    if not fields:
        return
    where, general, check, name = rnd.choice(fields)
    wrong = rnd.choice(schema_walk.wrong_values(check))
    damaged = copy.deepcopy(value)
    parent = damaged
    for key in where[:-1]:
        parent = parent[key]
    if where:
        parent[where[-1]] = wrong
    else:
        damaged = wrong
    with pytest.raises(BadReportError) as info:
        shape(damaged, "x")
    assert not name or re.search(rf"(^|\W){re.escape(name)}(\W|$)", str(info.value)), (general, wrong, str(info.value))


def test_every_leaf_kind_has_its_wrong_values_and_its_values():
    kinds = {check for _, check in schema_walk.leaves(WHOLE) if not isinstance(check, schema_walk.COMPOSERS)}
    assert kinds <= set(schema_walk.LEAF_VALUES) and kinds <= set(schema_walk.WRONG)
    for kind in kinds:
        assert all(schema_walk.refuses(kind, v) for v in schema_walk.WRONG[kind]), kind


def _draw_everything(recording, diagnosis, path: str) -> None:
    """What `report` (in the terminal and as a page, judged again), `compare` and the CI checks read of a
    report."""
    for judged in (diagnosis, diagnose(recording)):
        terminal.render(Console(file=io.StringIO(), width=80), recording, judged, path)
    html.render(recording, diagnosis, path)
    figures, ranks, parts = (ci_checks.figures(recording, diagnosis), ci_checks.rank_figures(recording, diagnosis),
                             ci_checks.peak_parts(diagnosis))
    policy = ci_checks.Policy(max_peak_bytes=1, max_retained_bytes=1, fail_on=ci_checks.FAILABLE, baseline=figures,
                              baseline_ranks=ranks or None, baseline_peak_parts=parts,
                              nvml_tolerance=ci_checks.Tolerance())
    results = ci_checks.evaluate(recording, diagnosis, policy)
    console = Console(file=io.StringIO(), width=80)
    ci_reporter.render(console, results)
    ci_reporter.render_comparison(console, diagnosis.verdict, diagnosis.verdict, figures, figures, ranks, ranks,
                                  ci_checks.peak_growth(parts, parts), parts, parts)
    notes = ci_reporter.comparison_notes(recording, recording)
    ci_reporter.junit_xml(results, notes=notes)
    ci_reporter.markdown_summary(path, diagnosis.verdict, figures, results, notes=notes)
    ci_checks.baseline_document(recording, diagnosis)


def test_every_field_that_is_read_of_a_recorded_report_is_declared(monkeypatch):
    """Each recorded report drawn by every reporter, judged again, compared and checked, with what the
    declarations keep as data (a finding's evidence beyond its drawn fields, the target's own fields, a
    device's) watched: no code reads a field of it that no declaration names, so each field read was
    read strictly. (Before issue 61: a device's name, evidence's host, an out-of-memory error's t, a
    search's searched and gave_up.)"""
    pytest.importorskip("plotly")
    reads = schema_walk.trace_reads(monkeypatch, WHOLE)
    for path in RECORDED:
        recording, diagnosis = report_file.load(str(path))
        _draw_everything(recording, diagnosis, str(path))
    two_nodes = [str(FIXTURES / "ranks_two_gpus" / f"two_nodes_node{n}.json") for n in (0, 1)]
    recordings = [report_file.load(p)[0] for p in two_nodes]
    job = diagnose_job(recordings)
    terminal.render_job(Console(file=io.StringIO(), width=80), recordings, job, two_nodes)
    html.render_job(recordings, job, two_nodes)
    assert not reads, sorted(reads)


def test_the_watch_on_undeclared_reads_sees_them(monkeypatch):
    """The test above can fail: a field taken out of its declaration is seen read."""
    monkeypatch.delitem(report_file.ROOT_CAUSE.fields, "searched")
    reads = schema_walk.trace_reads(monkeypatch, WHOLE)
    recording, diagnosis = report_file.load(str(FIXTURES / "reports" / "leak_training_list.json"))
    _draw_everything(recording, diagnosis, "leak_training_list.json")
    assert ("report findings evidence root_cause", "searched") in reads
