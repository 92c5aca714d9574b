"""CoPE against x-transformers' (``x_transformers.Attend`` with its ``CoPE``), the peer users
port from: the same outputs and gradients (of q, k, v and the position table) on every path
that takes CoPE, causal, at table sizes that clamp and that do not.

x-transformers adds the position logits ``q . e_p`` unscaled to the scaled logits, which is
posenc's ``position_logit="unscaled"``; its softmax runs in float32 whatever the inputs, so
float64 inputs agree to float32's precision, not float64's."""

from __future__ import annotations

import pytest
import torch

import posenc

xt_attend = pytest.importorskip("x_transformers.attend", reason="needs x-transformers (dev extra)")
xt_main = pytest.importorskip("x_transformers.x_transformers")


def _pair(d: int, h: int, npos: int, seed: int):
    enc = posenc.build("cope", head_dim=d, npos_max=npos, position_logit="unscaled")
    with torch.no_grad():
        enc.weight.normal_(0, 0.3, generator=torch.Generator().manual_seed(seed))
    peer = xt_main.CoPE(d, h, npos)
    with torch.no_grad():
        peer.pos_emb.copy_(enc.weight)
    return enc, peer, xt_attend.Attend(causal=True, cope=peer, flash=False)


@pytest.mark.parametrize("backend", ["eager", "chunked"])
@pytest.mark.parametrize(("s", "npos"), [(48, 49), (48, 7)], ids=["table-covers", "clamped"])
def test_cope_equals_x_transformers(s, npos, backend):
    b, h, d = 2, 3, 8
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(b, h, s, d, generator=g).requires_grad_(True) for _ in range(3))
    enc, peer, attend = _pair(d, h, npos, seed=2)
    weight = torch.randn(b, h, s, d, generator=g)

    want = attend(q, k, v)[0]
    want_grads = torch.autograd.grad((want * weight).sum(), (q, k, v, peer.pos_emb))
    got = posenc.attention(q, k, v, encoding=enc, causal=True, backend=backend)
    got_grads = torch.autograd.grad((got * weight).sum(), (q, k, v, enc.weight))

    torch.testing.assert_close(got, want, atol=2e-6, rtol=0)
    for name, a, e in zip(("q", "k", "v", "table"), got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=0, msg=name)
