"""Pauses in a loop's steps (gpumemdoctor/diagnosis/phases.py) and the rows of the decision table that
read them (judgement rows 2b and 13), on synthetic series built here (no GPU recorded them): a
staircase that each validation adds to, a ring filled once, an evaluation that lets go at its end.
The GPU recordings of the scenarios that show each side are judged in tests/test_accumulations.py."""
from __future__ import annotations

from gpumemdoctor.diagnosis import judgement, phases
from tests.test_judgement import evidence, held, kinds

MIB = 1 << 20
STEP_S = 0.005  # a training step
BASE = 500 * MIB


def synthetic(stretches, interval=0.02):
    """Readings (by, t, step, allocated, peak) of a loop: `stretches` is a list of
    ("steps", n, level) and ("pause", seconds, [levels...]) in order."""
    out, t, step, peak = [], 0.0, 0, 0
    for what, size, level in stretches:
        if what == "steps":
            for _ in range(size):
                t += STEP_S
                step += 1
                peak = max(peak, level + 64 * MIB)  # each step's activations, freed before its end
                out.append(("step", t, step, level, peak))
        else:
            for i, allocated in enumerate(level):
                t += size / len(level)
                peak = max(peak, allocated)
                out.append(("time", t, step, allocated, peak))
    return out


def staircase(validations=2, per_batch=32 * MIB, batches=20, keep=True):
    """Training, then a validation that keeps (or clears at its end) every batch's predictions."""
    stretches, level = [], BASE
    for _ in range(validations):
        stretches.append(("steps", 60, level))
        rising = [level + per_batch * (i + 1) for i in range(0, batches, 4)]
        stretches.append(("pause", 0.3, rising))
        if keep:
            level += per_batch * batches
    stretches.append(("steps", 60, level))
    return synthetic(stretches), level


def test_a_validation_between_steps_is_a_pause_with_its_levels():
    readings, _ = staircase(validations=1)
    (p,) = phases.pauses(readings, live_at_exit=None)
    assert (p.before, p.height, p.after) == (BASE, BASE + 17 * 32 * MIB, BASE + 20 * 32 * MIB)
    assert p.kept == 20 * 32 * MIB and p.rise == 17 * 32 * MIB and not p.last
    assert p.steps_peak == BASE + 64 * MIB


def test_a_slow_step_sampled_over_time_is_no_pause():
    # Steps of 0.1 s, each holding its activations while the timer samples it: every gap has time
    # samples, none is a pause (each lasts one median step).
    stretches = []
    for _ in range(30):
        stretches += [("steps", 1, BASE), ("pause", 0.1, [BASE + 300 * MIB] * 4)]
    readings = synthetic(stretches)
    assert phases.median_step_s(readings) > 0.09
    assert phases.pauses(readings, None) == []


def test_a_pause_after_the_last_step_is_measured_against_what_is_live_at_exit():
    readings = synthetic([("steps", 60, BASE), ("pause", 0.3, [BASE + 400 * MIB] * 5)])
    (p,) = phases.pauses(readings, live_at_exit=BASE + 2 * MIB)
    assert p.last and p.kept == 2 * MIB and p.rise == 400 * MIB


def test_start_up_before_the_first_step_is_not_a_pause():
    readings = synthetic([("pause", 1.0, [BASE + 900 * MIB] * 10), ("steps", 60, BASE)])
    assert phases.pauses(readings, None) == []


# -- row 2b: a staircase ------------------------------------------------------------------------

def judged(readings, level, accumulations, live=None):
    live = level if live is None else live
    return judgement.judge(evidence(samples=len(readings), by="step", enough_samples=True,
                                    pauses=phases.pauses(readings, live), live_bytes=live,
                                    accumulations=accumulations))


def test_two_validations_that_each_keep_their_predictions_are_a_leak_by_phases():
    readings, level = staircase(validations=2)
    preds = held(count=40, size=32 * MIB, pattern="__main__.keep.preds[*]", kind="attribute")
    found = judged(readings, level, [preds])
    assert kinds(found) == [("leak", "phases")]
    leak = found[0]
    assert leak.bytes == 40 * 32 * MIB
    assert "grew in steps, one at each of 2 pauses" in leak.summary and "__main__.keep.preds[*]" in leak.summary
    assert leak.suspects[0]["holders"][0]["pattern"] == "__main__.keep.preds[*]"
    assert [s["kept_bytes"] for s in leak.evidence["stairs"]] == [640 * MIB, 640 * MIB]


