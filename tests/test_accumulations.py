"""Accumulations over phases (issue 32) on the GPU recordings of the scenarios and workloads written
for them: a staircase that each validation or evaluation adds to is a leak held by its container
(the running sum's autograd graph included), an accumulation that a pause lets go of at its end is
the avoidable-peak warning with its holder, and what is filled once stays clean.

Skipped until the recordings exist. The lead records them on one GPU, in one call:

    GPUMEMDOCTOR_FIXTURE_DIR=/tmp/fx python3 -m pytest -q -n 4 tests/gpu/test_scenarios.py \\
        tests/gpu/test_corpus.py -k "<the names below, joined by or>"

then copies /tmp/fx/NAME.json into tests/fixtures/reports/ and /tmp/fx/corpus/NAME.json into
tests/fixtures/corpus/, and drops the names from the PENDING.txt beside them."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpumemdoctor.diagnosis.diagnose import diagnose
from gpumemdoctor.recording.recording import Recording
from tests.expect import CORPUS_DIR, SCENARIO_DIR, expectations, root_cause

FIXTURES = Path(__file__).parent / "fixtures"
STAIRCASES = ["leak_validation_staircase", "leak_eval_sum_kept", "corpus/lightning_validation_kept"]
PHASE_BOUND = ["clean_validation_outputs_cleared", "clean_eval_sum_without_no_grad",
               "corpus/lightning_validation_cleared", "corpus/hf_eval_without_no_grad"]
FILLED_ONCE = ["clean_validation_ring", "clean_dataset_on_gpu"]


def recorded(name: str):
    """(the program, its report, the diagnosis of its recording), or skip while it is not recorded."""
    folder, _, stem = name.rpartition("/")
    path = FIXTURES / (folder or "reports") / f"{stem}.json"
    if not path.exists():
        pytest.skip(f"{stem}: its GPU recording is pending (PENDING.txt)")
    report = json.loads(path.read_text())
    program = (CORPUS_DIR if folder else SCENARIO_DIR) / f"{stem}.py"
    return program, report, diagnose(Recording.from_json(report["recording"]))


def phase_searches(report: dict) -> list[dict]:
    return [s for a in report["recording"]["agents"] for s in a["root"]["investigations"] if s["when"] == "phase"]


@pytest.mark.parametrize("name", STAIRCASES)
def test_a_staircase_is_a_leak_held_by_its_container(name):
    program, report, d = recorded(name)
    assert d.verdict == "leak" == expectations(program)[0]
    leak = next(f for f in d.findings if f.kind == "leak")
    # Two steps, the second after the last training step: no steady slope, the phases decide.
    assert leak.evidence["decided_by"] == "phases", leak.evidence
    assert len(leak.evidence["stairs"]) >= 2
    want = root_cause(program)
    holder = leak.suspects[0]["holders"][0]
    assert holder["pattern"].startswith(want["holder"]) and holder["kind"] == want["holder-kind"]
    assert "Each pause adds a step" in leak.summary


@pytest.mark.parametrize("name", PHASE_BOUND)
def test_an_accumulation_a_pause_lets_go_of_is_the_avoidable_peak_never_a_leak(name):
    program, report, d = recorded(name)
    assert d.verdict in ("clean", "allocator-cache")
    assert not [f for f in d.findings if f.kind == "leak"]
    peak = next(f for f in d.findings if f.kind == "avoidable-peak")
    assert peak.evidence["decided_by"] == "phases" and peak.evidence["pauses"]
    assert all(p["kept_bytes"] <= 0.25 * p["rise_bytes"] or p["kept_bytes"] <= 16 << 20
               for p in peak.evidence["pauses"])
    assert phase_searches(report), "no search was made at a pause's height"
    want = root_cause(program)
    top = peak.suspects[0]
    assert top["holders"][0]["pattern"].startswith(want["holder"]), top
    if "holder-kind" in want:
        assert top["holders"][0]["kind"] == want["holder-kind"]
    if want.get("holder-kind") == "autograd-graph":
        assert "torch.no_grad()" in peak.remedy and "loss.item()" in peak.remedy
        assert "model.eval() does not stop autograd" in peak.remedy


@pytest.mark.parametrize("name", FILLED_ONCE)
def test_what_is_filled_once_stays_clean(name):
    _, _, d = recorded(name)
    assert d.verdict == "clean"
    assert {f.kind for f in d.findings} & {"leak", "avoidable-peak"} == set()


@pytest.mark.parametrize("name", STAIRCASES + PHASE_BOUND + FILLED_ONCE)
def test_the_searches_at_a_pause_cost_the_program_one_fork(name):
    """The search at a pause's height pauses the program once, in its evaluation (the roots and the
    fork on its main thread), at most twice a run, within the copy's limit of issue 18."""
    _, report, _ = recorded(name)
    assert len(phase_searches(report)) <= 2
    for agent in report["recording"]["agents"]:
        cost = (agent.get("exit_info") or {}).get("cost") or {}
        assert cost.get("phase_pause_s", 0.0) <= 0.1, cost
        assert cost.get("search_pause_max_s", 0.0) <= 0.1, cost
