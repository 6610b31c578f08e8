"""Holders named by the peak's probes when no copy of the process was searched (diagnosis/probed.py),
from SYNTHETIC records in the agent's shapes: an evaluation's running sum, a gathered list, a
training list that grows from one probe to the next."""
from __future__ import annotations

import json

from gpumemdoctor.diagnosis import probed
from gpumemdoctor.diagnosis.diagnose import diagnose
from gpumemdoctor.recording.recording import Recording
from gpumemdoctor.app.report_file import build, parse
from tests.test_accumulations import synthetic_evaluation_run

MiB = 1 << 20
GiB = 1 << 30


def capture(n, t, step, allocated, paused):
    return {"n": n, "t": t, "step": step, "device": 0, "allocated": allocated, "reserved": 2 * GiB,
            "nvml": 2 * GiB + 500 * MiB, "allocated_peak": allocated, "inactive_split": 0, "parameters": 0,
            "gradients": 0, "optimizer_state": 0, "optimizers": [], "where": "e.py:12 in evaluate()",
            "inside": None, "paused": paused}


def probe(n, t, temporaries=(), kept=(), graphs=()):
    return {"n": n, "t": t, "elapsed_s": 0.0004, "stopped": None, "graphs": len(graphs), "graph_nodes": 0,
            "temporaries": [list(h) for h in temporaries], "temporaries_bytes": sum(h[1] for h in temporaries),
            "kept-tensors": [list(h) for h in kept], "kept-tensors_bytes": sum(h[1] for h in kept),
            "graph_holders": [list(h) for h in graphs]}


def evaluation_without_a_copy(probes):
    """The synthetic evaluation of test_accumulations, its search at the height declined (the pause
    limit), with a capture in the pause and the probes given."""
    recording = synthetic_evaluation_run()
    root = recording.agents[0].root
    root["investigations"].clear()
    why = "a copy of this process (1.0 GiB of its own memory) would pause it for about 30 ms; the limit is 20 ms"
    root["declined"].append({"t": 1.7, "step": 120, "when": "phase", "why": why, "pause_s": 0.03,
                             "limit_s": 0.02, "private_bytes": GiB})
    root["peaks"] += [capture(1, 1.3, 60, 600 * MiB, False), capture(2, 1.85, 120, 1700 * MiB, True)]
    root["peak_probes"] += probes
    return Recording.from_json(json.loads(json.dumps(recording.to_json()))), why


def test_an_evaluation_s_running_sum_is_named_by_its_graph_s_nodes_when_no_copy_searched_it():
    total = "evaluate() local total (holds its autograd graph)"
    recording, why = evaluation_without_a_copy([
        probe(1, 1.3, temporaries=[("train() local x", 4 * MiB, "e.py:30", 1, 0)]),
        probe(2, 1.86, temporaries=[("evaluate() local x", 4 * MiB, "e.py:12", 1, 0),
                                    (total, 4, "e.py:12", 1, 4200)],
              graphs=[(total, 4, "e.py:12", 1, 4200), ("evaluate() local loss (holds its autograd graph)", 4,
                                                       "e.py:12", 1, 70)])])
    d = diagnose(recording)
    peak = next(f for f in d.findings if f.kind == "avoidable-peak")
    top = peak.suspects[0]
    holder = top["holders"][0]
    assert holder["pattern"] == "thread 'MainThread': evaluate() at e.py local total"
    assert holder["kind"] == "autograd-graph" and top["where"] is None
    assert top["summary"] == ("thread 'MainThread': evaluate() at e.py:12 local total carried an autograd graph "
                              "of 4,200 nodes (its saved tensors not measured)")
    assert peak.summary.endswith(f"no copy of the process was searched there ({why}).")
    assert "found thread 'MainThread': evaluate() at e.py:12 local total carried an autograd graph" in peak.summary
    assert peak.evidence["root_cause"]["probed"]["t"] == 1.85
    assert "torch.no_grad()" in peak.remedy
    _, back = parse(json.loads(json.dumps(build(recording, d))))
    assert next(f for f in back.findings if f.kind == "avoidable-peak").suspects[0]["summary"] == top["summary"]


def test_a_gathered_list_is_named_by_its_bytes_before_any_graph():
    recording, _ = evaluation_without_a_copy([
        probe(2, 1.86, kept=[("global validation_step_outputs[*]", 1100 * MiB, None, 55, 0)],
              graphs=[("evaluate() local loss (holds its autograd graph)", 4, "e.py:12", 1, 70)])])
    peak = next(f for f in diagnose(recording).findings if f.kind == "avoidable-peak")
    holder = peak.suspects[0]["holders"][0]
    assert holder["pattern"] == "__main__.validation_step_outputs[*]" and holder["kind"] == "global"
    assert peak.suspects[0]["summary"].startswith("1.07 GiB in 55 tensors held by __main__.validation_step_outputs[*]")
    assert len(peak.suspects) == 1  # the loss's 70 nodes are one batch's graph, not what rose


