"""apply_rotary and rotary_cos_sin against the float64 reference and rotary-embedding-torch."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rotary_embedding_torch import RotaryEmbedding as PeerRotary

import posenc
from posenc import PosEncError
from posenc import reference as ref
from posenc.rotary.kernels.plain import apply_rotary_torch
from posenc.rotary.layout import LAYOUTS
from posenc.rotary.xpos import xpos_scale

DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
HEAD_DIM = 16
TOL = {
    torch.float64: {"atol": 1e-12, "rtol": 1e-12},
    torch.float32: {"atol": 1e-6, "rtol": 1e-6},
    torch.bfloat16: {"atol": 2e-2, "rtol": 1e-2},
    torch.float16: {"atol": 4e-3, "rtol": 2e-3},
}


def _inputs(rotary_dim, *, batched_positions=False, b=2, h=3, s=7):
    x = torch.randn(b, h, s, HEAD_DIM, dtype=torch.float64)
    shape = (b, s) if batched_positions else (s,)
    positions = torch.randint(0, 5000, shape)
    inv_freq, _ = posenc.rope_frequencies(rotary_dim)
    return x, positions, inv_freq


def _expected(x, positions, inv_freq, layout, scale=1.0):
    angles = ref.rotary_angles(positions.numpy(), inv_freq.numpy())
    m = np.full(angles.shape, scale)
    return torch.from_numpy(ref.apply_rotary(x.double().numpy(), angles, layout=layout, scale=m))


@pytest.mark.parametrize("rotary_dim", [HEAD_DIM, 8, 2], ids=lambda r: f"r{r}")
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_apply_rotary_matches_reference(dtype, layout, rotary_dim):
    x64, positions, inv_freq = _inputs(rotary_dim)
    x = x64.to(dtype)
    cos_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    cos, sin = posenc.rotary_cos_sin(positions, inv_freq, dtype=cos_dtype)
    out = posenc.apply_rotary(x, cos, sin, layout=layout, rotary_dim=rotary_dim)
    assert out.dtype == dtype and out.shape == x.shape
    expected = _expected(x, positions, inv_freq, layout)  # from the (rounded) input, in float64
    torch.testing.assert_close(out.double(), expected, **TOL[dtype])
    torch.testing.assert_close(out[..., rotary_dim:], x[..., rotary_dim:], atol=0, rtol=0)
    if dtype in (torch.bfloat16, torch.float16):  # float32 math, rounded once to the input dtype
        once = posenc.apply_rotary(x.float(), cos, sin, layout=layout).to(dtype)
        torch.testing.assert_close(out, once, atol=0, rtol=0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_batched_cos_sin_and_attention_scale(layout):
    x, positions, inv_freq = _inputs(HEAD_DIM, batched_positions=True)
    cos, sin = posenc.rotary_cos_sin(positions, inv_freq, attention_scale=1.25, dtype=torch.float64)
    assert cos.shape == (2, 7, HEAD_DIM // 2)
    out = posenc.apply_rotary(x, cos, sin, layout=layout)
    torch.testing.assert_close(out, _expected(x, positions, inv_freq, layout, scale=1.25))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_seq_dim_minus_3_equals_transposed(layout):
    x, positions, inv_freq = _inputs(8, batched_positions=True)
    cos, sin = posenc.rotary_cos_sin(positions, inv_freq, dtype=torch.float64)
    x_bshd = x.transpose(1, 2)  # a strided view [b, s, h, d], not a copy
    out = posenc.apply_rotary(x_bshd, cos, sin, layout=layout, seq_dim=-3)
    expected = posenc.apply_rotary(x, cos, sin, layout=layout).transpose(1, 2)
    torch.testing.assert_close(out, expected, atol=0, rtol=0)


def test_cos_sin_matches_reference():
    positions = torch.tensor([[0, 3, 7], [100, -5, 2**20]])
    inv_freq, _ = posenc.rope_frequencies(12, base=500000.0)
    cos, sin = posenc.rotary_cos_sin(positions, inv_freq, attention_scale=0.5, dtype=torch.float64)
    angles = torch.from_numpy(ref.rotary_angles(positions.numpy(), inv_freq.numpy()))
    torch.testing.assert_close(cos, 0.5 * torch.cos(angles), atol=1e-9, rtol=0)
    torch.testing.assert_close(sin, 0.5 * torch.sin(angles), atol=1e-9, rtol=0)
    cos32, _ = posenc.rotary_cos_sin(positions, inv_freq)
    assert cos32.dtype == torch.float32


def test_sectioned_cos_sin_matches_reference():
    positions = torch.randint(0, 50, (2, 5, 3))  # [b, s, n_axes]
    inv_freq, _ = posenc.rope_frequencies(24)
    cos, sin = posenc.rotary_cos_sin(positions, inv_freq, sections=(2, 6, 4), dtype=torch.float64)
    angles = ref.sectioned_angles(positions.numpy(), inv_freq.numpy(), (2, 6, 4))
    torch.testing.assert_close(cos, torch.from_numpy(np.cos(angles)), atol=1e-12, rtol=0)
    torch.testing.assert_close(sin, torch.from_numpy(np.sin(angles)), atol=1e-12, rtol=0)


def test_xpos_scale_matches_reference():
    positions = torch.tensor([-3, 0, 5, 1000])
    got = xpos_scale(positions, 8, 512.0)
    torch.testing.assert_close(got, torch.from_numpy(ref.xpos_scale(positions.numpy(), 8, 512.0)))


@pytest.mark.parametrize("rotary_dim", [HEAD_DIM, 8], ids=lambda r: f"r{r}")
@pytest.mark.parametrize("seq_dim", [-2, -3])
def test_interleaved_matches_rotary_embedding_torch(rotary_dim, seq_dim):
    """rotary-embedding-torch pairs (2i, 2i + 1) and rotates the first `dim` channels."""
    inv_freq, _ = posenc.rope_frequencies(rotary_dim)
    peer = PeerRotary(
        rotary_dim,
        custom_freqs=inv_freq.clone(),
        cache_if_possible=False,
        seq_before_head_dim=seq_dim == -3,
    )
    x = torch.randn(2, 3, 9, HEAD_DIM, dtype=torch.float64)
    if seq_dim == -3:
        x = x.transpose(1, 2)
    cos, sin = posenc.rotary_cos_sin(torch.arange(9), inv_freq, dtype=torch.float64)
    out = posenc.apply_rotary(x, cos, sin, layout="interleaved", seq_dim=seq_dim)
    torch.testing.assert_close(out, peer.rotate_queries_or_keys(x), atol=1e-12, rtol=0)


def test_interleaved_matches_rotary_embedding_torch_default_frequencies_float32():
    peer = PeerRotary(HEAD_DIM)  # its own float32 frequencies
    inv_freq, _ = posenc.rope_frequencies(HEAD_DIM)
    torch.testing.assert_close(peer.freqs.detach(), inv_freq.float(), atol=0, rtol=3e-7)
    x = torch.randn(1, 2, 12, HEAD_DIM)
    cos, sin = posenc.rotary_cos_sin(torch.arange(12), inv_freq)
    out = posenc.apply_rotary(x, cos, sin, layout="interleaved")
    # the peer forms angles in float32 from float32 frequencies: agreement to ~1e-6
    torch.testing.assert_close(out, peer.rotate_queries_or_keys(x), atol=1e-5, rtol=1e-5)


def test_torch_twin_equals_public_function():
    x, positions, inv_freq = _inputs(8)
    cos, sin = posenc.rotary_cos_sin(positions, inv_freq)
    for layout in LAYOUTS:
        torch.testing.assert_close(
            apply_rotary_torch(x.float(), cos, sin, layout=layout),
            posenc.apply_rotary(x.float(), cos, sin, layout=layout, rotary_dim=8),
            atol=0,
            rtol=0,
        )


@settings(max_examples=25)
@given(
    layout=st.sampled_from(LAYOUTS),
    half=st.integers(1, 8),
    seed=st.integers(0, 2**16),
    scale=st.floats(-1e5, 1e5),
)
def test_rotation_keeps_norms(layout, half, seed, scale):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 2, 4, 2 * half, generator=gen, dtype=torch.float64)
    angles = torch.rand(4, half, generator=gen, dtype=torch.float64) * scale
    out = posenc.apply_rotary(x, torch.cos(angles), torch.sin(angles), layout=layout)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), atol=1e-12, rtol=1e-12)


@settings(max_examples=25)
@given(
    layout=st.sampled_from(LAYOUTS),
    m=st.integers(-(2**20), 2**20),
    n=st.integers(-(2**20), 2**20),
    shift=st.integers(-(2**20), 2**20),
    seed=st.integers(0, 2**16),
)
def test_score_depends_only_on_offset(layout, m, n, shift, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 1, 1, 1, HEAD_DIM, generator=gen, dtype=torch.float64)
    inv_freq, _ = posenc.rope_frequencies(HEAD_DIM)

    def score(a, b):
        cq, sq = posenc.rotary_cos_sin(torch.tensor([a]), inv_freq, dtype=torch.float64)
        ck, sk = posenc.rotary_cos_sin(torch.tensor([b]), inv_freq, dtype=torch.float64)
        return (
            posenc.apply_rotary(q, cq, sq, layout=layout)
            * posenc.apply_rotary(k, ck, sk, layout=layout)
        ).sum()

    torch.testing.assert_close(score(m + shift, n + shift), score(m, n), atol=1e-9, rtol=1e-9)


def _bad_apply(**change):
    args = {"x": torch.randn(1, 2, 3, 8), "cos": torch.ones(3, 4), "sin": torch.zeros(3, 4)}
    kwargs = {k: change.pop(k) for k in list(change) if k not in args}
    args.update(change)
    return lambda: posenc.apply_rotary(args["x"], args["cos"], args["sin"], **kwargs)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (_bad_apply(layout="neox"), r"layout must be one of 'half', 'interleaved', got 'neox'"),
        (_bad_apply(seq_dim=1), r"seq_dim must be one of -2, -3, got 1"),
        (_bad_apply(x=torch.randn(2, 3, 8)), r"x must be \[b, h, s, d\].*got shape \(2, 3, 8\)"),
        (_bad_apply(x=torch.ones(1, 2, 3, 8, dtype=torch.long)), "x must have a floating-point"),
        (_bad_apply(x=[1.0]), "x must be a torch.Tensor, got list"),
        (_bad_apply(cos=torch.ones(4, 4), sin=torch.ones(4, 4)), r"s == 3.*got shape \(4, 4\)"),
        (_bad_apply(sin=torch.ones(3, 2)), r"cos and sin must have the same shape"),
        (_bad_apply(cos=torch.ones(2, 3, 4), sin=torch.ones(2, 3, 4)), r"b == 1 .* or 1"),
        (_bad_apply(rotary_dim=5), r"rotary_dim must equal 2 \* cos.shape\[-1\] = 8, got 5"),
        (
            _bad_apply(cos=torch.ones(3, 6), sin=torch.ones(3, 6)),
            r"rotary_dim must be <= .* 8, got 12",
        ),
        (
            lambda: posenc.rotary_cos_sin(torch.tensor([0.0, float("nan")]), torch.ones(2)),
            "positions must be finite",
        ),
        (
            lambda: posenc.rotary_cos_sin(torch.tensor([True]), torch.ones(2)),
            "positions must be an integer or floating tensor",
        ),
        (lambda: posenc.rotary_cos_sin(torch.arange(3), torch.ones(2, 2)), "inv_freq must be 1-D"),
        (
            lambda: posenc.rotary_cos_sin(torch.arange(3), torch.tensor([1.0, float("nan")])),
            "inv_freq must be finite",
        ),
        (
            lambda: posenc.rotary_cos_sin(torch.arange(3), torch.ones(2), dtype=torch.int32),
            "dtype must be a floating-point dtype, got torch.int32",
        ),
        (
            lambda: posenc.rotary_cos_sin(torch.zeros(3, 2), torch.ones(4), sections=(1, 2)),
            r"sections must sum to rotary_dim / 2 = 4, got \[1, 2\]",
        ),
        (
            lambda: posenc.rotary_cos_sin(torch.zeros(3, 3), torch.ones(4), sections=(2, 2)),
            r"positions must be \[..., s, 2\]",
        ),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(PosEncError, match=match):
        call()
