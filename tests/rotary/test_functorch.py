"""torch.func transforms (vmap, grad) see through every rotary call: their wrapped tensors
have no storage for the fused launches, so the plain path serves them, with the same bits."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc import PosEncError
from posenc.rotary.kernels import fused_rotary


def _inputs(dtype):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 2, 4, 5, 16, generator=g).to(dtype)  # a batch of 3 calls
    k = torch.randn(3, 2, 2, 5, 16, generator=g).to(dtype)
    return q, k


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_vmap_over_the_module_equals_a_loop(dtype, layout):
    rope = posenc.RotaryEmbedding(16, layout=layout)
    q, k = _inputs(dtype)
    qs, ks = torch.func.vmap(lambda q, k: rope(q, k))(q, k)
    for i in range(q.shape[0]):
        want_q, want_k = rope(q[i], k[i])
        assert torch.equal(qs[i], want_q) and torch.equal(ks[i], want_k)


def test_vmap_over_fused_rotary_equals_a_loop():
    rope = posenc.RotaryEmbedding(16)
    cos, sin = rope.cos_sin(torch.arange(5))
    q, k = _inputs(torch.float32)
    qs, ks = torch.func.vmap(lambda q, k: fused_rotary(q, k, cos, sin))(q, k)
    for i in range(q.shape[0]):
        want_q, want_k = fused_rotary(q[i], k[i], cos, sin)
        assert torch.equal(qs[i], want_q) and torch.equal(ks[i], want_k)


def test_grad_transform_equals_autograd():
    rope = posenc.RotaryEmbedding(16)
    q, k = _inputs(torch.float32)
    weights = torch.linspace(-1, 1, 16)

    def loss(q, k):
        qr, kr = rope(q, k)
        return (qr * weights).sum() + (kr * weights).pow(2).sum()

    got = torch.func.grad(loss, argnums=(0, 1))(q[0], k[0])
    leaves = [q[0].clone().requires_grad_(True), k[0].clone().requires_grad_(True)]
    loss(*leaves).backward()
    for g, leaf in zip(got, leaves, strict=True):
        torch.testing.assert_close(g, leaf.grad, atol=1e-6, rtol=0)


@pytest.mark.parametrize("backend", ["cpu", "triton"])
def test_a_named_fused_backend_is_refused_under_vmap(backend):
    rope = posenc.RotaryEmbedding(16)
    cos, sin = rope.cos_sin(torch.arange(5))
    q, k = _inputs(torch.float32)
    with pytest.raises(PosEncError, match=f"backend='{backend}' cannot run under torch.func"):
        torch.func.vmap(lambda q, k: fused_rotary(q, k, cos, sin, backend=backend))(q, k)


def test_vmap_over_attention_with_cope_equals_a_loop():
    """CoPE's fused CPU path leaves torch.func's tensors to the eager path."""
    cope = posenc.build("cope", head_dim=8, npos_max=8)
    with torch.no_grad():
        cope.weight.normal_()
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(3, 3, 1, 2, 5, 8, generator=g).unbind(0)

    def attend(q, k, v):
        return posenc.attention(q, k, v, encoding=cope, causal=True)

    outs = torch.func.vmap(attend)(q, k, v)
    for i in range(q.shape[0]):
        torch.testing.assert_close(outs[i], attend(q[i], k[i], v[i]), atol=1e-6, rtol=0)
