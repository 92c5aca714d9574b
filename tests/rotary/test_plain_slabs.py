"""The plain torch path's slabs (large CPU tensors without autograd) against the one-pass
plain path, bit for bit, over every dtype, layout, sequence layout, cos/sin batch and
partial rotary; and that autograd and small tensors keep the one-pass path."""

from __future__ import annotations

import pytest
import torch

from posenc.rotary.kernels import plain
from posenc.rotary.kernels.plain import apply_rotary_torch

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def one_pass(x, cos, sin, **kw):
    """The plain path as autograd runs it (never in slabs)."""
    with torch.enable_grad():
        return apply_rotary_torch(x.detach().requires_grad_(), cos, sin, **kw).detach()


@pytest.fixture
def small_slabs(monkeypatch):
    """Slabs of 96 elements, from 64: many slabs and a ragged last one at test sizes."""
    monkeypatch.setattr(plain, "_SLAB_ELEMENTS", 96)
    monkeypatch.setattr(plain, "_SLAB_MIN_ELEMENTS", 64)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("seq_dim", [-2, -3])
@pytest.mark.parametrize("cos_batch", [None, 1, 3], ids=["cos-s", "cos-1s", "cos-bs"])
@pytest.mark.parametrize("d,r", [(8, 8), (10, 6)], ids=["full", "partial"])
def test_slabs_equal_the_one_pass_path(small_slabs, dtype, layout, seq_dim, cos_batch, d, r):
    gen = torch.Generator().manual_seed(d + r)
    shape = (3, 5, 7, d)  # [b, h, s, d] or [b, s, h, d]
    x = torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)
    s = shape[2] if seq_dim == -2 else shape[1]
    cs_shape = (s, r // 2) if cos_batch is None else (cos_batch, s, r // 2)
    angles = torch.rand(*cs_shape, generator=gen, dtype=torch.float64) * 6.3
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    cos, sin = angles.cos().to(compute), angles.sin().to(compute)
    with torch.no_grad():
        out = apply_rotary_torch(x, cos, sin, layout=layout, seq_dim=seq_dim)
    assert torch.equal(out, one_pass(x, cos, sin, layout=layout, seq_dim=seq_dim))


def test_slabs_of_a_strided_view(small_slabs):
    base = torch.randn(4, 9, 6, 20, dtype=torch.float64).bfloat16()
    x = base[1:, ::2, :, :16].transpose(1, 2)  # gaps, and [b, s, h, d] seen as [b, h, s, d]
    angles = torch.rand(x.shape[2], 8, dtype=torch.float64)
    cos, sin = angles.cos().float(), angles.sin().float()
    with torch.no_grad():
        out = apply_rotary_torch(x, cos, sin)
    assert torch.equal(out, one_pass(x, cos, sin))


def test_autograd_keeps_the_one_pass_path(small_slabs, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("slabs used under autograd")

    monkeypatch.setattr(plain, "_rotate_in_slabs", refuse)
    x = torch.randn(2, 3, 4, 8, requires_grad=True)
    cos, sin = torch.rand(4, 4), torch.rand(4, 4)
    apply_rotary_torch(x, cos, sin).sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    cos_leaf = torch.rand(4, 4, requires_grad=True)
    apply_rotary_torch(x.detach(), cos_leaf, sin).sum().backward()
    assert cos_leaf.grad is not None
