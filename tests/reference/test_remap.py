"""The position-map oracles (Self-Extend, STRING) against the papers' facts and against plain
RoPE attention where a map keeps every position."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

from posenc import reference as ref

B, H, HK, D = 2, 4, 2, 8


def _qkv(sq: int, sk: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, H, sq, D))
    k = rng.standard_normal((B, HK, sk, D))
    v = rng.standard_normal((B, HK, sk, 5))
    return q, k, v


def _grid(sq: int, sk: int):
    """Per-pair positions that keep every pair's own: ``qp[i, j] = i``, ``kp[i, j] = j``."""
    q_pos = np.arange(sk - sq, sk, dtype=np.float64)
    k_pos = np.arange(sk, dtype=np.float64)
    return np.repeat(q_pos[:, None], sk, axis=1), np.repeat(k_pos[None, :], sq, axis=0)


@pytest.mark.parametrize(
    ("g", "w"), [(2, 3), (3, 4), (4, 2), (2, 4)], ids=["G2W3", "G3W4", "G4W2", "G2W4"]
)
def test_self_extend_positions_per_branch(g: int, w: int) -> None:
    q_pos, k_pos = np.arange(3, 11), np.arange(11)
    qp, kp = ref.self_extend_positions(q_pos, k_pos, g, w)
    d = q_pos[:, None] - k_pos[None, :]
    near = d < w
    assert_array_equal(qp[near], np.broadcast_to(q_pos[:, None], d.shape)[near])
    assert_array_equal(kp[near], np.broadcast_to(k_pos[None, :], d.shape)[near])
    want_q = np.broadcast_to((q_pos // g + w - w / g)[:, None], d.shape)
    want_k = np.broadcast_to((k_pos // g)[None, :], d.shape)
    assert_array_equal(qp[~near], want_q[~near])
    assert_array_equal(kp[~near], want_k[~near])


def test_self_extend_regions_meet_at_the_window() -> None:
    # G divides W: the first grouped offset (d = W) is rotated at relative position W - j % G
    # for every query at a multiple of G; never beyond the offset itself.
    g, w = 4, 8
    q_pos, k_pos = np.arange(40), np.arange(40)
    qp, kp = ref.self_extend_positions(q_pos, k_pos, g, w)
    d = q_pos[:, None] - k_pos[None, :]
    grouped = d >= w
    rel = (qp - kp)[grouped]
    assert rel.min() >= w - (g - 1) and np.all(rel <= d[grouped])


@pytest.mark.parametrize(("s", "w"), [(4, 0), (5, 2), (6, 5)], ids=["S4W0", "S5W2", "S6W5"])
def test_string_relative_positions(s: int, w: int) -> None:
    q_pos, k_pos = np.arange(2, 12), np.arange(12)
    qp, kp = ref.string_positions(q_pos, k_pos, s, w)
    d = (q_pos[:, None] - k_pos[None, :]).astype(np.float64)
    want = np.where(d < s, d, d - s + w)
    assert_array_equal(qp - kp, want)
    assert_array_equal(kp, np.broadcast_to(k_pos[None, :], d.shape).astype(np.float64))


@pytest.mark.parametrize(("sq", "sk"), [(6, 6), (2, 7)], ids=["prefill", "decode"])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_kept_positions_are_plain_rope_attention(sq: int, sk: int, layout: str) -> None:
    q, k, v = _qkv(sq, sk)
    inv_freq, _ = ref.rope_frequencies(D)
    qp, kp = _grid(sq, sk)
    got = ref.remapped_attention_reference(q, k, v, inv_freq, qp, kp, layout=layout, scale=0.3)
    q_pos, k_pos = np.arange(sk - sq, sk), np.arange(sk)
    qr, kr = ref.rotary_qk(q, k, q_pos, k_pos, inv_freq, layout=layout)
    want = ref.attention(qr, kr, v, causal=True, scale=0.3)
    assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_attention_factor_keep_and_softcap() -> None:
    q, k, v = _qkv(5, 5, seed=1)
    inv_freq, _ = ref.rope_frequencies(D)
    qp, kp = _grid(5, 5)
    keep = np.random.default_rng(2).random((B, 1, 5, 5)) > 0.3
    got = ref.remapped_attention_reference(
        q, k, v, inv_freq, qp, kp, attention_factor=1.5, softcap=2.0, keep=keep
    )
    pos = np.arange(5)
    qr, kr = ref.rotary_qk(q, k, pos, pos, inv_freq, attention_scale=1.5)
    kr, vr = np.repeat(kr, H // HK, axis=1), np.repeat(v, H // HK, axis=1)
    logits = 2.0 * np.tanh(qr @ kr.swapaxes(-1, -2) / np.sqrt(D) / 2.0)
    zeros = np.zeros((B, H, 5, 1))  # the logits all in the bias
    want = ref.attention(zeros, zeros, vr, bias=logits, causal=True, mask=keep)
    assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_a_query_seeing_no_key_gives_zeros() -> None:
    q, k, v = _qkv(3, 4)
    inv_freq, _ = ref.rope_frequencies(D)
    qp, kp = ref.string_positions([0, 1, 2], [1, 2, 3, 4], 2, 1)
    out = ref.remapped_attention_reference(
        q, k, v, inv_freq, qp, kp, q_positions=[0, 1, 2], k_positions=[1, 2, 3, 4]
    )
    assert_array_equal(out[:, :, 0], 0.0)
    assert np.all(np.abs(out[:, :, 1:]).sum(axis=-1) > 0)
