"""RotaryEmbedding: whole tensors vs the float64 reference, decoding, GQA, state, bad input."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import PosEncError, RotaryEmbedding, XPosEmbedding
from posenc import reference as ref
from posenc.rotary.layout import LAYOUTS

from ._reference import reference_rotation

TOL = {  # float64: the product p * w itself rounds by ~1e-10 at p ~ 1e6 (in both)
    torch.float64: {"atol": 1e-9, "rtol": 1e-9},
    torch.float32: {"atol": 2e-6, "rtol": 1e-6},
    torch.bfloat16: {"atol": 2e-2, "rtol": 1e-2},
}


def _expected(rope, q, k, q_pos, k_pos, *, scaling=None, seq_len=None):
    """The reference rotation of (q, k) with the reference frequencies of `rope`'s options."""
    scaling_dict = None if scaling is None else dict(scaling)
    inv_freq, scale = ref.rope_frequencies(
        rope.rotary_dim, base=rope.base, scaling=scaling_dict, seq_len=seq_len
    )
    return reference_rotation(
        q,
        k,
        q_pos,
        k_pos,
        inv_freq,
        layout=rope.layout,
        attention_scale=scale,
        sections=rope.sections,
        xpos_scale_base=getattr(rope, "scale_base", None),
    )


@pytest.mark.parametrize("positions_kind", ["none", "1d", "2d", "float"])
@pytest.mark.parametrize("rotary_dim", [None, 8], ids=lambda r: f"r{r}")
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", list(TOL), ids=str)
def test_forward_matches_reference(dtype, layout, rotary_dim, positions_kind):
    rope = RotaryEmbedding(16, base=50000.0, rotary_dim=rotary_dim, layout=layout)
    b, s = 2, 6
    q = torch.randn(b, 4, s, 16).to(dtype)
    k = torch.randn(b, 2, s, 16).to(dtype)  # GQA: 4 query heads, 2 key heads
    positions = {
        "none": None,
        "1d": torch.arange(s) + 1000,
        "2d": torch.randint(0, 10**6, (b, s)),
        "float": torch.rand(s, dtype=torch.float64) * 100,
    }[positions_kind]
    q_out, k_out = rope(q, k, positions)
    assert (q_out.dtype, k_out.dtype) == (dtype, dtype)
    pos = torch.arange(s) if positions is None else positions
    eq, ek = _expected(rope, q, k, pos, pos)
    torch.testing.assert_close(q_out.double(), eq, **TOL[dtype])
    torch.testing.assert_close(k_out.double(), ek, **TOL[dtype])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_seq_dim_minus_3_equals_bhsd(layout):
    rope = RotaryEmbedding(8, layout=layout)
    q, k = torch.randn(2, 3, 5, 8), torch.randn(2, 1, 5, 8)
    positions = torch.randint(0, 100, (2, 5))
    q_bshd, k_bshd = q.transpose(1, 2), k.transpose(1, 2)  # strided views, not copies
    got = rope(q_bshd, k_bshd, positions, seq_dim=-3)
    want = rope(q, k, positions)
    torch.testing.assert_close(got[0], want[0].transpose(1, 2), atol=0, rtol=0)
    torch.testing.assert_close(got[1], want[1].transpose(1, 2), atol=0, rtol=0)


def test_decoding_defaults_to_last_positions():
    rope = RotaryEmbedding(8)
    q, k = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    q_full, k_full = rope(q, k)
    q_last, k_all = rope(q[:, :, -2:], k)  # no positions: queries are the last 2 of the keys
    torch.testing.assert_close(q_last, q_full[:, :, -2:], atol=0, rtol=0)
    torch.testing.assert_close(k_all, k_full, atol=0, rtol=0)
    q_tail, _ = rope(q[:, :, -2:], k, k_positions=torch.arange(6) + 7)
    q_shift, _ = rope(q, k, torch.arange(6) + 7)
    torch.testing.assert_close(q_tail, q_shift[:, :, -2:], atol=0, rtol=0)


