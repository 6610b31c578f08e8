"""The pytest plugin (`pytest --vram-check`, the vram_* markers) without a GPU.

Three kinds of test: the decisions on plain numbers (judge_*), the plugin in a
real pytest subprocess as its entry point loads it, and the plugin's whole
protocol against FAKE_TORCH, a test double of torch.cuda whose "allocations"
are Python objects, so that leaks, fixtures and peaks can be checked here.
tests/gpu/test_pytest_plugin_gpu.py runs the same kind of checks on a real GPU.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from gpumemdoctor.pytest_plugin import (NVML_FLOOR_BYTES, judge_leak, judge_limit, judge_outside,
                                        needs_peak_reset)

pytest_plugins = ["pytester"]

MIB = 1 << 20
NO_CUDA_LINE = "gpumemdoctor: no CUDA in this session; VRAM checks were skipped"

# A test double of torch for the plugin, named as such: `torch.empty(n)` makes an object
# that counts n bytes as allocated until it is freed, and starts "CUDA" the first time.
FAKE_TORCH = '''
import sys, types

class _State:
    initialised = False
    allocated = reserved = peak = reserved_peak = 0

S = _State()

class FakeTensor:
    def __init__(self, nbytes):
        S.initialised = True
        self.nbytes = nbytes
        S.allocated += nbytes
        S.reserved = max(S.reserved, S.allocated)
        S.peak = max(S.peak, S.allocated)
        S.reserved_peak = max(S.reserved_peak, S.reserved)

    def __del__(self):
        S.allocated -= self.nbytes

def _stats(index):
    return {"allocated_bytes": {"all": {"current": S.allocated, "peak": S.peak}},
            "reserved_bytes": {"all": {"current": S.reserved, "peak": S.reserved_peak}}}

def _reset(index):
    S.peak, S.reserved_peak = S.allocated, S.reserved

fake_torch = types.ModuleType("torch")
fake_torch.empty = FakeTensor
fake_torch._C = types.SimpleNamespace()
fake_torch.cuda = types.SimpleNamespace(
    is_initialized=lambda: S.initialised, device_count=lambda: 1,
    memory_stats_as_nested_dict=_stats, synchronize=lambda index: None,
    reset_peak_memory_stats=_reset, max_memory_allocated=lambda index=0: S.peak,
    is_current_stream_capturing=lambda: False,
    get_device_properties=lambda index: types.SimpleNamespace(uuid="fake-gpu"))
sys.modules["torch"] = fake_torch
'''


# -- the decisions, on plain numbers -------------------------------------------------------
def test_judge_leak_plain_numbers():
    assert judge_leak(100 * MIB, 100 * MIB, MIB) is None
    assert judge_leak(100 * MIB, 101 * MIB, MIB) is None  # exactly the threshold is allowed
    assert judge_leak(100 * MIB, 90 * MIB, MIB) is None  # freeing is never a leak
    message = judge_leak(1 << 30, (1 << 30) + 8 * MIB, MIB, device="cuda:1")
    assert message.startswith("VRAM leak: cuda:1 allocated grew by 8.00 MiB (8388608 bytes)")
    assert "before 1.00 GiB, after 1.01 GiB, after gc.collect()" in message


def test_judge_leak_leaves_out_wider_fixtures_plain_numbers():
    assert judge_leak(0, 100 * MIB, MIB, fixtures=100 * MIB) is None
    message = judge_leak(0, 108 * MIB, MIB, fixtures=100 * MIB)
    assert "grew by 8.00 MiB" in message and "less 100 MiB held by wider-scoped fixtures" in message


def test_judge_outside_plain_numbers():
    assert judge_outside(64 * MIB, 64 * MIB, MIB) is None  # the allocator's own growth
    assert judge_outside(NVML_FLOOR_BYTES, 0, MIB) is None  # within the 32 MiB floor
    assert judge_outside(40 * MIB, 0, 64 * MIB) is None  # a threshold above the floor wins
    message = judge_outside(200 * MIB, 2 * MIB, MIB, device="cuda:0")
    assert "outside PyTorch's allocator grew by 198 MiB" in message
    assert "NVML +200 MiB" in message and "reserved +2.00 MiB" in message


def test_judge_limit_plain_numbers():
    limit = 128 * MIB
    # The test set a new peak: that is its peak.
    assert judge_limit(0, 100 * MIB, limit) is None
    message = judge_limit(0, 256 * MIB, limit, start=10 * MIB)
    assert message.startswith("VRAM limit: cuda:0 peak allocated during this test was 256 MiB")
    assert "above its vram_limit of 128 MiB" in message and "10.0 MiB was allocated" in message
    # No new peak: the test stayed at or below the earlier peak, which is within the limit.
    assert not needs_peak_reset(100 * MIB, limit)
    assert judge_limit(100 * MIB, 100 * MIB, limit) is None
    # The earlier peak is above the limit: only a reset before the test can tell.
    assert needs_peak_reset(256 * MIB, limit)
    assert judge_limit(64 * MIB, 64 * MIB, limit, was_reset=True) is None
    assert judge_limit(200 * MIB, 200 * MIB, limit, was_reset=True) is not None


# -- the plugin as pytest loads it ------------------------------------------------------------
def test_importing_the_plugin_loads_neither_torch_nor_pynvml():
    code = ("import sys, gpumemdoctor.pytest_plugin; "
            "print(sorted(m for m in ('torch', 'pynvml') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_vram_check_without_cuda_passes_and_says_so_once(pytester):
    pytester.makepyfile("""
        def test_one():
            assert 1 + 1 == 2

        def test_two():
            import torch
            assert torch.ones(3).sum().item() == 3  # on the CPU: CUDA never starts
    """)
    pytest.importorskip("torch")
    result = pytester.runpytest_subprocess("--vram-check")
    result.assert_outcomes(passed=2)
    assert result.stdout.str().count(NO_CUDA_LINE) == 1


def test_off_unless_asked(pytester):
    pytester.makepyfile("def test_one():\n    pass\n")
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1)
    assert "gpumemdoctor:" not in result.stdout.str()


def test_ini_option_turns_it_on(pytester):
    pytester.makeini("[pytest]\nvram_check = true\n")
    pytester.makepyfile("def test_one():\n    pass\n")
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1)
    assert result.stdout.str().count(NO_CUDA_LINE) == 1


def test_markers_are_registered(pytester):
    pytester.makepyfile("""
        import pytest

        @pytest.mark.vram_leak_free
        def test_leak_free():
            pass

        @pytest.mark.vram_limit("2GiB")
        def test_limited():
            pass
    """)
    result = pytester.runpytest_subprocess("--strict-markers")
    result.assert_outcomes(passed=2)
    assert result.stdout.str().count(NO_CUDA_LINE) == 1  # the markers alone turn the checks on


def test_bad_threshold_is_a_usage_error(pytester):
    pytester.makepyfile("def test_one():\n    pass\n")
    result = pytester.runpytest_subprocess("--vram-check", "--vram-threshold", "nonsense")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--vram-threshold" in result.stderr.str()
    assert "'nonsense' is not a size" in result.stderr.str()


def test_bad_vram_limit_is_a_usage_error(pytester):
    pytester.makepyfile("""
        import pytest

        @pytest.mark.vram_limit("lots")
        def test_limited():
            pass
    """)
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "test_limited: vram_limit('lots')" in result.stderr.str()


def test_a_failing_test_fails_as_usual(pytester):
    pytester.makepyfile("""
        def test_fails():
            assert 1 == 2

        def test_passes():
            pass
    """)
    result = pytester.runpytest_subprocess("--vram-check")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*assert 1 == 2*"])


def test_works_under_xdist(pytester):
    pytest.importorskip("xdist")
    pytester.makepyfile("\n".join(f"def test_{i}():\n    pass\n" for i in range(6)))
    result = pytester.runpytest_subprocess("--vram-check", "-n", "2", "-p", "xdist")
    result.assert_outcomes(passed=6)
    assert result.stdout.str().count(NO_CUDA_LINE) == 1


# -- the whole protocol, against the torch test double -------------------------------------
LEAKS = """
    import pytest
    import torch

    MIB = 1 << 20
    KEPT = []

    @pytest.fixture(scope="module")
    def model():
        return torch.empty(100 * MIB)

    @pytest.fixture
    def scratch():
        return torch.empty(50 * MIB)

    @pytest.fixture
    def bucket():
        return []

    def test_starts_cuda():
        x = torch.empty(10 * MIB)

    def test_leaks():
        KEPT.append(torch.empty(8 * MIB))

    def test_module_fixture(model):
        pass

    def test_function_fixture(scratch):
        pass

    def test_fills_a_function_fixture(bucket):
        bucket.append(torch.empty(20 * MIB))

    def test_below_threshold():
        KEPT.append(torch.empty(MIB // 2))

    def test_garbage_cycle():  # freed by the plugin's gc.collect(): no leak
        class Node:
            pass
        node = Node()
        node.self, node.tensor = node, torch.empty(64 * MIB)

    def test_fails_itself():
        KEPT.append(torch.empty(8 * MIB))
        assert 1 == 2
"""


def test_leaks_fail_with_their_bytes_fake_torch(pytester):
    pytester.makeconftest(FAKE_TORCH)
    pytester.makepyfile(LEAKS)
    result = pytester.runpytest_subprocess("--vram-check", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=6, failed=2)
    text = result.stdout.str()
    result.stdout.fnmatch_lines([
        "*_ test_leaks _*",
        ("VRAM leak: cuda:0 allocated grew by 8.00 MiB (8388608 bytes) during this test "
         "(before 0 B, after 8.00 MiB, after gc.collect()*"),
    ])
    # One failure message (the short summary may repeat its start); a test that failed on its
    # own keeps its own failure.
    assert len([line for line in result.outlines if line.startswith("VRAM leak: ")]) == 1
    result.stdout.fnmatch_lines(["*_ test_fails_itself _*", "*assert 1 == 2*"])
    assert "CUDA started during test_leaks_fail_with_their_bytes_fake_torch.py::test_starts_cuda" in text


def test_leak_free_marker_checks_one_test_fake_torch(pytester):
    pytester.makeconftest(FAKE_TORCH)
    pytester.makepyfile("""
        import pytest
        import torch

        KEPT = []

        def test_unchecked():
            KEPT.append(torch.empty(8 << 20))

        @pytest.mark.vram_leak_free
        def test_checked():
            KEPT.append(torch.empty(8 << 20))
    """)
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*_ test_checked _*", "VRAM leak: cuda:0 allocated grew by 8.00 MiB*"])


def test_threshold_option_fake_torch(pytester):
    pytester.makeconftest(FAKE_TORCH)
    pytester.makepyfile("""
        import torch

        KEPT = []

        def test_leaks_a_little():
            KEPT.append(torch.empty(8 << 20))
    """)
    pytester.runpytest_subprocess("--vram-check", "--vram-threshold", "16MiB").assert_outcomes(passed=1)


def test_vram_limit_fake_torch(pytester):
    pytester.makeconftest(FAKE_TORCH)
    pytester.makepyfile("""
        import pytest
        import torch

        MIB = 1 << 20

        @pytest.mark.vram_limit("128MiB")
        def test_a_over():
            x = torch.empty(256 * MIB)

        @pytest.mark.vram_limit("1GiB")
        def test_b_under():
            x = torch.empty(256 * MIB)

        @pytest.mark.vram_limit("1GiB")
        def test_c_peak_left_alone():
            assert torch.cuda.max_memory_allocated() == 256 * MIB

        @pytest.mark.vram_limit("192MiB")
        def test_d_under_after_reset():
            x = torch.empty(128 * MIB)

        @pytest.mark.vram_limit(192 << 20)
        def test_e_over():
            x = torch.empty(256 * MIB)
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.fnmatch_lines([
        "*_ test_a_over _*",
        ("VRAM limit: cuda:0 peak allocated during this test was 256 MiB (268435456 bytes), above "
         "its vram_limit of 128 MiB (134217728 bytes)."),
        "*_ test_e_over _*",
        "VRAM limit: cuda:0 peak allocated during this test was 256 MiB*above its vram_limit of 192 MiB*",
    ])
    text = result.stdout.str()
    assert "test_d_under_after_reset: reset PyTorch's peak memory statistics on cuda:0" in text
    assert "test_c_peak_left_alone: reset" not in text


def test_leak_under_xdist_fake_torch(pytester):
    pytest.importorskip("xdist")
    pytester.makeconftest(FAKE_TORCH)
    pytester.makepyfile(LEAKS)
    result = pytester.runpytest_subprocess("--vram-check", "-n", "2", "-p", "xdist")
    result.assert_outcomes(passed=6, failed=2)
    result.stdout.fnmatch_lines(["*VRAM leak: cuda:0 allocated grew by 8.00 MiB*"])
    assert result.stdout.str().count("gpumemdoctor: VRAM checked in") == 1


def test_an_error_in_the_plugin_never_fails_a_test_fake_torch(pytester):
    pytester.makeconftest(FAKE_TORCH + '''
def _broken(index):
    raise RuntimeError("the stats are gone")

fake_torch.cuda.memory_stats_as_nested_dict = _broken
''')
    pytester.makepyfile("""
        import torch

        KEPT = []

        def test_one():
            KEPT.append(torch.empty(8 << 20))

        def test_two():
            KEPT.append(torch.empty(8 << 20))
    """)
    result = pytester.runpytest_subprocess("--vram-check")
    result.assert_outcomes(passed=2)
    assert result.stdout.str().count("gpumemdoctor: VRAM checks stopped after an error in "
                                     "gpumemdoctor's plugin (RuntimeError: the stats are gone)") == 1


# -- what filled a vram_limit test's peak --------------------------------------------------------

def test_judge_limit_parts_plain_numbers():
    from gpumemdoctor.pytest_plugin import judge_limit_parts

    parts = {"parameters": 64 * MIB, "gradients": 64 * MIB, "optimizer state": 128 * MIB}
    assert judge_limit_parts(400 * MIB, parts, 3) == (
        "What filled it, read at the last optimizer step (step 3 of the test), not at the peak itself: "
        "parameters 64.0 MiB, gradients 64.0 MiB, optimizer state 128 MiB; the rest of the peak, 144 MiB, "
        "unclassified (activations, temporaries).")
    assert "(the only one)" in judge_limit_parts(400 * MIB, parts, 1)
    assert "the rest of the peak, 0 B," in judge_limit_parts(100 * MIB, parts, 1)  # never negative
    assert judge_limit_parts(400 * MIB, None, 0).startswith("What filled it is not known here: no optimizer stepped")


def _need_torch() -> None:
    """Skip without torch, without importing it here (an earlier test's in-process run replaced it)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        pytest.skip("needs torch (a CPU build will do)")


OPTIMIZER_PARTS_CPU = """
import torch
from gpumemdoctor.pytest_plugin import optimizer_parts

model = torch.nn.Linear(4, 4)  # 16 + 4 float32: 80 bytes
adam = torch.optim.Adam(model.parameters())
model(torch.ones(2, 4)).sum().backward()
adam.step()
parts = optimizer_parts([adam])
# Adam's state: exp_avg and exp_avg_sq like each parameter, and a 4-byte step per parameter
assert parts == {"cpu": {"parameters": 80, "gradients": 80, "optimizer state": 2 * 80 + 2 * 4}}, parts
# a parameter in two optimizers, a state tensor that views a parameter: counted once, where first found
sgd = torch.optim.SGD([model.weight], lr=0.1)
sgd.state[model.weight]["view"] = model.weight.data[0]
assert optimizer_parts([adam, sgd]) == parts
assert optimizer_parts([]) == {}
print("ok")
"""


def test_optimizer_parts_count_each_storage_once_per_device_cpu():
    """Real torch on CPU, in a process of its own (torch is imported once per process)."""
    _need_torch()
    out = subprocess.run([sys.executable, "-c", OPTIMIZER_PARTS_CPU], capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_the_step_hook_is_there_during_a_vram_limit_test_only_cpu(pytester):
    """Real torch on CPU: CUDA never starts, so nothing is measured, but the hook comes and goes."""
    _need_torch()
    pytester.makepyfile("""
        import pytest
        import torch
        import torch.optim.optimizer as opt

        def test_a_plain():
            assert len(opt._global_optimizer_post_hooks) == 0

        @pytest.mark.vram_limit("1GiB")
        def test_b_limited():
            assert len(opt._global_optimizer_post_hooks) == 1
            model = torch.nn.Linear(4, 4)
            sgd = torch.optim.SGD(model.parameters(), lr=0.1)
            model(torch.ones(1, 4)).sum().backward()
            sgd.step()

        def test_c_after():
            assert len(opt._global_optimizer_post_hooks) == 0
    """)
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly").assert_outcomes(passed=3)


# The fake torch with a fake optimizer: its tensors have storages on "cuda:0", and its step runs the
# global step post hooks, as torch.optim's does.
FAKE_OPTIM = FAKE_TORCH + '''
import itertools

_ptrs = itertools.count(1)

class _Storage:
    def __init__(self, tensor):
        self.tensor, self.ptr = tensor, next(_ptrs)
    def data_ptr(self):
        return self.ptr
    def nbytes(self):
        return self.tensor.nbytes

def _storage(self):
    if not hasattr(self, "_storage_"):
        self._storage_ = _Storage(self)
    return self._storage_

FakeTensor.untyped_storage = _storage
FakeTensor.device = "cuda:0"
FakeTensor.grad = None

_hooks = {}

class _Handle:
    def __init__(self, key):
        self.key = key
    def remove(self):
        _hooks.pop(self.key, None)

def register_optimizer_step_post_hook(hook):
    key = object()
    _hooks[key] = hook
    return _Handle(key)

class FakeAdam:
    def __init__(self, params):
        self.param_groups = [{"params": list(params)}]
        self.state = {}
    def step(self):  # a step's temporaries: setdefault's two new tensors, freed at once after the first step
        for p in self.param_groups[0]["params"]:
            self.state.setdefault(id(p), {"exp_avg": fake_torch.empty(p.nbytes), "exp_avg_sq": fake_torch.empty(p.nbytes)})
        for hook in list(_hooks.values()):
            hook(self, (), {})

optimizer_module = types.ModuleType("torch.optim.optimizer")
optimizer_module.register_optimizer_step_post_hook = register_optimizer_step_post_hook
optimizer_module.hooks = _hooks
fake_torch.optim = types.SimpleNamespace(Adam=FakeAdam)
sys.modules["torch.optim"] = fake_torch.optim
sys.modules["torch.optim.optimizer"] = optimizer_module
'''


def test_a_vram_limit_failure_says_what_filled_the_peak_fake_torch(pytester):
    pytester.makeconftest(FAKE_OPTIM)
    pytester.makepyfile("""
        import sys

        import pytest
        import torch

        opt = sys.modules["torch.optim.optimizer"]
        MIB = 1 << 20

        @pytest.mark.vram_limit("256MiB")
        def test_a_trains_over():
            w = torch.empty(64 * MIB)
            w.grad = torch.empty(64 * MIB)
            adam = torch.optim.Adam([w])
            adam.step()
            adam.step()
            activations = torch.empty(100 * MIB)

        @pytest.mark.vram_limit("64MiB")
        def test_b_no_step_over():
            x = torch.empty(100 * MIB)

        def test_c_hook_removed():
            assert opt.hooks == {}
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines([
        "*_ test_a_trains_over _*",
        ("VRAM limit: cuda:0 peak allocated during this test was 384 MiB*above its vram_limit of 256 MiB* "
         "What filled it, read at the last optimizer step (step 2 of the test), not at the peak itself: "
         "parameters 64.0 MiB, gradients 64.0 MiB, optimizer state 128 MiB; the rest of the peak, 128 MiB, "
         "unclassified (activations, temporaries)."),
        "*_ test_b_no_step_over _*",
        "VRAM limit: cuda:0 peak allocated*What filled it is not known here: no optimizer stepped during the test*",
    ])
