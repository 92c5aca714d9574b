"""xPos keys stay finite over the documented range and are refused beyond it (issue 13)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import posenc
from posenc import reference as ref
from posenc.rotary.xpos import xpos_max_position, xpos_scale


def test_documented_range():
    assert xpos_max_position(512.0) == 512.0 * 66
    assert xpos_max_position(512.0, torch.float64) == 512.0 * 562
    assert xpos_max_position(512.0, torch.bfloat16) == 512.0 * 66
    assert xpos_max_position(512.0, torch.float16) == 512.0 * 4
    assert xpos_max_position(64.0) == 64.0 * 66


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: xpos_scale(torch.arange(3), 8, -1.0), "scale_base must be > 0.0, got -1.0"),
        (lambda: xpos_max_position(-64.0), "scale_base must be > 0.0, got -64.0"),
        (lambda: xpos_max_position(64.0, torch.int64), "dtype must be a floating-point dtype"),
        (lambda: xpos_max_position(64.0, "float16"), "dtype must be a torch.dtype"),
    ],
    ids=["scale-negative", "max-negative", "max-int-dtype", "max-str-dtype"],
)
def test_negative_scale_base_and_bad_dtype_are_refused(call, match):
    """xpos_scale(scale_base=-1) was silently the key's scale; keys take -positions."""
    with pytest.raises(posenc.PosEncError, match=match):
        call()


def test_the_key_scale_is_the_scale_at_minus_n():
    p = torch.arange(-3, 4)
    want = ref.xpos_scale((-p).numpy(), 8, 64.0)
    np.testing.assert_allclose(xpos_scale(-p, 8, 64.0).numpy(), want, rtol=1e-15, atol=0)
    np.testing.assert_allclose(want, 1.0 / ref.xpos_scale(p.numpy(), 8, 64.0), rtol=1e-12)


