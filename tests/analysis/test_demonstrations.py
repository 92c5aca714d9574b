"""The classic order-sensitivity demonstrations give the answers the theory predicts."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc import PosEncError
from posenc.analysis import order_sensitivity


@pytest.fixture(scope="module")
def demo():
    return order_sensitivity()


def test_mean_pooling_cannot_tell_the_orders_apart(demo):
    gen = torch.Generator().manual_seed(0)
    table = torch.randn(3, 16, generator=gen)  # the demonstration's embeddings, vocab sorted
    vocab = ["chase", "jerry", "tom"]
    assert list(demo.vocabulary) == vocab
    a = table[[vocab.index(w) for w in "tom chase jerry".split()]].mean(0)
    b = table[[vocab.index(w) for w in "jerry chase tom".split()]].mean(0)
    assert demo.mean_pooling.pooled_distance == pytest.approx(float((a - b).norm()), abs=1e-6)
    assert not demo.mean_pooling.tells_apart
    assert demo.mean_pooling.scale == pytest.approx(float(table.norm(dim=-1).mean()))


def test_naive_index_still_cannot_and_swamps_the_tokens(demo):
    assert not demo.index_pooling.tells_apart
    sw = demo.index_swamping
    assert sw.position_norm == pytest.approx(100 * math.sqrt(16))  # PE(100) = 100 per channel
    assert sw.ratio == pytest.approx(sw.position_norm / demo.mean_pooling.scale)
    assert sw.ratio > 50 and sw.encoded_cosine > 0.999 > sw.token_cosine


def test_attention_without_positions_is_permutation_equivariant(demo):
    rows = {row.label: row for row in demo.attention}
    assert rows["no positions"].permutation_equivariant
    assert rows["no positions"].max_word_distance < 1e-5 * rows["no positions"].scale
    for label in (
        "sinusoidal added to embeddings",
        "RoPE in attention",
        "ALiBi in causal attention",
        "no positions, causal mask",
    ):
        assert not rows[label].permutation_equivariant, label
        assert rows[label].max_word_distance > 0.01 * rows[label].scale, label
    # reversal keeps every |i - j|: a symmetric bias in bidirectional attention cannot see it
    assert rows["symmetric ALiBi, bidirectional"].permutation_equivariant


@settings(max_examples=6)
@given(order=st.permutations(["a", "b", "c", "d"]))
def test_any_reordering_only_permutes_outputs_without_positions(order):
    r = order_sensitivity(("a b c d", " ".join(order)), dim=8, num_heads=1)
    rows = {row.label: row for row in r.attention}
    assert rows["no positions"].permutation_equivariant
    assert not r.mean_pooling.tells_apart and not r.index_pooling.tells_apart
    moved = list(order) != ["a", "b", "c", "d"]
    assert rows["RoPE in attention"].permutation_equivariant is not moved
    assert rows["sinusoidal added to embeddings"].permutation_equivariant is not moved


def test_to_dict_is_json(demo):
    data = json.loads(json.dumps(demo.to_dict(), allow_nan=False))
    assert data["sentences"] == ["tom chase jerry", "jerry chase tom"]
    assert len(data["attention"]) == 6


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sentences": ("tom chase jerry", "tom chase")}, "two orderings of the same"),
        ({"sentences": ("tom tom", "tom tom")}, "distinct words"),
        ({"sentences": "tom chase jerry"}, "two strings"),
        ({"dim": 6, "num_heads": 2}, "dim must be divisible by 2 \\* num_heads"),
        ({"num_heads": 0}, "num_heads must be >= 1"),
        ({"swamp_position": -1}, "swamp_position must be >= 0"),
    ],
)
def test_bad_input_raises(kwargs, match):
    with pytest.raises(PosEncError, match=match):
        order_sensitivity(**kwargs)
