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


PAIRS = {
    # (q_len, k_len, q_positions, k_positions) -> (expected q, expected k)
    "self": ((4, None, None, None), ([0, 1, 2, 3], [0, 1, 2, 3])),
    "decode": ((2, 5, None, None), ([3, 4], [0, 1, 2, 3, 4])),
    "decode-given-keys": ((2, 4, None, [[5, 6, 7, 8]]), ([[7, 8]], [[5, 6, 7, 8]])),
    "cross": ((4, 2, None, None), ([0, 1, 2, 3], [0, 1])),
    "given-queries": ((2, 3, [10, 11], None), ([10, 11], [0, 1, 2])),
}


@pytest.mark.parametrize("case", list(PAIRS))
def test_resolve_pair(case):
    (q_len, k_len, qp, kp), (want_q, want_k) = PAIRS[case]
    qp = None if qp is None else torch.tensor(qp)
    kp = None if kp is None else torch.tensor(kp)
    q, k = positions.resolve_pair(q_len, k_len, qp, kp, batch=1)
    assert torch.equal(q, torch.tensor(want_q)) and torch.equal(k, torch.tensor(want_k))


def test_resolve_pair_shares_one_tensor():
    q, k = positions.resolve_pair(3)
    assert q is k  # self-attention: the keys' positions are the queries'
    p = torch.tensor([[4.0, 5.5, 7.0]])
    q, k = positions.resolve_pair(3, 3, p, p)
    assert q is p and k is p


def test_resolve_pair_coords():
    q, k = positions.resolve_pair(2, 3, coords=3)
    assert torch.equal(k, torch.arange(3)[:, None].expand(3, 3))
    assert torch.equal(q, k[1:])
    grid = positions.grid((2, 2)).reshape(4, 2)
    q, k = positions.resolve_pair(1, 4, None, grid, coords=2)
    assert torch.equal(q, grid[3:]) and torch.equal(k, grid)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: positions.resolve_pair(0), "q_len must be >= 1, got 0"),
        (lambda: positions.resolve_pair(2, 0), "k_len must be >= 1, got 0"),
        (lambda: positions.resolve_pair(2, 3, torch.arange(3)), "q_positions must have length 2"),
        (
            lambda: positions.resolve_pair(2, 3, None, torch.arange(2)),
            "k_positions must have length 3",
        ),
        (lambda: positions.resolve_pair(2, 2, torch.zeros(3, 2), None, batch=2), "b == 2"),
        (
            lambda: positions.resolve_pair(2, 2, torch.zeros(3, 2), torch.zeros(2, 2)),
            r"same batch size \(or 1\), got shapes \(3, 2\) and \(2, 2\)",
        ),
        (
            lambda: positions.resolve_pair(2, 2, None, torch.tensor([0.0, float("nan")])),
            "k_positions must be finite",
        ),
        (
            lambda: positions.resolve_pair(2, 2, None, torch.zeros(2, 3), coords=2),
            r"k_positions must be \[s, 2\] or \[b, s, 2\]",
        ),
        (
            lambda: positions.resolve_pair(2, 2, torch.zeros(3, 2, 2), None, batch=2, coords=2),
            "must have b == 2",
        ),
        (
            lambda: positions.resolve_pair(2, 3, torch.arange(2), torch.arange(2)),
            "k_positions must have length 3",
        ),
        (
            lambda: positions.resolve_pair(3, 3, torch.arange(2), names=("positions", "k")),
            "^positions must have length 3",
        ),
    ],
)
def test_resolve_pair_bad_input(call, match):
    with pytest.raises(posenc.PosEncError, match=match):
        call()


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


