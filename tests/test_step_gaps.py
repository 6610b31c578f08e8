"""The pause the program feels (issue 57): the agent's step-gap figures (_agent/readings/felt.py) and the
report's note on a gap that stands out (diagnosis/step_gaps.py)."""
from __future__ import annotations

from types import SimpleNamespace

from gpumemdoctor._agent.readings.felt import GAP_WARMUP_STEPS, GROWTH_WATCH, SAMPLE, STEP_END, STEP_RING, Felt
from gpumemdoctor.diagnosis import step_gaps


def _steps(felt: Felt, gaps: list[float], start: float = 100.0) -> None:
    t = start
    for step, gap in enumerate(gaps, 1):
        t += gap
        felt.step_end(t, step)


def test_the_longest_gap_after_warm_up_with_what_ran_in_it():
    felt = Felt()
    gaps = [2.0] * (GAP_WARMUP_STEPS + 1) + [0.005] * 30 + [0.3] + [0.005] * 10  # a slow start, then a stall
    t = 100.0
    for step, gap in enumerate(gaps, 1):
        if gap == 0.3:
            felt.add(SAMPLE, 0.0005)  # the agent's work inside the gap, by part
            felt.add(GROWTH_WATCH, 0.0015)
            felt.collection_start(t + 0.01)
            felt.collection_stop(t + 0.29, 2)
            felt.collection_start(t + 0.291)
            felt.collection_stop(t + 0.292, 0)
        t += gap
        felt.step_end(t, step)
    r = felt.record()
    assert r["step_gap_max_step"] == GAP_WARMUP_STEPS + 1 + 31  # the warm-up's 2 s gaps are not counted
    assert abs(r["step_gap_max_s"] - 0.3) < 1e-9 and abs(r["step_gap_agent_s"] - 0.002) < 1e-9
    assert r["step_gap_agent_parts"] == {"sample": 0.0005, "growth_watch": 0.0015}
    assert abs(r["step_gap_collection_s"] - 0.281) < 1e-9 and r["step_gap_collection_generation"] == 2
    assert abs(r["step_gap_typical_s"] - 0.005) < 1e-9
    assert r["step_gaps"] == len(gaps) - GAP_WARMUP_STEPS - 1


def test_what_ran_in_a_gap_is_counted_in_that_gap_only():
    felt = Felt()
    _steps(felt, [0.01] * 10)
    felt.add(STEP_END, 0.5)  # work in the gap that ends at step 11, which is short
    felt.collection_start(1.0)
    felt.collection_stop(1.2, 1)
    felt.step_end(felt.last_end + 0.011, 11)
    felt.step_end(felt.last_end + 0.05, 12)  # the longest: nothing of the agent's in it
    r = felt.record()
    assert r["step_gap_max_step"] == 12 and r["step_gap_agent_s"] == 0 and r["step_gap_collection_s"] == 0
    assert r["step_gap_agent_parts"] == {} and sum(felt.since_end.parts) == 0
    assert r["step_gap_collection_generation"] is None


