"""The allocated peak told from the allocator's events (gpumemdoctor/_agent/peak/replay.py), on a real
recording: transformers' GPT-2 124M, four AdamW steps on an H100 (tests/fixtures/history/, made by
benchmarks/peak_history.py), against PyTorch's MemTracker on the same steps; and on small traces
whose answer is known."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from gpumemdoctor._agent.peak import replay as R
from gpumemdoctor.contract import HISTORY_PARTS

FIXTURE = Path(__file__).parent / "fixtures" / "history" / "gpt2-124m-h100.json.gz"
KINDS = {"backward": R.BACKWARD, "backward_end": R.BACKWARD_END, "step": R.STEP, "step_end": R.STEP_END}
MIB = 1 << 20


def gpt2_recording():
    """The recorded GPT-2 steps: the file's dict, its trace of events, the marks' times and kinds, and
    the optimizers' storages read after them ({address: category}, {address: bytes})."""
    with gzip.open(FIXTURE, "rt") as f:
        d = json.load(f)
    trace = [{"action": a, "addr": addr, "size": size, "time_us": t} for a, addr, size, t in d["trace"]]
    times = [t for k, t in d["marks"] if k in KINDS]
    kinds = [KINDS[k] for k, t in d["marks"] if k in KINDS]
    storages, sizes = {}, {}
    for category, key in ((1, "parameters"), (2, "gradients"), (3, "state")):
        for address, size in d["storages"][key]:
            storages.setdefault(address, category)
            sizes.setdefault(address, size)
    return d, trace, times, kinds, storages, sizes


def _gpt2(first_entry: int = 0):
    d, trace, times, kinds, storages, sizes = gpt2_recording()
    found = R.replay(trace[first_entry:], d["allocated"], times, kinds, storages, sizes, d["reserved"],
                     counter=d["per_step"][-1]["peak"])
    return found, d


@pytest.mark.parametrize("first_entry", [0, 8000])  # all four steps; only the last one and a half
def test_gpt2s_peak_is_split_as_memtracker_splits_it(first_entry):
    found, d = _gpt2(first_entry)
    reference = d["memtracker"]["peak"]["cuda:0"]
    parts = {k: v["bytes"] for k, v in found["parts"].items()}
    assert found["complete"] and found["phase"] == "backward"
    assert abs(found["allocated_peak"] - d["per_step"][-1]["peak"]) <= 16 * MIB
    for ours, theirs in (("activations", "Activation"), ("temporaries", "Temp"),
                         ("optimizer-state", "Optstate"), ("parameters", "Parameter")):
        assert abs(parts[ours] - reference[theirs]) <= max(64 * MIB, 0.10 * reference[theirs]), (ours, parts, reference)
    assert parts.get("gradients", 0) <= 64 * MIB  # MemTracker: 0 (set_to_none, the peak early in backward)
    assert parts.get("unclassified", 0) <= 0.10 * found["allocated_peak"]
    assert sum(parts.values()) == found["allocated_peak"]
    assert set(parts) <= set(HISTORY_PARTS)



def test_the_entries_history_skips_change_nothing_in_the_split():
    """history.py asks PyTorch not to record SKIPPED (a free's completion, a snapshot's mark): the
    recorded GPT-2 steps without them, 30% fewer entries, give the same peak and the same parts."""
    from gpumemdoctor._agent.peak.history import SKIPPED

    d, trace, times, kinds, storages, sizes = gpt2_recording()
    kept = [e for e in trace if e["action"] not in SKIPPED]
    assert len(kept) <= 0.7 * len(trace)
    counter = d["per_step"][-1]["peak"]
    full = R.replay(trace, d["allocated"], times, kinds, storages, sizes, d["reserved"], counter=counter)
    short = R.replay(kept, d["allocated"], times, kinds, storages, sizes, d["reserved"], counter=counter)
    assert full["complete"] and short["complete"]
    for key in ("allocated_peak", "reserved_at_peak", "peak_time_us", "phase", "joined", "parts"):
        assert short[key] == full[key], key
    assert short["events"] == len(kept)

def _e(action, addr, size, t):
    return {"action": action, "addr": addr, "size": size, "time_us": t}


