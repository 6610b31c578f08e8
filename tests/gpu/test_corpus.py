"""The corpus of real-library workloads (corpus/: Hugging Face transformers, PyTorch Lightning,
torchvision with DataLoader workers, a program with a million-object heap), each run for real under
`gpumemdoctor run`: every clean one comes out clean, every leaky one a leak with its holder named.
A workload whose library is missing here exits 77 and is skipped.

Set GPUMEMDOCTOR_FIXTURE_DIR to keep each report in DIR/corpus: that is how tests/fixtures/corpus
is made. Timings (plain against the tool) are benchmarks/corpus.py's business, not these tests'.
"""
from __future__ import annotations

import pytest

from pathlib import Path

from tests.expect import corpus, expectations, root_cause
from tests.gpu.runs import check_suspect, keep_run, run_scenario

WORKLOADS = corpus()
CLEAN = ("clean", "allocator-cache")  # a clean program may end with memory in the cache


@pytest.mark.parametrize("path", WORKLOADS, ids=[p.stem for p in WORKLOADS])
def test_workload_gets_its_verdict_and_its_holder(path, tmp_path):
    report = run_scenario(path, tmp_path, subdir="corpus", timeout=600)
    verdict, _ = expectations(path)
    assert report["_returncode"] == 0, report["_stderr"]
    if verdict == "clean":
        assert report["verdict"] in CLEAN, (report["findings"], report["_stderr"])
    else:
        assert report["verdict"] == verdict, (report["findings"], report["_stderr"])
    if root_cause(path):
        check_suspect(path, report)
    # Every search says its budget (benchmarks/corpus.py holds each to it).
    for agent in report["recording"]["agents"]:
        for search in agent["root"]["investigations"]:
            assert search["budget_s"] is not None, search


def test_the_trainers_evaluation_inside_train_gets_the_trainers_switches(tmp_path):
    """Issue 56: a Trainer that evaluates each epoch inside trainer.train() with compute_metrics and no
    eval_accumulation_steps fills the cache with logits concatenated batch after batch: the finding
    names the Trainer's loop and its switches, never torch.no_grad() (the Trainer evaluates under it)."""
    from tests.test_claims import problems

    path = Path(__file__).resolve().parents[2] / "corpus" / "hf_trainer_train_eval_logits.py"
    report = run_scenario(path, tmp_path, subdir="corpus", timeout=600)
    assert report["_returncode"] == 0, report["_stderr"]
    found = [f for f in report["findings"] if "library-loop" in {c["claim"] for c in f.get("claims") or []}]
    assert found, report["findings"]
    assert "eval_accumulation_steps" in found[0]["remedy"] and "preprocess_logits_for_metrics" in found[0]["remedy"]
    text = " ".join(f["summary"] + " " + f["remedy"] for f in report["findings"])
    assert "no_grad" not in text, text
    assert not [p for f in report["findings"] for p in problems(f)]


def test_the_trainers_evaluation_gets_the_same_verdict_and_claims_every_run(tmp_path):
    """Issue 56's done-when: three runs of the Trainer's workload, the same verdict, findings and claims."""
    path = Path(__file__).resolve().parents[2] / "corpus" / "hf_trainer_train_eval_logits.py"
    seen = []
    for i in range(3):
        (tmp_path / str(i)).mkdir()
        report = run_scenario(path, tmp_path / str(i), subdir="corpus", timeout=600)
        assert report["_returncode"] == 0, report["_stderr"]
        seen.append((report["verdict"], sorted((f["kind"], tuple(sorted(c["claim"] for c in f.get("claims") or [])))
                                               for f in report["findings"] if f["kind"] != "context")))
        keep_run(path, tmp_path / str(i) / "report.json", i, subdir="corpus")
    print(path.stem, seen)  # shown with -rA: the three runs' verdicts and claims
    assert seen[0] == seen[1] == seen[2], seen