def test_of_a_capture_s_two_probes_the_one_that_found_the_most_names_the_holder():
    """The probe made as a call returned, before the validation's list was cleared, found the list; the
    second, at the next sample, after it (clean_validation_outputs_cleared on the H100 lost its holder
    when only the second was made)."""
    gathered = probe(2, 1.86, kept=[("global validation_step_outputs[*]", 1100 * MiB, None, 55, 0)])
    after = probe(2, 1.92, temporaries=[("train_steps() local x", MiB, "c.py:31", 1, 0)])
    for order in ([gathered, after], [after, gathered]):
        recording, _ = evaluation_without_a_copy(order)
        peak = next(f for f in diagnose(recording).findings if f.kind == "avoidable-peak")
        assert peak.suspects[0]["holders"][0]["pattern"] == "__main__.validation_step_outputs[*]"
        assert probed.probe_of(recording.agents[0], 2)["t"] == 1.86  # (the recording copies its records)


def test_a_probe_out_of_the_pause_names_nothing_there():
    recording, why = evaluation_without_a_copy([probe(1, 1.3, kept=[("global data", GiB, None, 1, 0)])])
    peak = next(f for f in diagnose(recording).findings if f.kind == "avoidable-peak")
    assert not peak.suspects and peak.summary.endswith(f"What held it was not seen: {why}.")


def test_a_local_that_grew_between_two_probes_holds_a_growth_nobody_searched():
    """A training function's list grew by 448 MiB between two probes while allocated memory grew by
    460 MiB; an attribute that stayed the same size, and a list that grew by less than half, are not named."""
    agent = type("A", (), {})()
    agent.root = {"peaks": [capture(1, 2.0, 4, 1 * GiB, False), capture(2, 3.0, 12, GiB + 460 * MiB, False)],
                  "peak_probes": [
                      probe(1, 2.0, temporaries=[("train() local outputs[*]", 64 * MiB, "r.py:20", 1, 0),
                                                 ("train() local model.cache[*]", 32 * MiB, "r.py:20", 2, 0)],
                            kept=[("global small[*]", 0, None, 0, 0)]),
                      probe(2, 3.0, temporaries=[("train() local outputs[*]", 512 * MiB, "r.py:20", 8, 0),
                                                 ("train() local model.cache[*]", 32 * MiB, "r.py:20", 2, 0)],
                            kept=[("global small[*]", 100 * MiB, None, 10, 0)])]}
    found, meta = probed.growth_holders(agent, 0)
    assert [h["pattern"] for h in found] == ["thread 'MainThread': train() at r.py local outputs[*]"]
    assert found[0]["grew_bytes"] == 448 * MiB and found[0]["kind"] == "frame-local" and found[0]["count"] == 8
    assert meta["t"] == 3.0 and meta["step"] == 12
    assert "grew by 448 MiB from the probe at 2.0 s" in probed.summary(found[0])
    agent.root["peak_probes"] = agent.root["peak_probes"][:1]
    assert probed.growth_holders(agent, 0) == ([], None)  # one probe: nothing to compare


def _growing_agent():
    agent = type("A", (), {})()
    agent.root = {"peaks": [capture(1, 2.0, 4, GiB, False), capture(2, 3.0, 12, GiB + 460 * MiB, False)],
                  "peak_probes": [probe(1, 2.0, temporaries=[("train() local outputs[*]", 64 * MiB, "r.py:20", 1, 0)]),
                                  probe(2, 3.0, temporaries=[("train() local outputs[*]", 512 * MiB, "r.py:20", 8, 0)])],
                  "declined": [{"t": 2.5, "step": 8, "when": "growth", "why": "a copy ... 25 ms; the limit is 20 ms"}]}
    return agent


