"""p-RoPE (``proportional``), the two partial-rotary placements (``partial="leading"`` /
``"whole_head"``) and interleaved M-RoPE (``section_layout="interleaved"``): whole tensors
against the float64 reference and against transformers' own functions, and bad inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tests.rotary._reference import reference_qk

from posenc import PosEncError, RotaryEmbedding, build
from posenc import reference as ref
from posenc.rotary.apply import section_map
from posenc.rotary.frequencies import ProportionalScaling, rotated_frequencies
from posenc.rotary.layout import LAYOUTS

TOL = {
    torch.float64: {"atol": 1e-10, "rtol": 1e-10},  # the reference: unreduced p * w at 1e5
    torch.float32: {"atol": 2e-6, "rtol": 1e-6},
    torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2},
}


def _qk(head_dim: int, dtype, n: int = 11, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 3, n, head_dim, generator=g)
    k = torch.randn(2, 1, n, head_dim, generator=g)
    return q.to(dtype), k.to(dtype)


@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("partial", ["leading", "whole_head"])
@pytest.mark.parametrize("factor", [1.0, 4.0])
def test_proportional_matches_reference(dtype, layout, partial, factor) -> None:
    rope = RotaryEmbedding(
        32,
        rotary_dim=8,
        base=1e6,
        layout=layout,
        partial=partial,
        scaling=ProportionalScaling(factor=factor),
    )
    q, k = _qk(32, dtype)
    positions = torch.randint(0, 100_000, (2, 11), generator=torch.Generator().manual_seed(1))
    q_out, k_out = rope(q, k, positions)
    eq, ek = reference_qk(rope, q, k, positions)
    assert q_out.dtype == dtype
    torch.testing.assert_close(q_out.double(), eq, **TOL[dtype])
    torch.testing.assert_close(k_out.double(), ek, **TOL[dtype])


@pytest.mark.parametrize("dtype", list(TOL), ids=str)
@pytest.mark.parametrize("scaling", [None, {"type": "linear", "factor": 2.0}])
def test_trailing_matches_reference(dtype, scaling) -> None:
    """DeepSeek-V4's placement: the last 8 of 32 channels, interleaved pairs."""
    rope = RotaryEmbedding(
        32, rotary_dim=8, base=1e4, layout="interleaved", partial="trailing", scaling=scaling
    )
    assert rope.inv_freq.shape == (16,) and not rope.inv_freq[:12].any()
    q, k = _qk(32, dtype)
    positions = torch.randint(0, 100_000, (2, 11), generator=torch.Generator().manual_seed(4))
    for ours, expected in zip(rope(q, k, positions), reference_qk(rope, q, k, positions)):
        torch.testing.assert_close(ours.double(), expected, **TOL[dtype])


@pytest.mark.parametrize(
    ("partial", "layout"),
    [
        ("leading", "half"),
        ("whole_head", "half"),
        ("whole_head", "interleaved"),
        ("trailing", "interleaved"),
    ],
)
def test_channels_that_rotate(partial: str, layout: str) -> None:
    """``"leading"`` rotates channels 0..7 of 32; ``"whole_head"`` (half layout) the pairs
    (i, i + 16), i < 4, (interleaved) channels 0..7; ``"trailing"`` channels 24..31; every
    other channel passes through exactly."""
    rope = RotaryEmbedding(
        32, rotary_dim=8, partial=partial, layout=layout, scaling={"type": "proportional"}
    )
    q, k = _qk(32, torch.float32)
    q_out, _ = rope(q, k, torch.arange(1, 12))
    moved = (q_out - q).abs().amax(dim=(0, 1, 2)) > 0
    expected = torch.zeros(32, dtype=torch.bool)
    if partial == "trailing":
        expected[24:] = True
    elif partial == "whole_head" and layout == "half":
        expected[:4] = expected[16:20] = True
    else:
        expected[:8] = True
    assert torch.equal(moved, expected)


