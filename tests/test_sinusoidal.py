"""posenc.sinusoidal against the float64 reference, the widely copied peers, and the maths."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import posenc
from conftest import ATOL
from posenc import reference
from posenc.sinusoidal import LAYOUTS, ORDERS

DIMS = [1, 2, 3, 7, 8, 33, 64]
# layout="flax" spaces its rates over dim // 2 - 1 steps: dim >= 4
DIM_LAYOUTS = [(dim, layout) for layout in LAYOUTS for dim in DIMS if layout != "flax" or dim >= 4]
DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]
POSITIONS = {
    "int": torch.arange(-5, 70),
    "float": torch.tensor([-3.25, -0.5, 0.0, 0.1, 1.0, 2.5, 17.75, 1000.125, 12345.5]),
    "batched": torch.arange(24).reshape(3, 8) * 37 - 100,
}


def _ref(positions: torch.Tensor, dim: int, **options) -> torch.Tensor:
    return torch.from_numpy(reference.sinusoidal_table(positions.double().numpy(), dim, **options))


# --- against the float64 reference -------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize(("dim", "layout"), DIM_LAYOUTS)
@pytest.mark.parametrize("kind", list(POSITIONS))
def test_table_matches_reference(kind, dim, layout, order, dtype):
    pos = POSITIONS[kind]
    out = posenc.sinusoidal_table(pos, dim, layout=layout, order=order, dtype=dtype)
    ref = _ref(pos, dim, layout=layout, order=order)
    assert out.shape == (*pos.shape, dim) and out.dtype == dtype
    # float64: both sides round the angle, by a few ulp of the largest position
    atol = max(ATOL[dtype], 1e-15 * float(pos.abs().max()))
    torch.testing.assert_close(out.double(), ref, atol=atol, rtol=0)
    if dtype != torch.float64:  # computed in float64 and rounded once: ref rounded, exactly
        torch.testing.assert_close(out, ref.to(dtype), atol=0, rtol=0)


@pytest.mark.parametrize("base", [2.0, 100.0, 10000.0, 500000.0])
def test_table_base_matches_reference(base):
    pos = torch.arange(50)
    out = posenc.sinusoidal_table(pos, 16, base=base, dtype=torch.float64)
    torch.testing.assert_close(out, _ref(pos, 16, base=base), atol=1e-12, rtol=0)


def test_table_accepts_sequences_and_default_dtype():
    out = posenc.sinusoidal_table([0, 1.5, 3], 6)
    assert out.dtype == torch.get_default_dtype()
    torch.testing.assert_close(out.double(), _ref(torch.tensor([0, 1.5, 3]), 6), atol=1e-6, rtol=0)


@pytest.mark.parametrize("dim", [2, 8, 9])
def test_half_is_interleaved_with_channels_regrouped(dim):
    pos = torch.arange(-3, 40)
    inter = posenc.sinusoidal_table(pos, dim, dtype=torch.float64)
    half = posenc.sinusoidal_table(pos, dim, layout="half", dtype=torch.float64)
    n_first = (dim + 1) // 2
    regrouped = torch.cat([inter[..., 0::2], inter[..., 1::2]], dim=-1)
    assert torch.equal(half, regrouped)
    assert half.shape[-1] == dim and n_first == inter[..., 0::2].shape[-1]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("grid", [(2, 3), (3, 1, 4), (5,)])
def test_table_nd_matches_reference(grid, layout, dtype):
    dim = 12
    out = posenc.sinusoidal_table_nd(grid, dim, layout=layout, dtype=dtype)
    ref = torch.from_numpy(reference.sinusoidal_table_nd(grid, dim, layout=layout))
    assert out.shape == (*grid, dim)
    torch.testing.assert_close(out.double(), ref, atol=ATOL[dtype], rtol=0)


def test_table_nd_coordinates_and_blocks():
    coords = torch.tensor([[0.5, -2.0], [3.0, 7.25], [100.0, 0.0]])  # [3, 2]
    out = posenc.sinusoidal_table_nd(coords, 8, order="cos_sin", dtype=torch.float64)
    ref = torch.from_numpy(reference.sinusoidal_table_nd(coords.numpy(), 8, order="cos_sin"))
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
    # axis 0 first, each block the 1-D table of dim / n_axes channels
    blocks = [
        posenc.sinusoidal_table(coords[:, a], 4, order="cos_sin", dtype=torch.float64)
        for a in range(2)
    ]
    assert torch.equal(out, torch.cat(blocks, dim=-1))


def test_table_nd_equals_the_mae_2d_formulation():
    """MAE / many ViTs' get_2d_sincos_pos_embed: per axis, D/2 channels laid out [sin | cos]
    with omega = 1 / 10000^(i / (D/4)); the first half encodes the *column* coordinate."""
    h, w, d = 3, 5, 16

    def mae_1d(d_axis, pos):
        omega = 1.0 / 10000 ** (np.arange(d_axis // 2, dtype=np.float64) / (d_axis / 2.0))
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    grid_w, grid_h = np.meshgrid(np.arange(w, dtype=np.float64), np.arange(h, dtype=np.float64))
    peer = np.concatenate([mae_1d(d // 2, grid_w), mae_1d(d // 2, grid_h)], axis=1)  # [h*w, d]
    coords = posenc.positions.grid((h, w)).flip(-1)  # [h, w, 2] as (column, row)
    ours = posenc.sinusoidal_table_nd(coords, d, layout="half", dtype=torch.float64)
    torch.testing.assert_close(ours.reshape(h * w, d), torch.from_numpy(peer), atol=1e-12, rtol=0)


# --- the worked example and the widely copied peers -----------------------------------


def test_worked_example_dim4():
    out = posenc.sinusoidal_table(torch.arange(6), 4, dtype=torch.float64)
    rows = [[math.sin(p), math.cos(p), math.sin(p / 100), math.cos(p / 100)] for p in range(6)]
    torch.testing.assert_close(out, torch.tensor(rows, dtype=torch.float64), atol=1e-15, rtol=0)


def _numpy_tutorial_encoding(position: int, d_model: int) -> np.ndarray:
    """The widely copied NumPy formulation (TensorFlow's transformer tutorial)."""

    def get_angles(pos, i, d_model):
        angle_rates = 1 / np.power(10000, (2 * (i // 2)) / np.float32(d_model))
        return pos * angle_rates

    angle_rads = get_angles(
        np.arange(position)[:, np.newaxis], np.arange(d_model)[np.newaxis, :], d_model
    )
    angle_rads[:, 0::2] = np.sin(angle_rads[:, 0::2])
    angle_rads[:, 1::2] = np.cos(angle_rads[:, 1::2])
    return angle_rads[np.newaxis, ...].astype(np.float32)


def test_equals_the_numpy_tutorial_formulation():
    peer = _numpy_tutorial_encoding(50, 512)
    assert peer.shape == (1, 50, 512)
    ours = posenc.sinusoidal_table(torch.arange(50), 512)[None]
    torch.testing.assert_close(ours, torch.from_numpy(peer), atol=1e-6, rtol=0)


class _TutorialPositionalEncoding(nn.Module):
    """The widely copied PyTorch tutorial module (inputs ``[seq_len, batch, d_model]``)."""

    def __init__(self, d_model: int, dropout: float = 0.1, max_len: int = 5000):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, 1, d_model)
        pe[:, 0, 0::2] = torch.sin(position * div_term)
        pe[:, 0, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe)

    def forward(self, x):
        x = x + self.pe[: x.size(0)]
        return self.dropout(x)


def test_equals_the_pytorch_tutorial_module_in_eval():
    peer = _TutorialPositionalEncoding(64, dropout=0.1, max_len=128).eval()
    ours = posenc.SinusoidalEmbedding(64, dropout=0.1).eval()
    x = torch.randn(3, 100, 64)
    expected = peer(x.transpose(0, 1)).transpose(0, 1)  # the tutorial is sequence-first
    # the peer's float32 angles lose ~1e-5 by position 100; ours are exact
    torch.testing.assert_close(ours(x), expected, atol=5e-5, rtol=0)


def test_equals_the_pytorch_tutorial_module_with_dropout():
    """Added to x, then dropout: the same mask for the same seed (batch of one, so the
    peer's [s, 1, d] and our [1, s, d] have the same memory order)."""
    peer = _TutorialPositionalEncoding(32, dropout=0.25, max_len=64).train()
    ours = posenc.SinusoidalEmbedding(32, dropout=0.25).train()
    x = torch.randn(1, 40, 32)
    torch.manual_seed(123)
    expected = peer(x.transpose(0, 1)).transpose(0, 1)
    torch.manual_seed(123)
    out = ours(x)
    assert torch.equal(out == 0, expected == 0)  # the same elements dropped
    torch.testing.assert_close(out, expected, atol=1e-4, rtol=0)


# --- the flax layout (Flax examples, tensor2tensor, T5X, MaxText, fairseq) -----------------


def test_flax_worked_example_dim8():
    """dim 8: n = 4 rates log-spaced from 1 to 1/10000 over n - 1 = 3 steps."""
    out = posenc.sinusoidal_table(torch.arange(6), 8, layout="flax", dtype=torch.float64)
    rates = [1.0, 10000 ** (-1 / 3), 10000 ** (-2 / 3), 1e-4]  # 1, 0.0464, 0.00215, 0.0001
    rows = [[math.sin(p * w) for w in rates] + [math.cos(p * w) for w in rates] for p in range(6)]
    torch.testing.assert_close(out, torch.tensor(rows, dtype=torch.float64), atol=1e-15, rtol=0)
    # dim 4: [sin p, sin(p / 10000), cos p, cos(p / 10000)], where interleaved has p / 100
    four = posenc.sinusoidal_table(torch.tensor([1.0]), 4, layout="flax", dtype=torch.float64)
    expected = [math.sin(1.0), math.sin(1e-4), math.cos(1.0), math.cos(1e-4)]
    torch.testing.assert_close(
        four[0], torch.tensor(expected, dtype=torch.float64), atol=1e-15, rtol=0
    )


@pytest.mark.parametrize("dim", [5, 9, 65])
@pytest.mark.parametrize("order", ORDERS)
def test_flax_odd_dim_ends_in_a_zero_channel(dim, order):
    pos = torch.arange(-4, 30)
    odd = posenc.sinusoidal_table(pos, dim, layout="flax", order=order, dtype=torch.float64)
    even = posenc.sinusoidal_table(pos, dim - 1, layout="flax", order=order, dtype=torch.float64)
    assert torch.equal(odd, torch.cat([even, torch.zeros(len(pos), 1, dtype=torch.float64)], -1))


@given(
    half_dim=st.integers(2, 512),
    base=st.floats(min_value=1.0001, max_value=1e9, allow_nan=False, allow_infinity=False),
)
def test_flax_rates_run_from_one_to_exactly_one_over_base(half_dim, base):
    from posenc.sinusoidal import _frequencies

    for dim in (2 * half_dim, 2 * half_dim + 1):
        rates = _frequencies(dim, base, "flax", torch.device("cpu"))
        assert rates.shape == (half_dim,) and rates.dtype == torch.float64
        assert float(rates[0]) == 1.0 and float(rates[-1]) == 1.0 / base  # exactly
        ratios = rates[1:] / rates[:-1]  # log-spaced: one ratio, base^(-1/(n-1))
        torch.testing.assert_close(
            ratios, torch.full_like(ratios, base ** (-1 / (half_dim - 1))), atol=0, rtol=1e-12
        )
    # the reference's last sine column is sin(p * (1 / base)), at its own float64 rounding
    p = np.array([0.0, 1.0, 12345.0, 1e6])
    ref = reference.sinusoidal_table(p, 2 * half_dim, base=base, layout="flax")
    np.testing.assert_array_equal(ref[:, half_dim - 1], np.sin(p * (1.0 / base)))


def _flax_sinusoidal_init(max_len: int, d_feature: int, max_scale: float = 10000.0) -> np.ndarray:
    """Flax examples' (lm1b, wmt) ``sinusoidal_init(max_len)(key, (1, max_len, d_feature))``,
    restated without jax (it returns ``jnp.array(pe)`` of this float32 NumPy array)."""
    pe = np.zeros((max_len, d_feature), dtype=np.float32)
    position = np.arange(0, max_len)[:, np.newaxis]
    scale_factor = -np.log(max_scale / 1.0) / (d_feature // 2 - 1)
    div_term = 1.0 * np.exp(np.arange(0, d_feature // 2) * scale_factor)
    pe[:, : d_feature // 2] = np.sin(position * div_term)
    pe[:, d_feature // 2 : 2 * (d_feature // 2)] = np.cos(position * div_term)
    return pe[np.newaxis, :, :]


@pytest.mark.parametrize(("max_len", "dim"), [(2048, 512), (512, 64), (300, 7), (100, 4)])
def test_flax_equals_flax_examples_sinusoidal_init(max_len, dim):
    """Both compute float64 angles and round once to float32: equal but for the float64
    rounding of the rates (``exp(i * -log(base) / (n - 1))`` there, ``base ** (-i / (n - 1))``
    here), which moves a value by at most one float32 ulp."""
    peer = torch.from_numpy(_flax_sinusoidal_init(max_len, dim))
    ours = posenc.sinusoidal_table(torch.arange(max_len), dim, layout="flax", dtype=torch.float32)
    assert peer.shape == (1, max_len, dim)
    ulp = torch.finfo(torch.float32).eps * ours.abs().clamp(min=2.0**-126)  # about one ulp
    assert bool(((ours[None] - peer).abs() <= ulp).all())
    assert (ours[None] != peer).double().mean() < 1e-3  # nearly all bit-equal


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_flax_far_positions_match_the_reference(dtype):
    pos = torch.tensor([0, 1, 255, 256, 257, 4095, 10**5, 10**6, 2**24 + 1, 2**30 + 3])
    out = posenc.sinusoidal_table(pos, 64, layout="flax", dtype=dtype)
    ref = _ref(pos, 64, layout="flax")
    # the reference rounds p * rate in float64 (about 1e-16 * p); ours reduces exactly
    atol = ATOL[dtype] if dtype != torch.float64 else 1e-15 * float(pos.max())
    torch.testing.assert_close(out.double(), ref, atol=atol, rtol=0)


def test_flax_module_and_config_round_trip():
    pe = posenc.SinusoidalEmbedding(9, layout="flax", base=500.0)
    assert pe.to_config()["layout"] == "flax"
    again = posenc.build(pe.to_config())
    x = torch.randn(2, 5, 9, dtype=torch.float64)
    assert torch.equal(again(x), pe(x))
    torch.testing.assert_close(
        pe(x), x + _ref(torch.arange(5), 9, layout="flax", base=500.0), atol=1e-15, rtol=0
    )


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"dim": 2, "layout": "flax"}, "dim must be >= 4 for layout='flax', got 2"),
        ({"dim": 3, "layout": "flax"}, "dim must be >= 4 for layout='flax', got 3"),
        ({"dim": 8, "layout": "diagonal"}, "layout must be 'interleaved', 'half' or 'flax'"),
    ],
)
def test_reference_bad_input(options, match):
    with pytest.raises(ValueError, match=match):
        reference.sinusoidal_table(np.arange(3), **options)


# --- the module --------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dim", [5, 16])
def test_module_adds_the_table(dim, layout):
    pe = posenc.SinusoidalEmbedding(dim, layout=layout, order="cos_sin", scale=2.0, base=500.0)
    x = torch.randn(2, 7, dim, dtype=torch.float64)
    ref = _ref(torch.arange(3, 10), dim, layout=layout, order="cos_sin", base=500.0)
    torch.testing.assert_close(pe(x, offset=3), x + 2.0 * ref, atol=1e-12, rtol=0)
    batched = torch.tensor([[0, 1, 2, 0, 1, 2, 3], [9, 8, 7, 6, 5, 4, 3]])  # [b, s]
    ref_b = _ref(batched, dim, layout=layout, order="cos_sin", base=500.0)
    torch.testing.assert_close(pe(x, batched), x + 2.0 * ref_b, atol=1e-12, rtol=0)
    # [1, s] positions broadcast over the batch; offset shifts given positions too
    one = torch.tensor([[0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5]])
    ref_1 = _ref(one + 10, dim, layout=layout, order="cos_sin", base=500.0)
    torch.testing.assert_close(pe(x, one, offset=10), x + 2.0 * ref_1, atol=1e-12, rtol=0)


def test_module_bf16_only_the_final_add_rounds():
    pe = posenc.SinusoidalEmbedding(64).to(torch.bfloat16)
    x = torch.randn(2, 32, 64).to(torch.bfloat16)
    offset = 5_000_000  # where a bf16 (or float32-angle) table would be visibly wrong
    table_f64 = _ref(torch.arange(offset, offset + 32), 64)
    out = pe(x, offset=offset)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, (x.float() + table_f64).to(torch.bfloat16))
    naive = x + table_f64.to(torch.bfloat16)  # what a bf16 table would give
    assert not torch.equal(out, naive)


def test_module_state_dict_holds_no_table():
    assert posenc.SinusoidalEmbedding(16).state_dict() == {}
    assert list(posenc.SinusoidalEmbedding(16).buffers()) == []
    learnable = posenc.SinusoidalEmbedding(16, scale=0.5, learnable_scale=True)
    assert list(learnable.state_dict()) == ["scale"]
    assert torch.equal(learnable.state_dict()["scale"], torch.tensor(0.5))


def test_module_learnable_scale_gets_a_gradient():
    pe = posenc.SinusoidalEmbedding(8, learnable_scale=True)
    pe(torch.zeros(1, 4, 8)).sum().backward()
    expected = posenc.sinusoidal_table(torch.arange(4), 8, dtype=torch.float64).sum()
    torch.testing.assert_close(pe.scale.grad.double(), expected, atol=1e-6, rtol=0)


def test_module_config_round_trip():
    pe = posenc.SinusoidalEmbedding(
        10, base=100.0, layout="half", order="cos_sin", dropout=0.1, scale=3.0
    )
    again = posenc.build(pe.to_config())
    assert isinstance(again, posenc.SinusoidalEmbedding)
    assert again.to_config() == pe.to_config()
    x = torch.randn(2, 5, 10)
    assert torch.equal(again.eval()(x), pe.eval()(x))


# --- precision -------------------------------------------------------------------------


@pytest.mark.parametrize("exponent", [24, 25, 26, 27])
@pytest.mark.parametrize("pos_dtype", [torch.int64, torch.float64], ids=str)
def test_precision_at_long_positions(exponent, pos_dtype):
    start = 2**exponent - 4
    pos = torch.arange(start, start + 9, dtype=pos_dtype)  # straddles 2^exponent
    out = posenc.sinusoidal_table(pos, 128, dtype=torch.float32)
    ref = _ref(pos, 128)
    torch.testing.assert_close(out.double(), ref, atol=1e-6, rtol=0)
    # the module too, positions given by offset
    x = torch.zeros(1, 9, 128)
    torch.testing.assert_close(
        posenc.SinusoidalEmbedding(128)(x, offset=start).double()[0], ref, atol=1e-6, rtol=0
    )


def test_float32_angles_fail_where_we_do_not():
    """The tutorial's float32 angles (position * div_term) are off by far more than 1e-6 at
    2^24; this is what the precision promise is about."""
    pos = torch.arange(2**24, 2**24 + 8)
    div_term = torch.exp(torch.arange(0, 64, 2) * (-math.log(10000.0) / 64))
    naive = torch.sin(pos[:, None].float() * div_term)
    ref = _ref(pos, 64)[:, 0::2]
    assert (naive.double() - ref).abs().max() > 1e-2
    ours = posenc.sinusoidal_table(pos, 64)[:, 0::2]
    assert (ours.double() - ref).abs().max() <= 1e-6


# --- properties --------------------------------------------------------------------------

positions_st = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False, allow_infinity=False)


def _layout_and_dim(low: int, high: int) -> st.SearchStrategy[tuple[str, int]]:
    """A layout and a dim in ``[low, high]`` it takes (``"flax"``: from 4)."""
    return st.sampled_from(LAYOUTS).flatmap(
        lambda layout: st.tuples(
            st.just(layout), st.integers(max(low, 4) if layout == "flax" else low, high)
        )
    )


@given(
    pos=st.lists(positions_st, min_size=1, max_size=8),
    layout_dim=_layout_and_dim(1, 64),
    order=st.sampled_from(ORDERS),
)
def test_values_are_bounded(pos, layout_dim, order):
    layout, dim = layout_dim
    out = posenc.sinusoidal_table(
        torch.tensor(pos, dtype=torch.float64), dim, layout=layout, order=order
    )
    assert bool((out.abs() <= 1.0).all())


@given(
    p=st.floats(min_value=-1e7, max_value=1e7, allow_nan=False), layout_dim=_layout_and_dim(2, 128)
)
def test_squared_norm_is_half_dim(p, layout_dim):
    layout, dim = layout_dim
    half_dim = dim // 2  # odd dim: flax's zero channel adds nothing; the others add sin^2 or cos^2
    if dim % 2 and layout != "flax":
        dim -= 1
    out = posenc.sinusoidal_table(
        torch.tensor([p], dtype=torch.float64), 2 * half_dim, layout=layout, dtype=torch.float64
    )
    torch.testing.assert_close(
        out.square().sum(), torch.tensor(float(half_dim), dtype=torch.float64)
    )


@given(
    p=st.floats(min_value=-1e4, max_value=1e4, allow_nan=False),
    k=st.floats(min_value=-1e3, max_value=1e3, allow_nan=False),
    half_dim=st.integers(1, 32),
    base=st.sampled_from([100.0, 10000.0]),
)
def test_dot_product_depends_only_on_the_offset(p, k, half_dim, base):
    dim = 2 * half_dim
    pos = torch.tensor([p, p + k, 0.0, k], dtype=torch.float64)
    t = posenc.sinusoidal_table(pos, dim, base=base, dtype=torch.float64)
    freqs = base ** (-2.0 * torch.arange(half_dim, dtype=torch.float64) / dim)
    if half_dim >= 2:  # the flax layout too, at its own rates
        flax = posenc.sinusoidal_table(pos, dim, base=base, layout="flax", dtype=torch.float64)
        rates = base ** -(torch.arange(half_dim, dtype=torch.float64) / (half_dim - 1))
        torch.testing.assert_close(
            flax[0] @ flax[1], torch.cos((pos[1] - pos[0]) * rates).sum(), atol=1e-9, rtol=0
        )
        torch.testing.assert_close(flax[0] @ flax[1], flax[2] @ flax[3], atol=1e-9, rtol=0)
    expected = torch.cos((pos[1] - pos[0]) * freqs).sum()  # sum_i cos(k w_i)
    torch.testing.assert_close(t[0] @ t[1], expected, atol=1e-9, rtol=0)
    torch.testing.assert_close(t[0] @ t[1], t[2] @ t[3], atol=1e-9, rtol=0)


# --- bad input ---------------------------------------------------------------------------

T = posenc.sinusoidal_table


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: T(torch.arange(3), 0), "dim must be >= 1, got 0"),
        (lambda: T(torch.arange(3), -2), "dim must be >= 1, got -2"),
        (lambda: T(torch.arange(3), 2.5), "dim must be an integer, got 2.5"),
        (lambda: T(torch.arange(3), True), "dim must be an integer, got True"),
        (
            lambda: T(torch.arange(3), 4, layout="diagonal"),
            "layout must be one of 'half', 'interleaved', 'flax', got 'diagonal'",
        ),
        *[
            (
                lambda d=d: T(torch.arange(3), d, layout="flax"),
                rf"dim must be >= 4 for layout='flax' \(rates spaced over dim // 2 - 1 steps\), "
                rf"got {d}",
            )
            for d in (1, 2, 3)
        ],
        (
            lambda: posenc.sinusoidal_table_nd((2, 3), 6, layout="flax"),
            "dim 6 over 2 axes gives 3 channels per axis; layout='flax' needs >= 4 per axis",
        ),
        (
            lambda: posenc.SinusoidalEmbedding(3, layout="flax"),
            "dim must be >= 4 for layout='flax' .*, got 3",
        ),
        (
            lambda: T(torch.arange(3), 4, order="sin"),
            "order must be one of 'sin_cos', 'cos_sin', got 'sin'",
        ),
        (lambda: T(torch.arange(3), 4, base=1.0), "base must be > 1.0, got 1.0"),
        (lambda: T(torch.arange(3), 4, base=float("inf")), "base must be finite"),
        (lambda: T(torch.tensor([0.0, float("nan")]), 4), "positions must be finite"),
        (lambda: T(torch.tensor([float("inf")]), 4), "positions must be finite"),
        (
            lambda: T(torch.tensor([True, False]), 4),
            "positions must be an integer or floating tensor",
        ),
        (lambda: T(["a"], 4), "positions must be a tensor of numbers"),
        (lambda: T(torch.arange(3), 4, dtype=torch.int64), "dtype must be a floating-point dtype"),
        (lambda: T(torch.arange(3), 4, dtype="float32"), "dtype must be a torch.dtype"),
        (
            lambda: posenc.sinusoidal_table_nd((2, 3), 5),
            r"dim must be divisible by the number of axes \(2\), got 5",
        ),
        (lambda: posenc.sinusoidal_table_nd((2, 0), 4), r"grid\[1\] must be >= 1, got 0"),
        (
            lambda: posenc.sinusoidal_table_nd(torch.zeros(3, 0), 4),
            r"grid coordinates must be \[..., n_axes\]",
        ),
        (
            lambda: posenc.sinusoidal_table_nd(torch.tensor([[float("nan"), 0.0]]), 4),
            "positions must be finite",
        ),
        (lambda: posenc.SinusoidalEmbedding(0), "dim must be >= 1, got 0"),
        (lambda: posenc.SinusoidalEmbedding(8, layout="x"), "layout must be one of"),
        (lambda: posenc.SinusoidalEmbedding(8, dropout=1.5), "dropout must be <= 1.0, got 1.5"),
        (lambda: posenc.SinusoidalEmbedding(8, scale=float("nan")), "scale must be finite"),
        (
            lambda: posenc.SinusoidalEmbedding(8, learnable_scale="yes"),
            "learnable_scale must be one of True, False, got 'yes'",
        ),
        (
            lambda: posenc.SinusoidalEmbedding(8)(
                torch.zeros(1, 3, 8), torch.arange(3), offset=0.5
            ),
            "offset must be an integer, got 0.5",
        ),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(posenc.PosEncError, match=match):
        call()


PE = posenc.SinusoidalEmbedding(8)


@pytest.mark.parametrize(
    ("x", "positions", "match"),
    [
        (torch.zeros(2, 3, 7), None, r"x must have last dimension 8, got shape \(2, 3, 7\)"),
        (
            torch.zeros(2, 3, 8, dtype=torch.long),
            None,
            "x must have a floating-point dtype, got torch.int64",
        ),
        (torch.zeros(3, 8), None, r"x must be \[b, s, dim\], got shape \(3, 8\)"),
        ([[0.0] * 8], None, "x must be a torch.Tensor, got list"),
        (
            torch.zeros(2, 3, 8),
            torch.arange(4),
            r"positions must have length 3 .* got shape \(4,\)",
        ),
        (
            torch.zeros(2, 3, 8),
            torch.zeros(3, 3),
            r"must have b == 2 \(the batch size\) or 1, got shape \(3, 3\)",
        ),
        (torch.zeros(2, 3, 8), torch.zeros(2, 1, 3), r"positions must be \[s\] or \[b, s\]"),
        (torch.zeros(2, 3, 8), torch.tensor([0.0, float("nan"), 1.0]), "positions must be finite"),
        (
            torch.zeros(2, 3, 8),
            torch.tensor([True, False, True]),
            "positions must be an integer or floating",
        ),
    ],
)
def test_module_bad_input(x, positions, match):
    with pytest.raises(posenc.PosEncError, match=match):
        PE(x, positions)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("learnable_scale", [False, True])
def test_forward_and_backward_equal_plain_autograd_of_the_float64_sum(dtype, learnable_scale):
    """The module's rounded float64 sum has a hand-written backward (the gradient passes
    through without its two exact casts); it must equal plain autograd of
    ``(x.double() + scale * PE).to(dtype)`` bit for bit, the scale's gradient included."""
    from posenc import positions as _positions
    from posenc.sinusoidal import _table

    torch.manual_seed(0)
    pe = posenc.SinusoidalEmbedding(64, scale=0.7, learnable_scale=learnable_scale)
    x = torch.randn(3, 17, 64, dtype=dtype, requires_grad=True)
    pos = torch.randint(0, 10**6, (3, 17))
    out = pe(x, pos)
    grad = torch.randn_like(out)
    out.backward(grad)

    x_ref = x.detach().clone().requires_grad_(True)
    scale_ref = pe.scale.detach().clone().requires_grad_(True) if learnable_scale else 0.7
    table = _table(
        _positions.resolve(pos, 17, batch=3, device=x.device),
        64,
        pe.base,
        pe.layout,
        pe.order,
        torch.float64,
    )
    scale64 = scale_ref.double() if learnable_scale else scale_ref
    ref = (x_ref.double() + scale64 * table).to(dtype)
    ref.backward(grad)
    assert torch.equal(out, ref)
    assert torch.equal(x.grad, x_ref.grad)
    if learnable_scale:
        assert torch.equal(pe.scale.grad, scale_ref.grad)


# --- issue 24: a scale beyond the dtype gave inf embeddings --------------------------------


@pytest.mark.parametrize(
    ("scale", "dtype", "match"),
    [
        (1e308, torch.float32, r"scale must be within \+-3\.403e\+38 \(finite in torch\.float32"),
        (-1e39, torch.float32, r"scale must be within \+-3\.403e\+38"),
        (1e5, torch.float16, r"scale must be within \+-6\.55e\+04 \(finite in torch\.float16"),
        (1e39, torch.bfloat16, r"scale must be within \+-3\.39e\+38 \(finite in torch\.bfloat16"),
    ],
)
def test_scale_beyond_the_embeddings_dtype_is_refused_by_name(scale, dtype, match):
    pe = posenc.SinusoidalEmbedding(8, scale=scale)
    with pytest.raises(posenc.PosEncError, match=match):
        pe(torch.zeros(1, 3, 8, dtype=dtype))


def test_learnable_scale_beyond_its_parameter_dtype_is_refused_by_name():
    with pytest.raises(
        posenc.PosEncError, match=r"scale must be within \+-3\.403e\+38 .* parameter"
    ):
        posenc.SinusoidalEmbedding(8, scale=1e308, learnable_scale=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_large_scale_that_fits_equals_the_reference(dtype):
    """The largest float32 scale, and 1e308 for float64 embeddings: x + scale * PE rounded once."""
    scale = float(torch.finfo(dtype).max) if dtype == torch.float32 else 1e308
    got = posenc.SinusoidalEmbedding(8, scale=scale)(torch.zeros(1, 3, 8, dtype=dtype))
    table = reference.sinusoidal_table(np.arange(3), 8)
    want = torch.from_numpy(scale * np.asarray(table, dtype=np.float64)).to(dtype)[None]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)  # float64: the table's rounding
    assert bool(torch.isfinite(got).all())
