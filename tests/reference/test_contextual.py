"""The CoPE and forgetting-attention (FoX) oracles against hand-worked cases."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.testing import assert_allclose

from posenc import reference as ref

TOL = {"rtol": 1e-12, "atol": 1e-12}
B, H, D, DV = 2, 2, 4, 3


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _qkv(nq: int, nk: int, *, heads: int = H, kv_heads: int = H, seed: int = 0):
    rng = _rng(seed)
    q = rng.standard_normal((B, heads, nq, D))
    k = rng.standard_normal((B, kv_heads, nk, D))
    v = rng.standard_normal((B, kv_heads, nk, DV))
    return q, k, v


def _expected_counts(nq: int, nk: int, *, causal: bool, per_gate: float, cap=None) -> np.ndarray:
    """``p_ij = per_gate * (number of allowed t >= j)``, clamped to ``cap``, 0 off the mask."""
    out = np.zeros((B, H, nq, nk))
    for i in range(nq):
        last = i + (nk - nq) if causal else nk - 1
        for j in range(last + 1):
            p = per_gate * (last - j + 1)
            out[:, :, i, j] = p if cap is None else min(p, cap)
    return out


SIZES = [pytest.param(5, 5, id="nq=nk"), pytest.param(2, 5, id="nq<nk")]


# --- CoPE positions ----------------------------------------------------------------------


@pytest.mark.parametrize("zero", ["q", "k"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize(("nq", "nk"), SIZES)
def test_cope_zero_logits_give_half_gates(zero, causal, nq, nk):
    q, k, _ = _qkv(nq, nk)
    if zero == "q":
        q = np.zeros_like(q)
    else:
        k = np.zeros_like(k)
    p = ref.cope_positions(q, k, causal=causal)
    # sigmoid(0) = 0.5 exactly and sums of halves are exact: p_ij = 0.5 * (i' - j + 1).
    expected = _expected_counts(nq, nk, causal=causal, per_gate=0.5)
    assert_allclose(p, expected, rtol=0, atol=0)


@pytest.mark.parametrize(("nq", "nk"), SIZES)
def test_cope_saturated_gates_give_relative_positions(nq, nk):
    # q . k huge and positive: every gate is 1, p_ij = i' - j + 1 (relative positions from 1).
    rng = _rng(1)
    q = 30.0 + rng.random((B, H, nq, D))
    k = 30.0 + rng.random((B, H, nk, D))
    p = ref.cope_positions(q, k)
    assert_allclose(p, _expected_counts(nq, nk, causal=True, per_gate=1.0), rtol=0, atol=0)


@pytest.mark.parametrize("npos_max", [1, 2, 3])
def test_cope_positions_clamp_to_the_table(npos_max):
    rng = _rng(2)
    q = 30.0 + rng.random((B, H, 5, D))
    k = 30.0 + rng.random((B, H, 5, D))
    p = ref.cope_positions(q, k, npos_max=npos_max)
    expected = _expected_counts(5, 5, causal=True, per_gate=1.0, cap=npos_max - 1)
    assert_allclose(p, expected, rtol=0, atol=0)


def test_cope_saturated_negative_gates_give_zero_positions():
    rng = _rng(3)
    q = 30.0 + rng.random((B, H, 4, D))
    k = -30.0 - rng.random((B, H, 4, D))
    p = ref.cope_positions(q, k)
    assert_allclose(p, np.zeros((B, H, 4, 4)), rtol=0, atol=1e-300)


def test_cope_positions_are_reverse_cumsums_of_sigmoid_gates():
    q, k, _ = _qkv(3, 5)
    scale = 0.7
    p = ref.cope_positions(q, k, scale=scale)
    gates = 1.0 / (1.0 + np.exp(-scale * np.einsum("bhid,bhjd->bhij", q, k)))
    causal = np.arange(5)[None, :] <= np.arange(3)[:, None] + 2
    gates = np.where(causal, gates, 0.0)
    expected = np.flip(np.cumsum(np.flip(gates, -1), -1), -1)
    assert_allclose(p, np.where(causal, expected, 0.0), **TOL)


# --- CoPE interpolation ---------------------------------------------------------------------


@pytest.mark.parametrize("case", ["integer", "half_integer"])
def test_cope_interpolates_position_logits(case):
    nq = nk = 5
    npos_max = nk + 2  # no clamp
    rng = _rng(4)
    weight = rng.standard_normal((npos_max, D))
    if case == "integer":
        q = 30.0 + rng.random((B, H, nq, D))
        k = 30.0 + rng.random((B, H, nk, D))
        per_gate = 1.0
    else:
        q = rng.standard_normal((B, H, nq, D))
        k = np.zeros((B, H, nk, D))
        per_gate = 0.5
    z = ref.cope_bias(q, k, weight, position_logit="unscaled")
    e = np.einsum("bhid,pd->bhip", q, weight)  # e[b, h, i, p] = q_i . weight[p]
    expected = np.zeros((B, H, nq, nk))
    for i in range(nq):
        for j in range(i + 1):
            p = per_gate * (i - j + 1)
            lo, hi = int(np.floor(p)), int(np.ceil(p))
            # integer p: exactly e[p]; half-integer p: the mean of its two neighbours
            expected[:, :, i, j] = (
                e[:, :, i, lo] if lo == hi else 0.5 * (e[:, :, i, lo] + e[:, :, i, hi])
            )
    assert_allclose(z, expected, **TOL)
    if case == "half_integer":  # both kinds of p occur
        assert {0.5 * (i - j + 1) % 1 for i in range(nq) for j in range(i + 1)} == {0.0, 0.5}


def test_cope_quarter_gates_weight_the_nearer_neighbour_more():
    # One query, every key k_j = s q / |q|^2 with scale * s = -log 3: each gate is
    # sigmoid(-log 3) = 1/4, so p_j = (5 - j) / 4 = 1.25, 1, 0.75, 0.5, 0.25 and
    # z_j = (1 - w) e[floor p] + w e[ceil p] with w = p - floor p (not the mirror image).
    nk, scale = 5, 0.5
    rng = _rng(30)
    q = rng.standard_normal((B, H, 1, D))
    s = -np.log(3.0) / scale
    k = np.repeat(s * q / np.sum(q * q, axis=-1, keepdims=True), nk, axis=2)
    weight = rng.standard_normal((3, D))
    p = ref.cope_positions(q, k, scale=scale)
    assert_allclose(p, np.broadcast_to([1.25, 1.0, 0.75, 0.5, 0.25], (B, H, 1, nk)), **TOL)
    e = np.einsum("bhid,pd->bhip", q, weight)[:, :, 0]  # [b, h, npos]
    expected = np.stack(
        [
            0.75 * e[..., 1] + 0.25 * e[..., 2],
            e[..., 1],
            0.25 * e[..., 0] + 0.75 * e[..., 1],
            0.5 * e[..., 0] + 0.5 * e[..., 1],
            0.75 * e[..., 0] + 0.25 * e[..., 1],
        ],
        axis=-1,
    )[:, :, None]
    z = ref.cope_bias(q, k, weight, scale=scale, position_logit="unscaled")
    assert_allclose(z, expected, **TOL)
    assert_allclose(ref.cope_bias(q, k, weight, scale=scale), scale * expected, **TOL)


def test_cope_interpolates_at_the_clamp():
    # Saturated gates with npos_max = 3: every p >= 2 reads weight[2].
    rng = _rng(5)
    q = 30.0 + rng.random((B, H, 4, D))
    k = 30.0 + rng.random((B, H, 4, D))
    weight = rng.standard_normal((3, D))
    z = ref.cope_bias(q, k, weight, position_logit="unscaled")
    e = np.einsum("bhid,pd->bhip", q, weight)
    expected = np.zeros((B, H, 4, 4))
    for i in range(4):
        for j in range(i + 1):
            expected[:, :, i, j] = e[:, :, i, min(i - j + 1, 2)]
    assert_allclose(z, expected, **TOL)


# --- CoPE attention ----------------------------------------------------------------------------


@pytest.mark.parametrize("position_logit", ["scaled", "unscaled"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize(("nq", "nk"), SIZES)
def test_cope_with_zero_table_is_plain_attention(position_logit, causal, nq, nk):
    q, k, v = _qkv(nq, nk)
    weight = np.zeros((4, D))
    got = ref.cope_attention(q, k, v, weight, position_logit=position_logit, causal=causal)
    assert_allclose(got, ref.attention(q, k, v, causal=causal), **TOL)
    assert_allclose(
        ref.cope_bias(q, k, weight, position_logit=position_logit, causal=causal),
        np.zeros((B, H, nq, nk)),
        rtol=0,
        atol=0,
    )


@pytest.mark.parametrize("scale", [None, 0.3])
@pytest.mark.parametrize(("nq", "nk"), SIZES)
def test_cope_scaled_and_unscaled_differ_by_scale(scale, nq, nk):
    q, k, _ = _qkv(nq, nk)
    weight = _rng(6).standard_normal((3, D))
    factor = 1.0 / np.sqrt(D) if scale is None else scale
    scaled = ref.cope_bias(q, k, weight, scale=scale, position_logit="scaled")
    unscaled = ref.cope_bias(q, k, weight, scale=scale, position_logit="unscaled")
    assert_allclose(scaled, factor * unscaled, rtol=1e-15, atol=0)
    assert np.abs(unscaled).max() > 0.1  # the cases are not trivially zero


@pytest.mark.parametrize("position_logit", ["scaled", "unscaled"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize(("nq", "nk"), SIZES)
def test_cope_attention_is_attention_with_cope_bias(position_logit, causal, nq, nk):
    q, k, v = _qkv(nq, nk, seed=7)
    weight = _rng(8).standard_normal((4, D))
    bias = ref.cope_bias(q, k, weight, position_logit=position_logit, causal=causal)
    got = ref.cope_attention(q, k, v, weight, position_logit=position_logit, causal=causal)
    assert_allclose(got, ref.attention(q, k, v, bias=bias, causal=causal), **TOL)


@pytest.mark.parametrize("nq", [1, 3])
def test_cope_decoding_rows_equal_the_last_full_rows(nq):
    q, k, v = _qkv(6, 6, seed=9)
    weight = _rng(10).standard_normal((4, D))
    full = ref.cope_attention(q, k, v, weight)
    got = ref.cope_attention(q[:, :, -nq:], k, v, weight)
    assert_allclose(got, full[:, :, -nq:], **TOL)
    assert_allclose(
        ref.cope_positions(q[:, :, -nq:], k), ref.cope_positions(q, k)[:, :, -nq:], **TOL
    )


# --- CoPE padding --------------------------------------------------------------------------------


def test_cope_padded_key_contributes_nothing():
    # Bidirectional, key 2 padded: the same as deleting key 2, whatever its value.
    q, k, v = _qkv(4, 5, seed=11)
    weight = _rng(12).standard_normal((4, D))
    keep = np.ones((B, 5), bool)
    keep[:, 2] = False
    v_garbage = v.copy()
    v_garbage[:, :, 2] = 1e6
    k_garbage = k.copy()
    k_garbage[:, :, 2] = 1e3
    kept = [0, 1, 3, 4]
    p = ref.cope_positions(q, k_garbage, causal=False, keep=keep)
    assert_allclose(p[..., 2], np.zeros((B, H, 4)), rtol=0, atol=0)
    assert_allclose(p[..., kept], ref.cope_positions(q, k[:, :, kept], causal=False), **TOL)
    got = ref.cope_attention(q, k_garbage, v_garbage, weight, causal=False, keep=keep)
    expected = ref.cope_attention(q, k[:, :, kept], v[:, :, kept], weight, causal=False)
    assert_allclose(got, expected, **TOL)


def test_cope_left_padding_and_empty_rows():
    # Causal, the first 2 tokens of batch 0 padded and all of batch 1: rows with no key are 0,
    # the rest equal the unpadded suffix.
    q, k, v = _qkv(5, 5, seed=13)
    weight = _rng(14).standard_normal((4, D))
    keep = np.ones((B, 5), bool)
    keep[0, :2] = False
    keep[1, :] = False
    got = ref.cope_attention(q, k, v, weight, keep=keep)
    suffix = ref.cope_attention(q[:1, :, 2:], k[:1, :, 2:], v[:1, :, 2:], weight)
    assert_allclose(got[0, :, 2:], suffix[0], **TOL)
    assert_allclose(got[0, :, :2], np.zeros((H, 2, DV)), rtol=0, atol=0)
    assert_allclose(got[1], np.zeros((H, 5, DV)), rtol=0, atol=0)
    bias = ref.cope_bias(q, k, weight, keep=keep)
    assert_allclose(bias[1], np.zeros((H, 5, 5)), rtol=0, atol=0)
    assert_allclose(bias[0, :, :, :2], np.zeros((H, 5, 2)), rtol=0, atol=0)


# --- grouped-query attention ---------------------------------------------------------------------


@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("position_logit", ["scaled", "unscaled"])
def test_cope_grouped_query_equals_repeated_heads(kv_heads, position_logit):
    heads = 4
    q, k, v = _qkv(3, 5, heads=heads, kv_heads=kv_heads, seed=15)
    weight = _rng(16).standard_normal((4, D))
    kr, vr = (np.repeat(t, heads // kv_heads, axis=1) for t in (k, v))
    assert_allclose(ref.cope_positions(q, k), ref.cope_positions(q, kr), rtol=0, atol=0)
    assert_allclose(
        ref.cope_bias(q, k, weight, position_logit=position_logit),
        ref.cope_bias(q, kr, weight, position_logit=position_logit),
        rtol=0,
        atol=0,
    )
    assert_allclose(
        ref.cope_attention(q, k, v, weight, position_logit=position_logit),
        ref.cope_attention(q, kr, vr, weight, position_logit=position_logit),
        rtol=0,
        atol=0,
    )


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_fox_grouped_query_equals_repeated_heads(kv_heads):
    heads = 4
    q, k, v = _qkv(3, 5, heads=heads, kv_heads=kv_heads, seed=17)
    log_forget = np.log(1.0 / (1.0 + np.exp(-_rng(18).standard_normal((B, heads, 5)))))
    kr, vr = (np.repeat(t, heads // kv_heads, axis=1) for t in (k, v))
    assert_allclose(
        ref.fox_attention(q, k, v, log_forget),
        ref.fox_attention(q, kr, vr, log_forget),
        rtol=0,
        atol=0,
    )


# --- FoX -------------------------------------------------------------------------------------------


def _log_sigmoid_gates(nk: int, seed: int) -> np.ndarray:
    x = _rng(seed).standard_normal((B, H, nk))
    return -np.log1p(np.exp(-x))


@pytest.mark.parametrize(("nq", "nk"), SIZES)
def test_fox_zero_log_forget_is_plain_causal_attention(nq, nk):
    q, k, v = _qkv(nq, nk, seed=19)
    got = ref.fox_attention(q, k, v, np.zeros((B, H, nk)))
    assert_allclose(got, ref.attention(q, k, v, causal=True), **TOL)
    bias = ref.fox_bias(np.zeros((B, H, nk)), nq)
    causal = np.arange(nk)[None, :] <= np.arange(nq)[:, None] + (nk - nq)
    expected = np.broadcast_to(np.where(causal, 0.0, -np.inf), (B, H, nq, nk))
    assert_allclose(bias, expected, rtol=0, atol=0)


@pytest.mark.parametrize(("nq", "nk"), SIZES)
def test_fox_constant_log_forget_is_alibi(nq, nk):
    slopes = ref.alibi_slopes(H)
    log_forget = np.broadcast_to(-slopes[None, :, None], (B, H, nk)).copy()
    q_pos, k_pos = np.arange(nk - nq, nk), np.arange(nk)
    alibi = ref.alibi_bias(q_pos, k_pos, slopes)  # -m (i' - j), [h, nq, nk]
    causal = k_pos[None, :] <= q_pos[:, None]
    expected = np.broadcast_to(np.where(causal, alibi, -np.inf), (B, H, nq, nk))
    assert_allclose(ref.fox_bias(log_forget, nq), expected, **TOL)
    q, k, v = _qkv(nq, nk, seed=20)
    got = ref.fox_attention(q, k, v, log_forget)
    assert_allclose(got, ref.attention(q, k, v, bias=alibi, causal=True), **TOL)


@pytest.mark.parametrize(("nq", "nk"), [*SIZES, pytest.param(1, 5, id="nq=1")])
def test_fox_bias_is_a_difference_of_cumsums(nq, nk):
    log_forget = _log_sigmoid_gates(nk, seed=21)
    c = np.cumsum(log_forget, axis=-1)  # [b, h, nk]
    last = np.arange(nq) + (nk - nq)  # i'
    expected = c[:, :, last, None] - c[:, :, None, :]
    expected = np.where(np.arange(nk)[None, :] <= last[:, None], expected, -np.inf)
    assert_allclose(ref.fox_bias(log_forget, nq), expected, **TOL)


@pytest.mark.parametrize(("nq", "nk"), SIZES)
def test_fox_attention_is_attention_with_fox_bias(nq, nk):
    q, k, v = _qkv(nq, nk, seed=22)
    log_forget = _log_sigmoid_gates(nk, seed=23)
    bias = ref.fox_bias(log_forget, nq)
    got = ref.fox_attention(q, k, v, log_forget, scale=0.4)
    assert_allclose(got, ref.attention(q, k, v, bias=bias, causal=True, scale=0.4), **TOL)


@pytest.mark.parametrize("nq", [1, 3])
def test_fox_decoding_rows_equal_the_last_full_rows(nq):
    q, k, v = _qkv(6, 6, seed=24)
    log_forget = _log_sigmoid_gates(6, seed=25)
    full = ref.fox_attention(q, k, v, log_forget)
    got = ref.fox_attention(q[:, :, -nq:], k, v, log_forget)
    assert_allclose(got, full[:, :, -nq:], **TOL)
    assert_allclose(ref.fox_bias(log_forget, nq), ref.fox_bias(log_forget, 6)[:, :, -nq:], **TOL)


def test_fox_padded_key_contributes_nothing_and_empty_rows_are_zero():
    q, k, v = _qkv(5, 5, seed=26)
    log_forget = _log_sigmoid_gates(5, seed=27)
    keep = np.ones((B, 5), bool)
    keep[0, :2] = False  # left padding
    keep[1, :] = False  # nothing at all
    v_garbage = v.copy()
    v_garbage[:, :, :2] = 1e6
    got = ref.fox_attention(q, k, v_garbage, log_forget, keep=keep)
    suffix = ref.fox_attention(q[:1, :, 2:], k[:1, :, 2:], v[:1, :, 2:], log_forget[:1, :, 2:])
    assert_allclose(got[0, :, 2:], suffix[0], **TOL)
    assert_allclose(got[0, :, :2], np.zeros((H, 2, DV)), rtol=0, atol=0)
    assert_allclose(got[1], np.zeros((H, 5, DV)), rtol=0, atol=0)


# --- shapes ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "match"),
    [
        pytest.param(
            lambda: ref.cope_positions(np.zeros((1, 2, 3)), np.zeros((1, 2, 3, 4))),
            r"\[b, h, n, d\]",
            id="q-3d",
        ),
        pytest.param(
            lambda: ref.cope_positions(np.zeros((1, 3, 2, 4)), np.zeros((1, 2, 2, 4))),
            "must divide",
            id="heads",
        ),
        pytest.param(
            lambda: ref.cope_bias(np.zeros((1, 1, 2, 4)), np.zeros((1, 1, 2, 4)), np.zeros((3, 5))),
            r"weight must be \[npos_max, d\]",
            id="weight",
        ),
        pytest.param(
            lambda: ref.cope_bias(
                np.zeros((1, 1, 2, 4)), np.zeros((1, 1, 2, 4)), np.zeros((3, 4)), position_logit="x"
            ),
            "position_logit",
            id="position_logit",
        ),
        pytest.param(
            lambda: ref.cope_positions(
                np.zeros((1, 1, 2, 4)), np.zeros((1, 1, 2, 4)), keep=np.ones((1, 3), bool)
            ),
            r"keep must be \[b, nk\]",
            id="keep",
        ),
        pytest.param(
            lambda: ref.cope_positions(np.zeros((1, 1, 3, 4)), np.zeros((1, 1, 2, 4))),
            "nq 3 > nk 2",
            id="causal-nq>nk",
        ),
        pytest.param(
            lambda: ref.cope_attention(
                np.zeros((1, 1, 2, 4)),
                np.zeros((1, 1, 2, 4)),
                np.zeros((1, 1, 3, 4)),
                np.zeros((2, 4)),
            ),
            r"v must be",
            id="v",
        ),
        pytest.param(lambda: ref.fox_bias(np.zeros((1, 2)), 1), r"log_forget must be", id="fox-2d"),
        pytest.param(lambda: ref.fox_bias(np.zeros((1, 1, 2)), 3), "nq 3", id="fox-nq>nk"),
        pytest.param(
            lambda: ref.fox_attention(
                np.zeros((1, 2, 2, 4)),
                np.zeros((1, 2, 2, 4)),
                np.zeros((1, 2, 2, 4)),
                np.zeros((1, 1, 2)),
            ),
            r"log_forget must be \[b, h, nk\]",
            id="fox-log_forget",
        ),
    ],
)
def test_bad_shapes_raise_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()
