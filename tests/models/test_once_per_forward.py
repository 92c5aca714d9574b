"""TinyTransformer prepares its encoding once per forward pass: positions, rotary cos/sin
(xPos scales, dynamic-NTK frequencies) and the bias are computed once for all layers, and
the logits equal those of the per-layer computation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import posenc
from posenc.models import KVCache, TinyTransformer
from posenc.rotary.module import RotaryEmbedding

VOCAB, DIM, HEADS, LAYERS = 13, 16, 2, 4

ENCODINGS = {
    "rope": "rope",
    "xpos": "xpos",
    "dynamic": {"name": "rope", "scaling": {"type": "dynamic", "factor": 2.0, "max_position": 4}},
    "alibi": "alibi",
    "t5": "t5",
    "fire": "fire",
    "shaw": {"name": "shaw", "values": True},
}


def make(spec) -> TinyTransformer:
    torch.manual_seed(0)
    return TinyTransformer(VOCAB, dim=DIM, num_heads=HEADS, num_layers=LAYERS, encoding=spec)


def per_layer_forward(model: TinyTransformer, tokens, positions=None, mask=None):
    """The computation before preparation: every layer hands the encoding module and the
    positions to attention (rotary: rotates its own q and k), as a reference."""
    b, s = tokens.shape
    pos = torch.arange(s) if positions is None else positions
    enc = model.encoding
    x = model.embed(tokens) * math.sqrt(model.dim)
    for block in model.blocks:
        attn = block.attn
        qkv = attn.qkv(block.norm1(x)).view(b, s, 3, attn.num_heads, attn.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        bias = enc
        if enc.kind == "rotary":
            q, k = enc(q, k, pos, k_positions=pos)
            bias = None
        out = posenc.attention(
            q,
            k,
            v,
            encoding=bias,
            causal=model.causal,
            q_positions=pos,
            k_positions=pos,
            attn_mask=mask,
        )
        x = x + attn.proj(out.transpose(1, 2).reshape(b, s, model.dim))
        x = x + block.out(F.gelu(block.fc(block.norm2(x))))
    return (model.norm(x) * model.dim**-0.5) @ model.embed.weight.T


def _spy(monkeypatch, obj, name):
    calls = []
    original = getattr(obj, name)

    def wrapper(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(obj, name, wrapper)
    return calls


@pytest.mark.parametrize("name", list(ENCODINGS))
def test_once_per_forward_and_equal_to_per_layer(name, monkeypatch):
    model = make(ENCODINGS[name])
    tokens = torch.randint(0, VOCAB, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, :2] = False
    positions = posenc.positions.from_attention_mask(mask) + 3
    want = per_layer_forward(model, tokens, positions, mask[:, None, None, :])
    enc = model.encoding
    if enc.kind == "rotary":  # cos/sin (and the frequencies: dynamic NTK's .item()) once
        counted = {n: _spy(monkeypatch, enc, n) for n in ("rotation_at", "_call_frequencies")}
    else:
        counted = {"bias_at": _spy(monkeypatch, enc, "bias_at")}
    resolved = _spy(monkeypatch, posenc.positions, "resolve_pair")
    got = model(tokens, positions, attn_mask=mask)
    for method, calls in counted.items():
        expected = LAYERS if method == "bias_at" and enc.query_dependent else 1
        if method == "_call_frequencies":  # 0 when the cos/sin table (rotary/cache) holds them
            assert len(calls) <= expected, method
        else:
            assert len(calls) == expected, method
    if not getattr(
        enc, "query_dependent", False
    ):  # Shaw resolves them in each of its per-layer calls
        assert len(resolved) <= 2  # attention's, and the rotary module's own (not per layer)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.parametrize("name", ["rope", "alibi"])
def test_once_per_decoding_step(name, monkeypatch):
    """With a KV cache: one cos/sin or bias per new token, and the cached pass equals the full one."""
    model = make(name).eval()
    tokens = torch.randint(0, VOCAB, (2, 6))
    full = model(tokens)
    cache = KVCache()
    model(tokens[:, :4], cache=cache)
    method = "rotation_at" if name == "rope" else "bias_at"
    calls = _spy(monkeypatch, model.encoding, method)
    steps = [model(tokens[:, i : i + 1], cache=cache) for i in (4, 5)]
    assert len(calls) == 2
    torch.testing.assert_close(torch.cat(steps, 1), full[:, 4:], atol=1e-5, rtol=1e-5)


def test_once_per_training_step_gradients_equal(monkeypatch):
    """Training with a learned bias (T5): one bias per step, gradients as per layer."""
    model = make("t5").train()
    tokens = torch.randint(0, VOCAB, (2, 8))
    per_layer_forward(model, tokens).square().mean().backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    calls = _spy(monkeypatch, model.encoding, "bias_at")
    model(tokens).square().mean().backward()
    assert len(calls) == 1
    for w, p in zip(want, model.parameters()):  # the shared bias sums its grads in another order
        torch.testing.assert_close(p.grad, w, atol=1e-9, rtol=1e-6)


def test_float_positions_synchronise_a_fixed_number_of_times(monkeypatch):
    """Floating positions are checked for NaN with a host sync: per forward, not per layer."""
    from posenc import _errors

    calls = _spy(monkeypatch, _errors, "check_finite")
    model = make("rope")
    model(torch.randint(0, VOCAB, (1, 5)), torch.arange(5) * 0.5)
    with_four = len(calls)
    calls.clear()
    deeper = TinyTransformer(VOCAB, dim=DIM, num_heads=HEADS, num_layers=8, encoding="rope")
    deeper(torch.randint(0, VOCAB, (1, 5)), torch.arange(5) * 0.5)
    assert len(calls) == with_four
    assert isinstance(model.encoding, RotaryEmbedding)
