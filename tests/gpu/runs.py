"""Running a program for real under `gpumemdoctor run` on a GPU, and checking what the report says
of its root cause against the program's own `# expect-...` lines (tests/expect.py). Shared by the
scenarios and the corpus of real-library workloads.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.expect import expectations, extra_args, root_cause

SKIP_EXIT = 77
# The GPU suite may run in several pytest-xdist workers at once (`-n 4`): programs share the GPU,
# but one that fills it (the out-of-memory scenarios) runs alone. A lock file all workers see.
GPU_LOCK = Path(tempfile.gettempdir()) / "gpumemdoctor-gpu-tests.lock"


@contextlib.contextmanager
def gpu_turn(alone: bool):
    """Shared with other programs, or the GPU to itself (waits for the others to end)."""
    with open(GPU_LOCK, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# Scenarios whose judgement rests on samples a few tens of ms apart: beside seven other programs a
# sample cost about 1 ms of the sampler's thread, its pace (1% of the program's time) stretched the
# interval to 100-170 ms, and a 0.1-0.2 s validation could fall between two samples (once in four
# runs of clean_validation_outputs_cleared), a 1.5 s growth outside PyTorch got too few, a short
# program one. Alone, as a user's program runs, they do not. (A list here, not a header line in the
# scenarios: a line there would move their allocating lines away from their recordings'.)
RUN_ALONE = {"clean_validation_outputs_cleared", "clean_eval_sum_without_no_grad", "clean_validation_ring",
             "leak_validation_staircase", "non_torch_threads", "peak_fragmented"}


def fills_the_gpu(path: Path) -> bool:
    """An out-of-memory scenario, or one of RUN_ALONE: it runs with the GPU to itself."""
    return path.stem.startswith("oom_") or path.stem in RUN_ALONE


def cached_report(path: Path, cache: Path, run) -> dict:
    """The report of `path`, run once for all the tests and workers that ask for it."""
    cache.mkdir(parents=True, exist_ok=True)
    saved = cache / f"{path.stem}.json"
    with open(cache / f"{path.stem}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if saved.exists():
                data = json.loads(saved.read_text())
                if data.get("_skip"):
                    pytest.skip(data["_skip"])
                return data
            try:
                data = run()
            except pytest.skip.Exception as exc:
                saved.write_text(json.dumps({"_skip": str(exc)}))
                raise
            saved.write_text(json.dumps(data))
            return data
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def run_scenario(path: Path, tmp_path: Path, env: dict | None = None, args: tuple = (),
                 subdir: str = "", timeout: float = 300) -> dict:
    report = tmp_path / "report.json"
    with gpu_turn(alone=fills_the_gpu(path)):
        proc = subprocess.run([sys.executable, "-m", "gpumemdoctor", "run", "-o", str(report),
                               *extra_args(path), *args, str(path)],
                              cwd=tmp_path, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})})
    if proc.returncode == SKIP_EXIT:
        pytest.skip(proc.stderr.strip().splitlines()[0] if proc.stderr.strip() else "scenario skipped")
    assert report.exists(), proc.stderr
    data = json.loads(report.read_text())
    keep = os.environ.get("GPUMEMDOCTOR_FIXTURE_DIR")
    if keep and not env and not args:
        keep = str(Path(keep) / subdir) if subdir else keep
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(report, Path(keep) / f"{path.stem}.json")
        (Path(keep) / f"{path.stem}.stderr.txt").write_text(proc.stderr)
    data["_stderr"] = proc.stderr
    data["_returncode"] = proc.returncode
    return data


def keep_run(path: Path, report: Path, run: int, subdir: str = "") -> None:
    """With GPUMEMDOCTOR_FIXTURE_DIR set, keep one of several runs' reports as DIR[/subdir]/<stem>.run<N>.json."""
    keep = os.environ.get("GPUMEMDOCTOR_FIXTURE_DIR")
    if keep:
        folder = Path(keep) / subdir if subdir else Path(keep)
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(report, folder / f"{path.stem}.run{run}.json")


def check_suspect(path: Path, report: dict) -> None:
    """The finding the program's lines name carries a suspect with the named holder (and, with
    allocation stacks, the marked allocating line)."""
    want = root_cause(path)
    verdict, _ = expectations(path)
    finding = next(f for f in report["findings"] if f["kind"] == want.get("suspects-on", verdict))
    assert finding["suspects"], (finding["evidence"], report["_stderr"])
    top = finding["suspects"][0]
    searched = finding["evidence"].get("root_cause") or {}
    if searched.get("allocation_stacks") or top["where"] is not None:
        # Without allocation stacks (a run too short for --trace auto to turn them on) only the
        # holder can be named; with them, the allocating line must be the marked one.
        assert top["where"] is not None, top
        assert Path(top["where"][0]).name == path.name and top["where"][1] == want["line"], top
    assert top["holders"], top
    holder = top["holders"][0]
    assert holder["pattern"].startswith(want["holder"]), holder
    if "holder-kind" in want:
        assert holder["kind"] == want["holder-kind"], holder
    if "thread" in want:
        assert top["thread"] and any(t.startswith(want["thread"]) for t in top["thread"]), top
        assert any("(ended)" in t for t in top["thread"]), top
    # The whole of what was found is accounted for by the top suspect's holder pattern.
    assert holder["bytes"] >= 0.9 * top["bytes"], top