def test_a_step_is_split_by_when_each_block_was_made_and_freed():
    # 100 allocated before (a parameter at 1 and its state at 2 among them); a forward makes 3 and 4
    # (4 freed before backward: a temporary), backward (t 10-20) makes 5 (a gradient, freed after
    # it) and 6 (freed within it), the peak comes at t 13 with 3, 5 and 6 live.
    trace = [_e("alloc", 3, 40, 2), _e("alloc", 4, 8, 3), _e("free_requested", 4, 8, 4),
             _e("alloc", 5, 10, 11), _e("alloc", 6, 30, 13), _e("free_requested", 6, 30, 14),
             _e("free_requested", 3, 40, 15), _e("free_requested", 5, 10, 30)]
    found = R.replay(trace, 100, [10, 20, 21, 25], [R.BACKWARD, R.BACKWARD_END, R.STEP, R.STEP_END],
                     {1: 1, 2: 3}, {1: 512, 2: 1024}, counter=180)
    assert found["allocated_peak"] == 180 and found["complete"] and found["phase"] == "backward"
    parts = {k: v["bytes"] for k, v in found["parts"].items()}
    assert parts == {"activations": 40, "gradients": 10, "temporaries": 30, "parameters": 100}


def test_an_evaluation_without_a_backward_is_gathered_and_a_peak_before_the_events_is_incomplete():
    # Eight batches kept until the end (made at 1-8, freed at 21-28) and one short-lived tensor made
    # last and freed first (9-10): gathered 80, a temporary 30, over 50 kept from before.
    trace = ([_e("alloc", a, 10, a) for a in range(1, 9)] + [_e("alloc", 9, 30, 9), _e("free_requested", 9, 30, 10)]
             + [_e("free_requested", a, 10, 20 + a) for a in range(1, 9)])
    found = R.replay(trace, 50, [], [], {}, {}, counter=160)
    assert found["allocated_peak"] == 160
    assert found["parts"]["gathered"]["bytes"] == 80 and found["parts"]["temporaries"]["bytes"] == 30
    assert found["parts"]["kept-tensors"]["bytes"] == 50
    assert not R.replay(trace, 50, [], [], {}, {}, counter=160 + 32 * MIB)["complete"]  # (16 MiB short is still it)
    assert R.replay(trace, 50, [], [], {}, {}, counter=160 + 16 * MIB)["complete"]
    assert R.replay([_e("segment_alloc", 1, 10, 1)], 0, [], [], {}, {}) is None


def test_the_marks_kept_are_those_from_the_last_before_the_events_on_in_order():
    from gpumemdoctor._agent.peak.history import Marks

    marks = Marks()
    for i, kind in enumerate([R.BACKWARD, R.BACKWARD_END, R.STEP, R.STEP_END] * 3):
        marks.times[marks.n] = 100 + 10 * i
        marks.kinds[marks.n] = kind
        marks.n += 1
    times, kinds = [], []
    marks.ordered(times, kinds, 175)
    assert times == [170, 180, 190, 200, 210] and kinds == [R.STEP_END, R.BACKWARD, R.BACKWARD_END, R.STEP, R.STEP_END]


def test_a_concatenation_made_while_its_pieces_are_held_is_joined():
    # Four pieces of 10 (made at 1-4) and their concatenation of 40 (5), all freed after it (6-10).
    trace = ([_e("alloc", a, 10, a) for a in range(1, 5)] + [_e("alloc", 5, 40, 5)]
             + [_e("free_requested", a, s, 5 + a) for a, s in ((1, 10), (2, 10), (3, 10), (4, 10), (5, 40))])
    found = R.replay(trace, 0, [], [], {}, {}, counter=80)
    assert found["parts"]["gathered"]["bytes"] == 80
    assert found["joined"] == {"bytes": 40, "pieces": 4, "pieces_bytes": 40, "held": False, "address": 5}
    # The evaluation above, eight batches alike and one short-lived tensor: nothing joined.
    batches = ([_e("alloc", a, 10, a) for a in range(1, 9)] + [_e("free_requested", a, 10, 20 + a) for a in range(1, 9)])
    assert R.replay(batches, 0, [], [], {}, {}, counter=80)["joined"] is None


