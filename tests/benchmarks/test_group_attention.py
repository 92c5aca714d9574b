"""``benchmarks/group_attention.py``: llama-completion's group-attention procedure (batches,
cache moves), the relative positions it gives, and its replay in transformers (the emitted
flags read back by ``benchmarks/engines.py``: ``test_engines_flags.py``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"posenc_test_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


ga = _load("group_attention")
Batch, Move = ga.Batch, ga.Move


def test_schedule_of_three_blocks() -> None:
    """G = 2, W = 4, batches of 4: after block 1 its keys are divided to 0, 0, 1, 1 and
    block 2 starts at 2; before block 3, block 2 is shifted back to 4..7, divided to 2..3,
    and block 3 starts at 4 (llama-completion's arithmetic, by hand)."""
    assert list(ga.schedule(12, 2, 4, 4)) == [
        Batch(0, 4, 0, ()),
        Batch(4, 8, 2, (Move("add", 0, 4, 0), Move("div", 0, 4, 2), Move("add", 4, 4, -2))),
        Batch(8, 12, 4, (Move("add", 2, 6, 2), Move("div", 4, 8, 2), Move("add", 8, 8, -4))),
    ]


@pytest.mark.parametrize(
    "group, window, n_batch", [(3, 4, 4), (0, 4, 4), (2, 4, 0)], ids=["W % G", "G 0", "batch 0"]
)
def test_schedule_refuses_what_llama_completion_asserts(
    group: int, window: int, n_batch: int
) -> None:
    with pytest.raises(ValueError, match="W a multiple of G"):
        list(ga.schedule(8, group, window, n_batch))


def test_apply_moves_turns_keys_both_ways() -> None:
    positions = np.arange(8)
    moves = (Move("add", 6, 8, 3), Move("div", 0, 6, 2))
    new, intended = ga.apply_moves(positions, moves, "intended")
    _, flipped = ga.apply_moves(positions, moves, "llama.cpp")
    np.testing.assert_array_equal(new, [0, 0, 1, 1, 2, 2, 9, 10])
    np.testing.assert_array_equal(intended, new - positions)
    np.testing.assert_array_equal(flipped, [0, 1, 1, 2, 2, 3, 3, 3])  # divisions negated
    with pytest.raises(ValueError, match="below 0"):
        ga.apply_moves(positions, (Move("add", 0, 2, -1),))
    with pytest.raises(ValueError, match="rotation must be one of"):
        ga.apply_moves(positions, moves, "sideways")


@settings(max_examples=40, deadline=None)
@given(
    group=st.integers(1, 4),
    per=st.integers(1, 4),
    blocks=st.integers(1, 4),
    extra=st.integers(0, 3),
    rows=st.integers(1, 7),
)
def test_relative_positions_with_batches_of_w(
    group: int, per: int, blocks: int, extra: int, rows: int
) -> None:
    """Batches of W: query ``k W + r`` sits at ``k W / G + r``, keys of earlier blocks at
    ``j // G``, keys of its own block at their offset in it (the module's closed form)."""
    window = group * per
    n = blocks * window + extra
    got = np.full((n, n), -1)
    for start, stop, rel in ga.relative_positions(n, group, window, window, rows=rows):
        got[start:stop, : rel.shape[1]] = rel
    want = np.full((n, n), -1)
    for i in range(n):
        k, r = divmod(i, window)
        query = k * window // group + r if group > 1 else i
        for j in range(i + 1):
            key = j // group if j < k * window else k * window // group + (j - k * window)
            want[i, j] = query - (key if group > 1 else j)
    np.testing.assert_array_equal(got, want)


def test_map_difference_counts_pairs_against_longlm() -> None:
    n, group, window = 12, 2, 4
    rel = np.full((n, n), -1.0)
    for start, stop, part in ga.relative_positions(n, group, window, window):
        rel[start:stop, : part.shape[1]] = part
    gaps = [
        abs(rel[i, j] - (i - j if i - j < window else i // 2 + window - window / 2 - j // 2))
        for i in range(n)
        for j in range(i + 1)
    ]
    assert ga.map_difference(n, group, window, window) == {
        "pairs": 78,
        "pairs_differing": sum(g > 0 for g in gaps),
        "fraction_differing": sum(g > 0 for g in gaps) / 78,
        "mean_abs_difference": sum(gaps) / 78,
        "max_abs_difference": max(gaps),
    }


@given(i=st.integers(0, 200), back=st.integers(0, 200), group=st.integers(1, 8))
def test_self_extend_relative_is_longlms(i: int, back: int, group: int) -> None:
    j, window = max(i - back, 0), 16
    got = ga.self_extend_relative(np.array([i]), np.array([j]), group, window)[0]
    want = i - j if i - j < window else i // group + window - window / group - j // group
    assert got == want


def test_batch_nll_is_float64_cross_entropy() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 9, generator=g) * 20
    targets = [1, 8, 0, 3]
    want = torch.nn.functional.cross_entropy(
        logits[:4].double(), torch.tensor(targets), reduction="none"
    ).numpy()
    got = ga.batch_nll(logits.numpy(), targets)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def _tiny_llama() -> Any:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        initializer_range=0.2,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize("rotation", ["intended", "llama.cpp"])
def test_torch_replay_turns_cached_keys_to_their_moved_positions(rotation: str) -> None:
    """One layer, G = 2, W = 4, 8 tokens: block 2's losses equal one forward where block 1's
    keys sit where the moves turned them (``j // 2``; llama.cpp's ``pos_div``:
    ``2 j - j // 2``) and block 2 at ``2 + r``; block 1's are a plain forward's."""
    model = _tiny_llama()
    ids = [int(t) for t in torch.randint(0, 50, (8,), generator=torch.Generator().manual_seed(1))]
    got = ga.torch_replay_nll(model, ids, 2, 4, 4, rotation)["nll"]
    keys = [j // 2 if rotation == "intended" else 2 * j - j // 2 for j in range(4)]
    with torch.no_grad():
        first = model(torch.tensor([ids[:4]])).logits[0]
        second = model(torch.tensor([ids]), position_ids=torch.tensor([[*keys, 2, 3, 4, 5]]))
    want = np.concatenate(
        [
            ga.batch_nll(first.numpy(), ids[1:5]),
            ga.batch_nll(second.logits[0, 4:].numpy(), ids[5:]),
        ]
    )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