def test_a_growth_released_before_the_exit_search_is_named_by_the_probes_and_said_so():
    from gpumemdoctor.reporters.vocabulary import suspects_heading

    exit_search = {"searched": True, "when": "exit", "t": 9.0, "step": 80, "allocation_stacks": True,
                   "elapsed_s": 0.05, "gave_up": None}
    found, cause = probed.growth_suspects(exit_search, _growing_agent(), 0, released=True)
    assert found[0]["holders"][0]["pattern"] == "thread 'MainThread': train() at r.py local outputs[*]"
    assert found[0]["where"] is None and found[0]["remedy"].startswith("A local variable kept every step's tensors")
    assert cause["searched"] is False and cause["exit_search_t"] == 9.0 and "allocation_stacks" not in cause
    assert cause["why_not"] == ("the search at exit came after the memory was let go of; the one during the run "
                                "was not made (a copy ... 25 ms; the limit is 20 ms)")
    assert suspects_heading(cause) == (
        "Suspects (named by the probe of the program's names at step 12, 3.0 s, 0.4 ms, not by a search)")
    # a growth the exit search saw held keeps the exit search's suspects
    assert probed.growth_suspects(exit_search, _growing_agent(), 0, released=False) is None
    unsearched = {"searched": False, "why_not": "the growth search during the run was not made (...)"}
    found, cause = probed.growth_suspects(unsearched, _growing_agent(), 0, released=False)
    assert cause["why_not"] == unsearched["why_not"] and cause["probed"]["step"] == 12
    assert found[0]["remedy"].startswith("A local variable of a function that is still running keeps them")


def test_a_name_with_and_without_its_graph_mark_is_one_holder():
    """`x[*]` (tensors without graphs) and `x[*] (holds its autograd graph)` are one list: its rows
    are added up, and it is an autograd graph's holder when any of them chains."""
    rows = probe(1, 1.0, temporaries=[("f() local x[*]", 64 * MiB, "f.py:3", 4, 0, 0),
                                      ("f() local x[*] (holds its autograd graph)", 32 * MiB, "f.py:3", 2, 0, 12)])
    (h,) = probed.holders(rows)
    assert (h["bytes"], h["count"], h["chain"], h["kind"]) == (96 * MiB, 6, 12, "autograd-graph")
    old = probe(1, 1.0, graphs=[("f() local total (holds its autograd graph)", 4, "f.py:3", 1, 812)])
    assert probed.holders(old)[0]["nodes"] == 812  # a recording that counted the graph's nodes


def _joined_pieces(pieces_higher: bool):
    """A pause that gathers 55 pieces, then joins them into one tensor and drops the pieces: each is
    held for as long, and which of the two probes fell higher is chance (peak_single_cat, H200)."""
    recording, _ = evaluation_without_a_copy([
        probe(2, 1.86, kept=[("build_index() local chunks[*]", 1100 * MiB, "e.py:27", 55, 0)]),
        probe(3, 1.91, kept=[("build_index() local index", 1100 * MiB, "e.py:38", 1, 0)])])
    root = recording.agents[0].root
    root["peaks"].append(capture(3, 1.9, 120, 1700 * MiB + (-MiB if pieces_higher else MiB), True))
    return recording


def test_a_pause_that_gathers_pieces_and_joins_them_names_the_pieces_whichever_probe_fell_higher():
    for pieces_higher in (True, False):
        peak = next(f for f in diagnose(_joined_pieces(pieces_higher)).findings if f.kind == "avoidable-peak")
        first, second = (s["holders"][0]["pattern"] for s in peak.suspects[:2])
        assert (first, second) == ("thread 'MainThread': build_index() at e.py local chunks[*]",
                                   "thread 'MainThread': build_index() at e.py local index"), pieces_higher
        assert peak.evidence["root_cause"]["probed"]["t"] == 1.85  # the probe that found the pieces
        assert "gathers every batch's tensors" in peak.suspects[0]["remedy"]
        # one tensor gathers nothing: its remedy does not say that it does
        assert "gathers" not in peak.suspects[1]["remedy"] and "holds one tensor" in peak.suspects[1]["remedy"]


def test_a_search_early_in_the_pause_that_found_less_than_the_probe_gives_way_to_the_probe():
    """The copy's search ran when the copy was made (26-53 ms into the pause on the H200), before most
    of it was held; the probe at the height saw more, and says why it, not the search, names it."""
    recording = synthetic_evaluation_run()  # its search, 1.9 s into the pause, found 1.17 GiB held
    root = recording.agents[0].root
    root["peaks"].append(capture(2, 1.85, 120, 1700 * MiB, True))
    root["peak_probes"].append(probe(2, 1.86, kept=[("global outputs[*]", 1250 * MiB, None, 60, 0)]))
    peak = next(f for f in diagnose(recording).findings if f.kind == "avoidable-peak")
    assert peak.suspects[0]["holders"][0]["pattern"] == "__main__.outputs[*]"
    assert peak.evidence["root_cause"]["searched"] and peak.evidence["root_cause"]["probed"]["t"] == 1.85
    assert "found less held" in peak.summary
    root["peak_probes"][-1] = probe(2, 1.86, kept=[("global outputs[*]", 1100 * MiB, None, 60, 0)])
    peak = next(f for f in diagnose(recording).findings if f.kind == "avoidable-peak")
    assert "probed" not in peak.evidence["root_cause"]  # the search saw more: it names the holder
