"""RotaryEmbedding.forward's fast path (posenc.rotary.fast) against the general path: the
same bits on every call it serves, and every other call left to the general path."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import torch

import posenc
from posenc.rotary import kernels
from posenc.rotary.kernels import backends

from ._fast_cases import SERVED_CALLS, check_served_call, general, served, tensors

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CC", "cc")) is None, reason="the CPU fast path needs a C compiler"
)


@pytest.fixture(autouse=True)
def cpu_path():
    previous = backends._cpu_on
    kernels.enable_cpu_fast_path(True)
    yield
    backends._cpu_on = previous


@SERVED_CALLS
def test_fast_equals_general(dtype, layout, seq_dim, pos, rotary_dim, view):
    check_served_call(dtype, layout, seq_dim, pos, rotary_dim, view)


def test_scalings_with_a_table_are_served():
    rope = posenc.RotaryEmbedding(
        16, scaling={"type": "yarn", "factor": 4.0, "original_max_position": 64}
    )
    q, k = tensors(torch.float32, -2)
    with torch.no_grad():
        assert served(rope, q, k)
        assert all(torch.equal(a, b) for a, b in zip(rope(q, k), general(rope, q, k)))


def _grad_q():
    q, k = tensors(torch.float32, -2)
    return q.requires_grad_(), k


LEFT_TO_THE_GENERAL_PATH = {
    "float64": lambda: tensors(torch.float64, -2),
    "mixed-dtypes": lambda: (tensors(torch.float32, -2)[0], tensors(torch.bfloat16, -2)[1]),
    "requires-grad": _grad_q,
    "3-d": lambda: tuple(t[0] for t in tensors(torch.float32, -2)),
    "q-k-lengths-differ": lambda: (
        tensors(torch.float32, -2)[0][:, :, :2],
        tensors(torch.float32, -2)[1],
    ),
    "wrong-head-dim": lambda: tuple(t[..., :8] for t in tensors(torch.float32, -2)),
}


@pytest.mark.parametrize("case", list(LEFT_TO_THE_GENERAL_PATH))
def test_other_tensors_take_the_general_path(case):
    rope = posenc.RotaryEmbedding(16)
    q, k = LEFT_TO_THE_GENERAL_PATH[case]()
    assert not served(rope, q, k)


@pytest.mark.parametrize(
    "positions",
    [
        torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0]),  # floating
        torch.tensor([-1, 0, 1, 2, 3]),  # negative: the table computes
        torch.tensor([1 << 40, 0, 1, 2, 3]),  # past the table's cap
        torch.tensor(3),  # 0-d
        torch.arange(4),  # the wrong length
        torch.zeros(2, 5, dtype=torch.int64),  # the wrong batch
        torch.zeros(3, 5, 1, dtype=torch.int64),  # 3-d
        torch.tensor([1, 2, 3, 4, 5], dtype=torch.int16),
    ],
    ids=["float", "negative", "past-cap", "0-d", "length", "batch", "3-d", "int16"],
)
def test_other_positions_take_the_general_path(positions):
    rope = posenc.RotaryEmbedding(16)
    q, k = tensors(torch.float32, -2)
    assert not served(rope, q, k, positions)


def test_xpos_and_position_dependent_scalings_take_the_general_path():
    q, k = tensors(torch.float32, -2)
    assert not served(posenc.XPosEmbedding(16), q, k)
    dynamic = {"type": "dynamic", "factor": 2.0, "max_position": 8}
    assert not served(posenc.RotaryEmbedding(16, scaling=dynamic), q, k)


@pytest.mark.parametrize("needs_grad", [False, True], ids=["no-grad", "grad"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_fused_path_off_serves_the_torch_engine_with_the_general_bits(dtype, needs_grad):
    """With the fused path off a call shape's plan is the torch engine on the table's rows:
    the general path's outputs and gradients, bit for bit."""
    rope = posenc.RotaryEmbedding(16)
    kernels.enable_cpu_fast_path(False)
    results = []
    for run in ("fast", "general"):
        q, k = (t.detach().requires_grad_(needs_grad) for t in tensors(dtype, -2))
        outs = (
            rope(q, k, torch.arange(5)) if run == "fast" else general(rope, q, k, torch.arange(5))
        )
        if needs_grad:
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
        results.append([o.detach() for o in outs] + ([q.grad, k.grad] if needs_grad else []))
    assert [p.engine for p in rope._fast.plans.values()] == ["torch"]
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "positions", [[0, 1, 2, 3, 4], 3, np.arange(5)], ids=["list", "int", "numpy"]
)
def test_a_seen_shape_with_positions_that_are_no_tensor_gets_the_entry_check(positions):
    """After a call shape has been served, the same q and k with positions that are not a
    tensor get the general path's one PosEncError naming ``positions`` (was a TypeError
    from the plan's key)."""
    rope = posenc.RotaryEmbedding(16)
    q, k = tensors(torch.float32, -2)
    rope(q, k, torch.arange(5))
    assert len(rope._fast.plans) == 1
    with pytest.raises(posenc.PosEncError, match="positions") as info:
        rope(q, k, positions)
    assert "tensor(" not in str(info.value)


