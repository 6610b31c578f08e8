"""Issue 56's seven shapes as recorded on one H200 (tests/fixtures/issue56_h200, see its README), judged
again on the CPU: the GPU tests' own checks (tests/gpu/test_scenarios.py, tests/gpu/test_corpus.py) run
on this version's report of each recording. The recordings are measured; only the judgement is new."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpumemdoctor.app import report_file
from gpumemdoctor.diagnosis.diagnose import diagnose_job
from tests.gpu import test_scenarios as gpu
from tests.test_claims import problems

FIXTURES = Path(__file__).parent / "fixtures"
RECORDED = FIXTURES / "issue56_h200"
SCENARIOS = Path(__file__).parents[1] / "scenarios"
MIB, GIB = 1 << 20, 1 << 30


def rejudged(path: Path) -> dict:
    """The report this version writes for the recording in `path`, as the GPU tests read one."""
    recorded = json.loads(path.read_text())
    rec, _ = report_file.parse(recorded)
    report = json.loads(json.dumps(report_file.build(rec, diagnose_job([rec]))))
    stderr = path.with_suffix(".stderr.txt")
    report["_stderr"] = stderr.read_text() if stderr.exists() else ""
    report["_returncode"] = recorded["target"].get("exit_code")
    return report


_CACHE: dict = {}


def reports(path: Path) -> dict:
    """tests/gpu/test_scenarios.py's `reports` fixture, over the H200's recordings."""
    if path.stem not in _CACHE:
        _CACHE[path.stem] = rejudged(RECORDED / f"{path.stem}.json")
    return _CACHE[path.stem]


@pytest.mark.parametrize("name", gpu.ISSUE_56)
def test_the_new_shapes_claim_only_what_was_seen(name):
    gpu.test_the_new_shapes_claim_only_what_was_seen(name, reports)


def test_one_long_batch_under_a_cap_is_the_step_asked_for_more_not_fragmentation():
    gpu.test_one_long_batch_is_the_step_asked_for_more_with_its_input_and_its_remedies(reports)
    oom = gpu._oom(reports(SCENARIOS / "oom_memory_fraction_long_batch.py"))
    names = gpu.claim_names(oom)
    # The free pieces (1.27 GiB) would have served the 1.12 GiB request as one piece, but the step had
    # needed 2.63 GiB beyond the earlier steps' peak (16.1 GiB): said, and not taken for the cause.
    assert "split-not-the-cause" in names and "fragmented" not in names, oom["claims"]
    split = next(c for c in oom["claims"] if c["claim"] == "split-not-the-cause")["evidence"]
    assert split["step_excess_bytes"] > split["free_in_segments_bytes"] >= split["request_bytes"]
    # Nothing smaller than what the step needed beyond the earlier ones is offered as the fix.
    assert oom["evidence"]["what_would_fit"] is None, oom["evidence"]["what_would_fit"]
    assert "16.1 GiB" in oom["remedy"] and "16.7 GiB this step had allocated" in oom["remedy"], oom["remedy"]
    assert oom["remedy"].index("sequence length") < oom["remedy"].index("gradient checkpointing") \
        < oom["remedy"].index("bfloat16")


def test_out_of_memory_is_found_with_its_cause_and_figures():
    gpu.test_out_of_memory_is_found_with_its_cause_and_figures(SCENARIOS / "oom_fragmentation_under_fraction.py",
                                                               reports)
    # The long batch's error came 16 frames deep in transformers: this recording's stack (16 frames, all
    # the libraries') does not reach the program's line, which the agent now adds (events.program_stack;
    # tests/test_agent_oom_stack below); the rest of the GPU test's checks hold on it.
    path = SCENARIOS / "oom_memory_fraction_long_batch.py"
    oom = gpu._oom(reports(path))
    assert oom["evidence"]["cause"] == gpu.header(path, "expect-cause"), oom["summary"]
    first = oom["evidence"]["first"]
    assert first["request_bytes"] > 0 and first["limit_bytes"] > 0 and first["allocated_bytes"] is not None
    assert first["at"] == "activations.py:66 in forward()", first


def test_a_deep_library_stack_keeps_the_programs_own_line():
    """An error deep in a library (a model's 16th nested call): the program's own innermost frame is
    added beyond the 16 frames kept, so the error's line is the program's."""
    from gpumemdoctor._agent.readings.events import MAX_STACK, program_stack

    code = compile("import sys\n"
                   "def library(depth, grab):\n"
                   "    return library(depth - 1, grab) if depth else grab(sys._getframe())\n",
                   "/usr/lib/python3/site-packages/model/layers.py", "exec")  # a library's file name
    scope: dict = {}
    exec(code, scope)
    stack = scope["library"](MAX_STACK + 5, program_stack)
    assert len(stack) == MAX_STACK + 1 and all(f[0].endswith("layers.py") for f in stack[:MAX_STACK]), stack
    assert stack[-1][0] == __file__ and stack[-1][2] == "test_a_deep_library_stack_keeps_the_programs_own_line"
    assert len(scope["library"](3, program_stack)) <= MAX_STACK  # (a short stack: as before)


def test_the_trainers_evaluation_inside_train_gets_the_trainers_switches():
    """tests/gpu/test_corpus.py's check, on its H200 recording (tests/fixtures/corpus)."""
    report = rejudged(FIXTURES / "corpus" / "hf_trainer_train_eval_logits.json")
    found = [f for f in report["findings"] if "library-loop" in {c["claim"] for c in f.get("claims") or []}]
    assert found, [f["summary"] for f in report["findings"]]
    assert "eval_accumulation_steps" in found[0]["remedy"] and "preprocess_logits_for_metrics" in found[0]["remedy"]
    text = " ".join(f["summary"] + " " + f["remedy"] for f in report["findings"])
    assert "no_grad" not in text, text
    assert not [p for f in report["findings"] for p in problems(f)]


def test_a_graphs_pools_join_the_container_that_keeps_the_graphs():
    """The exit search's groups as the agent now writes them for CUDA graphs (each pool segment a block
    held by its graph, tests/test_search.py): SYNTHETIC groups, shaped like leak_cuda_graph_pools' (40
    graphs, 2 MiB x k static inputs, the pools at the capture's line), not a recording. The container
    that keeps the graphs and their inputs is one accumulation, placed at the capture's line (the pools
    are most of it), and the leak does not count the pools' free memory twice."""
    from gpumemdoctor.contract import GRAPH_POOL_LABEL
    from gpumemdoctor.diagnosis.accumulations import accumulations

    inputs = {"device": 0, "new": True, "bytes": 40 * 41 * MIB, "count": 40, "thread": None,
              "frames": [["/s/leak_cuda_graph_pools.py", 24, "capture"]], "unheld_bytes": 0, "unheld_count": 0,
              "unheld_sizes": [], "unheld_why": [],
              "holders": [{"path": "__main__.graphs[39][1]", "pattern": "__main__.graphs[*][*]", "kind": "global",
                           "count": 40, "bytes": 40 * 41 * MIB, "sizes": [[80 * MIB, 1]]}]}
    pools = dict(inputs, bytes=3354 * MIB, count=80, frames=[["/s/leak_cuda_graph_pools.py", 33, "capture"]],
                 holders=[{"path": "__main__.graphs[39][0]" + GRAPH_POOL_LABEL,
                           "pattern": "__main__.graphs[*][*]" + GRAPH_POOL_LABEL, "kind": "global",
                           "count": 80, "bytes": 3354 * MIB, "sizes": [[40 * MIB, 2]]}])
    (a,), _ = accumulations({"groups": [inputs, pools], "graph_grads": 0}, 0)
    assert a["pattern"] == "__main__.graphs[*][*]" and a["bytes"] == (1640 + 3354) * MIB
    assert a["where"] == ["/s/leak_cuda_graph_pools.py", 33, "capture"] and a["graph_pool_bytes"] == 3354 * MIB
    from gpumemdoctor.diagnosis.suspects import accumulation_suspect

    top = accumulation_suspect(a)
    assert top["where"][1] == 33 and top["holders"][0]["pattern"].startswith("__main__.graphs"), top
    assert "private memory pools of the CUDA graphs" in top["summary"], top["summary"]
    assert "captured at leak_cuda_graph_pools.py:33 in capture()" in top["remedy"], top["remedy"]

    from types import SimpleNamespace

    from gpumemdoctor.diagnosis.held import held_claims

    e = SimpleNamespace(shutdown=None, graph_pools=[40, 3354 * MIB, 1640 * MIB])  # what held_claims reads
    (claim,), size = held_claims(e, a["bytes"], a["graph_pool_bytes"])
    assert claim.name == "graph-pools" and size == a["bytes"]
    _, older = held_claims(e, 1640 * MIB)  # a recording made before pools were searched: their free memory added
    assert older == (1640 + 3354 - 1640) * MIB


def test_the_error_says_its_input_against_the_earlier_steps():
    """Item 5's words where the agent read the earlier steps' inputs (step_inputs.py; the recordings
    above were made before it): the names whose shape differs, with the largest each was given."""
    from gpumemdoctor.diagnosis import claims
    from gpumemdoctor.diagnosis.words import say

    made = claims.make("inputs-at-error", inputs=[["input_ids", [24, 4096], "int64"], ["labels", [24, 4096], "int64"]],
                       earlier_inputs=[["input_ids", [24, 512], "int64", 29], ["labels", [24, 512], "int64", 29]])
    assert say(made) == ("its input then: input_ids 24 x 4096 (int64), labels 24 x 4096 (int64); the steps before "
                         "it were given at most input_ids 24 x 512 (29 steps), labels 24 x 512 (29 steps)")
    same = claims.make("inputs-at-error", inputs=[["args[0]", [8, 3], "float32"]],
                       earlier_inputs=[["args[0]", [8, 3], "float32", 5]])
    assert say(same).endswith("; the steps before it were given the same shapes")


AGAIN = FIXTURES / "issue56_h200_call1"  # two shapes recorded again after the merges (see its README)


def test_kept_graphs_whose_pools_the_search_found_are_a_leak_by_their_structure():
    """The recording whose pools the exit search counted into the container (3.12 GiB of segments, about
    half of it free): the structure rule weighs only what PyTorch's allocated counter sees of them, and
    the remedy is the graphs', not a foreign array's."""
    report = rejudged(AGAIN / "leak_cuda_graph_pools.json")
    assert report["verdict"] == "leak", [f["kind"] for f in report["findings"]]
    gpu.test_cuda_graphs_pools_are_the_graphs_memory(lambda path: report)
    leak = next(f for f in report["findings"] if f["kind"] == "leak")
    assert {"decided-by-structure", "graph-pools"} <= gpu.claim_names(leak), leak["claims"]
    assert "keeps CUDA graphs" in leak["remedy"] and "cupy" not in leak["remedy"], leak["remedy"]
    assert not [p for f in report["findings"] for p in problems(f)]


def test_a_graphs_pool_held_at_exit_gets_the_graphs_remedy():
    """Where the memory is only held at the end (live-at-exit), a suspect held by a graph's private pool
    is told to drop or reuse the graphs, never that an array of another library shares a tensor."""
    from gpumemdoctor.contract import GRAPH_POOL_LABEL
    from gpumemdoctor.diagnosis.suspects import _live_remedy

    holder = {"pattern": "__main__.graphs[*][*]" + GRAPH_POOL_LABEL, "kind": "foreign"}
    remedy = _live_remedy(holder, ["/s/x.py", 33, "capture"])
    assert remedy.startswith("__main__.graphs[*][*] keeps CUDA graphs") and "x.py:33" in remedy, remedy


def test_the_structure_rule_weighs_what_the_allocated_counter_sees():
    """An accumulation of 4.64 GiB of which 3.12 GiB are graphs' pool segments, half free: the counter
    sees 3.08 GiB of it. A rise of 1.2 GiB after the first third is more than a third of that (a leak
    by structure); a rise of 0.5 GiB is not; and all of it made before the first third ended (a
    dataset loaded at the start) is never one."""
    from types import SimpleNamespace

    from gpumemdoctor.diagnosis.held import allocated_part, structural

    a = {"bytes": 4750 * MIB, "graph_pool_bytes": 3194 * MIB, "where": ["/s/x.py", 33, "capture"],
         "pattern": "__main__.graphs[*][*]", "count": 115}
    pools = [40, 3354 * MIB, 1673 * MIB]

    def evidence(values):
        return SimpleNamespace(accumulations=[a], by="time", steps=0, allocated_values=values, graph_pools=pools)

    assert allocated_part(evidence([]), a) == 4750 * MIB - round(3194 * MIB * (3354 - 1673) / 3354)
    assert allocated_part(SimpleNamespace(graph_pools=None), a) == a["bytes"]
    assert structural(evidence([256 * MIB, 1800 * MIB, 3600 * MIB] + [4200 * MIB] * 3 + [4800 * MIB] * 3))
    assert structural(evidence([256 * MIB, 1800 * MIB, 4300 * MIB] + [4500 * MIB] * 3 + [4800 * MIB] * 3)) is None
    assert structural(evidence([4800 * MIB] * 9)) is None


def test_a_leak_decided_by_its_structure_has_the_rise_of_the_counter_for_its_time_to_full():
    """The rate a structure-decided leak's time-to-full rests on: the allocated counter's rise from the
    first reading to the first near its highest, over the time between (here 3 GiB in 3 s), whatever the
    readings after; none where it never rose."""
    from types import SimpleNamespace

    from gpumemdoctor.diagnosis.held import rise_rate

    e = SimpleNamespace(allocated_values=[1 * GIB, 2 * GIB, 3 * GIB, 4 * GIB, 4 * GIB, 4 * GIB],
                        allocated_times=[10.0, 11.0, 12.0, 13.0, 20.0, 30.0])
    assert rise_rate(e, 64 * MIB) == 1 * GIB
    assert rise_rate(SimpleNamespace(allocated_values=[GIB] * 4, allocated_times=[1.0, 2.0, 3.0, 4.0]), 0) is None


def test_split_pieces_within_the_allocated_peak_are_not_a_fragmented_peak():
    """A metric's compute() at the end (H200, issue56_h200): 704 MiB free in split pieces at one reading,
    but the allocator reserved only 18 MiB beyond PyTorch's allocated peak counter: the pieces are the
    peak's own freed tensors, not memory fragmentation cost. Where the reservation passed the allocated
    peak by more (the fragmentation scenario: 544 MiB), the claim stands."""
    from gpumemdoctor.diagnosis import claims

    e = {"split_bytes": 704 * MIB, "graph_pool_free_bytes": 0, "inactive_split_bytes": 704 * MIB}
    assert claims.make("fragmented-peak", **e, reserved_bytes=3616 * MIB, allocated_peak_bytes=3598 * MIB) is None
    assert claims.make("fragmented-peak", **e, reserved_bytes=1824 * MIB, allocated_peak_bytes=1280 * MIB)
    assert claims.make("fragmented-peak", **e) is not None  # a recording that did not read them
    report = rejudged(RECORDED / "leak_metric_state_short_loop.json")
    assert not [f for f in report["findings"] if f["kind"] == "fragmented-peak"]


CALL2 = FIXTURES / "issue56_h200_call2"  # the six shapes at the session's last call (see its README)


def _cached(folder: Path, name: str) -> dict:
    key = f"{folder.name}/{name}"
    if key not in _CACHE:
        _CACHE[key] = rejudged(folder / name)
    return _CACHE[key]


def _call2(path: Path) -> dict:
    return _cached(CALL2, f"{path.stem}.json")


def _gpu_checks(reports) -> None:
    """tests/gpu/test_scenarios.py's checks of the six scenario shapes, over `reports`."""
    gpu.test_thread_local_buffers_freed_by_the_shutdown_are_a_leak_held_until_the_end(reports)
    gpu.test_an_error_under_a_memory_fraction_is_held_to_its_limit(reports)
    gpu.test_one_cat_of_64_chunks_names_the_concatenation_and_its_pieces(reports)
    gpu.test_a_metric_state_in_a_short_loop_is_a_leak_by_its_structure(reports)
    gpu.test_cuda_graphs_pools_are_the_graphs_memory(reports)


@pytest.mark.parametrize("name", gpu.ISSUE_56)
def test_the_last_calls_recordings_claim_only_what_was_seen(name):
    gpu.test_the_new_shapes_claim_only_what_was_seen(name, _call2)


def test_the_last_calls_recordings_pass_the_gpu_checks():
    _gpu_checks(_call2)


@pytest.mark.parametrize("name", ["leak_cuda_graph_pools", "leak_metric_state_short_loop"])
def test_every_recording_of_a_shape_gets_the_same_verdict_and_claims(name):
    """The runs recorded of one program on the H200 (three calls; they differed in when the samples and
    the peak's readings fell) are judged the same: verdict, findings and claims (the GPU's three-runs
    test asks it of three fresh runs)."""
    seen = []
    for folder in (RECORDED, AGAIN, CALL2):
        report = rejudged(folder / f"{name}.json")
        seen.append((report["verdict"], sorted((f["kind"], tuple(sorted(gpu.claim_names(f))))
                                               for f in report["findings"] if f["kind"] != "context")))
    assert seen[0] == seen[1] == seen[2], seen


CALL3 = Path(__file__).parent / "fixtures" / "issue56_h200_call3"  # three runs each, 2026-12-03 (README.md)


def _claims_of_three(stem: str) -> list:
    seen = []
    for i in range(3):
        report = rejudged(CALL3 / f"{stem}.run{i}.json")
        seen.append((report["verdict"], sorted((f["kind"], tuple(sorted(c["claim"] for c in f.get("claims") or [])))
                                               for f in report["findings"] if f["kind"] != "context")))
    return seen


@pytest.mark.parametrize("stem", gpu.ISSUE_56)
def test_three_h200_runs_of_a_shape_get_the_same_verdict_and_claims(stem):
    seen = _claims_of_three(stem)
    assert seen[0] == seen[1] == seen[2], seen


def test_a_single_cat_s_pieces_and_its_pause_are_named_alike_in_three_h200_runs():
    """peak_single_cat: the concatenation's pieces were still held while it ran, by the function's local
    list (the probe before the peak named it in every run, one of them before the last pieces were made),
    and the pause's holder is that list, whichever of the pause's probes fell higher."""
    for i in range(3):
        report = rejudged(CALL3 / f"peak_single_cat.run{i}.json")
        joined = next(f for f in report["findings"] if f["kind"] == "temporary-peak")
        assert joined["evidence"]["pieces_holder"] == "build_index() local chunks[*]", i
        assert joined["summary"].endswith("the pieces were held by build_index() local chunks[*] (peak_single_cat.py:27)")
        pause = next(f for f in report["findings"] if f["kind"] == "avoidable-peak")
        assert pause["suspects"][0]["holders"][0]["pattern"].endswith("build_index() at peak_single_cat.py local chunks[*]")
        assert "gathers every batch's tensors" in pause["suspects"][0]["remedy"]


CALL4 = FIXTURES / "issue56_h200_call4"  # three runs each on the final agent, 2026-12-04 (README.md)


def _seen(report: dict) -> tuple:
    return (report["verdict"], sorted((f["kind"], tuple(sorted(c["claim"] for c in f.get("claims") or [])))
                                      for f in report["findings"] if f["kind"] != "context"))


@pytest.mark.parametrize("stem", [*gpu.ISSUE_56, "corpus/hf_trainer_train_eval_logits"])
def test_the_final_agents_three_h200_runs_of_each_shape_agree(stem):
    """Issue 56's done-when, on the recordings of its last calls: the same verdict, findings and claims
    in all three runs of each of the seven shapes, as judged now."""
    seen = [_seen(rejudged(CALL4 / f"{stem}.run{i}.json")) for i in range(3)]
    assert seen[0] == seen[1] == seen[2], seen


def _call4(path: Path) -> dict:
    return _cached(CALL4, f"{path.stem}.run0.json")


@pytest.mark.parametrize("name", gpu.ISSUE_56)
def test_the_final_agents_recordings_claim_only_what_was_seen(name):
    gpu.test_the_new_shapes_claim_only_what_was_seen(name, _call4)


def test_the_final_agents_recordings_pass_the_gpu_checks():
    _gpu_checks(_call4)
    trainer = rejudged(CALL4 / "corpus" / "hf_trainer_train_eval_logits.run0.json")
    found = [f for f in trainer["findings"] if "library-loop" in gpu.claim_names(f)]
    assert found and "eval_accumulation_steps" in found[0]["remedy"], [f["summary"] for f in trainer["findings"]]
