"""Issue 24: NumPy integers are counts wherever a Python int is (never a NumPy bool);
roformer_bound's inv_freq must be floating; every result dataclass checks its fields."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from posenc import PosEncError, analysis
from posenc.analysis import roformer_bound
from posenc.analysis.demonstrations import AttentionDemo, PoolingDemo, SwampingDemo
from posenc.analysis.properties import Collision

# name -> (the call with Python ints, the same with NumPy integers)
CALLS = {
    "boundedness": (
        lambda: analysis.boundedness("sinusoidal", 16),
        lambda: analysis.boundedness("sinusoidal", np.int64(16)),
    ),
    "boundedness-range": (
        lambda: analysis.boundedness("alibi", (2, 18)),
        lambda: analysis.boundedness("alibi", (np.int32(2), np.int64(18))),
    ),
    "uniqueness": (
        lambda: analysis.uniqueness("rope", 16, max_examples=2),
        lambda: analysis.uniqueness("rope", np.int16(16), max_examples=np.int64(2)),
    ),
    "shift_structure": (
        lambda: analysis.shift_structure("sinusoidal", 16, offsets=[1, 2]),
        lambda: analysis.shift_structure("sinusoidal", np.int64(16), offsets=[np.int64(1), 2]),
    ),
    "decay": (
        lambda: analysis.decay("rope", 8, anchors=2),
        lambda: analysis.decay("rope", np.int64(8), anchors=np.uint8(2)),
    ),
    "properties": (
        lambda: analysis.properties("t5", 16, shift_positions=8, max_distance=8),
        lambda: analysis.properties(
            "t5", np.int64(16), shift_positions=np.int32(8), max_distance=np.int64(8)
        ),
    ),
    "order_sensitivity": (
        lambda: analysis.order_sensitivity(dim=8, num_heads=2, swamp_position=10, seed=1),
        lambda: analysis.order_sensitivity(
            dim=np.int64(8), num_heads=np.int64(2), swamp_position=np.int64(10), seed=np.int64(1)
        ),
    ),
}


@pytest.mark.parametrize("name", CALLS)
def test_numpy_integers_are_counts(name):
    """positions=np.int64(16) was refused ('must be a count ...')."""
    python, numpy = CALLS[name]
    a, b = numpy(), python()
    assert type(a) is type(b)
    _same(a.to_dict(), b.to_dict())


def _same(a, b) -> None:
    """Equal, floats to rel 1e-9 or abs 1e-6: quantities at rounding level vary with the
    order torch sums in (threads, vector width): least-squares residuals of 1e-16, and
    shift_structure's dot spreads of float32 products, about 1e-8 (one failed a 1e-12
    bound in a full run, passing alone). The test is about the arguments' types."""
    if isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-6)
    elif isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a == b and type(a) is type(b)


@pytest.mark.parametrize("flag", [True, np.bool_(True)], ids=["bool", "numpy-bool"])
def test_bools_are_no_counts(flag):
    with pytest.raises(PosEncError, match="positions must be a count"):
        analysis.boundedness("sinusoidal", flag)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8], ids=str)
def test_roformer_bound_refuses_integer_frequencies(dtype):
    """An integer inv_freq was silently accepted."""
    with pytest.raises(PosEncError, match=f"inv_freq must be a floating tensor .*got {dtype}"):
        roformer_bound(torch.tensor([1, 2], dtype=dtype), torch.arange(3))
    want = roformer_bound(torch.tensor([1.0, 2.0], dtype=torch.float64), torch.arange(3))
    got = roformer_bound(torch.tensor([1.0, 2.0], dtype=torch.float32), torch.arange(3))
    torch.testing.assert_close(got, want, atol=0, rtol=0)


# --- the result dataclasses -----------------------------------------------------------------


def _results() -> dict[str, object]:
    p = analysis.properties("alibi", 16, shift_positions=8, max_distance=8)
    demo = analysis.order_sensitivity(dim=8, num_heads=2, swamp_position=10)
    u = analysis.uniqueness({"name": "sinusoidal", "dim": 2}, torch.tensor([0.0, 1.0, 2 * math.pi]))
    return {
        "Boundedness": p.boundedness,
        "Uniqueness": u,
        "Collision": u.collisions[0],
        "ShiftStructure": analysis.shift_structure("rope", 16),
        "Decay": analysis.decay("rope", 8, anchors=2),
        "Properties": p,
        "OrderSensitivity": demo,
        "PoolingDemo": demo.mean_pooling,
        "SwampingDemo": demo.index_swamping,
        "AttentionDemo": demo.attention[0],
    }


RESULTS = _results()


@pytest.mark.parametrize("name", RESULTS)
def test_a_result_rebuilt_from_its_fields_is_equal(name):
    result = RESULTS[name]
    fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
    assert type(result)(**fields) == result
    as_lists = {k: list(v) if isinstance(v, tuple) else v for k, v in fields.items()}
    assert type(result)(**as_lists) == result  # lists are stored as tuples


