"""posenc.learned: the trained table, its validation, and resampling against the float64
reference, timm's formulation and Hugging Face ViT."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import posenc
from posenc import reference
from posenc.learned import LearnedEmbedding, resample_table


def _module(max_len=16, dim=8, dtype=torch.float64, **kwargs) -> LearnedEmbedding:
    return LearnedEmbedding(max_len, dim, dtype=dtype, **kwargs)


def _ref_resample(table: torch.Tensor, size, **kwargs) -> torch.Tensor:
    return torch.from_numpy(reference.resample_table(table.double().numpy(), size, **kwargs))


# --- forward ---------------------------------------------------------------------------


def test_forward_adds_the_rows():
    pe = _module()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    w = pe.weight.detach()
    assert torch.equal(pe(x), x + w[:5])
    assert torch.equal(pe(x, offset=11), x + w[11:16])
    batched = torch.tensor([[4, 3, 2, 1, 0], [15, 0, 15, 0, 7]])
    assert torch.equal(pe(x, batched), x + w[batched])
    one = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]])  # [1, s], integral floats
    assert torch.equal(pe(x, one, offset=2), x + w[3:8].expand(2, 5, 8))


def test_table_method():
    pe = _module()
    pos = torch.tensor([[0, 3], [15, 2]])
    assert torch.equal(pe.table(pos), pe.weight.detach()[pos])


@pytest.mark.parametrize(
    ("positions", "offset", "match"),
    [
        (
            None,
            12,
            r"positions must be in \[0, max_len\) with max_len=16, got values from 12 to 16",
        ),
        (torch.tensor([0, 1, 2, 3, 16]), 0, r"max_len=16, got values from 0 to 16"),
        (torch.tensor([-1, 0, 1, 2, 3]), 0, r"max_len=16, got values from -1 to 3"),
        (torch.tensor([0, 1, 2, 3, 4]), -1, r"max_len=16, got values from -1 to 3"),
        (torch.tensor([0.0, 1.0, 2.5, 3.0, 4.0]), 0, "positions must be integers .* got 2.5"),
        (torch.tensor([0.0, 1.0, float("nan"), 3.0, 4.0]), 0, "positions must be finite"),
        (torch.tensor([0, 1, 2]), 0, "positions must have length 5"),
    ],
)
def test_forward_bad_positions(positions, offset, match):
    with pytest.raises(posenc.PosEncError, match=match):
        _module()(torch.zeros(1, 5, 8, dtype=torch.float64), positions, offset=offset)


@pytest.mark.parametrize(
    ("x", "match"),
    [
        (torch.zeros(1, 3, 7), r"x must have last dimension 8, got shape \(1, 3, 7\)"),
        (torch.zeros(1, 3, 8, dtype=torch.int32), "x must have a floating-point dtype"),
        (torch.zeros(3, 8), r"x must be \[b, s, dim\]"),
    ],
)
def test_forward_bad_x(x, match):
    with pytest.raises(posenc.PosEncError, match=match):
        _module()(x)


def test_table_bad_positions():
    with pytest.raises(posenc.PosEncError, match="positions must be an integer or floating tensor"):
        _module().table(torch.tensor([True]))
    with pytest.raises(posenc.PosEncError, match="positions must be finite"):
        _module().table(torch.tensor([0.0, float("inf")]))


def test_bf16_module_rounds_once():
    pe = LearnedEmbedding(32, 16).to(torch.bfloat16)
    assert pe.weight.dtype == torch.bfloat16  # a learned table is a parameter: it is cast
    x = torch.randn(2, 32, 16).to(torch.bfloat16)
    out = pe(x)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, (x.float() + pe.weight.float()).to(torch.bfloat16))


def test_float32_weight_bf16_input():
    pe = LearnedEmbedding(8, 4)
    x = torch.randn(1, 8, 4).to(torch.bfloat16)
    assert torch.equal(pe(x), (x.float() + pe.weight.detach()).to(torch.bfloat16))


def test_gradient_reaches_the_used_rows():
    pe = LearnedEmbedding(6, 3)
    pe(torch.zeros(1, 2, 3), torch.tensor([1, 4])).sum().backward()
    expected = torch.zeros(6, 3)
    expected[[1, 4]] = 1.0
    assert torch.equal(pe.weight.grad, expected)


def test_dropout_after_the_addition():
    pe = LearnedEmbedding(8, 4, dropout=0.5).train()
    x = torch.randn(2, 8, 4)
    torch.manual_seed(7)
    out = pe(x)
    torch.manual_seed(7)
    expected = F.dropout(x + pe.weight.detach(), 0.5, training=True)
    assert torch.equal(out, expected)


# --- state, config, construction --------------------------------------------------------


def test_state_dict_is_the_weight():
    pe = LearnedEmbedding(16, 8)
    state = pe.state_dict()
    assert list(state) == ["weight"] and state["weight"].shape == (16, 8)
    again = posenc.build(pe.to_config())
    again.load_state_dict(state)
    x = torch.randn(2, 16, 8)
    assert torch.equal(again(x), pe(x))


def test_reset_parameters_is_normal_with_init_std():
    torch.manual_seed(3)
    pe = LearnedEmbedding(10, 4, init_std=0.5)
    torch.manual_seed(3)
    expected = torch.nn.init.normal_(torch.empty(10, 4), std=0.5)
    assert torch.equal(pe.weight.detach(), expected)


def test_meta_device_and_dtype():
    pe = LearnedEmbedding(10, 4, device="meta", dtype=torch.bfloat16)
    assert pe.weight.is_meta and pe.weight.dtype == torch.bfloat16


def test_from_table_copies():
    table = torch.randn(5, 3, dtype=torch.float64)
    pe = LearnedEmbedding.from_table(table, dropout=0.1)
    assert torch.equal(pe.weight.detach(), table) and pe.weight.dtype == torch.float64
    assert pe.to_config()["max_len"] == 5 and pe.to_config()["dropout"] == 0.1
    table.zero_()
    assert not torch.equal(pe.weight.detach(), table)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: LearnedEmbedding(0, 4), "max_len must be >= 1, got 0"),
        (lambda: LearnedEmbedding(8, 0), "dim must be >= 1, got 0"),
        (lambda: LearnedEmbedding(8.0, 4), "max_len must be an integer, got 8.0"),
        (
            lambda: LearnedEmbedding(10, 4, grid=(3, 4)),
            r"grid \(3, 4\) with num_prefix_tokens=0 needs 12 rows, got 10",
        ),
        (lambda: LearnedEmbedding(10, 4, grid=(3, 3)), r"needs 9 rows, got 10"),
        (lambda: LearnedEmbedding(9, 4, grid=9), r"grid must be a pair of sizes \(H, W\), got 9"),
        (
            lambda: LearnedEmbedding(9, 4, grid=(3, 3, 1)),
            r"grid must be a pair of sizes \(H, W\), got 3 sizes",
        ),
        (lambda: LearnedEmbedding(9, 4, grid=(0, 3)), r"grid\[0\] must be >= 1, got 0"),
        (
            lambda: LearnedEmbedding(4, 4, num_prefix_tokens=4),
            "num_prefix_tokens must be < the number of rows",
        ),
        (lambda: LearnedEmbedding(4, 4, num_prefix_tokens=-1), "num_prefix_tokens must be >= 0"),
        (lambda: LearnedEmbedding(4, 4, dropout=-0.1), "dropout must be >= 0.0"),
        (lambda: LearnedEmbedding(4, 4, init_std=-1.0), "init_std must be >= 0.0"),
        (lambda: LearnedEmbedding(4, 4, dtype=torch.int64), "dtype must be a floating-point dtype"),
        (lambda: LearnedEmbedding.from_table(torch.zeros(4)), r"table must be \[max_len, dim\]"),
        (
            lambda: LearnedEmbedding.from_table(torch.zeros(4, 2, dtype=torch.long)),
            "table must have a floating-point dtype",
        ),
    ],
)
def test_constructor_bad_input(call, match):
    with pytest.raises(posenc.PosEncError, match=match):
        call()


# --- resampling: against the float64 reference ------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("prefix", [0, 1])
@pytest.mark.parametrize("new_len", [3, 17, 40])
def test_resample_1d_matches_reference(new_len, prefix, align_corners, dtype):
    pe = LearnedEmbedding(17, 6, num_prefix_tokens=prefix, dtype=dtype)
    new = pe.resample(new_len, align_corners=align_corners)
    ref = _ref_resample(
        pe.weight.detach(), new_len, num_prefix_tokens=prefix, align_corners=align_corners
    )
    assert new.weight.shape == (new_len, 6) and new.weight.dtype == dtype
    assert new.max_len == new_len and new.to_config()["max_len"] == new_len
    # interpolated in float32 (float64 for a float64 table), then rounded to the dtype
    atol, rtol = {torch.float64: (1e-12, 0), torch.float32: (1e-6, 0), torch.bfloat16: (0, 2**-8)}[
        dtype
    ]
    torch.testing.assert_close(new.weight.detach().double(), ref, atol=atol, rtol=rtol)
    assert torch.equal(new.weight[:prefix], pe.weight[:prefix])


@pytest.mark.parametrize("antialias", [True, False])
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("mode", ["bicubic", "bilinear"])
@pytest.mark.parametrize(
    ("grid", "new_grid"), [((4, 4), (7, 7)), ((6, 6), (3, 3)), ((3, 5), (5, 2))]
)
@pytest.mark.parametrize("prefix", [0, 1, 4])
def test_resample_2d_matches_reference(prefix, grid, new_grid, mode, align_corners, antialias):
    n = prefix + grid[0] * grid[1]
    pe = _module(n, 5, grid=grid, num_prefix_tokens=prefix)
    new = pe.resample(new_grid, mode=mode, align_corners=align_corners, antialias=antialias)
    ref = _ref_resample(
        pe.weight.detach(),
        new_grid,
        grid=grid,
        num_prefix_tokens=prefix,
        mode=mode,
        align_corners=align_corners,
        antialias=antialias,
    )
    torch.testing.assert_close(new.weight.detach(), ref, atol=1e-12, rtol=0)
    assert new.grid == new_grid and new.max_len == prefix + new_grid[0] * new_grid[1]
    assert new.to_config()["grid"] == list(new_grid)
    assert torch.equal(new.weight[:prefix], pe.weight[:prefix])


def test_resample_2d_defaults_are_bicubic_antialiased():
    pe = _module(1 + 36, 4, grid=(6, 6), num_prefix_tokens=1)
    ref = _ref_resample(
        pe.weight.detach(), (4, 5), grid=(6, 6), num_prefix_tokens=1, mode="bicubic", antialias=True
    )
    torch.testing.assert_close(pe.resample((4, 5)).weight.detach(), ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize("grid", [None, (3, 4)])
def test_resample_to_the_same_size_is_the_identity(grid):
    n = 12 if grid is None else 13
    pe = _module(n, 3, grid=grid, num_prefix_tokens=0 if grid is None else 1)
    new = pe.resample(n if grid is None else grid)
    torch.testing.assert_close(new.weight, pe.weight, atol=1e-15, rtol=0)


def test_resample_align_corners_keeps_the_end_rows():
    pe = _module(10, 4)
    new = pe.resample(37, align_corners=True)
    assert torch.equal(new.weight[0], pe.weight[0]) and torch.equal(new.weight[-1], pe.weight[-1])


def test_resample_returns_an_independent_module():
    pe = LearnedEmbedding(8, 4, dropout=0.2, init_std=0.1)
    pe.weight.requires_grad_(False)
    before = pe.weight.detach().clone()
    new = pe.resample(12)
    assert new is not pe and new.weight.requires_grad is False
    assert new.to_config() == {**pe.to_config(), "max_len": 12}
    with torch.no_grad():
        new.weight.add_(1.0)
    assert torch.equal(pe.weight, before) and pe.max_len == 8
    assert LearnedEmbedding(4, 2).resample(8).weight.requires_grad is True


def test_resample_table_function_on_a_plain_tensor():
    t = torch.tensor([[0.0, 10.0], [2.0, 20.0], [4.0, 30.0]])
    out = resample_table(t, 5, align_corners=True)
    assert torch.equal(
        out, torch.tensor([[0.0, 10.0], [1.0, 15.0], [2.0, 20.0], [3.0, 25.0], [4.0, 30.0]])
    )


# --- resampling: the peers -------------------------------------------------------------


def _timm_resample_abs_pos_embed(
    posemb, new_size, old_size, num_prefix_tokens=1, interpolation="bicubic", antialias=True
):
    """timm.layers.pos_embed.resample_abs_pos_embed, its computation step by step
    (timm is not a dependency): split the prefix, interpolate [1, D, H, W] in float32,
    flatten back, concatenate."""
    posemb_prefix, posemb = posemb[:, :num_prefix_tokens], posemb[:, num_prefix_tokens:]
    embed_dim, orig_dtype = posemb.shape[-1], posemb.dtype
    posemb = posemb.float().reshape(1, old_size[0], old_size[1], -1).permute(0, 3, 1, 2)
    posemb = F.interpolate(posemb, size=new_size, mode=interpolation, antialias=antialias)
    posemb = posemb.permute(0, 2, 3, 1).reshape(1, -1, embed_dim).to(orig_dtype)
    return torch.cat([posemb_prefix, posemb], dim=1)


@pytest.mark.parametrize(
    ("old", "new"), [((14, 14), (16, 16)), ((14, 14), (7, 10)), ((4, 6), (6, 4))]
)
@pytest.mark.parametrize("prefix", [1, 5])
def test_resample_equals_timm(old, new, prefix):
    pe = LearnedEmbedding(prefix + old[0] * old[1], 16, grid=old, num_prefix_tokens=prefix)
    expected = _timm_resample_abs_pos_embed(pe.weight.detach()[None], new, old, prefix)[0]
    assert torch.equal(pe.resample(new).weight.detach(), expected)


@pytest.mark.parametrize("new", [(6, 6), (3, 5), (8, 2)])
def test_resample_equals_hugging_face_vit(new):
    from transformers import ViTConfig
    from transformers.models.vit.modeling_vit import ViTEmbeddings

    patch, side, dim = 4, 4, 12
    vit = ViTEmbeddings(ViTConfig(image_size=patch * side, patch_size=patch, hidden_size=dim))
    table = vit.position_embeddings.detach()[0]  # [1 + 16, dim], CLS first
    ours = LearnedEmbedding.from_table(table, grid=(side, side), num_prefix_tokens=1)
    embeddings = torch.zeros(1, 1 + new[0] * new[1], dim)
    with torch.no_grad():
        expected = vit.interpolate_pos_encoding(embeddings, new[0] * patch, new[1] * patch)[0]
    assert torch.equal(ours.resample(new, antialias=False).weight.detach(), expected)


# --- resampling: bad targets -------------------------------------------------------------

ONE_D = LearnedEmbedding(8, 4, num_prefix_tokens=1)
TWO_D = LearnedEmbedding(1 + 9, 4, grid=(3, 3), num_prefix_tokens=1)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda: ONE_D.resample((4, 4)),
            r"new_len_or_grid must be a length \(an int\) for a 1-D table, got \(4, 4\)",
        ),
        (lambda: ONE_D.resample(1), r"new_len_or_grid must be >= 2, got 1"),
        (lambda: ONE_D.resample(-3), "new_len_or_grid must be >= 2, got -3"),
        (lambda: ONE_D.resample(12.0), "new_len_or_grid must be an integer, got 12.0"),
        (lambda: ONE_D.resample(True), "new_len_or_grid must be an integer, got True"),
        (lambda: ONE_D.resample("16"), "new_len_or_grid must be an integer, got '16'"),
        (lambda: ONE_D.resample(None), "new_len_or_grid must be an integer, got None"),
        (lambda: ONE_D.resample(16, mode="bicubic"), "mode must be one of 'linear', got 'bicubic'"),
        (lambda: ONE_D.resample(16, antialias=True), "antialias applies to 2-D grids only"),
        (lambda: ONE_D.resample(16, align_corners=1), "align_corners must be True or False, got 1"),
        (
            lambda: TWO_D.resample(16),
            r"new_len_or_grid must be a grid \(H', W'\) for a table with grid=\(3, 3\), got 16",
        ),
        (
            lambda: TWO_D.resample((4,)),
            r"new_len_or_grid must be a pair of sizes \(H, W\), got 1 sizes",
        ),
        (lambda: TWO_D.resample((4, 4, 4)), "new_len_or_grid must be a pair of sizes"),
        (lambda: TWO_D.resample((4, 0)), r"new_len_or_grid\[1\] must be >= 1, got 0"),
        (lambda: TWO_D.resample((4, 2.5)), r"new_len_or_grid\[1\] must be an integer, got 2.5"),
        (lambda: TWO_D.resample("44"), r"new_len_or_grid must be a grid \(H', W'\)"),
        (
            lambda: TWO_D.resample((4, 4), mode="linear"),
            "mode must be one of 'bicubic', 'bilinear', got 'linear'",
        ),
        (lambda: TWO_D.resample((4, 4), antialias="yes"), "antialias must be True, False or None"),
        (lambda: resample_table(torch.zeros(4), 8), r"table must be \[n, dim\], got shape \(4,\)"),
        (
            lambda: resample_table(torch.zeros(4, 2, dtype=torch.long), 8),
            "table must have a floating-point dtype",
        ),
        (
            lambda: resample_table(torch.zeros(5, 2), (3, 3), grid=(2, 2)),
            r"grid \(2, 2\) .* needs 4 rows, got 5",
        ),
    ],
)
def test_resample_bad_target(call, match):
    with pytest.raises(posenc.PosEncError, match=match):
        call()


def test_resample_errors_leave_the_module_unchanged():
    before = TWO_D.weight.detach().clone()
    with pytest.raises(posenc.PosEncError):
        TWO_D.resample(16)
    assert (
        torch.equal(TWO_D.weight, before)
        and TWO_D.max_len == 10
        and math.isclose(TWO_D.init_std, 0.02)
    )


@pytest.mark.parametrize(
    "shape", [(16, 0), (0, 4), (1, 0)], ids=["no-columns", "no-rows", "one-row-no-columns"]
)
def test_resample_table_refuses_an_empty_table(shape):
    """A [16, 0] table was a RuntimeError from F.interpolate."""
    with pytest.raises(
        posenc.PosEncError, match=r"table must have at least one row and one column .*got shape"
    ):
        resample_table(torch.zeros(shape), 8)
    with pytest.raises(
        posenc.PosEncError, match=r"table must have at least one row and one column"
    ):
        resample_table(torch.zeros(shape[0], shape[1]), (2, 2), grid=(4, 4))
