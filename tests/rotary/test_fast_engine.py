"""RotaryEmbedding.forward's common call with the fused CPU path off
(``posenc.rotary.kernels.planned.fast_forward``, a plan whose engine is ``"torch"``): checked
once per call shape, then the paired table's rows and the torch engine. The same bits and
gradients as the general path on every call it serves, every other call left to the general
path (and its messages). Needs no compiler."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.rotary.kernels import backends, planned

from ._fast_cases import SERVED_CALLS, check_served_call, general, served, tensors


@pytest.fixture(autouse=True)
def fused_path_off():
    previous = backends._cpu_on
    backends._cpu_on = False
    yield
    backends._cpu_on = previous


@SERVED_CALLS
def test_engine_route_equals_general(dtype, layout, seq_dim, pos, rotary_dim, view):
    """Every served call, on the plan its first call made: the torch engine."""
    rope = check_served_call(dtype, layout, seq_dim, pos, rotary_dim, view)
    assert [p.engine for p in rope._fast.plans.values()] == ["torch"]


@pytest.mark.parametrize("needs_grad", ["q", "k", "both"])
def test_a_plan_made_without_gradients_serves_them(needs_grad):
    """A call shape planned outside autograd, called again with q or k needing a gradient:
    the autograd rotation, with the general path's gradients."""
    rope = posenc.RotaryEmbedding(16)
    positions = torch.tensor([3, 1, 4, 1, 5])
    with torch.no_grad():
        rope(*tensors(torch.bfloat16, -2), positions)
    assert [p.engine for p in rope._fast.plans.values()] == ["torch"]
    grads = []
    for call in (rope, lambda *a: general(rope, *a)):
        q, k = tensors(torch.bfloat16, -2)
        q.requires_grad_(needs_grad != "k")
        k.requires_grad_(needs_grad != "q")
        q_out, k_out = call(q, k, positions)
        assert q_out.requires_grad == q.requires_grad and k_out.requires_grad == k.requires_grad
        (q_out.float().square().sum() + (k_out.float() * 3).sum()).backward()
        grads.append((q.grad, k.grad))
    for got, want in zip(*grads):
        assert (got is None) == (want is None)
        assert got is None or torch.equal(got, want)


@pytest.mark.parametrize("needs_grad", ["q", "k", "both"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_engine_route_gradients_equal_general(dtype, needs_grad):
    rope = posenc.RotaryEmbedding(16)
    positions = torch.tensor([3, 1, 4, 1, 5])
    leaves = []
    for _ in range(2):
        q, k = tensors(dtype, -2)
        leaves.append((q.requires_grad_(needs_grad != "k"), k.requires_grad_(needs_grad != "q")))
    weights = torch.linspace(-1, 2, 16)
    for (q, k), call in zip(leaves, (rope, lambda *a: general(rope, *a))):
        q_out, k_out = call(q, k, positions)
        assert q_out.requires_grad == q.requires_grad and k_out.requires_grad == k.requires_grad
        ((q_out.float() * weights).sum() + (k_out.float() * weights).square().sum()).backward()
    for got, want in zip(leaves[0], leaves[1]):
        assert (got.grad is None) == (want.grad is None)
        if got.grad is not None:
            assert torch.equal(got.grad, want.grad)


NOT_SERVED = {
    "float64": lambda: tensors(torch.float64, -2),
    "mixed-dtypes": lambda: (tensors(torch.float32, -2)[0], tensors(torch.bfloat16, -2)[1]),
    "q-k-lengths-differ": lambda: (
        tensors(torch.float32, -2)[0][:, :, :2],
        tensors(torch.float32, -2)[1],
    ),
    "batch-differs": lambda: (tensors(torch.float32, -2)[0][:2], tensors(torch.float32, -2)[1]),
}


@pytest.mark.parametrize("case", list(NOT_SERVED))
def test_other_tensors_take_the_general_path(case):
    rope = posenc.RotaryEmbedding(16)
    q, k = NOT_SERVED[case]()
    assert not served(rope, q, k)


@pytest.mark.parametrize(
    "positions",
    [
        torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0]),
        torch.tensor([-1, 0, 1, 2, 3]),
        torch.tensor([1 << 40, 0, 1, 2, 3]),
        torch.arange(4),
        torch.zeros(2, 5, dtype=torch.int64),
        torch.tensor([1, 2, 3, 4, 5], dtype=torch.int16),
    ],
    ids=["float", "negative", "past-cap", "length", "batch", "int16"],
)
def test_other_positions_take_the_general_path_with_its_bits(positions):
    rope = posenc.RotaryEmbedding(16)
    q, k = tensors(torch.float32, -2)
    assert not served(rope, q, k, positions)
    if positions.shape[-1] == 5 and positions.ndim == 1:  # valid: computed, same bits
        with torch.no_grad():
            got, want = rope(q, k, positions), general(rope, q, k, positions)
        assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_bad_input_still_raises_the_general_message():
    rope = posenc.RotaryEmbedding(16)
    q, k = tensors(torch.float32, -2)
    rope(q, k, torch.arange(5))  # a plan for this shape of q and k
    with pytest.raises(posenc.PosEncError, match="q_positions must have length 5"):
        rope(q, k, torch.arange(4))


