"""The cos/sin table (posenc.rotary.cache): the numbers the call would compute, and when
it is used, grows, or steps aside."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

import posenc
from posenc.rotary.apply import rotary_cos_sin
from posenc.rotary.cache import CosSinTable
from posenc.rotary.kernels.torch_engine import paired


def computed(rope: posenc.RotaryEmbedding, positions: torch.Tensor, dtype: torch.dtype):
    """cos/sin of the module's frequencies, computed from the float64 angles (no table)."""
    return rotary_cos_sin(
        positions, rope.inv_freq, attention_scale=rope.attention_scale, dtype=dtype
    )


SCALINGS = {
    "none": None,
    "linear": {"type": "linear", "factor": 4.0},
    "yarn": {"type": "yarn", "factor": 8.0, "original_max_position": 2048},
    "llama3": {
        "type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position": 8192,
    },
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("scaling", list(SCALINGS), ids=str)
@pytest.mark.parametrize(
    "positions",
    [
        torch.arange(7),
        torch.tensor([[3, 9000, 0], [131071, 17, 5]]),  # [b, s], grows the table
        torch.arange(100, 140, dtype=torch.int32).view(2, 20),
    ],
    ids=["arange", "batched-far", "int32"],
)
def test_table_equals_the_computed_values(dtype, scaling, positions):
    rope = posenc.RotaryEmbedding(64, scaling=SCALINGS[scaling])
    cos, sin = rope.cos_sin(positions, dtype=dtype)
    assert rope.cos_sin_table is not None and rope.cos_sin_table.rows[dtype] > positions.max()
    want_cos, want_sin = computed(rope, positions, dtype)
    assert cos.dtype == dtype and cos.shape == want_cos.shape == (*positions.shape, 32)
    assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_forward_with_the_table_equals_forward_without(layout):
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 6, 32, generator=gen), torch.randn(2, 2, 6, 32, generator=gen)
    positions = torch.tensor([[0, 1, 2, 3, 4, 5], [70000, 70001, 70002, 9, 8, 7]])
    with_table = posenc.RotaryEmbedding(32, layout=layout)
    without = posenc.RotaryEmbedding(32, layout=layout)
    without.cos_sin_table.max_bytes = 0  # off: every call computes
    for a, b in zip(with_table(q, k, positions), without(q, k, positions)):
        assert torch.equal(a, b)
    assert with_table.cos_sin_table.rows and not without.cos_sin_table.rows


def test_grows_to_powers_of_two_and_is_shared_by_queries_and_keys():
    rope = posenc.RotaryEmbedding(16)
    rot = rope.rotation(3, q_positions=torch.tensor([1, 2, 3]))
    assert rope.cos_sin_table.rows == {torch.float32: 4096}
    assert rot.cos_k is rot.cos_q  # the same tokens: one gather
    rope.cos_sin(torch.tensor([4096]))
    assert rope.cos_sin_table.rows == {torch.float32: 8192}
    rope.cos_sin(torch.tensor([5000]), dtype=torch.float64)
    assert rope.cos_sin_table.rows == {torch.float32: 8192, torch.float64: 8192}


@pytest.mark.parametrize(
    "positions",
    [
        torch.tensor([-1, 0, 1]),  # negative: computed
        torch.tensor([0.5, 1.0]),  # floating: computed
        torch.tensor([1 << 40]),  # past the cap: computed, nothing grows
        torch.zeros(0, dtype=torch.int64),  # empty
        torch.tensor([1, 2], dtype=torch.int16),  # an index dtype embedding does not take
    ],
    ids=["negative", "float", "past-cap", "empty", "int16"],
)
def test_positions_the_table_does_not_serve_are_computed(positions):
    rope = posenc.RotaryEmbedding(16)
    cos, sin = rope.cos_sin(positions)
    want_cos, want_sin = computed(rope, positions, torch.float32)
    assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    assert rope.cos_sin_table.rows == {}


def test_cap_limits_growth():
    rope = posenc.RotaryEmbedding(16)  # 16 float32 numbers (64 bytes) per position
    rope.cos_sin_table.max_bytes = 64 * 5000
    rope.cos_sin(torch.tensor([4999]))
    assert rope.cos_sin_table.rows == {torch.float32: 5000}  # capped below the power of two
    cos, _ = rope.cos_sin(torch.tensor([5000]))  # one past: computed
    assert torch.equal(cos, computed(rope, torch.tensor([5000]), torch.float32)[0])
    assert rope.cos_sin_table.rows == {torch.float32: 5000}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"scaling": {"type": "dynamic", "factor": 2.0, "max_position": 64}},
        {"sections": (4, 4)},
    ],
    ids=["dynamic", "sections"],
)
def test_no_table_where_cos_sin_depend_on_more_than_the_position(kwargs):
    assert posenc.RotaryEmbedding(16, **kwargs).cos_sin_table is None


def test_no_state_pickle_and_deepcopy_carry_no_table():
    rope = posenc.RotaryEmbedding(16)
    rope.cos_sin(torch.arange(10))
    assert rope.state_dict() == {}
    for clone in (pickle.loads(pickle.dumps(rope)), copy.deepcopy(rope)):
        assert clone.cos_sin_table.rows == {}
        assert torch.equal(clone.cos_sin(torch.arange(10))[0], rope.cos_sin(torch.arange(10))[0])


