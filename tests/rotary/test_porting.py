"""Porting q/k projections between the interleaved and half RoPE layouts: the permutation
is transformers' convert_llama_weights permute, it inverts, and attention scores are unchanged
(posenc in both layouts, and a Meta-layout model against transformers' Llama rotary)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posenc import PosEncError, RotaryEmbedding
from posenc.rotary.porting import layout_permutation, permute_qk_weight

LAYOUT_PAIRS = [("interleaved", "half"), ("half", "interleaved")]


def _convert_llama_permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """transformers' models/llama/convert_llama_weights_to_hf.py ``permute`` (Meta -> HF):
    ``w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)``."""
    dim1, dim2 = w.shape
    return w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)


@pytest.mark.parametrize(("num_heads", "head_dim"), [(1, 2), (4, 8), (3, 64)])
def test_matches_convert_llama_weights(num_heads: int, head_dim: int) -> None:
    w = torch.randn(num_heads * head_dim, 5)
    ours = permute_qk_weight(w, num_heads, source="interleaved", target="half")
    assert torch.equal(ours, _convert_llama_permute(w, num_heads))


def test_permutation_small_cases() -> None:
    assert layout_permutation(8, source="interleaved", target="half").tolist() == [
        0,
        2,
        4,
        6,
        1,
        3,
        5,
        7,
    ]
    assert layout_permutation(8, source="half", target="interleaved").tolist() == [
        0,
        4,
        1,
        5,
        2,
        6,
        3,
        7,
    ]
    assert layout_permutation(8, source="half", target="half").tolist() == list(range(8))
    # partial rotary: only the first rotary_dim channels move
    assert layout_permutation(8, source="interleaved", target="half", rotary_dim=4).tolist() == [
        0,
        2,
        1,
        3,
        4,
        5,
        6,
        7,
    ]


@given(
    num_heads=st.integers(1, 4),
    half=st.integers(1, 8),
    data=st.data(),
    in_features=st.integers(1, 5),
    bias=st.booleans(),
)
def test_round_trip(num_heads, half, data, in_features, bias) -> None:
    head_dim = 2 * half
    rotary_dim = 2 * data.draw(st.integers(1, half))
    shape = (num_heads * head_dim,) if bias else (num_heads * head_dim, in_features)
    w = torch.randn(shape, dtype=torch.float64)
    for source, target in LAYOUT_PAIRS:
        moved = permute_qk_weight(w, num_heads, source=source, target=target, rotary_dim=rotary_dim)
        back = permute_qk_weight(
            moved, num_heads, source=target, target=source, rotary_dim=rotary_dim
        )
        assert torch.equal(back, w)
        # a permutation: same multiset of rows, pass-through channels untouched
        assert torch.equal(moved.sort(dim=0).values, w.sort(dim=0).values)
        heads_in = w.reshape(num_heads, head_dim, -1)
        heads_out = moved.reshape(num_heads, head_dim, -1)
        assert torch.equal(heads_out[:, rotary_dim:], heads_in[:, rotary_dim:])


def test_other_axis_and_input_untouched() -> None:
    w = torch.randn(7, 2 * 8)  # [in, out] (JAX / Megatron-style storage)
    before = w.clone()
    moved = permute_qk_weight(w, 2, source="interleaved", target="half", dim=1)
    assert torch.equal(moved, _convert_llama_permute(w.t().contiguous(), 2).t())
    assert torch.equal(w, before)
    assert torch.equal(permute_qk_weight(w, 2, source="interleaved", target="half", dim=-1), moved)


def _project(x, w, b, num_heads):
    """``x [b, s, in] -> [b, h, s, d]``."""
    y = x @ w.t() + (0 if b is None else b)
    bsz, s, _ = x.shape
    return y.view(bsz, s, num_heads, -1).transpose(1, 2)


def _scores(q, k):
    """GQA scores ``[b, hq, s, s]``: each key head serves hq / hk query heads."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    return q @ k.transpose(-1, -2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("rotary_dim", [None, 8], ids=["full", "partial"])
