"""The Triton kernel's checks, run by test_kernels_triton.py in a subprocess under Triton's
interpreter (``TRITON_INTERPRET=1``, CPU tensors), so the setting never reaches other
tests. Not collected on its own (the name does not start with ``test_``).
"""

from __future__ import annotations

import os

import pytest
import torch

from posenc.rotary.kernels import fused_rotary

from ._kernel_cases import (
    LAYOUTS,
    SMALL_CASES,
    Case,
    check_compile_grads,
    check_forward,
    check_inplace,
    check_rounding_ties,
    make_inputs,
    matrix_tests,
)


@pytest.fixture(autouse=True)
def _interpreter_only() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("run through test_kernels_triton.py (TRITON_INTERPRET=1)")


(
    test_triton_matches_plain_and_reference,
    test_triton_inplace_writes_only_rotated_channels,
    test_triton_backward_equals_plain_autograd,
) = matrix_tests("triton", SMALL_CASES, 6)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    "tile,target", [(32, 1), (2048, 64)], ids=["head-chunks-loop", "head-groups"]
)
def test_triton_head_chunks_and_groups(layout, tile, target, monkeypatch):
    # Small tiles: each program loops over several chunks of heads; many target programs:
    # heads are split into groups over the grid's second axis (decoding shapes on a GPU).
    from posenc.rotary.kernels import triton_rope

    monkeypatch.setattr(triton_rope, "_TILE", tile)
    monkeypatch.setattr(triton_rope, "_TARGET_PROGRAMS", target)
    case = Case(20, 16, 11, 5, 1, 2, layout, torch.bfloat16, positions="batched", view="sliced")
    check_forward(case, "triton")
    check_inplace(case, "triton")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_triton_gradcheck_float64(layout):
    # fast_mode: a few random projections of the Jacobian (each launch is slow here);
    # the full backward is compared with plain autograd above.
    case = Case(6, 4, 2, 1, 1, 2, layout, torch.float64, positions="batched", view="transposed")
    q, k, cos, sin, _, _ = make_inputs(case)
    q, k = q.detach().requires_grad_(), k.detach().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda q, k: fused_rotary(q, k, cos, sin, layout=layout, backend="triton"),
        (q, k),
        fast_mode=True,
    )


def test_triton_compile_fullgraph():
    case = Case(head_dim=8, rotary_dim=8, hq=2, hk=1, batch=1, seq=3, positions="batched")
    q, k, cos, sin, _, _ = make_inputs(case)

    def f(q, k):
        q_out, k_out = fused_rotary(q * 2, k, cos, sin, backend="triton")
        return q_out.sum() + k_out.square().sum()

    check_compile_grads(f, q, k, backend="aot_eager")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_triton_rounds_ties_to_even(dtype):
    check_rounding_ties("triton", dtype)
