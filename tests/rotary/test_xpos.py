"""xPos: the float64 reference, offset-only scores, and rotary-embedding-torch's use_xpos."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rotary_embedding_torch import RotaryEmbedding as PeerRotary

import posenc
from posenc import PosEncError, RotaryEmbedding, XPosEmbedding
from posenc import reference as ref
from posenc.rotary.layout import LAYOUTS
from posenc.rotary.xpos import xpos_scale

from ._reference import reference_rotation


@pytest.mark.parametrize("rotary_dim", [None, 8], ids=lambda r: f"r{r}")
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_xpos_matches_reference(dtype, layout, rotary_dim):
    xpos = XPosEmbedding(16, scale_base=64.0, rotary_dim=rotary_dim, layout=layout)
    q, k = torch.randn(2, 2, 5, 16).to(dtype), torch.randn(2, 1, 7, 16).to(dtype)
    q_pos, k_pos = torch.randint(0, 300, (2, 5)), torch.randint(0, 300, (7,))
    q_out, k_out = xpos(q, k, q_pos, k_positions=k_pos)
    inv_freq, _ = ref.rope_frequencies(xpos.rotary_dim)
    eq, ek = reference_rotation(q, k, q_pos, k_pos, inv_freq, layout=layout, xpos_scale_base=64.0)
    tol = {"atol": 1e-10, "rtol": 1e-10} if dtype == torch.float64 else {"atol": 1e-5, "rtol": 2e-6}
    torch.testing.assert_close(q_out.double(), eq, **tol)
    torch.testing.assert_close(k_out.double(), ek, **tol)


def _zeta(rotary_dim):
    i = torch.arange(rotary_dim // 2, dtype=torch.float64)
    return (2 * i + 0.4 * rotary_dim) / (1.4 * rotary_dim)


def _peer(rotary_dim, scale_base, inv_freq, seq_dim=-2):
    """The peer in float64: our float64 frequencies, and its zeta (computed in float32 at
    construction) recomputed in float64, so only the formulas are compared."""
    peer = PeerRotary(
        rotary_dim,
        custom_freqs=inv_freq.clone(),
        use_xpos=True,
        xpos_scale_base=scale_base,
        cache_if_possible=False,
        seq_before_head_dim=seq_dim == -3,
    ).double()
    torch.testing.assert_close(peer.scale, _zeta(rotary_dim), atol=0, rtol=1e-7)
    peer.scale.copy_(_zeta(rotary_dim))
    return peer


@pytest.mark.parametrize("seq_dim", [-2, -3])
@pytest.mark.parametrize(("head_dim", "rotary_dim", "s"), [(16, 16, 9), (16, 8, 12)])
def test_xpos_matches_rotary_embedding_torch(head_dim, rotary_dim, s, seq_dim):
    """rotary-embedding-torch scales by centred positions n - s // 2: the scores are equal, and
    q / k differ by zeta^(+-(s // 2) / scale_base) on the rotated channels."""
    scale_base = 32.0
    xpos = XPosEmbedding(
        head_dim, scale_base=scale_base, rotary_dim=rotary_dim, layout="interleaved"
    )
    peer = _peer(rotary_dim, scale_base, xpos.inv_freq, seq_dim)
    q = torch.randn(2, 3, s, head_dim, dtype=torch.float64)
    k = torch.randn(2, 3, s, head_dim, dtype=torch.float64)
    if seq_dim == -3:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    q_out, k_out = xpos(q, k, seq_dim=seq_dim)
    q_peer, k_peer = peer.rotate_queries_and_keys(q, k, seq_dim=seq_dim)
    if seq_dim == -3:
        q_out, k_out, q_peer, k_peer = (t.transpose(1, 2) for t in (q_out, k_out, q_peer, k_peer))
    scores = q_out @ k_out.transpose(-1, -2)  # [b, h, s, s]
    torch.testing.assert_close(scores, q_peer @ k_peer.transpose(-1, -2), atol=1e-9, rtol=1e-9)
    # the individual tensors: a constant factor per frequency pair (interleaved: repeated twice)
    factor = (_zeta(rotary_dim) ** ((s // 2) / scale_base)).repeat_interleave(2)
    factor = torch.cat([factor, torch.ones(head_dim - rotary_dim, dtype=torch.float64)])
    torch.testing.assert_close(q_out, q_peer * factor, atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(k_out, k_peer / factor, atol=1e-9, rtol=1e-9)
    # shifting our positions by -(s // 2) gives the same scores again (offsets are unchanged)
    q_c, k_c = xpos(q, k, torch.arange(s) - s // 2, seq_dim=seq_dim)
    if seq_dim == -3:
        q_c, k_c = q_c.transpose(1, 2), k_c.transpose(1, 2)
    torch.testing.assert_close(q_c @ k_c.transpose(-1, -2), scores, atol=1e-9, rtol=1e-9)


def test_xpos_matches_rotary_embedding_torch_float32():
    xpos = XPosEmbedding(16, scale_base=512.0, layout="interleaved")
    peer = PeerRotary(16, use_xpos=True, xpos_scale_base=512)  # its own float32 numbers
    q, k = torch.randn(1, 2, 20, 16), torch.randn(1, 2, 20, 16)
    q_out, k_out = xpos(q, k)
    q_peer, k_peer = peer.rotate_queries_and_keys(q, k)
    torch.testing.assert_close(
        q_out @ k_out.transpose(-1, -2), q_peer @ k_peer.transpose(-1, -2), atol=1e-4, rtol=1e-5
    )


def test_xpos_is_rope_times_zeta_rounded_once():
    """XPosEmbedding's cos/sin: RoPE's in float64 times xpos_scale(+-n), one rounding."""
    xpos = XPosEmbedding(8, scale_base=100.0)
    q_pos, k_pos = torch.arange(5) + 3, torch.arange(7)
    rot = xpos.rotation(5, 7, q_positions=q_pos, k_positions=k_pos)
    cos_q, sin_q = RotaryEmbedding(8).cos_sin(q_pos, dtype=torch.float64)
    cos_k, sin_k = RotaryEmbedding(8).cos_sin(k_pos, dtype=torch.float64)
    zq, zk = xpos_scale(q_pos, 8, 100.0), xpos_scale(-k_pos, 8, 100.0)
    for got, want in zip(rot, (cos_q * zq, sin_q * zq, cos_k * zk, sin_k * zk)):
        assert torch.equal(got, want.float())
    q = torch.randn(1, 1, 5, 8)
    assert torch.equal(xpos(q, q)[0], xpos.rotate(q, q, xpos.rotation(5))[0])
    built = posenc.build("xpos", head_dim=8)
    assert isinstance(built, XPosEmbedding) and built.scale_base == 512.0
    assert posenc.build(xpos.to_config()).to_config() == xpos.to_config()


@settings(max_examples=25)
@given(
    layout=st.sampled_from(LAYOUTS),
    m=st.integers(0, 2000),
    n=st.integers(0, 2000),
    shift=st.integers(-2000, 2000),
)
def test_score_depends_only_on_offset_and_decays(layout, m, n, shift):
    xpos = XPosEmbedding(16, scale_base=512.0, layout=layout)
    q, k = torch.randn(2, 1, 1, 1, 16, dtype=torch.float64)

    def score(a, b):
        qr, kr = xpos(q, k, torch.tensor([a]), k_positions=torch.tensor([b]))
        return (qr * kr).sum()

    torch.testing.assert_close(score(m + shift, n + shift), score(m, n), atol=1e-9, rtol=1e-9)


def test_decoding_equals_full_pass():
    xpos = XPosEmbedding(8, scale_base=64.0)
    q, k = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    q_full, k_full = xpos(q, k)
    q_one, k_all = xpos(q[:, :, -1:], k)
    torch.testing.assert_close(q_one, q_full[:, :, -1:], atol=0, rtol=0)
    torch.testing.assert_close(k_all, k_full, atol=0, rtol=0)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: XPosEmbedding(8, scale_base=0.0), "scale_base must be > 0.0, got 0.0"),
        (lambda: XPosEmbedding(8, scale_base=float("inf")), "scale_base must be finite"),
        (lambda: XPosEmbedding(9), "head_dim must be even"),
        (lambda: XPosEmbedding(8, rotary_dim=3), "rotary_dim must be even"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(PosEncError, match=match):
        call()
