import pytest
import torch

import posenc
from posenc import positions


def test_arange_offset():
    assert torch.equal(positions.arange(4, offset=3), torch.tensor([3, 4, 5, 6]))


@pytest.mark.parametrize(
    ("lens", "expected"),
    [([3, 2], [0, 1, 2, 0, 1]), ([1], [0]), ([0, 2], [0, 1]), ([2, 0, 1], [0, 1, 0])],
)
def test_from_seq_lens(lens, expected):
    assert torch.equal(positions.from_seq_lens(lens), torch.tensor(expected))


def test_from_cu_seqlens_equals_seq_lens():
    cu = torch.tensor([0, 3, 3, 7], dtype=torch.int32)
    assert torch.equal(positions.from_cu_seqlens(cu), positions.from_seq_lens([3, 0, 4]))


def test_from_attention_mask_left_padding():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])
    expected = torch.tensor([[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 0, 0, 0, 0]])
    assert torch.equal(positions.from_attention_mask(mask), expected)
    assert torch.equal(positions.from_attention_mask(mask.bool()), expected)


def test_grid():
    g = positions.grid((2, 3))
    assert g.shape == (2, 3, 2)
    assert g[1, 2].tolist() == [1, 2]
    assert torch.equal(g.reshape(-1, 2)[:, 1], torch.tensor([0, 1, 2, 0, 1, 2]))


def test_randomized_sorted_distinct_in_range():
    gen = torch.Generator().manual_seed(1)
    p = positions.randomized(16, 100, batch_size=8, generator=gen)
    assert p.shape == (8, 16)
    assert bool((p[:, 1:] > p[:, :-1]).all())
    assert int(p.min()) >= 0 and int(p.max()) < 100
    q = positions.randomized(16, 100, batch_size=8, generator=torch.Generator().manual_seed(1))
    assert torch.equal(p, q)


def test_resolve():
    assert torch.equal(positions.resolve(None, 3, offset=2), torch.tensor([2, 3, 4]))
    p = torch.tensor([[5, 6, 7]])
    assert torch.equal(positions.resolve(p, 3, batch=4), p)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: positions.arange(-1), "seq_len must be >= 0, got -1"),
        (lambda: positions.arange(2.5), "seq_len must be an integer"),
        (lambda: positions.from_seq_lens([2, -1]), "seq_lens must be >= 0"),
        (lambda: positions.from_seq_lens([1.5]), "seq_lens must be a 1-D sequence of integers"),
        (lambda: positions.from_cu_seqlens([1, 3]), "cu_seqlens must start with 0"),
        (lambda: positions.from_cu_seqlens([0, 3, 2]), "cu_seqlens must be non-decreasing"),
        (lambda: positions.from_cu_seqlens("ab"), "cu_seqlens must be a 1-D sequence"),
        (lambda: positions.as_tensor([[0], [1, 2]]), "positions must be a tensor of numbers"),
        (lambda: positions.as_tensor(torch.tensor([True])), "must be an integer or floating"),
        (lambda: positions.as_tensor([0.0, float("inf")]), "positions must be finite"),
        (lambda: positions.from_attention_mask(torch.tensor([[2, 1]])), "only 0 and 1"),
        (lambda: positions.resolve(torch.arange(3), 3, offset=0.5), "offset must be an integer"),
        (lambda: positions.resolve(torch.arange(3), 3, offset="1"), "offset must be an integer"),
        (lambda: positions.from_attention_mask(torch.ones(3)), r"mask must be \[b, s\]"),
        (lambda: positions.grid(()), "shape must be a non-empty sequence"),
        (lambda: positions.grid((2, 0)), r"shape\[1\] must be >= 1, got 0"),
        (lambda: positions.randomized(5, 3), "max_len must be >= seq_len"),
        (lambda: positions.resolve(torch.arange(4), 3), "positions must have length 3"),
        (lambda: positions.resolve(torch.zeros(2, 3), 3, batch=4), "b == 4"),
        (lambda: positions.resolve(torch.tensor([0.0, float("nan")]), 2), "must be finite"),
        (lambda: positions.resolve(torch.zeros(1, 1, 2), 2), r"\[s\] or \[b, s\]"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(posenc.PosEncError, match=match):
        call()


def test_error_is_value_error():
    assert issubclass(posenc.PosEncError, ValueError)
