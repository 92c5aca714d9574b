"""``RotaryEmbedding(direction="negative")`` (rotation by -theta, NanoChat) and
``section_layout="spatial_interleaved"`` (ERNIE 4.5-VL's M-RoPE): whole tensors against the
float64 reference (``posenc.reference``'s rotation of the negated / remapped angles), the
table path against the computed one, the config round trip and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import posenc
from posenc import PosEncError, reference
from posenc.rotary.apply import section_map

TOL = {torch.float32: 2e-6, torch.float64: 1e-12}


def _qk(head_dim: int, s: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(2, 3, s, head_dim, generator=g, dtype=dtype) for _ in range(2))


def _expected(x: torch.Tensor, theta: np.ndarray, layout: str, scale: float = 1.0):
    """The reference's rotation of ``x`` by ``theta`` (cos and sin times ``scale``)."""
    factor = np.full(theta.shape, scale)
    return torch.from_numpy(
        reference.apply_rotary(x.double().numpy(), theta, layout=layout, scale=factor)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("rotary_dim", [16, 8])
@pytest.mark.parametrize(
    "scaling", [None, {"type": "yarn", "factor": 4.0, "original_max_position": 64}]
)
def test_negative_direction_rotates_by_minus_theta(dtype, layout, rotary_dim, scaling) -> None:
    rope = posenc.RotaryEmbedding(
        16, rotary_dim=rotary_dim, layout=layout, scaling=scaling, direction="negative"
    )
    plus = posenc.RotaryEmbedding(16, rotary_dim=rotary_dim, layout=layout, scaling=scaling)
    assert torch.equal(rope.inv_freq, plus.inv_freq) and rope.direction == "negative"
    q, k = _qk(16, 40, dtype)
    pos = torch.arange(1000, 1040)
    theta = -reference.rotary_angles(pos.numpy(), plus.inv_freq.numpy())
    scale = plus.attention_scale
    qr, kr = rope(q, k, pos)
    for ours, x in ((qr, q), (kr, k)):
        want = _expected(x, theta, layout, scale)
        torch.testing.assert_close(ours.double(), want, rtol=0, atol=TOL[dtype] * 8)


def test_negative_direction_is_positive_at_negated_positions() -> None:
    """A rotation by -theta at p is the rotation by +theta at -p."""
    q, k = _qk(8, 6, torch.float64)
    pos = torch.arange(100, 106, dtype=torch.float64)
    minus, plus = (posenc.RotaryEmbedding(8, direction=d) for d in ("negative", "positive"))
    for a, b in zip(minus(q, k, pos), plus(q, k, -pos)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_table_and_computed_paths_agree() -> None:
    """Integer CPU positions (the cos/sin table, the fused path) and float positions (computed)
    rotate alike under direction='negative'."""
    rope = posenc.RotaryEmbedding(32, direction="negative")
    q, k = _qk(32, 50, torch.float32)
    pos = torch.arange(50)
    table = rope(q, k, pos)
    computed = rope(q, k, pos.double())
    for a, b in zip(table, computed):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_direction_config_round_trip_and_refusal() -> None:
    rope = posenc.RotaryEmbedding(8, direction="negative")
    config = rope.to_config()
    assert config["direction"] == "negative"
    assert (
        "direction" not in posenc.RotaryEmbedding(8).to_config()
    )  # the default: unchanged configs
    assert posenc.build(config).direction == "negative"
    with pytest.raises(
        PosEncError, match=r"direction must be one of 'positive', 'negative', got 'up'"
    ):
        posenc.RotaryEmbedding(8, direction="up")


def _spatial_theta(pos: np.ndarray, w: np.ndarray, h: int) -> np.ndarray:
    """ERNIE 4.5-VL's angles as its rotary module forms them (positions [..., 3]: T, H, W):
    its inv_freq pre-rotated (the even frequencies of the first 2h, then the odd), split (h,
    h, t) onto axes H, W, T, the H and W parts stacked in turn."""
    pre = np.concatenate([w[: 2 * h][0::2], w[: 2 * h][1::2], w[2 * h :]])
    hh = pos[..., 1:2] * pre[:h]
    ww = pos[..., 2:3] * pre[h : 2 * h]
    tt = pos[..., 0:1] * pre[2 * h :]
    hw = np.stack([hh, ww], axis=-1).reshape(*hh.shape[:-1], 2 * h)
    return np.concatenate([hw, tt], axis=-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("sections", [(4, 6, 6), (2, 3, 3), (16, 8, 8)])
def test_spatial_interleaved_sections(dtype, sections) -> None:
    h = sections[1]
    head_dim = 2 * sum(sections)
    rope = posenc.RotaryEmbedding(
        head_dim, sections=sections, section_layout="spatial_interleaved", layout="interleaved"
    )
    g = torch.Generator().manual_seed(3)
    pos = torch.randint(0, 5000, (2, 30, 3), generator=g)
    q, k = _qk(head_dim, 30, dtype)
    theta = _spatial_theta(pos.numpy().astype(np.float64), rope.inv_freq.numpy(), h)
    qr, kr = rope(q, k, pos)
    for ours, x in ((qr, q), (kr, k)):
        torch.testing.assert_close(
            ours.double(), _expected(x, theta, "interleaved"), rtol=0, atol=TOL[dtype] * 8
        )


def test_spatial_interleaved_text_positions_are_plain_rope() -> None:
    """Text tokens (t = h = w) rotate as plain RoPE, whatever the section layout."""
    rope = posenc.RotaryEmbedding(16, sections=(2, 3, 3), section_layout="spatial_interleaved")
    plain = posenc.RotaryEmbedding(16)
    q, k = _qk(16, 12, torch.float64)
    pos = torch.arange(12)
    for a, b in zip(rope(q, k, pos[:, None].expand(12, 3)), plain(q, k, pos)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_spatial_interleaved_map() -> None:
    assert section_map((2, 2, 2), "spatial_interleaved", 6).order == (4, 5, 0, 2, 1, 3)


@pytest.mark.parametrize(
    ("sections", "match"),
    [
        ((2, 4, 2), "the axes after the first alike"),
        ((8,), "two or more sections"),
        ((2, 2, 2), "must sum to rotary_dim / 2 = 8"),
    ],
)
def test_spatial_interleaved_refusals(sections, match) -> None:
    with pytest.raises(PosEncError, match=match):
        posenc.RotaryEmbedding(16, sections=sections, section_layout="spatial_interleaved")