HALF = [torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_half_keys_are_finite_and_exact_up_to_their_limit(dtype):
    """float16 keys were inf from n ~ 5300 (the check was float32's, 33 792)."""
    edge = int(xpos_max_position(512.0, dtype))
    xpos = posenc.XPosEmbedding(16)
    q, k = torch.randn(1, 2, 3, 16), torch.randn(1, 2, 3, 16)
    pos = torch.tensor([edge - 2, edge - 1, edge])
    q_out, k_out = xpos(q.to(dtype), k.to(dtype), pos, k_positions=-pos)
    inv_freq, _ = ref.rope_frequencies(16)
    eq, ek = ref.rotary_qk(
        q.to(dtype).double().numpy(),
        k.to(dtype).double().numpy(),
        pos.numpy(),
        (-pos).numpy(),
        inv_freq,
        xpos_scale_base=512.0,
    )
    rtol = {torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
    for got, want in ((q_out, eq), (k_out, ek)):
        assert bool(torch.isfinite(got).all())
        np.testing.assert_allclose(got.double().numpy(), want, rtol=rtol, atol=rtol * 1e-2)


def test_float16_beyond_its_limit_is_refused_in_every_path():
    """XPosEmbedding(64)(q.half(), q.half(), tensor([8000]))[1] was all inf."""
    xpos = posenc.XPosEmbedding(64)
    q = torch.randn(1, 1, 1, 64).half()
    with pytest.raises(posenc.PosEncError, match=r"q_positions must be within \+-2048 .*float16"):
        xpos(q, q, torch.tensor([8000]))
    with pytest.raises(posenc.PosEncError, match=r"k_positions must be within \+-2048 .*float16"):
        xpos(q, q, torch.tensor([0]), k_positions=torch.tensor([-3000]))
    with pytest.raises(posenc.PosEncError, match=r"q_positions must be within \+-2048 .*float16"):
        xpos(q, q.float(), torch.tensor([2049]))  # the narrower of q and k
    rot = xpos.rotation(1, q_positions=torch.tensor([2100]))  # float32 cos/sin: fine
    with pytest.raises(posenc.PosEncError, match=r"within \+-2048 .*about 2100"):
        xpos.rotate(q, q, rot)
    v = torch.randn(1, 1, 3, 64).half()
    with pytest.raises(posenc.PosEncError, match=r"within \+-2048 .*float16"):
        posenc.attention(v, v, v, encoding=xpos, q_positions=torch.arange(3) + 4000)
    model = posenc.models.TinyTransformer(11, dim=16, num_heads=2, encoding="xpos").half()
    with pytest.raises(posenc.PosEncError, match=r"within \+-2048 .*float16"):
        model(torch.zeros(1, 2, dtype=torch.long), torch.tensor([0, 9000]))


@pytest.mark.parametrize(
    "scaling", [None, {"type": "yarn", "factor": 4.0, "original_max_position": 64}]
)
def test_rotate_reads_the_positions_back_from_the_rotation(scaling):
    """The rotation's scales (YaRN's attention factor divided out) give the positions:
    accepted up to the float16 limit, refused past it, as forward decides."""
    xpos = posenc.XPosEmbedding(16, scaling=scaling)
    q = torch.randn(1, 1, 2, 16).half()
    inside = torch.tensor([2048, -2048])
    got = xpos.rotate(q, q, xpos.rotation(2, q_positions=inside))
    want = xpos(q, q, inside)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    with pytest.raises(posenc.PosEncError, match="k_positions must be within"):
        xpos.rotate(q, q, xpos.rotation(2, q_positions=inside, k_positions=inside + 2))


def test_forty_thousand_positions_are_refused_not_inf():
    q = torch.randn(1, 1, 1, 64)
    xpos = posenc.XPosEmbedding(64)
    with pytest.raises(posenc.PosEncError, match=r"q_positions must be within \+-33792"):
        xpos(q, q, torch.tensor([40000]))
    with pytest.raises(posenc.PosEncError, match=r"k_positions must be within \+-33792"):
        xpos(q, q, torch.tensor([0]), k_positions=torch.tensor([-40000]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_keys_finite_and_exact_up_to_the_limit(dtype):
    scale_base = 512.0
    edge = int(xpos_max_position(scale_base, torch.float32))
    xpos = posenc.XPosEmbedding(16, scale_base=scale_base)
    q, k = torch.randn(1, 2, 3, 16).to(dtype), torch.randn(1, 2, 3, 16).to(dtype)
    pos = torch.tensor([edge - 2, edge - 1, edge])
    q_out, k_out = xpos(q, k, pos, k_positions=-pos)
    assert bool(torch.isfinite(q_out).all()) and bool(torch.isfinite(k_out).all())
    inv_freq, _ = ref.rope_frequencies(16)
    eq, ek = ref.rotary_qk(
        q.double().numpy(),
        k.double().numpy(),
        pos.numpy(),
        (-pos).numpy(),
        inv_freq,
        xpos_scale_base=scale_base,
    )
    # float32: cos/sin rounded to float32, and a rotated pair may cancel: a few 1e-5 relative
    rtol = 1e-9 if dtype == torch.float64 else 5e-4
    np.testing.assert_allclose(q_out.double().numpy(), eq, rtol=rtol, atol=0)
    np.testing.assert_allclose(k_out.double().numpy(), ek, rtol=rtol, atol=0)


def test_float64_allows_a_longer_range():
    xpos = posenc.XPosEmbedding(8)
    q = torch.randn(1, 1, 1, 8, dtype=torch.float64)
    q_out, k_out = xpos(q, q, torch.tensor([100_000]))
    assert bool(torch.isfinite(q_out).all()) and bool(torch.isfinite(k_out).all())


def test_xpos_scale_validates_its_arguments():
    p = torch.arange(3)
    with pytest.raises(posenc.PosEncError, match=r"positions must be a torch\.Tensor"):
        xpos_scale([0, 1], 8, 512.0)
    with pytest.raises(posenc.PosEncError, match="rotary_dim must be even"):
        xpos_scale(p, 7, 512.0)
    with pytest.raises(posenc.PosEncError, match=r"scale_base must be > 0\.0, got 0\.0"):
        xpos_scale(p, 8, 0.0)
    with pytest.raises(posenc.PosEncError, match="scale_base must be finite"):
        xpos_scale(p, 8, float("nan"))
    with pytest.raises(posenc.PosEncError, match="positions must be within"):
        xpos_scale(torch.tensor([2**62]), 8, 512.0)


def test_scale_base_none_is_refused():
    with pytest.raises(posenc.PosEncError, match="scale_base must be a number, got None"):
        posenc.XPosEmbedding(8, scale_base=None)


# --- other rotary reproducers of issue 13 (files beside xPos: nd, scalings, frequencies) ---


@pytest.mark.parametrize(
    "module",
    [
        lambda: posenc.RotaryEmbedding(8, sections=(2, 1, 1)),
        lambda: posenc.AxialRotaryEmbedding(8),
    ],
    ids=["mrope", "axial"],
)
def test_nd_cos_sin_of_a_0d_tensor(module):
    with pytest.raises(posenc.PosEncError, match=r"positions must be \[\*P, \d\]"):
        module().cos_sin(torch.tensor(3))


def test_nd_cos_sin_equals_the_reference():
    axial = posenc.AxialRotaryEmbedding(8, 2)
    pos = posenc.positions.grid((2, 3)).reshape(-1, 2)
    cos, sin = axial.cos_sin(pos, dtype=torch.float64)
    inv = ref.axial_frequencies((4, 4))
    angles = np.concatenate([pos[:, :1].numpy() * inv[:2], pos[:, 1:].numpy() * inv[2:]], axis=-1)
    np.testing.assert_allclose(cos.numpy(), np.cos(angles), rtol=0, atol=1e-15)
    np.testing.assert_allclose(sin.numpy(), np.sin(angles), rtol=0, atol=1e-15)


def test_yarn_without_original_max_position():
    with pytest.raises(
        posenc.PosEncError,
        match=r"yarn scaling is missing required field\(s\) original_max_position;",
    ):
        posenc.rotary.YarnScaling(factor=2)
    with pytest.raises(
        posenc.PosEncError, match="original_max_position must be an integer, got None"
    ):
        posenc.rotary.YarnScaling(factor=2, original_max_position=None)


def test_rope_frequencies_seq_len_must_be_a_number():
    scaling = {"type": "dynamic", "factor": 2.0, "max_position": 16}
    with pytest.raises(posenc.PosEncError, match="seq_len must be a number"):
        posenc.rope_frequencies(8, scaling=scaling, seq_len=True)
    with pytest.raises(posenc.PosEncError, match="seq_len must be <="):
        posenc.rope_frequencies(8, scaling=scaling, seq_len=1e300)


def test_scaling_factor_bounded():
    with pytest.raises(posenc.PosEncError, match=r"linear scaling factor must be <= 1000000\.0"):
        posenc.rotary.LinearScaling(factor=1e300)
