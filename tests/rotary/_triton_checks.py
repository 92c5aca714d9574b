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
    case_param,
    check_backward,
    check_forward,
    check_inplace,
    check_rounding_ties,
    make_inputs,
)


@pytest.fixture(autouse=True)
def _interpreter_only() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("run through test_kernels_triton.py (TRITON_INTERPRET=1)")


@pytest.mark.parametrize("case", [case_param(c) for c in SMALL_CASES])
def test_triton_matches_plain_and_reference(case):
    check_forward(case, "triton")


@pytest.mark.parametrize("case", [case_param(c) for c in SMALL_CASES[::6]])
def test_triton_inplace_writes_only_rotated_channels(case):
    check_inplace(case, "triton")


@pytest.mark.parametrize("case", [case_param(c) for c in SMALL_CASES[1::6]])
def test_triton_backward_equals_plain_autograd(case):
    check_backward(case, "triton")


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
    case = Case(
        head_dim=20,
        rotary_dim=16,
        hq=11,
        hk=5,
        batch=1,
        seq=2,
        layout=layout,
        dtype=torch.bfloat16,
        positions="batched",
        view="sliced",
    )
    check_forward(case, "triton")
    check_inplace(case, "triton")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_triton_gradcheck_float64(layout):
    # fast_mode: a few random projections of the Jacobian (each launch is slow here);
    # the full backward is compared with plain autograd above.
    case = Case(
        head_dim=6,
        rotary_dim=4,
        hq=2,
        hk=1,
        batch=1,
        seq=2,
        layout=layout,
        dtype=torch.float64,
        positions="batched",
        view="transposed",
    )
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

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    q1, k1 = q.clone().requires_grad_(), k.clone().requires_grad_()
    q2, k2 = q.clone().requires_grad_(), k.clone().requires_grad_()
    compiled(q1, k1).backward()
    f(q2, k2).backward()
    torch.testing.assert_close(q1.grad, q2.grad, atol=0, rtol=0)
    torch.testing.assert_close(k1.grad, k2.grad, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_triton_rounds_ties_to_even(dtype):
    check_rounding_ties("triton", dtype)