def test_a_decoding_loop_crosses_the_table_end_with_the_general_bits():
    rope = posenc.RotaryEmbedding(16)
    q, k = tensors(torch.bfloat16, -2, s=1)
    rows = None
    for step in (0, 1, 4095, 4096, 5000):
        positions = torch.full((3, 1), step)
        with torch.no_grad():
            got, want = rope(q, k, positions), general(rope, q, k, positions)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        rows = rope.cos_sin_table.paired_rows["half"]
    assert rows == 8192 and len(rope._fast.plans) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_at_the_tables_cap_the_general_path_takes_over(monkeypatch, dtype):
    """The paired table holds the positions the table holds under ``max_bytes``: up to
    them the engine route serves, past them the general path computes, the general bits
    throughout."""
    served: list[int] = []
    real = planned.rotate_paired
    monkeypatch.setattr(
        planned, "rotate_paired", lambda *a, **kw: served.append(1) or real(*a, **kw)
    )
    rope = posenc.RotaryEmbedding(16)
    table = rope.cos_sin_table
    table.max_bytes = 64 * 6000  # 6000 positions of 16 float32 numbers
    q, k = tensors(dtype, -2, s=1)
    for step in (2999, 5999, 6000):
        positions = torch.full((3, 1), step)
        with torch.no_grad():
            got, want = rope(q, k, positions), general(rope, q, k, positions)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert table.paired_rows == {"half": 6000} and len(served) == 2  # 6000: computed


def test_a_shape_first_called_past_the_cap_is_served_once_the_table_holds_it():
    """A call shape whose first call lies past the paired table's cap is planned onto the
    engine and computed by the general path; its calls the table holds are served, with the
    general bits throughout."""
    rope = posenc.RotaryEmbedding(16)
    rope.cos_sin_table.max_bytes = 64 * 6000  # 6000 positions of 16 float32 numbers
    q, k = tensors(torch.bfloat16, -2, s=1)
    for step in (7000, 10, 7000):
        positions = torch.full((3, 1), step)
        with torch.no_grad():
            got, want = rope(q, k, positions), general(rope, q, k, positions)
            assert (planned.fast_forward(rope._fast, q, k, positions, -2) is None) == (step > 5999)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert [p.engine for p in rope._fast.plans.values()] == ["torch"]


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_vmap_and_tracing_take_the_general_path():
    rope = posenc.RotaryEmbedding(16)
    q, k = tensors(torch.float32, -2)
    qs, ks = torch.func.vmap(lambda q, k: rope(q, k))(q[None], k[None])
    want = general(rope, q, k)
    assert torch.equal(qs[0], want[0]) and torch.equal(ks[0], want[1])
    traced = torch.jit.trace(lambda q, k: rope(q, k), (q, k), check_trace=False)
    assert all(torch.equal(a, b) for a, b in zip(traced(q, k), want))
    assert rope._fast.plans == {}