def test_whole_head_frequencies_are_transformers_proportional() -> None:
    """``inv_freq`` equals transformers' ``_compute_proportional_rope_parameters`` (zeros for
    the pairs that do not rotate), and q/k equal its rotation by ``apply_rotary_pos_emb``."""
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    head_dim, fraction, base = 64, 0.25, 1e6
    config = LlamaConfig(
        hidden_size=128,
        num_attention_heads=2,
        head_dim=head_dim,
        rope_parameters={
            "rope_type": "proportional",
            "rope_theta": base,
            "partial_rotary_factor": fraction,
            "factor": 2.0,
        },
    )
    theirs, scale = ROPE_INIT_FUNCTIONS["proportional"](config, "cpu")
    rope = RotaryEmbedding(
        head_dim,
        rotary_dim=2 * int(fraction * head_dim // 2),
        base=base,
        partial="whole_head",
        scaling={"type": "proportional", "factor": 2.0},
    )
    assert rope.inv_freq.shape == theirs.shape == (head_dim // 2,)
    torch.testing.assert_close(rope.inv_freq, theirs.double(), rtol=1e-6, atol=0)
    assert scale == rope.attention_scale == 1.0
    q, k = _qk(head_dim, torch.float32, n=64)
    positions = torch.arange(64)[None]
    freqs = positions[..., None].float() * theirs
    cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
    for ours, tf in zip(rope(q, k, positions), apply_rotary_pos_emb(q, k, cos, sin)):
        torch.testing.assert_close(ours, tf, atol=2e-5, rtol=1e-5)


def test_rotated_frequencies() -> None:
    """The kept frequencies: the first rotary_dim / 2 of the head's (proportional) or the
    rotated channels' own (plain partial rotary), against the reference."""
    ours, _ = rotated_frequencies(64, 16, base=1e4, scaling={"type": "proportional"})
    full, _ = ref.rope_frequencies(64, base=1e4)
    np.testing.assert_allclose(ours.numpy(), full[:8], rtol=1e-15)
    plain, _ = rotated_frequencies(64, 16, base=1e4)
    np.testing.assert_allclose(plain.numpy(), ref.rope_frequencies(16, base=1e4)[0], rtol=1e-15)


def test_config_round_trip() -> None:
    rope = RotaryEmbedding(16, rotary_dim=4, partial="whole_head", scaling={"type": "proportional"})
    config = rope.to_config()
    assert config["partial"] == "whole_head"
    again = build(config)
    assert again.partial == "whole_head" and torch.equal(again.inv_freq, rope.inv_freq)
    assert "partial" not in RotaryEmbedding(16).to_config()  # the default is not written


def test_rotation_then_rotate_equals_forward() -> None:
    rope = RotaryEmbedding(16, rotary_dim=4, partial="whole_head", scaling={"type": "proportional"})
    q, k = _qk(16, torch.float32)
    rotation = rope.rotation(11)
    assert rotation.cos_q.shape[-1] == 8  # head_dim / 2: the pairs that stay at angle 0 too
    for a, b in zip(rope.rotate(q, k, rotation), rope(q, k)):
        assert torch.equal(a, b)


# --- interleaved M-RoPE --------------------------------------------------------------------


def test_interleaved_section_map_is_qwen3_vl() -> None:
    """Qwen3-VL's [24, 20, 20] of 64 frequencies: H at 1, 4, ..., 58, W at 2, 5, ..., 59, T
    the rest (axis 0 first in the map's order)."""
    smap = section_map((24, 20, 20), "interleaved", 64)
    assert smap.counts == (24, 20, 20)
    assert smap.order is not None
    h = [j for j in range(1, 60, 3)]
    w = [j for j in range(2, 60, 3)]
    t = [j for j in range(64) if j not in h and j not in w]
    assert list(smap.order) == t + h + w
    # Qwen3.5's [11, 11, 10] over 128 frequencies: axis 0 takes everything else
    assert section_map((11, 11, 10), "interleaved", 128).counts == (128 - 21, 11, 10)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("sections", [(24, 20, 20), (11, 11, 10), (3, 3)])
def test_interleaved_mrope_matches_reference(dtype, layout, sections) -> None:
    head_dim = 128
    rope = RotaryEmbedding(
        head_dim, base=5e5, layout=layout, sections=sections, section_layout="interleaved"
    )
    q, k = _qk(head_dim, dtype, n=9)
    g = torch.Generator().manual_seed(2)
    positions = torch.randint(0, 50_000, (2, 9, len(sections)), generator=g)
    q_out, k_out = rope(q, k, positions)
    eq, ek = reference_qk(rope, q, k, positions)
    torch.testing.assert_close(q_out.double(), eq, **TOL[dtype])
    torch.testing.assert_close(k_out.double(), ek, **TOL[dtype])


def test_interleaved_mrope_matches_transformers_recomposition() -> None:
    """Qwen3-VL's rotary module's cos/sin (its recomposition of the three axes) against
    posenc's at the same positions."""
    pytest.importorskip("transformers")
    from transformers import Qwen3VLTextConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

    config = Qwen3VLTextConfig()
    module = Qwen3VLTextRotaryEmbedding(config)
    g = torch.Generator().manual_seed(3)
    positions = torch.randint(0, 4000, (1, 32, 3), generator=g)
    x = torch.zeros(1, 1, 32, config.head_dim)
    cos, sin = module(x, positions.permute(2, 0, 1))
    rope = RotaryEmbedding(
        config.head_dim,
        base=config.rope_parameters["rope_theta"],
        sections=(24, 20, 20),
        section_layout="interleaved",
    )
    ours_cos, ours_sin = rope.cos_sin(positions)
    half = config.head_dim // 2
    torch.testing.assert_close(ours_cos, cos[..., :half], atol=2e-3, rtol=0)
    torch.testing.assert_close(ours_sin, sin[..., :half], atol=2e-3, rtol=0)


# --- bad inputs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"partial": "middle"}, "partial must be one of"),
        ({"partial": "trailing", "rotary_dim": 8}, "partial 'trailing' needs layout="),
        ({"partial": True}, "partial"),
        ({"section_layout": "interleaved"}, "section_layout 'interleaved' needs sections"),
        ({"section_layout": "zigzag", "sections": (4, 4)}, "section_layout must be one of"),
        (
            {"partial": "whole_head", "rotary_dim": 8, "sections": (2, 2)},
            "partial must be 'leading' with sections",
        ),
        ({"sections": (16,), "section_layout": "interleaved"}, "two or more axes"),
        ({"scaling": {"type": "proportional", "factor": 0.5}}, "factor"),
        ({"scaling": {"type": "proportional", "fraction": 0.5}}, "unknown key 'fraction'"),
    ],
)
def test_bad_inputs(kwargs: dict, match: str) -> None:
    with pytest.raises(PosEncError, match=match):
        RotaryEmbedding(32, **kwargs)


