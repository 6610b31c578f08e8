"""The pytest plugin on a real GPU: a leaking test fails with its bytes and a clean one passes,
common operations and fixtures are no leak, and vram_limit bounds a test's peak and says what filled
it at the peak itself.

Each case runs in a fresh pytest process (pytester's subprocess), where CUDA starts inside
the tests, as it does in a user's session.
"""
from __future__ import annotations

import re

import pytest

pytest_plugins = ["pytester"]


def test_only_the_leaking_test_fails(pytester):
    pytester.makepyfile("""
        import torch

        KEPT = []

        def test_leaks():
            KEPT.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))

        def test_clean():
            x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
            del x
    """)
    result = pytester.runpytest_subprocess("--vram-check", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*_ test_leaks _*",
        ("VRAM leak: cuda:0 allocated grew by 64.0 MiB (67108864 bytes) during this test "
         "(before 0 B, after 64.0 MiB, after gc.collect()*"),
    ])
    # One failure message (the short summary may repeat its start).
    assert len([line for line in result.outlines if line.startswith("VRAM leak: ")]) == 1
    assert "CUDA started during test_only_the_leaking_test_fails.py::test_leaks" in result.stdout.str()


def test_common_operations_and_fixtures_are_no_leak(pytester):
    pytester.makepyfile("""
        import pytest
        import torch
        import torch.nn.functional as F

        @pytest.fixture(scope="module")
        def weights():
            return torch.randn(4096, 4096, device="cuda")  # 64 MiB, kept for the module

        @pytest.fixture
        def scratch():
            return torch.empty(32 << 20, dtype=torch.uint8, device="cuda")

        @pytest.fixture
        def bucket():
            return []

        def test_matmul():  # starts CUDA; cuBLAS keeps a workspace, which is not the test's
            a = torch.randn(1024, 1024, device="cuda")
            assert (a @ a).isfinite().all()

        def test_bf16_linear_with_bias():  # cuBLASLt
            x = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16)
            assert F.linear(x, w, torch.zeros(512, device="cuda", dtype=torch.bfloat16)).shape == (256, 512)

        def test_conv_and_attention():  # cuDNN, scaled dot-product attention
            x = torch.randn(8, 16, 64, 64, device="cuda")
            assert F.conv2d(x, torch.randn(32, 16, 3, 3, device="cuda")).shape[1] == 32
            q = torch.randn(2, 8, 128, 64, device="cuda", dtype=torch.float16)
            assert F.scaled_dot_product_attention(q, q, q).shape == q.shape

        def test_side_stream():
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                a = torch.randn(512, 512, device="cuda")
                b = a @ a
            stream.synchronize()

        def test_module_fixture(weights):
            assert weights.shape == (4096, 4096)

        def test_module_fixture_again(weights):
            assert (weights @ weights[:, :8]).shape == (4096, 8)

        def test_function_fixture(scratch):
            scratch.fill_(1)

        def test_fills_a_function_fixture(bucket):
            bucket.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
    """)
    result = pytester.runpytest_subprocess("--vram-check", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=8)
    result.stdout.fnmatch_lines(["gpumemdoctor: VRAM checked in 8 tests*"])


def test_vram_limit(pytester):
    pytester.makepyfile("""
        import pytest
        import torch

        def allocate(mib):
            x = torch.empty(mib << 20, dtype=torch.uint8, device="cuda")
            torch.cuda.synchronize()
            del x

        @pytest.mark.vram_limit("128MiB")
        def test_a_over():
            allocate(256)

        @pytest.mark.vram_limit("1GiB")
        def test_b_under():
            allocate(256)

        @pytest.mark.vram_limit("1GiB")
        def test_c_peak_left_alone():
            # Within the limit, the plugin leaves the session's peak statistics as they were.
            assert torch.cuda.max_memory_allocated() >= 256 << 20

        @pytest.mark.vram_limit("192MiB")
        def test_d_under_after_reset():
            allocate(128)

        @pytest.mark.vram_limit("64MiB")
        def test_e_over_after_reset():
            allocate(128)
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.fnmatch_lines([
        "*_ test_a_over _*",  # CUDA starts in it: the allocation events start with it
        ("VRAM limit: cuda:0 peak allocated during this test was 256 MiB (268435456 bytes), "
         "above its vram_limit of 128 MiB (134217728 bytes). What filled it, at the peak itself, which came "
         "outside backward() and the optimizer steps*: gathered, then freed 256 MiB."),
        "*_ test_e_over_after_reset _*",
        "VRAM limit: cuda:0 peak allocated during this test was 128 MiB*above its vram_limit of 64.0 MiB*",
    ])
    text = result.stdout.str()
    assert "test_d_under_after_reset: reset PyTorch's peak memory statistics on cuda:0" in text
    assert "test_e_over_after_reset: reset PyTorch's peak memory statistics on cuda:0" in text
    assert "test_c_peak_left_alone: reset" not in text


def test_vram_limit_says_what_filled_the_peak_itself(pytester):
    """A small MLP's two AdamW steps: the peak comes in the second backward(), with the activations
    (4 x 64 MiB saved) and the optimizer state made by the first step (2 x 64 MiB)."""
    pytester.makepyfile("""
        import pytest
        import torch

        @pytest.mark.vram_limit("128MiB")
        def test_trains_over():
            torch.manual_seed(0)
            layers = [m for _ in range(4) for m in (torch.nn.Linear(2048, 2048), torch.nn.ReLU())]
            model = torch.nn.Sequential(*layers).cuda()  # 64.0 MiB of parameters
            adam = torch.optim.AdamW(model.parameters())
            x = torch.randn(8192, 2048, device="cuda")  # 64 MiB, and as much for each layer's output
            for _ in range(2):
                adam.zero_grad()
                model(x).square().mean().backward()
                adam.step()
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    line = next(line for line in result.outlines if line.startswith("VRAM limit: "))
    # (seen on an H100: activations 256 MiB, temporaries 256 MiB, kept tensors 129 MiB, optimizer state 128 MiB,
    # parameters 64.0 MiB; the kept tensors are x and cuBLAS's workspaces)
    assert "What filled it, at the peak itself, which came inside backward(): " in line, line
    assert "optimizer state 128 MiB" in line and "parameters 64.0 MiB" in line, line
    number, unit = re.search(r"activations ([\d.]+) (MiB|GiB)", line).groups()
    assert float(number) * (1024 if unit == "GiB" else 1) >= 128, line


@pytest.mark.parametrize("fail_on_nvml", [False, True])
def test_memory_outside_pytorch(pytester, fail_on_nvml):
    pytest.importorskip("cupy")
    pytester.makepyfile("""
        import cupy
        import torch

        KEPT = []

        def test_a_starts_cuda():
            torch.ones(1, device="cuda")

        def test_b_raw_cuda_malloc():
            KEPT.append(cupy.cuda.runtime.malloc(256 << 20))  # outside PyTorch's allocator
    """)
    result = pytester.runpytest_subprocess("--vram-check-nvml" if fail_on_nvml else "--vram-check",
                                           "-p", "no:cacheprovider")
    if fail_on_nvml:
        result.assert_outcomes(passed=1, failed=1)
        result.stdout.fnmatch_lines(["*_ test_b_raw_cuda_malloc _*",
                                     ("VRAM outside PyTorch: on cuda:0, memory outside PyTorch's "
                                      "allocator grew by 2?? MiB during this test*")])
    else:
        result.assert_outcomes(passed=2)
        result.stdout.fnmatch_lines(["gpumemdoctor: *test_b_raw_cuda_malloc: VRAM outside PyTorch*"])
