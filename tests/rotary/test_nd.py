"""M-RoPE and axial N-D RoPE: the float64 reference, N-D offset invariance, Qwen2-VL vision."""

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import AxialRotaryEmbedding, MultimodalRotaryEmbedding, PosEncError, RotaryEmbedding
from posenc import reference as ref
from posenc.rotary.layout import LAYOUTS
from posenc.rotary.nd import axial_frequencies

from ._reference import reference_rotation

TOL = {torch.float64: {"atol": 1e-12, "rtol": 1e-12}, torch.float32: {"atol": 2e-6, "rtol": 1e-6}}


def _reference(q, k, q_pos, k_pos, inv_freq, sections, layout):
    return reference_rotation(q, k, q_pos, k_pos, inv_freq, layout=layout, sections=sections)


@pytest.mark.parametrize("batched", [False, True], ids=["s_n", "b_s_n"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", list(TOL), ids=str)
def test_mrope_matches_reference(dtype, layout, batched):
    rope = RotaryEmbedding(32, sections=(4, 6, 6), base=1e6, layout=layout)
    q, k = torch.randn(2, 4, 9, 32).to(dtype), torch.randn(2, 2, 9, 32).to(dtype)
    positions = torch.randint(0, 4096, (2, 9, 3) if batched else (9, 3))
    q_out, k_out = rope(q, k, positions)
    inv_freq, _ = ref.rope_frequencies(32, base=1e6)
    eq, ek = _reference(q, k, positions, positions, inv_freq, (4, 6, 6), layout)
    torch.testing.assert_close(q_out.double(), eq, **TOL[dtype])
    torch.testing.assert_close(k_out.double(), ek, **TOL[dtype])


def test_mrope_partial_rotary_and_scaling_match_reference():
    scaling = {"type": "linear", "factor": 2.0}
    rope = RotaryEmbedding(32, sections=(2, 3, 3), rotary_dim=16, scaling=scaling)
    q = torch.randn(1, 2, 5, 32, dtype=torch.float64)
    positions = torch.randint(0, 100, (5, 3))
    inv_freq, _ = ref.rope_frequencies(16, scaling=scaling)
    eq, _ = _reference(q, q, positions, positions, inv_freq, (2, 3, 3), "half")
    torch.testing.assert_close(rope(q, q, positions)[0], eq)


def test_mrope_text_tokens_are_plain_rope():
    """Equal coordinates on every axis (text) give exactly 1-D RoPE; None means that."""
    mrope = RotaryEmbedding(16, sections=(2, 3, 3))
    rope = RotaryEmbedding(16)
    q, k = torch.randn(1, 2, 6, 16), torch.randn(1, 2, 6, 16)
    pos = torch.arange(6) + 40
    want = rope(q, k, pos)
    got = mrope(q, k, pos[:, None].expand(6, 3))
    torch.testing.assert_close(got[0], want[0], atol=0, rtol=0)
    torch.testing.assert_close(mrope(q, k)[1], rope(q, k)[1], atol=0, rtol=0)


def test_mrope_spelling_is_deprecated_and_equal_to_rope_with_sections():
    """MultimodalRotaryEmbedding / "mrope" warn and point to "rope" with sections=, compute
    the same, and their saved config loads (without a warning) as the "rope" one."""
    with pytest.warns(DeprecationWarning, match=r"RotaryEmbedding\(head_dim, sections=\.\.\.\)"):
        a = MultimodalRotaryEmbedding(16, sections=(2, 3, 3), layout="interleaved")
    with pytest.warns(DeprecationWarning, match="registry name 'rope' with sections="):
        by_name = posenc.build("mrope", head_dim=16, sections=(2, 3, 3), layout="interleaved")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the kept spelling does not warn
        b = posenc.build("rope", head_dim=16, sections=(2, 3, 3), layout="interleaved")
        loaded = posenc.build(a.to_config())
    assert type(loaded) is RotaryEmbedding and loaded.to_config() == b.to_config()
    q = torch.randn(1, 1, 4, 16)
    pos = torch.randint(0, 50, (4, 3))
    for other in (by_name, b, loaded):
        torch.testing.assert_close(a(q, q, pos)[0], other(q, q, pos)[0], atol=0, rtol=0)
    with (
        pytest.warns(DeprecationWarning),
        pytest.raises(PosEncError, match="sections must be given"),
    ):
        MultimodalRotaryEmbedding(16, sections=None)


@pytest.mark.parametrize(
    ("n_axes", "axis_dims"), [(2, None), (3, None), (3, (4, 6, 6))], ids=["2d", "3d", "3d_uneven"]
)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", list(TOL), ids=str)
def test_axial_matches_reference(dtype, layout, n_axes, axis_dims):
    rope = AxialRotaryEmbedding(24, n_axes, layout=layout, axis_dims=axis_dims, base=100.0)
    dims = axis_dims or (24 // n_axes,) * n_axes
    assert rope.axis_dims == dims and rope.sections == tuple(d // 2 for d in dims)
    torch.testing.assert_close(rope.inv_freq, torch.from_numpy(ref.axial_frequencies(dims, 100.0)))
    shape = (2, 3, 2)[:n_axes]
    positions = posenc.positions.grid(shape).reshape(-1, n_axes)  # [s, n_axes]
    s = positions.shape[0]
    q, k = torch.randn(1, 2, s, 24).to(dtype), torch.randn(1, 1, s, 24).to(dtype)
    q_out, k_out = rope(q, k, positions)
    sections = tuple(d // 2 for d in dims)
    eq, ek = _reference(
        q, k, positions, positions, ref.axial_frequencies(dims, 100.0), sections, layout
    )
    torch.testing.assert_close(q_out.double(), eq, **TOL[dtype])
    torch.testing.assert_close(k_out.double(), ek, **TOL[dtype])


def test_axial_partial_rotary_passes_the_rest():
    rope = AxialRotaryEmbedding(16, 2, rotary_dim=8)
    q = torch.randn(1, 1, 4, 16)
    out, _ = rope(q, q, posenc.positions.grid((2, 2)).reshape(-1, 2))
    torch.testing.assert_close(out[..., 8:], q[..., 8:], atol=0, rtol=0)


def test_axial_matches_qwen2_vl_vision_rope():
    """AxialRotaryEmbedding(d, 2) is transformers' Qwen2-VL vision RoPE (float32 there)."""
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import (
        Qwen2VLVisionRotaryEmbedding,
        apply_rotary_pos_emb_vision,
    )
    from transformers.vision_utils import get_vision_position_ids

    config = Qwen2VLVisionConfig(embed_dim=128, num_heads=4)  # head_dim 32
    peer = Qwen2VLVisionRotaryEmbedding(config)
    grid_thw = torch.tensor([[1, 4, 6], [2, 2, 2]])
    position_ids = get_vision_position_ids(grid_thw, 2)  # [N, 2] (h, w)
    n = position_ids.shape[0]
    q, k = torch.randn(n, 4, 32), torch.randn(n, 4, 32)  # transformers' vision layout [N, h, d]
    cos, sin = peer(q, position_ids)
    want_q, want_k = apply_rotary_pos_emb_vision(q, k, cos, sin)
    rope = AxialRotaryEmbedding(32, 2, base=config.rope_parameters["rope_theta"])
    got_q, got_k = rope(q[None], k[None], position_ids, seq_dim=-3)  # [1, N, h, d]
    torch.testing.assert_close(got_q[0], want_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_k[0], want_k, atol=1e-5, rtol=1e-5)


@settings(max_examples=25)
@given(
    kind=st.sampled_from(["mrope", "axial"]),
    layout=st.sampled_from(LAYOUTS),
    m=st.lists(st.integers(0, 10**5), min_size=3, max_size=3),
    n=st.lists(st.integers(0, 10**5), min_size=3, max_size=3),
    shift=st.lists(st.integers(-(10**5), 10**5), min_size=3, max_size=3),
)
def test_score_depends_only_on_nd_offset(kind, layout, m, n, shift):
    if kind == "mrope":
        rope = RotaryEmbedding(24, sections=(4, 4, 4), layout=layout)
    else:
        rope = AxialRotaryEmbedding(24, 3, layout=layout)
    q, k = torch.randn(2, 1, 1, 1, 24, dtype=torch.float64)

    def score(a, b):
        qr, kr = rope(q, k, torch.tensor([a]), k_positions=torch.tensor([b]))
        return (qr * kr).sum()

    moved = score([x + t for x, t in zip(m, shift)], [x + t for x, t in zip(n, shift)])
    torch.testing.assert_close(moved, score(m, n), atol=1e-9, rtol=1e-9)


def test_decoding_with_nd_positions_equals_full_pass():
    rope = RotaryEmbedding(16, sections=(2, 3, 3))
    q, k = torch.randn(1, 2, 7, 16), torch.randn(1, 1, 7, 16)
    positions = torch.randint(0, 30, (7, 3))
    q_full, k_full = rope(q, k, positions)
    q_one, k_all = rope(q[:, :, -1:], k, positions[-1:], k_positions=positions)
    torch.testing.assert_close(q_one, q_full[:, :, -1:], atol=0, rtol=0)
    torch.testing.assert_close(k_all, k_full, atol=0, rtol=0)
    q_last, _ = rope(q[:, :, -2:], k, k_positions=positions)  # queries: the last 2 keys
    torch.testing.assert_close(q_last, q_full[:, :, -2:], atol=0, rtol=0)


@pytest.mark.parametrize("name", ["rope", "axial_rope"])
def test_registry_round_trip(name):
    args = {"sections": (2, 3, 3)} if name == "rope" else {"n_axes": 3, "axis_dims": (4, 6, 6)}
    pe = posenc.build(name, head_dim=16, **args)
    again = posenc.build(pe.to_config())
    assert again.to_config() == pe.to_config() and type(again) is type(pe)
    torch.testing.assert_close(again.inv_freq, pe.inv_freq, atol=0, rtol=0)


def test_axial_frequencies():
    torch.testing.assert_close(
        axial_frequencies((4, 8), base=50.0), torch.from_numpy(ref.axial_frequencies((4, 8), 50.0))
    )


_Q = torch.randn(1, 2, 4, 16)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda: RotaryEmbedding(16, sections=(2, 3, 4)),
            r"sections must sum to rotary_dim / 2 = 8, got \[2, 3, 4\] \(sum 9\)",
        ),
        (lambda: RotaryEmbedding(16, sections=(4, 0, 4)), r"sections\[1\] must be >= 1"),
        (lambda: RotaryEmbedding(16, sections="448"), "sections must be a sequence"),
        (
            lambda: RotaryEmbedding(16, sections=(2, 3, 3))(_Q, _Q, torch.zeros(4)),
            r"positions must be \[s, 3\] or \[b, s, 3\]",
        ),
        (
            lambda: RotaryEmbedding(16, sections=(2, 3, 3))(_Q, _Q, torch.zeros(5, 3)),
            r"with s == 4, got shape \(5, 3\)",
        ),
        (
            lambda: RotaryEmbedding(16, sections=(2, 3, 3))(_Q, _Q, torch.zeros(2, 4, 3)),
            r"must have b == 1",
        ),
        (
            lambda: RotaryEmbedding(16, sections=(2, 3, 3))(
                _Q, _Q, torch.full((4, 3), float("nan"))
            ),
            "positions must be finite",
        ),
        (lambda: AxialRotaryEmbedding(16, 3), r"divisible by 2 \* n_axes = 6 .* got 16"),
        (lambda: AxialRotaryEmbedding(16, 0), "n_axes must be >= 1, got 0"),
        (lambda: AxialRotaryEmbedding(15, 2), "head_dim must be even"),
        (lambda: AxialRotaryEmbedding(16, 2, axis_dims=(8, 5)), r"axis_dims\[1\] must be even"),
        (lambda: AxialRotaryEmbedding(16, 2, axis_dims=(8,)), "axis_dims must have n_axes = 2"),
        (
            lambda: AxialRotaryEmbedding(16, 2, axis_dims=(8, 10)),
            "axis_dims must sum to <= head_dim",
        ),
        (
            lambda: AxialRotaryEmbedding(16, 2, rotary_dim=12, axis_dims=(8, 8)),
            "axis_dims must sum to rotary_dim = 12",
        ),
        (
            lambda: AxialRotaryEmbedding(16, 2)(_Q, _Q, torch.zeros(4, 3)),
            r"positions must be \[s, 2\]",
        ),
        (lambda: axial_frequencies(()), "axis_dims must name at least one axis"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(PosEncError, match=match):
        call()
