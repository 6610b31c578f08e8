"""The program's own allocator snapshots under the agent (search/blocks.py's quiet_program_snapshots):
taken with torch._inductor answered as absent, as the agent's own are, so that the history the tool
records does not make the program's `torch.cuda.memory_snapshot()` import it (6.75 s on an H200)."""
from __future__ import annotations

import sys
import types

from gpumemdoctor._agent.search.blocks import quiet_program_snapshots


def _fake_torch(seen: list):
    torch = types.ModuleType("fake_torch")
    c = types.ModuleType("fake_torch._C")

    def _cuda_memorySnapshot(arg):
        seen.append(("_inductor" in torch.__dict__, arg))  # what a symbolizer's hasattr would find
        return {"segments": [arg]}

    c._cuda_memorySnapshot = _cuda_memorySnapshot
    torch._C = c
    return torch, _cuda_memorySnapshot


def test_the_programs_snapshot_is_taken_with_inductor_absent_and_answers_as_before(monkeypatch):
    # The premise: no torch._inductor in this process. Another test in the same worker may have
    # imported the real one (CI's full suite did), so it is taken out of sys.modules for this test.
    monkeypatch.delitem(sys.modules, "torch._inductor", raising=False)
    seen: list = []
    torch, original = _fake_torch(seen)
    assert quiet_program_snapshots(torch)
    wrapped = torch._C._cuda_memorySnapshot
    assert wrapped is not original and wrapped.__wrapped__ is original
    assert torch._C._cuda_memorySnapshot(None) == {"segments": [None]}
    assert seen == [(True, None)]  # the stub was there during the call
    assert "_inductor" not in torch.__dict__  # and is gone after it
    assert quiet_program_snapshots(torch) and torch._C._cuda_memorySnapshot is wrapped  # once


def test_an_inductor_the_program_has_is_left_as_it_is():
    seen: list = []
    torch, _ = _fake_torch(seen)
    mine = object()
    torch._inductor = mine
    quiet_program_snapshots(torch)
    torch._C._cuda_memorySnapshot((0, 0, False))
    assert torch.__dict__["_inductor"] is mine and seen == [(True, (0, 0, False))]


def test_an_error_of_the_snapshot_reaches_the_program_and_leaves_no_stub(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch._inductor", raising=False)  # so that a stub is made
    torch, _ = _fake_torch([])

    stubbed = []

    def failing(arg):
        stubbed.append("_inductor" in torch.__dict__)
        raise RuntimeError("CUDA not initialized")

    torch._C._cuda_memorySnapshot = failing
    quiet_program_snapshots(torch)
    try:
        torch._C._cuda_memorySnapshot(None)
    except RuntimeError as exc:
        assert "CUDA" in str(exc)
    else:
        raise AssertionError("the error did not reach the caller")
    assert stubbed == [True] and "_inductor" not in torch.__dict__


def test_a_torch_without_the_function_is_left_alone():
    torch = types.ModuleType("fake_torch")
    torch._C = types.ModuleType("fake_torch._C")
    assert not quiet_program_snapshots(torch) and not hasattr(torch._C, "_cuda_memorySnapshot")