# --- the reference itself, against numbers worked by hand ----------------------------------


def test_reference_proportional_frequencies_by_hand() -> None:
    """Over a head of 8 at base 10^4: 1, 0.1, 0.01, 0.001, divided by the factor."""
    inv_freq, scale = ref.rope_frequencies(8, base=1e4, scaling={"type": "proportional"})
    np.testing.assert_allclose(inv_freq, [1.0, 0.1, 0.01, 0.001], rtol=1e-15)
    halved, _ = ref.rope_frequencies(8, base=1e4, scaling={"type": "proportional", "factor": 2})
    np.testing.assert_allclose(halved, [0.5, 0.05, 0.005, 0.0005], rtol=1e-15)
    assert scale == 1.0


def test_reference_whole_head_pairs_by_hand() -> None:
    """One pair rotated by pi / 2 in a head of 8: ``"whole_head"`` moves channel 0 to 4,
    ``"leading"`` (r = 2) to 1."""
    x = np.zeros((1, 1, 1, 8))
    x[..., 0] = 1.0
    angles = np.array([[np.pi / 2]])
    whole = ref.apply_rotary(x, angles, partial="whole_head")
    leading = ref.apply_rotary(x, angles)
    np.testing.assert_allclose(whole[0, 0, 0], np.eye(8)[4], atol=1e-15)
    np.testing.assert_allclose(leading[0, 0, 0], np.eye(8)[1], atol=1e-15)


def test_reference_interleaved_sections_by_hand() -> None:
    """Sections (2, 2, 2) over 6 frequencies, interleaved: axes T H W T H W."""
    positions = np.array([[10.0, 20.0, 30.0]])
    angles = ref.sectioned_angles(positions, np.ones(6), (2, 2, 2), "interleaved")
    np.testing.assert_array_equal(angles[0], [10, 20, 30, 10, 20, 30])
    contiguous = ref.sectioned_angles(positions, np.ones(6), (2, 2, 2))
    np.testing.assert_array_equal(contiguous[0], [10, 10, 20, 20, 30, 30])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rotary_dim": 8, "partial": "whole_head", "scaling": {"type": "proportional"}},
        {"rotary_dim": 8, "partial": "trailing", "layout": "interleaved"},
        {"sections": (6, 5, 5), "section_layout": "interleaved"},
    ],
    ids=["whole_head", "trailing", "interleaved_sections"],
)
def test_compiles_in_one_graph(kwargs: dict) -> None:
    """Under ``torch.compile(fullgraph=True, dynamic=True)`` the new placements and the
    interleaved section order give eager's numbers, two lengths with one graph."""
    rope = RotaryEmbedding(32, base=1e4, **kwargs)
    compiled = torch.compile(rope, fullgraph=True, dynamic=True, backend="aot_eager")
    for n in (7, 13):
        q, k = _qk(32, torch.float32, n=n)
        shape = (n, 3) if "sections" in kwargs else (n,)
        positions = torch.randint(0, 5000, shape, generator=torch.Generator().manual_seed(n))
        for a, b in zip(compiled(q, k, positions), rope(q, k, positions)):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
