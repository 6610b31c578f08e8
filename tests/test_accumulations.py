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
    # A search at the pause's height (in a copy), or, where that copy would have paused the program
    # past the limit, the probe made there (issue 31): either names the holder.
    cause = peak.evidence["root_cause"]
    assert phase_searches(report) or cause.get("probed"), "neither a search nor a probe at a pause's height"
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


# -- the wiring, end to end, on a SYNTHETIC recording (built here, not measured) -------------------

MiB = 1 << 20


def synthetic_evaluation_run():
    """A made-up training run: 240 steps at 500 MiB whose steps reach 600 MiB, with an evaluation
    after step 120 that rises to 1.8 GiB over 0.3 s and lets it go; a search at its height (as
    phase_watch makes one) found the evaluation's running sum holding 60 saved tensors."""
    from gpumemdoctor.recording import records
    from gpumemdoctor.recording.recording import AgentRecording, DeviceReading, Recording, TorchDevice, TorchSample

    def reading(allocated):
        return DeviceReading(torch_index=0, allocated_bytes=allocated, active_bytes=allocated,
                             reserved_bytes=2 << 30, requested_bytes=allocated, nvml_used_bytes=(2 << 30) + 500 * MiB,
                             allocated_peak_bytes=max(allocated, 600 * MiB), reserved_peak_bytes=2 << 30)

    samples, t = [], 1.0
    for step in range(1, 241):
        t += 0.005
        samples.append(TorchSample(t=t, by="step", step=step, readings=[reading(500 * MiB)]))
        if step == 120:
            for i in range(15):
                t += 0.02
                samples.append(TorchSample(t=t, by="time", step=120, readings=[reading((500 + 90 * i) * MiB)]))
    end = reading(500 * MiB)
    probes = {p: TorchSample(t=t + 0.1, by=p, step=None, readings=[end]) for p in ("end", "gc", "sync", "empty_cache")}
    real = json.loads((FIXTURES / "reports" / "leak_loss_graph.json").read_text())
    search = dict(real["recording"]["agents"][0]["root"]["investigations"][-1])
    graph = "thread 'MainThread': evaluate() at e.py local total"
    search.update(when="phase", t=1.9, step=120, forked=True, trace=True, groups=[
        {"device": 0, "new": True, "bytes": 60 * 20 * MiB, "count": 60, "frames": [["/work/e.py", 12, "evaluate"]],
         "thread": None, "unheld_bytes": 0, "unheld_count": 0, "unheld_sizes": [], "unheld_why": [],
         "holders": [{"path": "thread 'MainThread': evaluate() at e.py:12 local total.grad_fn (3 autograd nodes down)._saved_result",
                      "pattern": graph + ".grad_fn (autograd graph)", "kind": "autograd-graph", "count": 59,
                      "bytes": 59 * 20 * MiB, "sizes": [[20 * MiB, 59]]},
                     {"path": "thread 'MainThread': evaluate() at e.py:12 local total", "pattern": graph,
                      "kind": "frame-local", "count": 1, "bytes": 20 * MiB, "sizes": [[20 * MiB, 1]]}]}])
    root = records.empty_root()
    root["investigations"].append(search)
    agent = AgentRecording(pid=7, ppid=1, argv=["train.py"], python="3.11.7", torch_version="2.13.0", cuda_t=0.9,
                           allocator_backend="native", samples=samples, probes=probes, steps=240,
                           explicit_steps=False, exited_normally=True, root=root,
                           devices=[TorchDevice(index=0, uuid="GPU-0", pci_bus_id="0:1", name="Test GPU", nvml_index=0)])
    return Recording(tool_version="0.1.0", target={"argv": ["train.py"], "pid": 7, "exit_code": 0, "signal": None,
                                                   "cwd": "/w"},
                     started_wall=1.7e9, duration_s=t + 0.2, poll_interval_s=0.005, nvml_available=True,
                     versions={"tool": "0.1.0"}, devices=[{"index": 0, "uuid": "GPU-0", "pci_bus_id": "0:1",
                                                          "name": "Test GPU", "total_bytes": 80 << 30}],
                     nvml={(7, 0): [(s.t, s.readings[0].nvml_used_bytes) for s in samples]}, processes=[], agents=[agent])