def test_xpos_uses_the_float64_table():
    xpos = posenc.XPosEmbedding(16, scale_base=512.0)
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 2, 5, 16, generator=gen), torch.randn(1, 2, 5, 16, generator=gen)
    first = xpos(q, k, torch.arange(5))
    assert xpos.cos_sin_table.rows == {torch.float64: 4096}
    xpos.cos_sin_table.max_bytes = 0
    xpos.cos_sin_table._tables.clear()
    for a, b in zip(first, xpos(q, k, torch.arange(5))):
        assert torch.equal(a, b)


def test_a_table_built_directly():
    inv_freq = torch.tensor([1.0, 0.25], dtype=torch.float64)
    table = CosSinTable(inv_freq, 0.5)
    cos, sin = table.lookup(torch.tensor([[2, 3]]), torch.float32)
    theta = torch.tensor([[2.0, 0.5], [3.0, 0.75]], dtype=torch.float64)[None]
    torch.testing.assert_close(cos, (0.5 * theta.cos()).float(), rtol=0, atol=0)
    torch.testing.assert_close(sin, (0.5 * theta.sin()).float(), rtol=0, atol=0)


def test_lowering_the_cap_drops_tables_that_no_longer_fit():
    rope = posenc.RotaryEmbedding(16)
    rope.cos_sin(torch.arange(3))  # 4096 positions x 64 bytes
    rope.cos_sin(torch.arange(3), dtype=torch.float64)  # 4096 x 128 bytes
    rope.cos_sin_table.max_bytes = 4096 * 64
    assert rope.cos_sin_table.rows == {torch.float32: 4096}


@pytest.mark.parametrize("value", [-1, 1.5, "big", None, True])
def test_bad_cap_is_refused(value):
    rope = posenc.RotaryEmbedding(16)
    with pytest.raises(posenc.PosEncError, match="max_bytes"):
        rope.cos_sin_table.max_bytes = value


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_cos_sin_in_16_bits_rounds_the_float64_values_once(dtype):
    rope = posenc.RotaryEmbedding(16)
    positions = torch.tensor([0, 5, 3000])
    cos, sin = rope.cos_sin(positions, dtype=dtype)
    want_cos, want_sin = rope.cos_sin(positions, dtype=torch.float64)
    assert torch.equal(cos, want_cos.to(dtype)) and torch.equal(sin, want_sin.to(dtype))


@pytest.mark.parametrize(
    "positions",
    [torch.tensor([3, -1, 2]), torch.tensor([[0, 5000]]), torch.tensor([7, 1])],
    ids=["negative", "past-the-rows", "held"],
)
def test_a_table_already_built_serves_what_it_holds_and_nothing_else(positions):
    """Once a table exists the gather's own bounds check decides: a negative position is
    computed (nothing grows), one past the rows grows the table, held rows are gathered."""
    rope = posenc.RotaryEmbedding(16)
    rope.cos_sin(torch.arange(4))  # builds the table
    rows = rope.cos_sin_table.rows[torch.float32]
    cos, sin = rope.cos_sin(positions)
    want_cos, want_sin = computed(rope, positions, torch.float32)
    assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    grown = rope.cos_sin_table.rows[torch.float32]
    assert grown == (8192 if int(positions.max()) >= rows else rows)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("scaling", ["none", "yarn"], ids=str)
@pytest.mark.parametrize(
    "positions",
    [torch.arange(7), torch.tensor([[3, 9000, 0], [131071, 17, 5]])],
    ids=["arange", "batched-far"],
)
def test_the_paired_table_holds_the_pairs_of_the_table(layout, scaling, positions):
    """``lookup_paired`` / ``leading_paired``: the bits of :func:`torch_engine.paired` of the
    float32 rows, from a table of their own (no float32 table is built for them)."""
    rope = posenc.RotaryEmbedding(16, scaling=SCALINGS[scaling])
    table = rope.cos_sin_table
    got = table.lookup_paired(positions, layout)
    assert table.rows == {} and table.paired_rows[layout] > positions.max()
    want = paired(*computed(rope, positions, torch.float32), layout)
    for a, b in zip(got, want):
        assert a.shape == (*positions.shape, 16) and torch.equal(a, b)
    leading = table.leading_paired(7, layout)
    for a, b in zip(leading, paired(*computed(rope, torch.arange(7), torch.float32), layout)):
        assert torch.equal(a, b)


def test_the_paired_table_is_capped_dropped_and_not_carried():
    """The paired table holds the positions the float32 table holds under ``max_bytes``
    (in twice its bytes): past them both answer None; lowering the cap drops both; a
    pickled module carries none."""
    rope = posenc.RotaryEmbedding(16)  # float32 rows: 16 numbers (64 bytes); paired: 32
    table = rope.cos_sin_table
    table.max_bytes = 64 * 5000
    assert table.lookup_paired(torch.tensor([4999]), "half") is not None
    assert table.lookup_paired(torch.tensor([5000]), "interleaved") is None
    assert table.lookup(torch.tensor([4999]), torch.float32) is not None
    assert table.lookup(torch.tensor([5000]), torch.float32) is None
    assert table.paired_rows == {"half": 5000} and table.rows == {torch.float32: 5000}
    assert pickle.loads(pickle.dumps(rope)).cos_sin_table.paired_rows == {}
    table.max_bytes = 64 * 4999
    assert table.paired_rows == {} and table.rows == {}