def test_bad_input_still_raises_the_general_message():
    rope = posenc.RotaryEmbedding(16)
    q, k = tensors(torch.float32, -2)
    with pytest.raises(posenc.PosEncError, match="q_positions must have length 5"):
        rope(q, k, torch.arange(4))


STRIDED_POSITIONS = {
    "expanded-batch": lambda: torch.arange(5).expand(3, 5),  # batch stride 0
    "transposed": lambda: torch.arange(15).view(5, 3).t(),  # [3, 5], strides (1, 3)
    "every-other": lambda: torch.arange(10)[::2],
    "int32-bs": lambda: torch.arange(15, dtype=torch.int32).view(3, 5) * 7,
}


@pytest.mark.parametrize("case", list(STRIDED_POSITIONS))
def test_strided_positions_are_gathered_as_the_general_path_reads_them(case):
    rope = posenc.RotaryEmbedding(16)
    q, k = tensors(torch.float32, -2)
    positions = STRIDED_POSITIONS[case]()
    with torch.no_grad():
        assert served(rope, q, k, positions)
        for a, b in zip(rope(q, k, positions), general(rope, q, k, positions)):
            assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_decoding_loop_reuses_its_plan_and_leaves_new_positions_to_the_table(dtype):
    """One plan per call shape; positions past the table's rows (grown by the general
    path), negative ones (computed there) and back: the same bits as the general path."""
    rope = posenc.RotaryEmbedding(16)
    q, k = tensors(dtype, -2, s=1)
    steps = [
        [[3], [9], [4]],
        [[4], [10], [5]],
        [[5000], [9000], [4]],
        [[-2], [0], [1]],
        [[6], [7], [8]],
    ]
    with torch.no_grad():
        for step in steps:
            positions = torch.tensor(step)
            out = rope(q, k, positions)
            want = general(rope, q, k, positions)
            assert all(torch.equal(a, b) for a, b in zip(out, want)), step
    assert len(rope._fast.plans) == 1  # every step had the shape of the first
    assert rope.cos_sin_table.rows[torch.float32] >= 9001  # grown for the far positions


def test_the_plan_follows_torch_threads():
    rope = posenc.RotaryEmbedding(16)
    q, k = tensors(torch.float32, -2)
    before = torch.get_num_threads()
    try:
        with torch.no_grad():
            for threads in (1, 2):
                torch.set_num_threads(threads)
                assert all(torch.equal(a, b) for a, b in zip(rope(q, k), general(rope, q, k)))
    finally:
        torch.set_num_threads(before)
    assert len(rope._fast.plans) == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_outputs_advised_to_huge_pages_hold_the_same_bits(dtype):
    """Outputs of 8 MiB and more are advised to huge pages before the kernel writes them:
    advice only, the numbers are the general path's."""
    rope = posenc.RotaryEmbedding(128)
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 8, 2048, 128, generator=gen).to(dtype)  # 16 / 8 MiB
    k = torch.randn(2, 8, 2048, 128, generator=gen).to(dtype)
    positions = torch.arange(2048) * 3
    with torch.no_grad():
        assert served(rope, q, k, positions)
        for a, b in zip(rope(q, k, positions), general(rope, q, k, positions)):
            assert torch.equal(a, b)


@pytest.mark.parametrize("seq_dim", [-2.0, -2 + 0j], ids=["float", "complex"])
def test_a_seen_shape_with_a_seq_dim_that_is_no_int_gets_the_entry_check(seq_dim):
    """A served call shape does not let ``seq_dim=-2.0`` through its plan (``-2.0 == -2``):
    the general path refuses it, naming ``seq_dim``."""
    rope = posenc.RotaryEmbedding(16)
    q, k = tensors(torch.float32, -2)
    rope(q, k, torch.arange(5))
    with pytest.raises(posenc.PosEncError, match="seq_dim"):
        rope(q, k, torch.arange(5), seq_dim=seq_dim)
