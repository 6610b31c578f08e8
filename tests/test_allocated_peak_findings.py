"""The findings made at PyTorch's allocated peak (gpumemdoctor/diagnosis/allocated_peak.py): a
concatenation made while its pieces were held, grown reading after reading inside a library's
gathering loop (the Trainer's evaluation), gets the library's own remedy. The compositions and
readings here are made up (tests/peak_samples.py); recorded ones are in tests/test_peak_reference.py."""
from __future__ import annotations

from gpumemdoctor.diagnosis.allocated_peak import LOOP_REMEDIES, findings
from gpumemdoctor.recording.records import PEAK_HISTORY
from tests.peak_samples import GiB, composition


def _reading(t: float, result: int, loop=None, called=None, holder=None) -> dict:
    part = {"bytes": result, "blocks": 2, "first_before_s": 0.5, "last_before_s": 0.1}
    return PEAK_HISTORY({"n": 1, "t": t, "device": 0, "counter": 2 * result, "allocated_peak": 2 * result,
                         "phase": "outside", "complete": True,
                         "parts": {"gathered": part, "kept-tensors": part}, "loop": loop, "loop_called_at": called,
                         "loop_holder": holder,
                         "joined": {"bytes": result, "pieces": 2, "pieces_bytes": result}}, "peak_history")


def test_a_concatenation_grown_in_the_trainers_evaluation_loop_gets_the_trainers_remedy():
    holder = "evaluation_loop() local all_preds.tensors at trainer.py:4398"
    readings = [_reading(1.0, 2 * GiB), _reading(2.0, 4 * GiB),
                _reading(3.0, 8 * GiB, "transformers.Trainer.evaluation_loop", "eval.py:40 in main()", holder)]
    c = composition(gathered=8 * GiB, kept_tensors=8 * GiB, cache=30 * GiB, context=GiB)
    (f,) = findings(c, readings[-1], "process 1", readings)
    assert f.kind == "temporary-peak" and f.remedy == LOOP_REMEDIES["transformers.Trainer.evaluation_loop"]
    assert "eval_accumulation_steps" in f.remedy and "preprocess_logits_for_metrics" in f.remedy
    assert "grew reading after reading (3 readings: 2.00 GiB to 8.00 GiB)" in f.summary
    assert "30.0 GiB of cache at this moment" in f.summary
    assert "while transformers.Trainer.evaluation_loop ran, called at eval.py:40 in main()" in f.summary
    assert f.evidence["loop_called_at"] == "eval.py:40 in main()"
    assert f.summary.endswith(f"; at the reading the result was held by {holder} (the line the loop was on)") and f.evidence["loop_holder"] == holder
    assert f.evidence["grown_bytes"] == [2 * GiB, 4 * GiB, 8 * GiB] and f.evidence["loop"].endswith("evaluation_loop")


def test_a_single_concatenation_outside_a_library_loop_keeps_the_general_remedy():
    reading = _reading(1.0, 8 * GiB)
    c = composition(gathered=8 * GiB, kept_tensors=8 * GiB, context=GiB)
    (f,) = findings(c, reading, "process 1", [reading])
    assert "torch.empty" in f.remedy and "grew" not in f.summary and "loop" not in f.evidence
    # Sizes that do not step up are no growth.
    readings = [_reading(1.0, 8 * GiB), _reading(2.0, 4 * GiB), _reading(3.0, 8 * GiB)]
    (f,) = findings(c, readings[-1], "process 1", readings)
    assert "grew" not in f.summary