def test_an_evaluation_s_peak_is_found_in_the_samples_and_named_from_the_search_at_its_height():
    from gpumemdoctor.app.report_file import build, parse

    recording = synthetic_evaluation_run()
    d = diagnose(recording)
    assert d.verdict == "clean"
    peak = next(f for f in d.findings if f.kind == "avoidable-peak")
    assert peak.bytes == 90 * 14 * MiB and peak.evidence["decided_by"] == "phases"
    (pause,) = peak.evidence["pauses"]
    assert pause["step"] == 120 and pause["kept_bytes"] == 0 and pause["steps_peak_bytes"] == 600 * MiB
    top = peak.suspects[0]
    assert top["holders"][0]["kind"] == "autograd-graph"  # one tensor with a graph: a chain, not a container
    assert top["where"] == ["/work/e.py", 12, "evaluate"]
    assert "model.eval() does not stop autograd" in peak.remedy and "(allocated at /work/e.py:12)" in peak.remedy
    assert peak.evidence["root_cause"]["when"] == "phase"
    report = build(recording, d)
    _, back = parse(json.loads(json.dumps(report)))
    assert [f.kind for f in back.findings] == [f.kind for f in d.findings]


def test_the_warning_is_drawn_under_the_verdict():
    import io

    from rich.console import Console

    from gpumemdoctor.reporters import terminal

    recording = synthetic_evaluation_run()
    out = io.StringIO()
    terminal.render(Console(file=out, width=100, color_system=None), recording, diagnose(recording))
    text = out.getvalue()
    assert "warning: In process 7 on GPU 0, memory rose during 1 pause" in text
    assert "avoidable-peak  1.23 GiB" in text


def test_a_search_declined_at_an_evaluation_s_height_is_said_where_its_holder_would_be():
    """Issue 31: a copy that would pause the program past the 20 ms limit is not made; the
    evaluation's warning then names no holder and says why, with the agent's figures."""
    from gpumemdoctor.recording.recording import Recording
    from gpumemdoctor.app.report_file import build, parse

    recording = synthetic_evaluation_run()
    root = recording.agents[0].root
    root["investigations"].clear()  # the search at the height was declined ...
    why = "a copy of this process (2.4 GiB of its own memory) would pause it for about 27 ms; the limit is 20 ms"
    root["declined"].append({"t": 1.9, "step": 120, "when": "phase", "why": why, "pause_s": 0.027,
                             "limit_s": 0.02, "private_bytes": int(2.4 * (1 << 30))})
    recording = Recording.from_json(json.loads(json.dumps(recording.to_json())))  # as read back
    assert recording.agents[0].root["declined"][0]["why"] == why
    d = diagnose(recording)
    peak = next(f for f in d.findings if f.kind == "avoidable-peak")
    assert not peak.suspects
    assert peak.summary.endswith(f"What held it was not seen: {why}.")
    assert peak.evidence["root_cause"] == {"searched": False, "declined": why,
                                           "why_not": f"the search at the pause's height was not made: {why}"}
    assert peak.remedy.startswith("What held it is not known (no search at its height)") and "no_grad" not in peak.remedy
    _, back = parse(json.loads(json.dumps(build(recording, d))))
    assert next(f for f in back.findings if f.kind == "avoidable-peak").summary == peak.summary


def test_a_recording_without_declined_searches_reads_back_to_itself():
    recording = synthetic_evaluation_run()
    written = recording.to_json()
    assert "declined" not in written["agents"][0]["root"]  # (older reports have none either)
    assert Recording.from_json(json.loads(json.dumps(written))).agents[0].root["declined"] == []
