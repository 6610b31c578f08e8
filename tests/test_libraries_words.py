"""The words diagnosis/libraries.py adds to a finding outside PyTorch: the libraries the process
imported, by name and time, and each one's switch in the remedy; a library this version does not know
(named by a newer agent) adds nothing, rather than an empty list."""
from __future__ import annotations

from types import SimpleNamespace

from gpumemdoctor.diagnosis.findings import Finding
from gpumemdoctor.diagnosis.libraries import name_holders


def _named(libraries: list[dict]) -> Finding:
    f = Finding(kind="non-torch", bytes=1 << 30, summary="Memory outside PyTorch grew.", evidence={},
                remedy="Look at the other libraries.")
    name_holders(f, SimpleNamespace(root={"libraries": libraries}, exit_info={}))
    return f


def test_a_known_library_is_named_with_when_and_its_switch():
    f = _named([{"name": "cupy", "t": 2.25}])
    assert f.summary == ("Memory outside PyTorch grew. GPU libraries in the process besides PyTorch: "
                         "CuPy (imported at 2.2 s).")
    assert f.remedy.startswith("Look at the other libraries. CuPy: ") and f.remedy.endswith(".")
    assert f.evidence["libraries"] == [{"name": "cupy", "t": 2.25}]


def test_a_library_this_version_does_not_know_adds_no_words():
    f = _named([{"name": "mxnet", "t": 1.0}])
    assert f.summary == "Memory outside PyTorch grew." and f.remedy == "Look at the other libraries."
    assert f.evidence["libraries"] == [{"name": "mxnet", "t": 1.0}]  # kept as recorded