@settings(max_examples=20)
@given(
    layout=st.sampled_from(LAYOUTS),
    s=st.integers(1, 8),
    n_new=st.integers(1, 8),
    offset=st.integers(0, 2**22),
)
def test_decoding_with_offsets_equals_full_pass(layout, s, n_new, offset):
    """Rotating a cache chunk by chunk with explicit positions equals one full pass."""
    n_new = min(n_new, s)
    rope = RotaryEmbedding(8, layout=layout)
    q, k = torch.randn(1, 2, s, 8), torch.randn(1, 1, s, 8)
    positions = torch.arange(s) + offset
    q_full, k_full = rope(q, k, positions)
    q_new, k_new = rope(q[:, :, -n_new:], k[:, :, -n_new:], positions[-n_new:])
    torch.testing.assert_close(q_new, q_full[:, :, -n_new:], atol=0, rtol=0)
    torch.testing.assert_close(k_new, k_full[:, :, -n_new:], atol=0, rtol=0)
    q_one, k_all = rope(q[:, :, -1:], k, positions[-1:], k_positions=positions)
    torch.testing.assert_close(q_one, q_full[:, :, -1:], atol=0, rtol=0)
    torch.testing.assert_close(k_all, k_full, atol=0, rtol=0)


@settings(max_examples=25)
@given(
    layout=st.sampled_from(LAYOUTS),
    rotary_dim=st.sampled_from([2, 8, 16]),
    m=st.integers(0, 2**20),
    n=st.integers(0, 2**20),
    shift=st.integers(-(2**19), 2**19),
)
def test_score_depends_only_on_offset(layout, rotary_dim, m, n, shift):
    rope = RotaryEmbedding(16, rotary_dim=rotary_dim, layout=layout, base=1e6)
    q, k = torch.randn(2, 1, 1, 1, 16, dtype=torch.float64)

    def score(a, b):
        qr, kr = rope(q, k, torch.tensor([a]), k_positions=torch.tensor([b]))
        return (qr * kr).sum()

    torch.testing.assert_close(score(m + shift, n + shift), score(m, n), atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize(
    "scaling",
    [
        {"type": "linear", "factor": 4.0},
        {"type": "ntk", "factor": 2.0},
        {"type": "yarn", "factor": 4.0, "original_max_position": 32},
        {
            "type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position": 32,
        },
    ],
    ids=lambda s: s["type"],
)
def test_static_scalings_match_reference(scaling):
    rope = RotaryEmbedding(16, scaling=scaling)
    q, k = (
        torch.randn(1, 2, 40, 16, dtype=torch.float64),
        torch.randn(1, 2, 40, 16, dtype=torch.float64),
    )
    pos = torch.arange(40)
    got = rope(q, k, pos)
    want = _expected(rope, q, k, pos, pos, scaling=scaling)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    inv_freq, scale = ref.rope_frequencies(16, scaling=scaling)
    torch.testing.assert_close(rope.inv_freq, torch.from_numpy(inv_freq))
    assert rope.attention_scale == pytest.approx(scale, rel=1e-15)


@pytest.mark.parametrize("length", [20, 32, 33, 70])
def test_dynamic_recomputes_from_largest_position(length):
    scaling = {"type": "dynamic", "factor": 2.0, "max_position": 32}
    rope = RotaryEmbedding(16, scaling=scaling)
    torch.testing.assert_close(rope.inv_freq, torch.from_numpy(ref.rope_frequencies(16)[0]))
    q = torch.randn(1, 1, length, 16, dtype=torch.float64)
    pos = torch.arange(length)
    got = rope(q, q, pos)
    want = _expected(rope, q, q, pos, pos, scaling=scaling, seq_len=length)
    torch.testing.assert_close(got[0], want[0])
    # decoding the last token alone uses the same (largest-position) frequencies
    q_last, _ = rope(q[:, :, -1:], q[:, :, -1:], pos[-1:])
    torch.testing.assert_close(q_last, want[0][:, :, -1:])


@pytest.mark.parametrize("largest", [31, 32, 40])
def test_longrope_switches_at_original_max_position(largest):
    scaling = {
        "type": "longrope",
        "short_factor": [1.0, 1.5, 2.0, 2.5],
        "long_factor": [3.0, 4.0, 5.0, 6.0],
        "original_max_position": 32,
        "factor": 4.0,
    }
    rope = RotaryEmbedding(8, scaling=scaling)
    short, scale = ref.rope_frequencies(8, scaling=scaling)
    torch.testing.assert_close(rope.inv_freq, torch.from_numpy(short))
    assert rope.attention_scale == pytest.approx(scale)
    q = torch.randn(1, 1, 3, 8, dtype=torch.float64)
    pos = torch.tensor([0, 5, largest])
    got = rope(q, q, pos)
    want = _expected(rope, q, q, pos, pos, scaling=scaling, seq_len=largest + 1)
    torch.testing.assert_close(got[0], want[0])


def test_no_state_and_to_bfloat16_keeps_precision():
    rope = RotaryEmbedding(16, scaling={"type": "linear", "factor": 2.0})
    assert rope.state_dict() == {} and list(rope.parameters()) == []
    before = rope.inv_freq.clone()
    q = torch.randn(1, 1, 4, 16)
    pos = torch.tensor([1, 2**22, 2**23 + 1, 2**24 - 3])
    want = rope(q, q, pos)
    rope.to(torch.bfloat16)
    assert rope.inv_freq.dtype == torch.float64
    torch.testing.assert_close(rope.inv_freq, before, atol=0, rtol=0)
    got = rope(q, q, pos)
    torch.testing.assert_close(got[0], want[0], atol=0, rtol=0)


def test_meta_device_construction():
    with torch.device("meta"):
        rope = RotaryEmbedding(
            64, scaling={"type": "yarn", "factor": 2.0, "original_max_position": 64}
        )
    assert rope.inv_freq.device.type == "cpu"
    plain = RotaryEmbedding(
        64, scaling={"type": "yarn", "factor": 2.0, "original_max_position": 64}
    )
    torch.testing.assert_close(rope.inv_freq, plain.inv_freq, atol=0, rtol=0)
    rope.to_empty(device="cpu")
    q = torch.randn(1, 2, 3, 64)
    torch.testing.assert_close(rope(q, q)[0], plain(q, q)[0], atol=0, rtol=0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"rotary_dim": 8, "layout": "interleaved", "base": 5e5},
        {"scaling": {"type": "yarn", "factor": 4, "original_max_position": 64}},
        {
            "scaling": {
                "type": "longrope",
                "short_factor": [1.0] * 8,
                "long_factor": [2.0] * 8,
                "original_max_position": 64,
                "max_position": 256,
            }
        },
        {"sections": (2, 3, 3)},
        {"name": "xpos", "scale_base": 256.0},
        {"name": "xpos", "scale_base": 256.0, "scaling": {"type": "linear", "factor": 2.0}},
    ],
    ids=["default", "partial", "yarn", "longrope", "sections", "xpos", "xpos-linear"],
)
def test_config_round_trip(kwargs):
    rope = posenc.build({"name": "rope", "head_dim": 16, **kwargs})
    assert isinstance(rope, RotaryEmbedding)
    assert "xpos_scale_base" not in rope.to_config()
    again = posenc.build(rope.to_config())
    assert again.to_config() == rope.to_config()
    torch.testing.assert_close(again.inv_freq, rope.inv_freq, atol=0, rtol=0)
    assert again.attention_scale == rope.attention_scale


