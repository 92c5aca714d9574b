"""Issue 13's reproducers outside the bias and rotary families: positions, additive tables,
the registry, the analysis, the plots and the model. Each once raised another type, hung,
allocated terabytes or was silently accepted; each is now a PosEncError or a correct result."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import posenc
from posenc import analysis, plot, reference
from posenc.analysis._encodings import MAX_POSITIONS
from posenc.models import TinyTransformer
from posenc.models.transformer import MAX_LAYERS, MAX_NEW_TOKENS

INT64_MAX = 2**63 - 1


def test_offset_wrap_around_int64_is_refused():
    pe = posenc.SinusoidalEmbedding(8)
    with pytest.raises(posenc.PosEncError, match="offset=1 moves positions out of int64"):
        pe(torch.zeros(1, 1, 8), torch.tensor([INT64_MAX]), offset=1)
    with pytest.raises(posenc.PosEncError, match="offset \\+ seq_len must be <= 2\\*\\*63"):
        posenc.positions.arange(2, offset=INT64_MAX)


def test_offset_near_the_int64_edge_that_fits_is_exact():
    got = posenc.positions.resolve(torch.tensor([INT64_MAX - 1]), 1, offset=1)
    torch.testing.assert_close(got, torch.tensor([INT64_MAX]), rtol=0, atol=0)
    got = posenc.positions.resolve(torch.tensor([0, 1], dtype=torch.int32), 2, offset=2**40)
    torch.testing.assert_close(got, torch.tensor([2**40, 2**40 + 1]), rtol=0, atol=0)


@pytest.mark.parametrize("lens", [{0: 3, 1: 2}, {3, 2}, "32", [True, 2]])
def test_from_seq_lens_refuses_other_containers(lens):
    with pytest.raises(posenc.PosEncError, match="seq_lens must be a 1-D sequence of integers"):
        posenc.positions.from_seq_lens(lens)


def test_batch_is_validated_for_1d_positions_too():
    with pytest.raises(posenc.PosEncError, match="batch must be an integer, got 'x'"):
        posenc.positions.resolve(torch.arange(3), 3, batch="x")
    with pytest.raises(posenc.PosEncError, match="batch must be >= 1, got -1"):
        posenc.positions.resolve_pair(3, q_positions=torch.arange(3), batch=-1)
    got = posenc.positions.resolve(torch.arange(3), 3, batch=4)  # [s] broadcasts over batch
    torch.testing.assert_close(got, torch.arange(3), rtol=0, atol=0)


def test_meta_positions_are_refused_by_name():
    rope = posenc.RotaryEmbedding(8)
    q = torch.randn(1, 1, 3, 8)
    with pytest.raises(posenc.PosEncError, match="q_positions must hold values"):
        rope(q, q, torch.arange(3, device="meta"))
    with pytest.raises(posenc.PosEncError, match="positions must hold values"):
        posenc.SinusoidalEmbedding(8)(torch.zeros(1, 3, 8), torch.arange(3, device="meta"))


def test_messages_name_the_length_argument():
    with pytest.raises(posenc.PosEncError, match="k_len=5"):
        posenc.positions.resolve_pair(3, 5, k_positions=torch.arange(3))


def test_sinusoidal_table_nd_names_grid():
    with pytest.raises(posenc.PosEncError, match=r"grid\[1\] must be >= 1, got 0"):
        posenc.sinusoidal_table_nd((2, 0), 4)
    with pytest.raises(posenc.PosEncError, match="grid must be a non-empty sequence"):
        posenc.sinusoidal_table_nd({2, 3}, 4)


def test_tables_refuse_huge_sizes_before_allocating():
    with pytest.raises(posenc.PosEncError, match="dim=1000000000000 would allocate"):
        posenc.sinusoidal_table(torch.arange(4), 10**12)
    with pytest.raises(posenc.PosEncError, match="max_len=1000000000000 would allocate"):
        posenc.LearnedEmbedding(10**12, 8)
    with pytest.raises(posenc.PosEncError, match="dim must fit in a 64-bit integer"):
        posenc.SinusoidalEmbedding(2**64)


def test_build_with_a_positional_argument():
    with pytest.raises(posenc.PosEncError, match="build takes the encoding and then arguments"):
        posenc.build("rope", 8)


def test_analysis_roformer_bound_validates():
    inv_freq = torch.tensor([1.0, 0.5])
    with pytest.raises(posenc.PosEncError, match=r"inv_freq must be a torch\.Tensor"):
        analysis.roformer_bound([1.0, 0.5], torch.arange(3))
    with pytest.raises(posenc.PosEncError, match="distances must be a 1-D real tensor"):
        analysis.roformer_bound(inv_freq, torch.tensor(3))
    with pytest.raises(posenc.PosEncError, match="inv_freq must hold at least one frequency"):
        analysis.roformer_bound(inv_freq[:0], torch.arange(3))
    got = analysis.roformer_bound(inv_freq, torch.tensor([0, 1]))
    k = torch.tensor(1.0, dtype=torch.float64)
    s1 = torch.polar(torch.ones((), dtype=torch.float64), k)
    s2 = s1 + torch.polar(torch.ones((), dtype=torch.float64), k * 0.5)
    want = torch.stack([torch.tensor(1.5, dtype=torch.float64), (s1.abs() + s2.abs()) / 2])
    torch.testing.assert_close(got, want, rtol=1e-15, atol=0)


@pytest.mark.parametrize("dtype", [torch.bool, torch.complex64])
def test_uniqueness_position_dtype(dtype):
    with pytest.raises(posenc.PosEncError, match="position_dtype must be a floating or integer"):
        analysis.uniqueness("sinusoidal", 16, position_dtype=dtype)


def test_analysis_counts_are_bounded():
    with pytest.raises(posenc.PosEncError, match=f"at most {MAX_POSITIONS} positions"):
        analysis.boundedness("sinusoidal", 10**12)
    with pytest.raises(posenc.PosEncError, match=f"max_distance must be <= {MAX_POSITIONS}"):
        analysis.decay("alibi", 10**12)


def test_plot_figsize_and_folder(tmp_path):
    with pytest.raises(posenc.PosEncError, match="figsize must be two positive numbers"):
        plot.plot_table("sinusoidal", 8, figsize=3)
    fig = plot.plot_table("sinusoidal", 8, figsize=(2, 2), dpi=20)
    with pytest.raises(posenc.PosEncError, match="path must be in an existing folder"):
        plot.save_figure(fig, tmp_path / "missing" / "x.png")
    with pytest.raises(posenc.PosEncError, match="fig must be a matplotlib Figure"):
        plot.figure_bytes("not a figure")
    assert plot.save_figure(fig, tmp_path / "x.png").read_bytes()[:4] == b"\x89PNG"


def test_tiny_transformer_sizes_bounded():
    with pytest.raises(posenc.PosEncError, match=f"num_layers must be <= {MAX_LAYERS}"):
        TinyTransformer(11, num_layers=10**12)
    with pytest.raises(posenc.PosEncError, match="vocab_size=1000000000000 would allocate"):
        TinyTransformer(10**12, dim=16)
    model = TinyTransformer(11, dim=16, num_layers=1, num_heads=2, encoding="rope")
    tokens = torch.randint(0, 11, (1, 3))
    with pytest.raises(posenc.PosEncError, match=f"max_new_tokens must be <= {MAX_NEW_TOKENS}"):
        model.generate(tokens, 10**12)
    with pytest.raises(posenc.PosEncError, match="use_cache must be True or False"):
        model.generate(tokens, 2, use_cache="yes")
    with pytest.raises(posenc.PosEncError, match="tokens must hold values"):
        model(tokens.to("meta"))


# --- issue 42: the "flax" sinusoidal layout needs dim >= 4 (rates over dim // 2 - 1 steps) ---

FLAX_DIM = r"dim must be >= 4 for layout='flax' \(rates spaced over dim // 2 - 1 steps\), got "


@pytest.mark.parametrize("dim", [1, 2, 3])
def test_flax_layout_refuses_dim_below_4(dim):
    with pytest.raises(posenc.PosEncError, match=f"^{FLAX_DIM}{dim}$"):
        posenc.sinusoidal_table(torch.arange(3), dim, layout="flax")
    with pytest.raises(posenc.PosEncError, match=f"^{FLAX_DIM}{dim}$"):
        posenc.SinusoidalEmbedding(dim, layout="flax")


@pytest.mark.parametrize("dim", [4, 5])
def test_flax_layout_from_dim_4_is_the_reference(dim):
    """The smallest dims it takes: one rate step (the last rate 1 / base), finite."""
    table = posenc.sinusoidal_table(torch.arange(3), dim, layout="flax", dtype=torch.float64)
    expected = reference.sinusoidal_table(np.arange(3), dim, layout="flax")
    np.testing.assert_allclose(table.numpy(), expected, rtol=0, atol=1e-15)


@pytest.mark.parametrize(("grid", "dim"), [((2, 3), 4), ((2, 3), 6), ((2, 3, 4), 9)])
def test_flax_layout_nd_names_the_dim_given(grid, dim):
    """The n-D table splits dim over the axes: a refusal gives the dim asked for (or says
    the count is per axis), not the per-axis count as if it were dim."""
    with pytest.raises(posenc.PosEncError) as info:
        posenc.sinusoidal_table_nd(grid, dim, layout="flax")
    message = str(info.value)
    assert "\n" not in message and "layout='flax'" in message, message
    assert re.search(rf"got {dim}\b|per axis", message), message