def test_a_forward_output_still_held_at_the_reading_is_an_activation_of_its_step_not_a_kept_tensor():
    # Step 1 ends at t 5. Made before it and still held: 7 (kept). Step 2's forward makes 8 (its
    # logits, still held by the program's name at the reading) and 9 (saved, freed in backward);
    # backward runs t 10-20 and the peak is in it (t 12).
    trace = [_e("alloc", 7, 16, 3), _e("alloc", 8, 64, 6), _e("alloc", 9, 32, 7), _e("alloc", 10, 8, 12),
             _e("free_requested", 10, 8, 13), _e("free_requested", 9, 32, 15)]
    marks = [4, 5, 10, 20], [R.STEP, R.STEP_END, R.BACKWARD, R.BACKWARD_END]
    found = R.replay(trace, 100 + 16 + 64, *marks, {}, {}, counter=100 + 16 + 64 + 32 + 8)
    parts = {k: v["bytes"] for k, v in found["parts"].items()}
    assert parts == {"kept-tensors": 100 + 16, "activations": 64 + 32, "temporaries": 8}, parts
    # With no optimizer step before the peak the stretch is not known: what is still held is kept.
    found = R.replay(trace, 100 + 16 + 64, marks[0][2:], marks[1][2:], {}, {}, counter=100 + 16 + 64 + 32 + 8)
    assert {k: v["bytes"] for k, v in found["parts"].items()} == {"kept-tensors": 100 + 16 + 64, "activations": 32,
                                                                  "temporaries": 8}


def test_a_concatenation_whose_result_is_still_held_is_joined():
    # A gathering loop (the Trainer's evaluation): the pieces gathered so far (30, made at 1) and a
    # new batch (10, at 2) are concatenated into 40 (at 3), which is still held at the reading.
    trace = [_e("alloc", 1, 30, 1), _e("alloc", 2, 10, 2), _e("alloc", 3, 40, 3),
             _e("free_requested", 1, 30, 4), _e("free_requested", 2, 10, 5)]
    found = R.replay(trace, 40 + 5, [], [], {}, {}, counter=80 + 5)
    # With no optimizer step before the peak, the result still held is the gathering's too; what
    # was there before the events (5) stays kept.
    assert {k: v["bytes"] for k, v in found["parts"].items()} == {"gathered": 80, "kept-tensors": 5}
    assert found["joined"] == {"bytes": 40, "pieces": 2, "pieces_bytes": 40, "held": True, "address": 3}
    # After an optimizer step (t 0.5) too: made since it, with no backward after it, still held.
    found = R.replay(trace, 40 + 5, [0, 0.5], [R.STEP, R.STEP_END], {}, {}, counter=80 + 5)
    assert {k: v["bytes"] for k, v in found["parts"].items()} == {"gathered": 80, "kept-tensors": 5}
    assert found["joined"] == {"bytes": 40, "pieces": 2, "pieces_bytes": 40, "held": True, "address": 3}


def _in_parts(trace, *args, **kwargs):
    """replay() made by a Walk of one CHUNK a part (a deadline already passed): its result and parts."""
    walk = R.Walk(trace, *args, **kwargs)
    parts = 1
    while not walk.run(0.0):
        parts += 1
    return walk.result, parts


def test_a_walk_in_parts_finds_what_the_whole_walk_finds():
    """history.py walks a reading put off over several step samples (replay.Walk, CHUNK entries and
    blocks between two looks at the clock): the same result as at once, on GPT-2's recorded steps
    (13,154 entries) and on a gathering loop whose live blocks span several parts."""
    d, trace, times, kinds, storages, sizes = gpt2_recording()
    args = (d["allocated"], times, kinds, storages, sizes, d["reserved"])
    whole = R.replay(trace, *args, counter=d["per_step"][-1]["peak"])
    found, parts = _in_parts(trace, *args, counter=d["per_step"][-1]["peak"])
    assert found == whole and whole["parts"]["activations"]["bytes"] > 0
    assert parts > len(trace) // R.CHUNK
    # An evaluation that gathers 700 outputs (more than CHUNK live blocks), then their concatenation.
    n = 3 * R.CHUNK + 17
    gather = ([_e("alloc", a, 10, a) for a in range(1, n + 1)] + [_e("alloc", n + 1, 10 * n, n + 1)]
              + [_e("free_requested", a, 10, n + 1 + a) for a in range(1, n + 1)])
    whole = R.replay(gather, 10 * n, [], [], {}, {}, counter=20 * n)
    found, parts = _in_parts(gather, 10 * n, [], [], {}, {}, counter=20 * n)
    assert found == whole and whole["joined"]["pieces"] == n and parts > 2 * n // R.CHUNK
    assert R.replay([], 0, [], [], {}, {}) is None and _in_parts([], 0, [], [], {}, {}) == (None, 1)
