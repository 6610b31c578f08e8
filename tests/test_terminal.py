"""The terminal report, rendered from GPU recordings into an 80-column console without colour.

The expected texts in tests/fixtures/terminal were rendered by this reporter and read
by a person; set GPUMEMDOCTOR_UPDATE_GOLDEN=1 to write them again after a deliberate change.
"""
from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from rich.console import Console

from gpumemdoctor.diagnosis.diagnose import diagnose
from gpumemdoctor.recording.recording import Recording
from gpumemdoctor.app.report_file import build, parse
from gpumemdoctor.reporters import terminal

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = ["clean_adam", "leak_training_list", "non_torch_threads", "orphan_child"]


def render(name: str, width: int = 80) -> str:
    report = json.loads((FIXTURES / "reports" / f"{name}.json").read_text())
    recording = Recording.from_json(report["recording"])
    out = io.StringIO()
    console = Console(file=out, width=width, no_color=True, color_system=None, highlight=False,
                      emoji=False)
    terminal.render(console, recording, diagnose(recording), f"gpumemdoctor-{name}.json")
    return out.getvalue()


@pytest.mark.parametrize("name", GOLDEN)
def test_report_text(name):
    text = render(name)
    golden = FIXTURES / "terminal" / f"{name}.txt"
    if os.environ.get("GPUMEMDOCTOR_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()


@pytest.mark.parametrize("name", GOLDEN)
def test_fits_in_80_columns_and_says_the_verdict_first(name):
    text = render(name)
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 80
    first = text.splitlines()[0]
    report = json.loads((FIXTURES / "reports" / f"{name}.json").read_text())
    assert first.startswith(f"gpumemdoctor verdict: {report['verdict']}")


def test_saved_report_renders_the_same_as_a_fresh_diagnosis():
    report = json.loads((FIXTURES / "reports" / "leak_training_list.json").read_text())
    recording = Recording.from_json(report["recording"])
    rebuilt = json.loads(json.dumps(build(recording, diagnose(recording))))
    again, diagnosis = parse(rebuilt)
    out = io.StringIO()
    terminal.render(Console(file=out, width=80, no_color=True, color_system=None, highlight=False,
                            emoji=False), again, diagnosis, "gpumemdoctor-leak_training_list.json")
    assert out.getvalue() == render("leak_training_list")


def test_sparkline_scales_to_the_given_top():
    assert terminal.sparkline([0, 4, 8], top=8, width=3) == "▁▄█"
    assert terminal.sparkline([1, 1], top=8, width=2) == "▁▁"
    assert terminal.sparkline([], top=8) == ""


def test_a_sparkline_of_fewer_values_than_columns_draws_each_value():
    from gpumemdoctor.reporters.terminal import sparkline

    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7], 7) == "▁▂▃▄▅▆▇█"
    assert len(sparkline(list(range(100)), 99)) == 40


def test_every_verdict_and_peak_part_has_its_words():
    """The words both reports use (reporters/vocabulary.py): a meaning and a style for each verdict,
    a label for each part of a peak."""
    from gpumemdoctor.diagnosis.findings import PEAK_CATEGORIES, VERDICTS
    from gpumemdoctor.reporters import vocabulary

    assert set(vocabulary.VERDICT_MEANING) == set(vocabulary.VERDICT_STYLE) == set(VERDICTS)
    assert set(vocabulary.PEAK_LABELS) == set(PEAK_CATEGORIES)


def test_the_breakdown_draws_the_parts_it_was_given():
    """A breakdown with every part measured (figures made up here, not recorded): each part on a line
    of its own, indented under what it is part of, within 80 columns."""
    from gpumemdoctor.diagnosis.diagnose import Breakdown

    MiB = 1 << 20
    b = Breakdown(pid=7, device=0, torch_index=0, nvml_bytes=884 * MiB, context_bytes=520 * MiB,
                  live_tensor_bytes=8 * MiB, garbage_bytes=0, pending_stream_bytes=0, cache_bytes=56 * MiB,
                  non_torch_bytes=300 * MiB, exit_probes=True, cublas_workspace_bytes=8 * MiB,
                  private_pool_bytes=48 * MiB, non_torch_warmup_bytes=44 * MiB, non_torch_cupy_bytes=256 * MiB,
                  non_torch_rest_bytes=0, nccl=True)
    out = io.StringIO()
    terminal._breakdown(Console(file=out, width=80, no_color=True, color_system=None, highlight=False,
                                emoji=False), b)
    lines = [line.rstrip() for line in out.getvalue().splitlines() if line.strip()]
    assert max(len(line) for line in lines) <= 80
    names = [line[:20].rstrip() for line in lines[1:] if not line.startswith(" " * 20)]
    assert names == ["CUDA context", "live tensors", "  cuBLAS workspaces", "garbage cycles", "pending stream",
                     "allocator cache", "  CUDA graph pools", "outside PyTorch", "  in warm-up", "  CuPy's pool",
                     "  the rest", "NVML total"]
    assert any("kernels, libraries, NCCL: loaded on first use" in line for line in lines)
    # without the parts (a report made before they were measured) the table is as it was
    old = Breakdown(pid=7, device=0, torch_index=0, nvml_bytes=884 * MiB, context_bytes=520 * MiB,
                    non_torch_bytes=300 * MiB, exit_probes=True)
    out = io.StringIO()
    terminal._breakdown(Console(file=out, width=80, no_color=True, color_system=None), old)
    assert "in warm-up" not in out.getvalue() and "CuPy, cudaMalloc, NCCL, loaded kernels" in out.getvalue()


