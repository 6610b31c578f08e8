"""A job of several recordings (diagnosis/job.py's `merged`): each run's notes say which run they came
from, and reports from runs with different run ids are questioned. The words are summaries_ranks.py's."""
from __future__ import annotations

from types import SimpleNamespace

from gpumemdoctor.diagnosis import job
from gpumemdoctor.diagnosis.findings import Diagnosis


def _run(host, pid: int, run_id: str, note: str):
    agent = SimpleNamespace(dist=SimpleNamespace(run_id=run_id))
    return SimpleNamespace(host=host, target_pid=pid, agents=[agent]), Diagnosis(verdict=None, notes=[note])


def test_each_runs_notes_name_it_and_different_run_ids_are_questioned():
    runs = [_run("node-a", 11, "job-2", "a note"), _run(None, 22, "job-1", "another")]
    merged = job.merged([r for r, _ in runs], [p for _, p in runs])
    assert merged.notes == ["node-a: a note", "the run of process 22: another",
                            "the reports come from runs with different run ids (job-1, job-2): are they one job?"]


def test_one_run_id_is_not_questioned():
    runs = [_run("node-a", 11, "job-1", "a note"), _run("node-b", 22, "job-1", "another")]
    merged = job.merged([r for r, _ in runs], [p for _, p in runs])
    assert merged.notes == ["node-a: a note", "node-b: another"]
