"""The Triton RoPE kernel: under Triton's CPU interpreter here, at real sizes on a GPU.

Triton reads ``TRITON_INTERPRET`` when a kernel is defined, so the interpreter checks
(_triton_checks.py) run in a child pytest with that variable set: it never leaks into
other tests of this process. The GPU tests (``-m gpu``) run the same checks on CUDA at
real sizes and skip cleanly without it.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from posenc.rotary.kernels import fused_rotary, select_backend

from ._kernel_cases import (
    Case,
    check_compile_grads,
    make_inputs,
    matrix,
    matrix_tests,
    plain,
    poisoned_outputs,
)

needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton is not installed"
)


def gpu(test):
    """A GPU test: marked ``gpu``, skipped without CUDA or triton."""
    skip_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
    return pytest.mark.gpu(needs_triton(skip_cuda(test)))


@needs_triton
def test_triton_kernel_under_interpreter():
    checks = Path(__file__).with_name("_triton_checks.py")
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(checks),
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-p",
            "no:randomly",
            "-x",
        ],
        cwd=Path(__file__).parents[2],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    tail = (result.stdout + result.stderr)[-6000:]
    assert result.returncode == 0, f"interpreter checks failed:\n{tail}"
    assert " passed" in tail and "skipped" not in tail, tail


# --- GPU: the same checks at real sizes -------------------------------------------------

GPU_CASES = matrix(
    [
        (128, 128, 32, 8, 1, 1024, -2, "arange", "contiguous"),
        (128, 64, 16, 16, 2, 512, -3, "batched", "transposed"),
        (96, 96, 12, 4, 1, 1500, -3, "packed", "contiguous"),
        (80, 40, 8, None, 3, 333, -2, "broadcast", "sliced"),
        (256, 192, 4, 1, 2, 256, -2, "batched", "transposed"),
        (2, 2, 5, 3, 2, 300, -3, "arange", "sliced"),
        (128, 128, 64, 8, 16, 1, -2, "batched", "contiguous"),  # decoding: one token
    ]
)

test_gpu_matches_plain_and_reference, test_gpu_inplace, test_gpu_backward = map(
    gpu, matrix_tests("triton", GPU_CASES, 3, device="cuda")
)


@gpu
def test_gpu_auto_dispatch_and_int64_offsets():
    q = torch.randn(1, 2, 3, 8, device="cuda")
    cos = torch.randn(3, 4, device="cuda")
    assert select_backend(q, cos, cos) == "triton"
    # head 1 of this view starts past 2^31 elements: int64 offsets
    storage = torch.empty(2**31 + 2**16, dtype=torch.bfloat16, device="cuda")
    x = storage.as_strided((1, 2, 3, 8), (0, 2**31, 8, 1))
    x.copy_(torch.randn(1, 2, 3, 8, device="cuda"))
    case = Case(8, 8, 2, None, 1, 3, dtype=torch.bfloat16)
    _, _, cos, sin, _, _ = make_inputs(case, "cuda")
    with poisoned_outputs():
        out, _ = fused_rotary(x, None, cos, sin, backend="triton")
    torch.testing.assert_close(out, plain(case, x, cos, sin), atol=0, rtol=0)
    del storage


@gpu
def test_gpu_compile_fullgraph_inductor():
    case = Case(128, 128, 8, 2, 2, 256, positions="batched", dtype=torch.bfloat16)
    q, k, cos, sin, _, _ = make_inputs(case, "cuda")

    def f(q, k):
        q_out, k_out = fused_rotary(q * 2, k, cos, sin)
        return q_out.float().sum() + k_out.float().square().sum()

    torch._dynamo.reset()
    check_compile_grads(f, q, k)
