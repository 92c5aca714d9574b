"""posenc.attend.prepare_encoding: one prepared encoding serves many attention calls."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc import PosEncError
from posenc.attend import PreparedEncoding, prepare_encoding

H, D = 4, 8


def _qkv(q_len=5, k_len=5, kv_heads=H, b=2, dtype=torch.float32):
    return (
        torch.randn(b, H, q_len, D, dtype=dtype),
        torch.randn(b, kv_heads, k_len, D, dtype=dtype),
        torch.randn(b, kv_heads, k_len, D, dtype=dtype),
    )


CASES = {  # name -> (encoding, q_len, k_len, kv_heads, causal, padding, q_positions, k_positions)
    "rope-self": ("rope", 5, 5, H, True, False, None, None),
    "xpos-decode-gqa": ("xpos", 2, 6, 2, True, False, None, None),
    "alibi-padding": ("alibi", 5, 5, H, True, True, None, None),
    "alibi-batched": ("alibi", 3, 6, H, True, True, None, torch.arange(12).reshape(2, 6)),
    "t5-cross": ("t5", 5, 4, H, False, False, None, None),
    "shaw-values": ({"name": "shaw", "values": True}, 4, 4, H, True, False, None, None),
    "fire": ("fire", 4, 4, 1, True, True, torch.arange(4) + 3, torch.arange(4) + 3),
    "kerple": ("kerple", 3, 5, H, False, False, None, None),
}


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("case", list(CASES))
def test_prepared_equals_direct_call(case, backend):
    """Reused for several (q, k, v), a PreparedEncoding gives what each direct call gives."""
    spec, q_len, k_len, kv_heads, causal, padding, qp, kp = CASES[case]
    if case == "shaw-values" and backend == "sdpa":
        backend = "auto"  # value-dependent: SDPA refuses it, auto runs it eager
    enc = posenc.build(spec, fill={"num_heads": H, "head_dim": D})
    prep = prepare_encoding(
        enc,
        q_len=q_len,
        k_len=k_len,
        num_heads=H,
        head_dim=D,
        batch=2,
        q_positions=qp,
        k_positions=kp,
    )
    assert isinstance(prep, PreparedEncoding) and prep.encoding is enc
    mask = None
    if padding:
        mask = torch.ones(2, k_len, dtype=torch.bool)
        mask[1, :2] = False
    for _ in range(3):  # layers
        q, k, v = _qkv(q_len, k_len, kv_heads)
        kw = dict(causal=causal, attn_mask=mask, backend=backend)
        got = posenc.attention(q, k, v, encoding=prep, **kw)
        want = posenc.attention(q, k, v, encoding=enc, q_positions=qp, k_positions=kp, **kw)
        assert torch.equal(got, want)


def test_bias_and_mask_computed_once(monkeypatch):
    enc = posenc.ALiBiBias(H)
    calls = []
    original = enc.bias_at
    monkeypatch.setattr(enc, "bias_at", lambda *a, **kw: calls.append(1) or original(*a, **kw))
    prep = prepare_encoding(enc, q_len=5, num_heads=H, head_dim=D)
    mask = torch.ones(2, 5, dtype=torch.bool)
    outs = [
        posenc.attention(*_qkv(), encoding=prep, causal=True, attn_mask=mask, backend="sdpa")
        for _ in range(4)
    ]
    assert len(calls) == 1 and len(outs) == 4
    # A different mask object, causality or dtype makes a new SDPA mask from the same bias.
    posenc.attention(*_qkv(), encoding=prep, causal=False, attn_mask=mask, backend="sdpa")
    posenc.attention(*_qkv(), encoding=prep, causal=True, attn_mask=mask.clone(), backend="sdpa")
    posenc.attention(*_qkv(dtype=torch.float64), encoding=prep, causal=True, backend="sdpa")
    assert len(calls) == 1 and len(prep._masks) == 3


def test_query_dependent_bias_computed_per_call(monkeypatch):
    enc = posenc.ShawRelativeBias(H, D)
    calls = []
    original = enc.bias_at
    monkeypatch.setattr(enc, "bias_at", lambda *a, **kw: calls.append(1) or original(*a, **kw))
    prep = prepare_encoding(enc, q_len=5, num_heads=H, head_dim=D)
    for _ in range(3):
        posenc.attention(*_qkv(), encoding=prep, causal=True, backend="sdpa")
    assert len(calls) == 3  # it depends on q


def test_rotation_computed_once_per_dtype(monkeypatch):
    enc = posenc.RotaryEmbedding(D)
    calls = []
    original = enc.rotation_at
    monkeypatch.setattr(
        enc, "rotation_at", lambda *a, **kw: calls.append(kw["dtype"]) or original(*a, **kw)
    )
    prep = prepare_encoding(enc, q_len=5, num_heads=H, head_dim=D)
    for dtype in (torch.float32, torch.bfloat16, torch.float32, torch.float64, torch.float64):
        posenc.attention(*_qkv(dtype=dtype), encoding=prep, causal=True)
    assert calls == [torch.float32, torch.float64]


def test_none_returns_none_and_still_checks_positions():
    assert prepare_encoding("none", q_len=3, num_heads=H, head_dim=D) is None
    with pytest.raises(PosEncError, match="q_positions must have length 3"):
        prepare_encoding(None, q_len=3, num_heads=H, head_dim=D, q_positions=torch.arange(2))


def _prep(**kw):
    return prepare_encoding("alibi", q_len=5, num_heads=H, head_dim=D, **kw)


BAD = {
    "positions-too": (
        lambda: posenc.attention(*_qkv(), encoding=_prep(), q_positions=torch.arange(5)),
        "must be None with a PreparedEncoding",
    ),
    "lengths": (
        lambda: posenc.attention(*_qkv(4, 4), encoding=_prep()),
        "prepared encoding is for q_len=5, k_len=5, got q_len=4, k_len=4",
    ),
    "batch": (
        lambda: posenc.attention(*_qkv(), encoding=_prep(k_positions=torch.zeros(3, 5))),
        "q_positions have batch size 3; q has 2",
    ),
    "heads": (
        lambda: posenc.attention(
            *_qkv(),
            encoding=prepare_encoding(
                posenc.ALiBiBias(H), q_len=5, num_heads=H, head_dim=D
            ).__class__(posenc.ALiBiBias(H + 1), torch.arange(5), torch.arange(5)),
        ),
        "num_heads=5; it must equal",
    ),
    "additive": (
        lambda: prepare_encoding("sinusoidal", q_len=5, num_heads=H, head_dim=D),
        "is additive",
    ),
    "num-heads": (
        lambda: prepare_encoding("alibi", q_len=5, num_heads=0, head_dim=D),
        "num_heads must be >= 1",
    ),
    "bias-heads": (
        lambda: prepare_encoding(posenc.ALiBiBias(2), q_len=5, num_heads=H, head_dim=D),
        "num_heads=2; it must equal the number of query heads, 4",
    ),
    "rotate-bias": (lambda: _prep().rotate(*_qkv()[:2]), "rotate needs a rotary encoding"),
    "bias-rotary": (
        lambda: prepare_encoding("rope", q_len=5, num_heads=H, head_dim=D).bias(_qkv()[0], 1.0),
        "a bias needs a bias encoding, got kind .rotary.",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input(case):
    call, match = BAD[case]
    with pytest.raises(PosEncError, match=match):
        call()
