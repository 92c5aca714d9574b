"""The optimised torch engine (``backend="torch"``) against the plain twin, the formula
(``x1 * cos - x2 * sin``, ``x2 * cos + x1 * sin`` in float32, one rounding), bit for bit:
by the harness the C and Triton paths run (``_kernel_cases.matrix_tests``), then route by
route: its slabs (large CPU tensors without autograd), its one pass, its joined q and k,
and with autograd its forward and its backward (the rotation by minus the angles) against
autograd through the twin, over every dtype, layout, sequence layout, cos/sin batch and
partial rotary."""

from __future__ import annotations

import pytest
import torch

from posenc.rotary.kernels import plain
from posenc.rotary.kernels import torch_engine as engine
from posenc.rotary.kernels.plain import apply_rotary_torch

from ._kernel_cases import SMALL_CASES, matrix_tests

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]

# the harness every engine runs: forward, in place and backward against the twin
test_torch_forward, test_torch_inplace, test_torch_backward = matrix_tests("torch", SMALL_CASES, 3)


def textbook(x, cos, sin, layout="half", seq_dim=-2):
    """The twin: the formula every engine is held to."""
    return apply_rotary_torch(x, cos, sin, layout=layout, seq_dim=seq_dim)


def engine_apply(x, cos, sin, layout="half", seq_dim=-2):
    """The engine's rotation of one tensor."""
    return engine.rotate_torch([x], cos, sin, layout=layout, seq_dim=seq_dim)[0]


def case(dtype, layout, seq_dim, cos_batch, d, r):
    gen = torch.Generator().manual_seed(d + r)
    shape = (3, 5, 7, d)  # [b, h, s, d] or [b, s, h, d]
    x = torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)
    s = shape[2] if seq_dim == -2 else shape[1]
    cs_shape = (s, r // 2) if cos_batch is None else (cos_batch, s, r // 2)
    angles = torch.rand(*cs_shape, generator=gen, dtype=torch.float64) * 6.3
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    return x, angles.cos().to(compute), angles.sin().to(compute)


@pytest.fixture
def small_slabs(monkeypatch):
    """Slabs of 96 elements, from 64: many slabs and a ragged last one at test sizes."""
    monkeypatch.setattr(engine, "_SLAB_ELEMENTS", 96)
    monkeypatch.setattr(engine, "_SLAB_MIN_ELEMENTS", 64)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("seq_dim", [-2, -3])
@pytest.mark.parametrize("cos_batch", [None, 1, 3], ids=["cos-s", "cos-1s", "cos-bs"])
@pytest.mark.parametrize("d,r", [(8, 8), (10, 6)], ids=["full", "partial"])
@pytest.mark.parametrize("slabs", [True, False], ids=["slabs", "one-pass"])
def test_no_grad_equals_the_textbook(monkeypatch, slabs, dtype, layout, seq_dim, cos_batch, d, r):
    if slabs:  # slabs of 96 elements, from 64
        monkeypatch.setattr(engine, "_SLAB_ELEMENTS", 96)
        monkeypatch.setattr(engine, "_SLAB_MIN_ELEMENTS", 64)
    x, cos, sin = case(dtype, layout, seq_dim, cos_batch, d, r)
    with torch.no_grad():
        out = engine_apply(x, cos, sin, layout=layout, seq_dim=seq_dim)
    assert torch.equal(out, textbook(x, cos, sin, layout=layout, seq_dim=seq_dim))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("seq_dim", [-2, -3])
@pytest.mark.parametrize("cos_batch", [None, 3], ids=["cos-s", "cos-bs"])
@pytest.mark.parametrize("d,r", [(8, 8), (10, 6)], ids=["full", "partial"])
@pytest.mark.parametrize("slabs", [True, False], ids=["slabs", "one-pass"])
def test_autograd_equals_autograd_through_the_textbook(
    monkeypatch, slabs, dtype, layout, seq_dim, cos_batch, d, r
):
    """Forward and x's gradient bit for bit: the backward's rotation by minus the angles
    rounds each gradient element once, as autograd through the float32 operations does."""
    if slabs:
        monkeypatch.setattr(engine, "_SLAB_ELEMENTS", 96)
        monkeypatch.setattr(engine, "_SLAB_MIN_ELEMENTS", 64)
    x, cos, sin = case(dtype, layout, seq_dim, cos_batch, d, r)
    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(5)).to(dtype)
    outs, grads = [], []
    for fn in (engine_apply, textbook):
        leaf = x.detach().requires_grad_()
        out = fn(leaf, cos, sin, layout=layout, seq_dim=seq_dim)
        out.backward(grad)
        outs.append(out.detach())
        grads.append(leaf.grad)
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(grads[0], grads[1])