def test_attributes_are_read_only():
    rope = RotaryEmbedding(8)
    with pytest.raises(AttributeError):
        rope.base = 5e5


def test_cos_sin_method():
    rope = RotaryEmbedding(8, scaling={"type": "yarn", "factor": 4.0, "original_max_position": 16})
    pos = torch.arange(5)
    cos, sin = rope.cos_sin(pos)
    want = posenc.rotary_cos_sin(pos, rope.inv_freq, attention_scale=rope.attention_scale)
    torch.testing.assert_close(cos, want[0], atol=0, rtol=0)
    torch.testing.assert_close(sin, want[1], atol=0, rtol=0)


def test_more_queries_than_keys_default_to_arange():
    """No positions and q longer than k: queries at arange(sq) (posenc.positions.resolve_pair)."""
    rope = RotaryEmbedding(8)
    q, k = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 3, 8)
    got = rope(q, k)
    want = rope(q, k, torch.arange(5), k_positions=torch.arange(3))
    torch.testing.assert_close(got[0], want[0], atol=0, rtol=0)
    torch.testing.assert_close(got[1], want[1], atol=0, rtol=0)


ROTATION_CASES = {
    "rope": ({}, None, None),
    "batched": ({}, torch.randint(0, 50, (2, 4)), None),
    "decode": ({}, torch.tensor([7, 8]), torch.arange(4) + 5),
    "xpos": ({"scale_base": 64.0}, torch.arange(4) + 3, None),
    "xpos-decode": ({"scale_base": 64.0}, None, torch.arange(4) + 2),
    "dynamic": (
        {"scaling": {"type": "dynamic", "factor": 2.0, "max_position": 8}},
        torch.arange(4) + 20,
        None,
    ),
    "partial-interleaved": ({"rotary_dim": 4, "layout": "interleaved"}, None, None),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("case", list(ROTATION_CASES))
def test_rotation_then_rotate_equals_forward(case, dtype):
    """rotation() once + rotate() per (q, k) is forward() exactly, for every variant."""
    kwargs, positions, k_positions = ROTATION_CASES[case]
    rope = (XPosEmbedding if "scale_base" in kwargs else RotaryEmbedding)(8, **kwargs)
    sk = 4 if k_positions is None else k_positions.shape[-1]
    sq = sk if positions is None else positions.shape[-1]
    q, k = torch.randn(2, 4, sq, 8, dtype=dtype), torch.randn(2, 2, sk, 8, dtype=dtype)
    rot = rope.rotation(
        sq,
        sk,
        q_positions=positions,
        k_positions=k_positions,
        batch=2,
        dtype=torch.float64 if dtype == torch.float64 else torch.float32,
    )
    for _ in range(2):  # reusable
        got = rope.rotate(q, k, rot)
        want = rope(q, k, positions, k_positions=k_positions)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        q, k = torch.randn_like(q), torch.randn_like(k)


_Q = torch.randn(1, 2, 3, 8)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: RotaryEmbedding(7), "head_dim must be even .*, got 7"),
        (lambda: RotaryEmbedding(8, rotary_dim=5), "rotary_dim must be even .*, got 5"),
        (
            lambda: RotaryEmbedding(8, rotary_dim=10),
            r"rotary_dim must be <= head_dim \(8\), got 10",
        ),
        (lambda: RotaryEmbedding(8, layout="neox"), "layout must be one of 'half', 'interleaved'"),
        (lambda: RotaryEmbedding(8, base=1.0), "base must be > 1.0, got 1.0"),
        (
            lambda: RotaryEmbedding(8, scaling={"type": "linear", "factor": 0.5}),
            "factor must be >= 1",
        ),
        (lambda: RotaryEmbedding(8, scaling={"type": "what"}), "scaling type must be one of"),
        (
            lambda: RotaryEmbedding(8, scaling={"type": "yarn", "factor": 2.0}),
            "missing required key.*original_max_position",
        ),
        (lambda: RotaryEmbedding(8, sections=(1, 2)), r"sections must sum to rotary_dim / 2 = 4"),
        (lambda: RotaryEmbedding(8)(torch.randn(1, 2, 3, 6), _Q), "q must have last dimension 8"),
        (lambda: RotaryEmbedding(8)(_Q, torch.randn(1, 2, 3, 6)), "k must have last dimension 8"),
        (lambda: RotaryEmbedding(8)(_Q[0], _Q), r"q must be \[b, h, s, d\]"),
        (lambda: RotaryEmbedding(8)(_Q, torch.randn(2, 2, 3, 8)), "same batch size"),
        (
            lambda: RotaryEmbedding(8)(_Q, _Q, torch.arange(4)),
            r"positions must have length 3 \(the sequence length\)",
        ),
        (lambda: RotaryEmbedding(8)(_Q, _Q, torch.zeros(2, 3)), r"must have b == 1"),
        (
            lambda: RotaryEmbedding(8)(_Q, _Q, torch.tensor([0.0, float("nan"), 2.0])),
            "positions must be finite",
        ),
        (
            lambda: RotaryEmbedding(8)(_Q, _Q, k_positions=torch.tensor([0.0, 1.0, float("inf")])),
            "k_positions must be finite",
        ),
        (
            lambda: RotaryEmbedding(8)(_Q, torch.randn(1, 2, 5, 8), torch.arange(3)),
            "k_positions must be given when q and k lengths differ",
        ),
        (
            lambda: RotaryEmbedding(8).rotate(_Q, _Q, RotaryEmbedding(8).rotation(4)),
            r"cos must be \[s, r/2\] or \[b, s, r/2\] with s == 3",
        ),
        (
            lambda: RotaryEmbedding(8).rotate(_Q, _Q, RotaryEmbedding(4).rotation(3)),
            r"rotation.cos_q must have 4 frequencies",
        ),
        (lambda: RotaryEmbedding(8).rotate(_Q, _Q, (1, 2, 3, 4)), "rotation must be a Rotation"),
        (
            lambda: RotaryEmbedding(8).rotation(3, dtype=torch.bfloat16),
            "dtype must be torch.float32",
        ),
        (lambda: RotaryEmbedding(8).rotation(0), "q_len must be >= 1"),
        (lambda: RotaryEmbedding(8)(_Q, _Q, seq_dim=-1), "seq_dim must be one of -2, -3, got -1"),
        (
            lambda: RotaryEmbedding(8, sections=(2, 2))(_Q, _Q, torch.zeros(3, 3)),
            r"positions must be \[s, 2\] or \[b, s, 2\]",
        ),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(PosEncError, match=match):
        call()