# --- issue 24: batch=0 was accepted ------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda: positions.resolve(None, 4, batch=0),
        lambda: positions.resolve(torch.arange(4), 4, batch=0),
        lambda: positions.resolve_pair(4, batch=0),
        lambda: positions.resolve_pair(2, 4, k_positions=torch.arange(4), batch=0),
        lambda: posenc.RotaryEmbedding(8).rotation(4, batch=0),  # passes batch to resolve_pair
        lambda: posenc.RotaryEmbedding(8).rotation(4, q_positions=torch.arange(4), batch=0),
    ],
    ids=[
        "resolve",
        "resolve-given",
        "resolve_pair",
        "resolve_pair-given",
        "rotation",
        "rotation-given",
    ],
)
def test_batch_zero_is_refused_by_name(call):
    with pytest.raises(posenc.PosEncError, match=r"^batch must be >= 1, got 0$"):
        call()


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda: posenc.attention(*torch.randn(3, 0, 2, 4, 8).unbind(0), encoding="alibi"),
            r"q and k must be non-empty .* got shapes \(0, 2, 4, 8\)",
        ),
        (
            lambda: posenc.SinusoidalEmbedding(8)(torch.zeros(0, 3, 8)),
            r"x must hold a batch of >= 1 sequences \[b, s, 8\], got shape \(0, 3, 8\)",
        ),
        (
            lambda: posenc.ShawRelativeBias(2, 8).bias(4, q=torch.zeros(0, 2, 4, 8)),
            r"q must be \[b, h, q, d\] with b >= 1, got shape \(0, 2, 4, 8\)",
        ),
    ],
    ids=["attention", "additive", "shaw"],
)
def test_an_empty_batch_is_refused_by_the_argument_that_has_it(call, match):
    """Callers that pass their input's batch size on name the input, not ``batch``."""
    with pytest.raises(posenc.PosEncError, match=match):
        call()


def test_batch_one_still_resolves():
    q, k = positions.resolve_pair(2, 4, batch=1)
    torch.testing.assert_close(q, torch.tensor([2, 3]), rtol=0, atol=0)
    torch.testing.assert_close(k, torch.arange(4), rtol=0, atol=0)
    got = positions.resolve(torch.zeros(1, 3, dtype=torch.long), 3, batch=1)
    torch.testing.assert_close(got, torch.zeros(1, 3, dtype=torch.long), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "q_len, k_len, rows, keys",
    [
        (6, 6, None, None),  # self-attention, the whole square
        (6, 6, (2, 5), (0, 5)),  # a block of rows over the keys up to its last query
        (6, 6, (2, 5), (2, 5)),  # square from the block's first key: the diagonal
        (3, 9, None, None),  # decoding with a cache: the queries are the last keys
        (3, 9, (1, 3), (4, 9)),  # a cache, rows and keys cut
        (1, 5, None, (2, 5)),  # one query
        (4, 4, (0, 4), (1, 3)),  # keys that end before the last query's
    ],
)
def test_additive_causal_mask_is_the_rule(q_len, k_len, rows, keys, dtype):
    """The additive form of the causal rule is 0 exactly where the bool rule is True and
    -inf where it is False, over the rows and key columns asked for, in the dtype."""
    start, stop = rows or (0, q_len)
    lo, hi = keys or (0, k_len)
    seen = positions.causal_pairs(q_len, k_len, rows=rows)[:, lo:hi]
    got = positions.causal_pairs(q_len, k_len, rows=rows, keys=keys, additive=dtype)
    assert got.shape == (stop - start, hi - lo) and got.dtype == dtype
    want = torch.zeros(seen.shape, dtype=dtype).masked_fill(~seen, float("-inf"))
    assert torch.equal(got, want)


@pytest.mark.parametrize(
    "q_len, k_len, rows",
    [(6, 6, None), (6, 6, (2, 5)), (3, 9, None), (3, 9, (1, 3)), (1, 5, None), (5, 5, (4, 5))],
)
def test_causal_counts_are_the_rule(q_len, k_len, rows):
    """``counts=True``: how many keys each row sees, the first ones, as the bool rule has it."""
    seen = positions.causal_pairs(q_len, k_len, rows=rows)
    got = positions.causal_pairs(q_len, k_len, rows=rows, counts=True)
    assert got.dtype == torch.int64 and torch.equal(got, seen.sum(-1))
    first = torch.arange(k_len) < got[:, None]  # a prefix of the keys
    assert torch.equal(first, seen)
