"""Precision at long positions (2^20 .. 2^24): cos/sin within 1e-6 of float64, in every dtype."""

import numpy as np
import pytest
import torch

import posenc
from posenc import RotaryEmbedding
from posenc import reference as ref

from ._reference import reference_rotation

BASES = (1e4, 5e5, 1e6)
LONG = torch.tensor([2**20, 2**20 + 1, 3 * 2**21 + 7, 2**23 - 1, 2**24 - 1, 2**24])


def _long_positions(batch=None):
    gen = torch.Generator().manual_seed(1)
    extra = torch.randint(2**20, 2**24 + 1, (58,), generator=gen)
    p = torch.cat([LONG, extra])  # [64]
    return p if batch is None else torch.stack([p, p.flip(0)])[:batch]


def _reference_cos_sin(positions, dim, base, scaling=None):
    inv_freq, scale = ref.rope_frequencies(dim, base=base, scaling=scaling)
    angles = ref.rotary_angles(positions.numpy(), inv_freq)  # float64 product: error ~2e-9
    return torch.from_numpy(scale * np.cos(angles)), torch.from_numpy(scale * np.sin(angles))


@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("base", BASES, ids=lambda b: f"base{b:g}")
def test_cos_sin_within_1e6_at_long_positions(base, dim):
    positions = _long_positions()
    inv_freq, _ = posenc.rope_frequencies(dim, base=base)
    cos, sin = posenc.rotary_cos_sin(positions, inv_freq)
    assert cos.dtype == torch.float32
    want_cos, want_sin = _reference_cos_sin(positions, dim, base)
    torch.testing.assert_close(cos.double(), want_cos, atol=1e-6, rtol=0)
    torch.testing.assert_close(sin.double(), want_sin, atol=1e-6, rtol=0)


def test_float32_product_fails_there():
    """The test above has teeth: the usual float32 `positions * inv_freq` is far off."""
    positions = _long_positions()
    inv_freq, _ = posenc.rope_frequencies(128, base=1e6)
    naive = torch.cos(positions.float()[:, None] * inv_freq.float())
    want, _ = _reference_cos_sin(positions, 128, 1e6)
    assert (naive.double() - want).abs().max() > 1e-2


def test_float_positions_are_exact():
    positions = torch.tensor([2**24 - 0.5, 2**23 + 0.25, 2**20 + 0.125], dtype=torch.float64)
    inv_freq, _ = posenc.rope_frequencies(64, base=5e5)
    cos, sin = posenc.rotary_cos_sin(positions, inv_freq)
    want_cos, want_sin = _reference_cos_sin(positions, 64, 5e5)
    torch.testing.assert_close(cos.double(), want_cos, atol=1e-6, rtol=0)
    torch.testing.assert_close(sin.double(), want_sin, atol=1e-6, rtol=0)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("base", BASES, ids=lambda b: f"base{b:g}")
def test_module_output_at_long_positions(base, layout):
    rope = RotaryEmbedding(64, base=base, layout=layout)
    positions = _long_positions(batch=2)  # [2, 64]
    q = torch.randn(2, 2, 64, 64)
    k = torch.randn(2, 1, 64, 64)
    q_out, k_out = rope(q, k, positions)
    inv_freq, _ = ref.rope_frequencies(64, base=base)
    eq, ek = reference_rotation(q, k, positions, positions, inv_freq, layout=layout)
    # x * cos - y * sin with |x|, |y| <~ 4: 1e-6 on cos/sin plus float32 rounding of the result
    torch.testing.assert_close(q_out.double(), eq, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(k_out.double(), ek, atol=1e-5, rtol=1e-6)
    cos, sin = rope.cos_sin(positions)
    want_cos, want_sin = _reference_cos_sin(positions, 64, base)
    torch.testing.assert_close(cos.double(), want_cos, atol=1e-6, rtol=0)
    torch.testing.assert_close(sin.double(), want_sin, atol=1e-6, rtol=0)


def test_yarn_cos_sin_at_long_positions():
    scaling = {"type": "yarn", "factor": 16.0, "original_max_position": 2**20}
    rope = RotaryEmbedding(128, base=1e6, scaling=scaling)
    positions = _long_positions()
    cos, sin = rope.cos_sin(positions)
    want_cos, want_sin = _reference_cos_sin(positions, 128, 1e6, scaling)
    torch.testing.assert_close(cos.double(), want_cos, atol=1e-6 * rope.attention_scale, rtol=0)
    torch.testing.assert_close(sin.double(), want_sin, atol=1e-6 * rope.attention_scale, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_precision_input_float32_math_rounded_once(dtype):
    """bf16/fp16 q and k: cos/sin and the rotation in float32, the result rounded once."""
    rope = RotaryEmbedding(64, base=5e5).to(dtype)  # .to(dtype) must not lower anything
    positions = _long_positions()
    q, k = torch.randn(1, 2, 64, 64).to(dtype), torch.randn(1, 2, 64, 64).to(dtype)
    q_out, k_out = rope(q, k, positions)
    assert q_out.dtype == dtype
    q32, k32 = rope(q.float(), k.float(), positions)
    torch.testing.assert_close(q_out, q32.to(dtype), atol=0, rtol=0)
    torch.testing.assert_close(k_out, k32.to(dtype), atol=0, rtol=0)
    inv_freq, _ = ref.rope_frequencies(64, base=5e5)
    eq, _ = ref.rotary_qk(
        q.double().numpy(), k.double().numpy(), positions.numpy(), positions.numpy(), inv_freq
    )
    # within one rounding of the float64 result: half an ulp of the output dtype (plus slack)
    ulp = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-10
    torch.testing.assert_close(q_out.double(), torch.from_numpy(eq), atol=1e-5, rtol=ulp)


def test_to_bfloat16_keeps_frequencies():
    rope = RotaryEmbedding(128, base=1e6)
    positions = _long_positions()
    q = torch.randn(1, 1, 64, 128)
    before = rope(q, q, positions)
    rope = rope.to(torch.bfloat16)
    assert rope.inv_freq.dtype == torch.float64
    after = rope(q, q, positions)
    torch.testing.assert_close(after[0], before[0], atol=0, rtol=0)