def test_the_typical_gap_is_the_median_of_the_ring_before_the_longest():
    felt = Felt()
    _steps(felt, [0.01] * (GAP_WARMUP_STEPS + 1) + [0.001 * k for k in range(1, 40)] + [1.0])
    r = felt.record()
    before = sorted(0.001 * k for k in range(40 - STEP_RING, 40))
    assert abs(r["step_gap_typical_s"] - before[STEP_RING // 2]) < 1e-9


def _agent(**gaps):
    figures = {"step_gap_max_s": 0.33, "step_gap_max_step": 229, "step_gap_agent_s": 0.0025,
               "step_gap_collection_s": 0.323, "step_gap_collection_generation": 2, "step_gap_typical_s": 0.0055,
               "step_gaps": 250, **gaps}
    return SimpleNamespace(pid=7, exit_info={"step_gaps": figures})


def test_a_gap_that_stands_out_is_told_with_what_it_held():
    text = step_gaps.note(_agent())
    assert text == ("process 7: the longest gap between two step ends was 330 ms, at step 229 (the median of the "
                    "gaps before it: 5.5 ms); in it: a full garbage collection (generation 2) 323 ms, "
                    "gpumemdoctor's own work 2.5 ms")


def test_a_gap_neither_explains_says_so():
    text = step_gaps.note(_agent(step_gap_collection_s=0.0, step_gap_collection_generation=None))
    assert text.endswith("in it: gpumemdoctor's own work 2.5 ms, 328 ms that was neither (the program's own "
                         "work, or a wait outside Python)")


def test_an_ordinary_gap_is_not_told():
    assert step_gaps.note(_agent(step_gap_max_s=0.012)) is None  # under 50 ms
    assert step_gaps.note(_agent(step_gap_max_s=0.06, step_gap_typical_s=0.03)) is None  # twice the median
    assert step_gaps.note(SimpleNamespace(pid=7, exit_info={})) is None  # a recording from before


def test_the_longest_gap_between_steps_starts():
    """Each step's first module call stamps its start (step_inputs.py calls step_start): the longest gap
    between two starts after the warm-up, and the step it began; a second call in one step is not a
    start; without starts the figures are null."""
    felt = Felt()
    assert felt.record()["step_start_gap_max_s"] is None
    t = 100.0
    for step in range(1, 40):
        wait = 0.040 if step == 20 else 0.010  # the program's sync after step 19's optimizer took long
        felt.step_start(t)
        felt.step_start(t + 0.001)  # a later module call of the same step: not a start
        t += 0.005
        felt.step_end(t, step)  # the optimizer's hook
        t += wait
    r = felt.record()
    assert r["step_start_gap_max_step"] == 21 and abs(r["step_start_gap_max_s"] - 0.045) < 1e-9, r
    assert r["step_gaps"] == 39 - GAP_WARMUP_STEPS - 1


def test_the_agents_step_inputs_hook_stamps_the_start():
    from gpumemdoctor._agent.readings import step_inputs

    felt = Felt()
    s = step_inputs.StepInputs(SimpleNamespace(), felt)
    s.handle = SimpleNamespace(remove=lambda: None)
    s._read(None, ())
    assert felt.started == 1 and felt.last_start > 0


def test_what_ran_between_two_starts_is_kept_beside_the_ends():
    """The agent's work at a step's end falls in both the gap that ends there and the starts' gap
    around it; work after the end and before the next start falls in the next end's gap too, but
    in the starts' gap that it lies in."""
    felt = Felt()
    t = 100.0
    for step in range(1, 30):
        felt.step_start(t)
        t += 0.004
        if step == 20:
            felt.add(GROWTH_WATCH, 0.003)  # at step 20's end: the growth watch's suspicion
            t += 0.003
        felt.step_end(t, step)
        t += 0.001
    r = felt.record()
    assert r["step_gap_max_step"] == 20 and r["step_gap_agent_parts"] == {"growth_watch": 0.003}
    assert r["step_start_gap_max_step"] == 21 and abs(r["step_start_gap_max_s"] - 0.008) < 1e-9
    assert r["step_start_gap_agent_parts"] == {"growth_watch": 0.003} and r["step_start_gap_agent_s"] == 0.003
    assert abs(r["step_start_gap_typical_s"] - 0.005) < 1e-9 and r["step_start_gaps"] == 29 - GAP_WARMUP_STEPS - 1
    assert r["step_start_gap_collection_s"] == 0 and r["step_start_gap_collection_generation"] is None


def test_the_note_leads_with_the_starts_gap_and_names_the_agents_parts():
    text = step_gaps.note(_agent(step_start_gap_max_s=0.2, step_start_gap_max_step=230, step_start_gap_agent_s=0.004,
                                 step_start_gap_agent_parts={"growth_watch": 0.003, "sample": 0.0009,
                                                             "collector": 0.00005},
                                 step_start_gap_collection_s=0.0, step_start_gap_collection_generation=None,
                                 step_start_gap_typical_s=0.006, step_start_gaps=249))
    assert text == ("process 7: the longest gap between two steps' starts was 200 ms, at step 230 (the median of "
                    "the gaps before it: 6.0 ms); in it: gpumemdoctor's own work 4.0 ms (its growth watch 3.0 ms, "
                    "its samples 0.9 ms), 196 ms that was neither (the program's own work, or a wait outside Python)")


def test_every_part_has_its_words():
    from gpumemdoctor.contract import AGENT_PARTS
    from gpumemdoctor.diagnosis.summaries_run import PART_WORDS

    assert set(PART_WORDS) == set(AGENT_PARTS)