# (result, field, bad value, the message's match)
BAD = [
    ("Boundedness", "kind", "bogus", "kind must be one of 'additive', 'rotary', 'bias', 'none'"),
    ("Boundedness", "unit", "tokens", "unit must be one of 'position', 'distance'"),
    ("Boundedness", "encoding", "", "encoding must be a non-empty str"),
    ("Boundedness", "norms", (1.0, float("nan")), r"norms\[1\] must be finite, got nan"),
    ("Boundedness", "norms", (1.0, math.inf), r"norms\[1\] must be finite, got inf"),
    ("Boundedness", "norms", "ab", "norms must be a tuple, got str"),
    ("Boundedness", "norms", {0: 1.0}, "norms must be a tuple, got dict"),
    ("Boundedness", "max_norm", "1.0", "max_norm must be a number"),
    ("Boundedness", "max_norm", True, "max_norm must be a number"),
    ("Boundedness", "bounded", 1, "bounded must be True or False"),
    ("Boundedness", "first_swamping", float("nan"), "first_swamping must be finite"),
    ("Uniqueness", "num_positions", -1, "num_positions must be >= 0"),
    ("Uniqueness", "num_positions", 2.5, "num_positions must be an integer"),
    ("Uniqueness", "num_positions", 2**64, "num_positions must fit in a 64-bit integer"),
    ("Uniqueness", "dtype", "float33", "dtype must be one of"),
    ("Uniqueness", "position_dtype", "bool", "position_dtype must be one of"),
    ("Uniqueness", "closest_pair", (1.0,), "closest_pair must hold 2 values, got 1"),
    ("Uniqueness", "collisions", (3,), r"collisions\[0\] must be a Collision, got int"),
    ("Collision", "distance", float("nan"), "distance must be finite"),
    ("ShiftStructure", "offsets", (-1,), r"offsets\[0\] must be >= 0"),
    ("Decay", "distances", (True,), r"distances\[0\] must be an integer"),
    ("Decay", "per_head", ((1.0,), ("x",)), r"per_head\[1\]\[0\] must be a number"),
    (
        "Properties",
        "config",
        {"name": "alibi", "no_such_key": 1},
        r"config of encoding 'alibi' has unknown keys \['no_such_key'\]",
    ),
    ("Properties", "config", {"num_heads": 4}, "config must hold the encoding's 'name'"),
    ("Properties", "config", [("name", "alibi")], "config must be a dict"),
    ("Properties", "decay", 3, "decay must be a Decay, got int"),
    ("OrderSensitivity", "seed", 2.0, "seed must be an integer"),
    ("OrderSensitivity", "dim", -1, "dim must be >= 0"),
    ("OrderSensitivity", "sentences", ("a b",), "sentences must hold 2 values"),
    ("PoolingDemo", "tells_apart", "yes", "tells_apart must be True or False"),
    ("SwampingDemo", "words", ("a", 3), r"words\[1\] must be a non-empty str, got 3"),
    ("AttentionDemo", "word_distances", {"": 1.0}, "word_distances must have non-empty str keys"),
    ("AttentionDemo", "word_distances", {"a": "x"}, r"word_distances\['a'\] must be a number"),
    ("AttentionDemo", "word_distances", {}, "word_distances must hold one distance per word"),
    (
        "AttentionDemo",
        "max_word_distance",
        1.0,
        "max_word_distance must be the largest of word_distances",
    ),
    ("AttentionDemo", "where", "bogus", "where must be one of 'none', 'embeddings', 'attention'"),
    ("Properties", "encoding", "bogus", "encoding and kind must be those config builds"),
    ("Properties", "kind", "rotary", "encoding and kind must be those config builds"),
    ("Properties", "config", {"name": "alibi", "num_heads": "8"}, "num_heads must be an integer"),
    ("OrderSensitivity", "vocabulary", ("x", "y", "z"), "vocabulary must be the sentences' words"),
    ("OrderSensitivity", "sentences", ("a b", "b c"), "sentences must be two orderings"),
    (
        "OrderSensitivity",
        "sentences",
        ("tom likes jerry", "jerry likes tom"),
        "vocabulary must be the sentences' words",
    ),
]


@pytest.mark.parametrize(
    ("name", "field", "value", "match"), BAD, ids=[f"{b[0]}-{b[1]}-{i}" for i, b in enumerate(BAD)]
)
def test_a_bad_field_is_named(name, field, value, match):
    with pytest.raises(PosEncError, match=match):
        dataclasses.replace(RESULTS[name], **{field: value})


def test_signed_seed_and_normalised_numbers():
    demo = RESULTS["OrderSensitivity"]
    assert dataclasses.replace(demo, seed=-3).seed == -3
    boundedness = dataclasses.replace(
        RESULTS["Boundedness"], max_norm=np.float32(2.5), swamp_ratio=2
    )
    assert type(boundedness.max_norm) is float and boundedness.max_norm == 2.5
    assert type(boundedness.swamp_ratio) is float
    assert dataclasses.replace(RESULTS["Uniqueness"], num_positions=np.int64(3)).num_positions == 3
    assert isinstance(RESULTS["PoolingDemo"], PoolingDemo)
    assert isinstance(RESULTS["SwampingDemo"], SwampingDemo)
    assert isinstance(RESULTS["AttentionDemo"], AttentionDemo)
    assert isinstance(RESULTS["Collision"], Collision)
