"""What filled the allocator's cache at a peak (gpumemdoctor/diagnosis/cache_filled.py): reserved
memory that grew beyond the allocated peak counter's rise (sizes it could not serve), or one moment's
allocated memory let go; on recorded runs and on samples made up here."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from gpumemdoctor.diagnosis import cache_filled
from gpumemdoctor.diagnosis.diagnose import diagnose
from gpumemdoctor.recording.recording import Recording, TorchSample
from gpumemdoctor.recording.records import DeviceReading
from tests.peak_samples import MiB, composition

FIXTURES = Path(__file__).parent / "fixtures"


def _shown(path: Path):
    recording = Recording.from_json(json.loads(path.read_text())["recording"])
    (c,) = [c for c in diagnose(recording).peak_compositions if c.pid == recording.target_pid]
    return c


def test_shapes_that_vary_are_said_to_have_filled_the_cache():
    """scenarios/clean_varying_shapes.py on an H100: 1.41 GiB of cache at the peak, 321 MiB in use."""
    c = _shown(FIXTURES / "reports" / "clean_varying_shapes.json")
    (said,) = [n for n in c.notes if n.startswith("what filled the cache")]
    assert "PyTorch reserved 864 MiB more, over 5 intervals" in said and "expandable_segments" in said


def test_no_word_where_the_cache_is_the_smaller_part():
    c = _shown(FIXTURES / "reports" / "clean_eval_sum_without_no_grad.json")
    assert not [n for n in c.notes if n.startswith("what filled the cache")]


def _agent(*rows):
    """Samples of (reserved, allocated peak counter) in MiB, one a second."""
    return SimpleNamespace(samples=[TorchSample(t=float(i), by="time", step=i, readings=[
        DeviceReading(0, 100 * MiB, 100 * MiB, reserved * MiB, None, None, counter * MiB)])
        for i, (reserved, counter) in enumerate(rows)])


def test_one_moment_that_filled_the_cache_and_let_it_go_is_said():
    agent = _agent((200, 100), (1200, 1100), (1200, 1100))  # the counter rose with the reserved memory
    c = composition(t=2.0, kept_tensors=100 * MiB, cache=1100 * MiB)
    c.allocated_peak_bytes = 1100 * MiB
    assert cache_filled.unserved(agent, 0, 2.0) == (0, 0)
    said = cache_filled.note(agent, c)
    assert said.startswith("what filled the cache: PyTorch's allocated memory had reached 1.07 GiB") and "92%" in said
    # Reserved beyond the counter's rise, in two intervals: sizes it could not serve.
    agent = _agent((200, 150), (700, 160), (1200, 170))
    assert cache_filled.unserved(agent, 0, 2.0) == (980 * MiB, 2)
    assert "reserved 980 MiB more, over 2 intervals" in cache_filled.note(agent, c)
    # A cache smaller than what is in use: nothing said.
    assert cache_filled.note(agent, composition(t=2.0, kept_tensors=2000 * MiB, cache=1100 * MiB)) is None