@pytest.mark.parametrize(("source", "target"), LAYOUT_PAIRS, ids=["to-half", "to-interleaved"])
def test_attention_scores_unchanged(source, target, rotary_dim, bias, dtype) -> None:
    hq, hk, head_dim, d_model = 4, 2, 16, 24
    x = torch.randn(2, 10, d_model, dtype=dtype)
    wq, wk = (
        torch.randn(hq * head_dim, d_model, dtype=dtype),
        torch.randn(hk * head_dim, d_model, dtype=dtype),
    )
    bq = torch.randn(hq * head_dim, dtype=dtype) if bias else None
    bk = torch.randn(hk * head_dim, dtype=dtype) if bias else None
    positions = torch.stack([torch.arange(10) + 3, torch.arange(10) * 7 + 1000])  # [b, s]

    def port(t, heads):
        return (
            None
            if t is None
            else permute_qk_weight(t, heads, source=source, target=target, rotary_dim=rotary_dim)
        )

    before = RotaryEmbedding(head_dim, rotary_dim=rotary_dim, layout=source, base=500.0)
    after = RotaryEmbedding(head_dim, rotary_dim=rotary_dim, layout=target, base=500.0)
    q0, k0 = before(_project(x, wq, bq, hq), _project(x, wk, bk, hk), positions)
    q1, k1 = after(
        _project(x, port(wq, hq), port(bq, hq), hq),
        _project(x, port(wk, hk), port(bk, hk), hk),
        positions,
    )
    tol = {torch.float32: 2e-4, torch.float64: 1e-10}[dtype]  # logits are O(100) here
    torch.testing.assert_close(_scores(q1, k1), _scores(q0, k0), rtol=tol, atol=tol)
    # the rotated heads themselves are the permuted ones
    perm = layout_permutation(head_dim, source=source, target=target, rotary_dim=rotary_dim)
    torch.testing.assert_close(q1, q0[..., perm], rtol=tol, atol=tol)
    torch.testing.assert_close(k1, k0[..., perm], rtol=tol, atol=tol)


def test_meta_checkpoint_ported_to_transformers_llama() -> None:
    """A Meta-layout (interleaved) model in posenc and its converted weights in transformers'
    LlamaRotaryEmbedding + apply_rotary_pos_emb give the same attention scores."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    hq, hk, head_dim, d_model = 4, 2, 16, 32
    cfg = transformers.LlamaConfig(
        hidden_size=d_model * 2,
        num_attention_heads=hq,
        num_key_value_heads=hk,
        head_dim=head_dim,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    x = torch.randn(2, 9, d_model, dtype=torch.float64)
    wq, wk = (
        torch.randn(hq * head_dim, d_model, dtype=torch.float64),
        torch.randn(hk * head_dim, d_model, dtype=torch.float64),
    )
    positions = torch.stack([torch.arange(9), torch.arange(9) + 40])

    meta = RotaryEmbedding(head_dim, layout="interleaved")
    q0, k0 = meta(_project(x, wq, None, hq), _project(x, wk, None, hk), positions)

    q1, k1 = (
        _project(x, _convert_llama_permute(wq, hq), None, hq),
        _project(x, _convert_llama_permute(wk, hk), None, hk),
    )
    cos, sin = LlamaRotaryEmbedding(cfg)(q1, positions)  # float32 angles, cast to float64
    q1, k1 = apply_rotary_pos_emb(q1, k1, cos, sin)
    # transformers' float32 angles at positions <= 48: error <= 48 * 3.1e-7 rad per pair
    torch.testing.assert_close(_scores(q1, k1), _scores(q0, k0), rtol=1e-4, atol=1e-3)


BAD = [
    ("not-tensor", dict(weight=[1.0, 2.0], num_heads=1), "weight must be a torch.Tensor"),
    ("3-d", dict(weight=torch.zeros(2, 4, 4), num_heads=1), r"weight must be a weight \[out, in\]"),
    (
        "heads-not-dividing",
        dict(weight=torch.zeros(10, 3), num_heads=3),
        "not divisible by num_heads=3",
    ),
    ("odd-head-dim", dict(weight=torch.zeros(6, 3), num_heads=2), "must be even, got 3"),
    ("zero-heads", dict(weight=torch.zeros(8, 3), num_heads=0), "num_heads must be >= 1"),
    (
        "odd-rotary-dim",
        dict(weight=torch.zeros(8, 3), num_heads=1, rotary_dim=3),
        "rotary_dim must be even",
    ),
    (
        "rotary-too-big",
        dict(weight=torch.zeros(8, 3), num_heads=1, rotary_dim=10),
        "rotary_dim must be <= head_dim",
    ),
    ("bad-axis", dict(weight=torch.zeros(8, 3), num_heads=1, dim=2), "dim must be <= 1"),
    (
        "bad-layout",
        dict(weight=torch.zeros(8, 3), num_heads=1, source="neox"),
        "source must be one of 'half', 'interleaved'",
    ),
]


@pytest.mark.parametrize(("kwargs", "match"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input(kwargs: dict, match: str) -> None:
    kwargs = {"source": "interleaved", "target": "half", **kwargs}
    with pytest.raises(PosEncError, match=match):
        permute_qk_weight(**kwargs)


def test_bad_permutation_args() -> None:
    with pytest.raises(PosEncError, match="head_dim must be even"):
        layout_permutation(7, source="half", target="interleaved")
    with pytest.raises(PosEncError, match="target must be one of"):
        layout_permutation(8, source="half", target="gptj")
