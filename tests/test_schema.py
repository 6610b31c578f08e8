"""The declared shapes and the one strict parser (files/schema.py), and the declarations of the
recording, the report and the baseline read through it."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from gpumemdoctor.diagnosis import ci_checks
from gpumemdoctor.errors import BadReportError
from gpumemdoctor.files.schema import (ANY, INT, SIZE, STR, Shape, absent, dict_of, list_of, may, null_as, opt, pair,
                                       row, written)
from gpumemdoctor.recording import recording as recording_module
from gpumemdoctor.diagnosis import report_file

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