def test_cos_sin_gradients_match_the_textbook():
    x, cos, sin = case(torch.float64, "half", -2, 3, 10, 6)
    got, want = [], []
    for fn, into in ((engine_apply, got), (textbook, want)):
        c, s = cos.clone().requires_grad_(), sin.clone().requires_grad_()
        leaf = x.clone().requires_grad_()
        fn(leaf, c, s).square().sum().backward()
        into.extend([leaf.grad, c.grad, s.grad])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_twice_differentiable():
    x, cos, sin = case(torch.float64, "interleaved", -3, None, 10, 6)
    leaf = x.clone().requires_grad_()
    assert torch.autograd.gradgradcheck(
        lambda t: engine_apply(t, cos, sin, layout="interleaved", seq_dim=-3), (leaf,)
    )


def test_slabs_of_a_strided_view(small_slabs):
    base = torch.randn(4, 9, 6, 20, dtype=torch.float64).bfloat16()
    x = base[1:, ::2, :, :16].transpose(1, 2)  # gaps, and [b, s, h, d] seen as [b, h, s, d]
    angles = torch.rand(x.shape[2], 8, dtype=torch.float64)
    cos, sin = angles.cos().float(), angles.sin().float()
    with torch.no_grad():
        out = engine_apply(x, cos, sin)
    assert torch.equal(out, textbook(x, cos, sin))