@pytest.mark.parametrize("gave_up, shown", [
    ("stopped at its 1 s budget with 3 of 5 allocations not reached (10 objects in the heap)",
     "stopped at its 1 s budget with 3 of 5 allocations not reached (10 objects in the heap)"),
    ("reached the end of what the sweep and the climb could reach with 1 of 2 allocations not reached",
     "reached the end of what the sweep and the climb could reach with 1 of 2 allocations not reached"),
    ("after 48,128 objects", "gave up after 48,128 objects"),  # an older report's words
])
def test_a_search_that_stopped_says_how_once(gave_up, shown):
    from gpumemdoctor.diagnosis.suspects import gave_up_text

    assert gave_up_text(gave_up) == shown


# -- what made the peak (compositions made up here: tests/peak_samples.py, never recorded) ---------

def _drawn_peak(compositions, width: int = 80) -> str:
    from gpumemdoctor.diagnosis.diagnose import Diagnosis

    diagnosis = Diagnosis(verdict="clean", findings=[], breakdowns=[], growth=[],
                          peaks={"nvml_bytes": 4 << 30, "nvml_t": 2.0}, notes=[], peak_compositions=compositions)
    out = io.StringIO()
    terminal._peak_compositions(Console(file=out, width=width, no_color=True, color_system=None,
                                        highlight=False, emoji=False), diagnosis)
    return out.getvalue()


def test_what_made_the_peak_is_a_table_of_the_largest_process_within_80_columns():
    from tests.peak_samples import GiB, MiB, composition, training_peak

    other = composition(pid=99, gradients=GiB, context=500 * MiB, temporaries=64 * MiB)
    text = _drawn_peak([other, training_peak()])
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    assert max(len(line) for line in lines) <= 80
    assert lines[0] == "What made the peak: 3.57 GiB (process 4242, GPU 0, at 2.0 s, step 7)"
    assert lines[1] == "  running train.py:88 in step()"
    rows = [line.split()[:2] for line in lines[3:10]]
    # PEAK_CATEGORIES' order, parts of 0 bytes left out (gradients... graphs-kept, temporaries, fragmentation)
    assert [" ".join(r) for r in rows] == ["parameters 512", "gradients 512", "optimizer state", "unclassified 768",
                                           "allocator cache", "outside PyTorch", "CUDA context"]
    assert "  optimizer state 1.00 GiB   28% holder of optimizer-state 1.00 GiB, train.py:12" in lines
    assert not any("graphs kept" in line or "fragmentation" in line for line in lines)
    joined = " ".join(line.strip() for line in lines)
    assert "note: the holders of 768 MiB were not searched at this moment: read from the exit search" in joined
    assert ("note: PyTorch's allocated peak reached 2.94 GiB by then, 192 MiB above this moment, at a moment of "
            "its own that this reading did not see (the counter is never reset: any before this one)") in joined
    # the other process: one line, its total and its two largest parts
    assert "also: process 99, GPU 0, at 2.0 s, step 7: 1.55 GiB (gradients 1.00 GiB, CUDA context 500 MiB)" in joined


@pytest.mark.parametrize("inside, shown", [
    ("optimizer step", "read inside an optimizer's step: its temporaries"),
    ("backward", "read while the program was inside backward(): activations saved"),
    (None, None),
])
def test_an_unclassified_part_says_where_it_was_read_when_that_tells_what_it_is(inside, shown):
    from gpumemdoctor.diagnosis.peak import _unclassified_how
    from tests.peak_samples import MiB, composition

    c = composition(parameters=512 * MiB, unclassified=577 * MiB, context=500 * MiB)
    part = next(p for p in c.parts if p.category == "unclassified")
    part.holders, part.how = [], _unclassified_how({"inside": inside}, probe={"n": 1, "elapsed_s": 0.001})
    row = next(line for line in _drawn_peak([c], width=200).splitlines() if "unclassified" in line)
    if shown:
        assert row.split("%", 1)[1].strip().startswith(shown)
    else:
        assert row.rstrip().endswith("%")  # nothing told: the holder's column stays empty


def test_a_peak_context_of_0_bytes_is_still_drawn_and_a_pause_is_said():
    from tests.peak_samples import MiB, composition

    c = composition(parameters=8 * MiB, context=0, t=None)
    c.in_pause, c.step = True, None
    text = _drawn_peak([c])
    assert "What made the peak: 8.00 MiB (process 4242, GPU 0, in a pause in the steps)" in text
    assert "CUDA context" in text and "note:" not in text and "also:" not in text


def test_reports_without_compositions_draw_no_peak_table():
    from tests.older import older_fixture

    assert _drawn_peak([]) == ""
    for name in GOLDEN:
        assert "What made the peak" in render(name)
        recording = Recording.from_json(older_fixture(name)["recording"])
        out = io.StringIO()
        terminal.render(Console(file=out, width=80, no_color=True, color_system=None), recording,
                        diagnose(recording), f"{name}.json")
        assert "What made the peak" not in out.getvalue()