def test_one_step_then_flat_is_not_a_staircase():
    # A ring of predictions filled at the first validation and refilled in place at the next.
    readings = synthetic([("steps", 60, BASE), ("pause", 0.3, [BASE + 320 * MIB, BASE + 640 * MIB]),
                          ("steps", 60, BASE + 640 * MIB), ("pause", 0.3, [BASE + 640 * MIB] * 2),
                          ("steps", 60, BASE + 640 * MIB)])
    ring = held(count=20, size=32 * MIB, pattern="__main__.ring[*]", kind="global")
    found = judged(readings, BASE + 640 * MIB, [ring])
    assert kinds(found) == [("live-at-exit", "exit")]


def test_a_staircase_without_an_accumulation_that_holds_it_is_no_leak():
    readings, level = staircase(validations=3)
    small = held(count=8, size=16 * MIB, pattern="__main__.misc[*]", kind="global")  # 128 of 1920 MiB
    assert kinds(judged(readings, level, [small])) == [("live-at-exit", "exit")]
    assert kinds(judged(readings, level, [])) == [("live-at-exit", "exit")]


def test_the_staircase_is_named_by_its_accumulation_not_by_a_bigger_one_filled_once():
    readings, level = staircase(validations=2, per_batch=2 * MIB)  # two steps of 40 MiB
    dataset = held(count=64, size=16 * MIB, pattern="__main__.dataset[*]", kind="global")  # 1 GiB, at start-up
    logs = held(count=40, size=2 * MIB, pattern="__main__.log_tensors[*]", kind="global")
    found = judged(readings, level, [dataset, logs])
    assert kinds(found) == [("leak", "phases")]
    assert found[0].suspects[0]["holders"][0]["pattern"] == "__main__.log_tensors[*]"
    assert kinds(judged(readings, level, [dataset])) == [("live-at-exit", "exit")]


def test_a_staircase_let_go_of_before_the_end_is_no_leak():
    readings, level = staircase(validations=2)
    preds = held(count=40, size=32 * MIB, pattern="__main__.keep.preds[*]", kind="attribute")
    found = judged(readings, level, [preds], live=BASE + 100 * MIB)
    assert ("leak", "phases") not in kinds(found)


# -- row 13: a peak bound to a phase----------------------------------------------------------

def test_an_evaluation_that_lets_go_at_its_end_is_the_avoidable_peak_never_a_leak():
    readings, level = staircase(validations=3, keep=False)
    total = held(count=60, size=8 * MIB, pattern="thread 'MainThread': evaluate() at e.py local total",
                 kind="autograd-graph")
    total["path"] = "thread 'MainThread': evaluate() at e.py:9 local total.grad_fn (5 autograd nodes down)._saved_mat1"
    found = judgement.judge(evidence(samples=len(readings), by="step", enough_samples=True,
                                     pauses=phases.pauses(readings, level), live_bytes=level,
                                     phase_accumulations=[total], phase_search={"searched": True}))
    assert kinds(found) == [("live-at-exit", "exit"), ("avoidable-peak", "phases")]
    peak = found[1]
    assert peak.bytes == 17 * 32 * MIB and len(peak.evidence["pauses"]) == 3
    assert "not a leak, but what made the peak" in peak.summary
    assert "torch.no_grad()" in peak.remedy and "loss.item()" in peak.remedy
    assert "model.eval() does not stop autograd" in peak.remedy
    assert "evaluate() at e.py:9 local total" in peak.remedy


def test_a_pause_that_stays_below_what_the_steps_reached_made_no_peak():
    readings = synthetic([("steps", 60, BASE), ("pause", 0.3, [BASE + 300 * MIB] * 4), ("steps", 60, BASE)])
    high = [(by, t, s, a, max(p, BASE + 2048 * MIB)) for by, t, s, a, p in readings]  # steps reached 2.5 GiB
    assert [j.kind for j in judgement.judge(evidence(pauses=phases.pauses(readings, BASE), by="step"))] \
        == ["avoidable-peak"]
    assert judgement.judge(evidence(pauses=phases.pauses(high, BASE), by="step")) == []


def test_a_small_rise_is_no_finding():
    readings = synthetic([("steps", 60, BASE), ("pause", 0.3, [BASE + 200 * MIB] * 4), ("steps", 60, BASE)])
    assert judgement.judge(evidence(pauses=phases.pauses(readings, BASE), by="step")) == []