def test_gradients_of_cos_keep_the_recorded_operations(small_slabs, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("slabs used where autograd records the operations")

    monkeypatch.setattr(engine, "_rotate_in_slabs", refuse)
    x = torch.randn(2, 3, 4, 8)
    cos_leaf, sin = torch.rand(4, 4, requires_grad=True), torch.rand(4, 4)
    engine_apply(x, cos_leaf, sin).sum().backward()
    assert cos_leaf.grad is not None


@pytest.mark.parametrize("needs_grad", ["none", "q", "k", "both"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("slabs", [True, False], ids=["slabs", "one-pass"])
@pytest.mark.parametrize("seq_dim", [-2, -3])
@pytest.mark.parametrize("d,r", [(8, 8), (10, 6)], ids=["full", "partial"])
def test_q_and_k_together_equal_each_alone(monkeypatch, slabs, dtype, needs_grad, seq_dim, d, r):
    """``rotate_torch([q, k])`` (the tables shaped once, one autograd node for the tensors
    that need a gradient) gives each tensor the bits, the layout, the gradient and the
    ``requires_grad`` of its rotation alone."""
    if slabs:
        monkeypatch.setattr(engine, "_SLAB_ELEMENTS", 96)
        monkeypatch.setattr(engine, "_SLAB_MIN_ELEMENTS", 64)
    q, cos, sin = case(dtype, "half", seq_dim, 3, d, r)
    heads = (slice(None), slice(0, 2)) if seq_dim == -2 else (slice(None), slice(None), slice(0, 2))
    k = q[heads].flip(-1).contiguous()  # fewer heads, other values
    wants = {"q": needs_grad in ("q", "both"), "k": needs_grad in ("k", "both")}
    leaves = [
        [t.detach().clone().requires_grad_(wants[n]) for n, t in (("q", q), ("k", k))]
        for _ in range(2)
    ]
    together = engine.rotate_torch(leaves[0], cos, sin, seq_dim=seq_dim)
    alone = [engine_apply(t, cos, sin, seq_dim=seq_dim) for t in leaves[1]]
    for got, want, leaf in zip(together, alone, leaves[0]):
        assert torch.equal(got, want) and got.stride() == want.stride()
        assert got.requires_grad == want.requires_grad == leaf.requires_grad
    if needs_grad == "none":
        return
    for outs in (together, alone):
        sum(
            (o * torch.linspace(-1, 2, o.shape[-1])).sum() for o in outs if o.requires_grad
        ).backward()
    for got, want in zip(leaves[0], leaves[1]):
        assert (got.grad is None) == (want.grad is None)
        if got.grad is not None:
            assert torch.equal(got.grad, want.grad)


def test_an_unused_output_gets_no_gradient():
    """Only q's rotation reaches the loss: k's gradient stays None, as through the
    operations, not a rotation of zeros."""
    q, cos, sin = case(torch.float32, "interleaved", -3, None, 8, 8)
    q_leaf, k_leaf = q.clone().requires_grad_(), q.clone().requires_grad_()
    q_out, _ = engine.rotate_torch([q_leaf, k_leaf], cos, sin, layout="interleaved", seq_dim=-3)
    q_out.sum().backward()
    assert k_leaf.grad is None
    want = engine_apply(torch.ones_like(q), cos, -sin, layout="interleaved", seq_dim=-3)
    assert torch.equal(q_leaf.grad, want)


@pytest.mark.parametrize("direct", [True, False], ids=["direct-apply", "function-apply"])
def test_the_autograd_node_with_and_without_its_direct_apply(monkeypatch, direct):
    """``_Rotation.apply`` skips ``Function.apply``'s argument binding where torch has the
    hooks for it; without them (another torch) it is ``Function.apply``: the same bits."""
    monkeypatch.setattr(engine, "_DIRECT_APPLY", direct)
    x, cos, sin = case(torch.bfloat16, "half", -2, None, 8, 8)
    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(2)).to(x.dtype)
    results = []
    for fn in (engine_apply, textbook):
        leaf = x.detach().requires_grad_()
        out = fn(leaf, cos, sin)
        out.backward(grad)
        results.append((out.detach(), leaf.grad))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


def _same(t, heads):
    return t


def _permuted(t):
    """t in memory of another order (dense, not contiguous)."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


JOINS = {  # (rotations joined: forward, backward; k's source from q; k from its source)
    "fewer-heads": ((1, 1), lambda q, heads: q[heads].flip(-1).contiguous(), _same),
    "same-shape": ((1, 1), lambda q, heads: q.flip(-1).contiguous(), _same),
    "k-permuted": ((0, 1), lambda q, heads: q.flip(-1).contiguous(), lambda t, heads: _permuted(t)),
    "other-batch": ((0, 0), lambda q, heads: torch.cat([q, q]).flip(-1), _same),
    "other-dtype": ((0, 0), lambda q, heads: q.flip(-1).to(torch.float16), _same),
}


@pytest.mark.parametrize("join", list(JOINS))
@pytest.mark.parametrize("needs_grad", [False, True], ids=["no-grad", "grad"])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("seq_dim", [-2, -3])
@pytest.mark.parametrize("cos_batch", [None, 3], ids=["cos-s", "cos-bs"])
@pytest.mark.parametrize("batch", [3, 1], ids=["b3", "b1"])
def test_q_and_k_joined_only_where_they_can_be(
    monkeypatch, join, needs_grad, layout, seq_dim, cos_batch, batch
):
    """A small 16-bit q and k of one dtype, contiguous, alike but for their heads, are
    rotated as one tensor (so are their gradients in the backward), anything else each
    alone: the textbook's bits and gradients either way, each output in memory of its own
    with the strides of its rotation alone."""
    joined: list[int] = []
    real = engine._rotate_joined
    monkeypatch.setattr(engine, "_rotate_joined", lambda *a: joined.append(1) or real(*a))
    q, cos, sin = case(torch.bfloat16, layout, seq_dim, cos_batch, 8, 8)
    q = q[:batch].contiguous()
    if cos_batch is not None:
        cos, sin = cos[:batch], sin[:batch]
    heads = (slice(None), slice(0, 2)) if seq_dim == -2 else (slice(None), slice(None), slice(0, 2))
    (forward_joined, backward_joined), make_source, make_k = JOINS[join]
    if join == "other-batch" and cos_batch is not None:
        cos, sin = cos[:1], sin[:1]  # a table both batch sizes broadcast against
    sources = (q, make_source(q, heads))
    grads = None
    results = []
    for fn in (engine.rotate_torch, None):  # posenc's, then the textbook's, each alone
        leaves = [t.detach().clone().requires_grad_(needs_grad) for t in sources]
        xs = [leaves[0], make_k(leaves[1], heads)]
        if fn is None:
            outs = [textbook(x, cos, sin, layout, seq_dim) for x in xs]
        else:
            outs = fn(xs, cos, sin, layout=layout, seq_dim=seq_dim)
            assert len(joined) == forward_joined
            assert outs[0].untyped_storage().data_ptr() != outs[1].untyped_storage().data_ptr()
        if needs_grad:
            gen = torch.Generator().manual_seed(3)
            grads = grads or [torch.randn(o.shape, generator=gen).to(o.dtype) for o in outs]
            torch.autograd.backward(outs, grads)
        results.append(([o.detach() for o in outs], [leaf.grad for leaf in leaves]))
    assert len(joined) == forward_joined + (backward_joined if needs_grad else 0)
    (got, got_grads), (want, want_grads) = results
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    alone = [engine_apply(x, cos, sin, layout=layout, seq_dim=seq_dim) for x in xs]
    assert [a.stride() for a in got] == [b.stride() for b in alone]
    for a, b in zip(got_grads, want_grads):
        assert (a is None) == (b is None) == (not needs_grad)
        assert a is None or torch.equal(a, b)


@pytest.mark.parametrize("name", plain._MOVED_TO_CHECKS)
def test_the_checks_moved_and_keep_their_old_place_one_release(name):
    from posenc.rotary.kernels import checks

    with pytest.warns(
        DeprecationWarning, match=rf"moved to posenc\.rotary\.kernels\.checks\.{name}"
    ):
        assert getattr(plain, name) is getattr(checks, name)
    assert name in checks.__all__ and name not in plain.__all__
    with pytest.raises(AttributeError, match="no attribute 'check_nothing'"):
        plain.check_nothing  # noqa: B018


@pytest.mark.parametrize("name", plain._MOVED_TO_ENGINE)
def test_the_engine_moved_and_keeps_its_old_place_one_release(name):
    with pytest.warns(
        DeprecationWarning, match=rf"moved to posenc\.rotary\.kernels\.torch_engine\.{name}"
    ):
        assert getattr(plain, name) is getattr(engine, name)


def test_the_direct_apply_is_on_exactly_where_it_was_tested():
    """``_Rotation.apply``'s bypass of ``Function.apply`` (a private torch API) is on for the
    torch releases listed in ``DIRECT_APPLY_TESTED`` (where the test above ran it both
    ways), and off for any other."""
    release = ".".join(torch.__version__.split(".")[:2])
    hooks = hasattr(torch._C, "_are_functorch_transforms_active")
    assert engine._DIRECT_APPLY == (hooks and release in engine.DIRECT_APPLY_TESTED)


def test_the_twin_is_the_formula():
    """The twin, written out: a quarter turn of (1, 0) is (0, 1), in both layouts, with the
    channels past the rotary dim copied."""
    x = torch.tensor([[[[1.0, 0.0, 5.0, 7.0]]]])
    cos, sin = torch.zeros(1, 1), torch.ones(1, 1)
    half = apply_rotary_torch(x, cos, sin, layout="half")
    inter = apply_rotary_torch(x, cos, sin, layout="interleaved")
    assert torch.equal(half, torch.tensor([[[[0.0, 1.0, 5.0, 7.0]]]]))
    assert torch.equal(inter, torch.tensor([[[[0.0, 1.0, 5.0, 7.0]]]]))
