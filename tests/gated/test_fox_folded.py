"""Forgetting attention through SDPA with its term folded into the keys
(:mod:`posenc.attend.folded`): every way the fold is cut (one call, blocks, heads grouped,
a band of short blocks sent as one batch, blocks recomputed in the backward pass) against
the float64 oracle, gradients against the eager path, float32 precision at a long length
with heads that forget fast, and the block rule as a property."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import reference as ref
from posenc.attend import folded as FO
from posenc.gated import FoXBias


@dataclass(frozen=True)
class Case:
    q_len: int
    k_len: int
    shifts: tuple[float, ...]  # per head: log f = logsigmoid(N(0, 1) + shift)
    kv_heads: int | None = None
    d: int = 8
    dv: int = 8
    padding: bool = False
    path: str = "block"  # the cut the case is made to take: one, block, batched


CASES = {
    "one-call": Case(64, 64, (6.0, 6.0), path="one"),
    "blocks": Case(300, 300, (2.0, 2.0, 2.0)),
    "band": Case(400, 400, (-3.0, -3.0), path="batched"),
    "mixed-heads": Case(300, 300, (8.0, 2.0, 0.0, -3.0), path="batched"),
    "decode": Case(5, 300, (0.5, 1.0), path="one"),
    "decode-blocks": Case(40, 300, (-1.0, 0.0), path="batched"),
    "one-query": Case(1, 200, (0.0, 3.0), path="one"),
    "padding": Case(120, 120, (1.0, 1.0), padding=True),
    "gqa": Case(200, 200, (1.0, 1.0, 2.0, 2.0), kv_heads=2),
    "wide-values": Case(200, 200, (1.0, 1.0), dv=12),
    "values-wider-than-fold": Case(200, 200, (1.0, 1.0), dv=16),
}
B = 2


def inputs(case: Case, dtype=torch.float64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h = len(case.shifts)
    hk = case.kv_heads or h
    q = torch.randn(B, h, case.q_len, case.d, generator=g, dtype=torch.float64)
    k = torch.randn(B, hk, case.k_len, case.d, generator=g, dtype=torch.float64)
    v = torch.randn(B, hk, case.k_len, case.dv, generator=g, dtype=torch.float64)
    shift = torch.tensor(case.shifts, dtype=torch.float64)[:, None]
    gates = F.logsigmoid(torch.randn(B, h, case.k_len, generator=g, dtype=torch.float64) + shift)
    return q.to(dtype), k.to(dtype), v.to(dtype), gates.to(dtype)


def keep_mask(case: Case) -> torch.Tensor | None:
    if not case.padding:
        return None
    keep = torch.ones(B, case.k_len, dtype=torch.bool)
    keep[1, : case.k_len // 3] = False  # left padding: row 1's first queries see no key
    return keep


def attend(case: Case, q, k, v, gates, backend="sdpa"):
    return posenc.attention(
        q,
        k,
        v,
        encoding=FoXBias(len(case.shifts)),
        causal=True,
        attn_mask=keep_mask(case),
        backend=backend,
        gates=gates,
    )


def oracle(case: Case, q, k, v, gates) -> torch.Tensor:
    keep = keep_mask(case)
    out = ref.fox_attention(
        *(t.double().numpy() for t in (q, k, v, gates)),
        keep=None if keep is None else keep.numpy(),
    )
    return torch.from_numpy(out)


@pytest.fixture
def cuts(monkeypatch):
    """Record which cut each call of the fold takes, and the first key of each block."""
    seen: dict[str, list] = {"one": [], "block": [], "batched": [], "lo": []}
    real_block, real_batched = FO._block, FO._batched

    def block(qw, kw, vw, c, call, d, span, lengths):
        whole = span[0] == 0 and span[1] == lengths[0]
        seen["one" if whole else "block"].append(span)
        seen["lo"].append(span[2])
        return real_block(qw, kw, vw, c, call, d, span, lengths)

    def batched(qp, kp, vp, c, call, d, spans, size):
        seen["batched"].append(len(spans))
        seen["lo"] += [lo for _, _, lo in spans]
        return real_batched(qp, kp, vp, c, call, d, spans, size)

    monkeypatch.setattr(FO, "_block", block)
    monkeypatch.setattr(FO, "_batched", batched)
    return seen


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", list(CASES))
def test_fold_matches_reference(name, dtype, cuts):
    case = CASES[name]
    q, k, v, gates = inputs(case, dtype)
    out = attend(case, q, k, v, gates)
    assert out.shape == (B, len(case.shifts), case.q_len, case.dv) and out.dtype == dtype
    atol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(out.double(), oracle(case, q, k, v, gates), atol=atol, rtol=0)
    assert cuts[case.path], f"{name} took {[key for key, val in cuts.items() if val]}"
    if case.path == "batched" and (dtype == torch.float32 or name == "band"):
        assert max(cuts["lo"]) > 0  # the band: keys of weight 0 (in the dtype) were skipped
    if case.padding:
        empty = ~(keep_mask(case)[:, None, :] & torch.ones(case.q_len, case.k_len).tril().bool())
        rows = out.permute(0, 2, 1, 3)[empty.all(-1)]
        assert rows.numel() and torch.equal(rows, torch.zeros_like(rows))


@pytest.mark.parametrize("recompute", [False, True], ids=["kept", "recomputed"])
@pytest.mark.parametrize("name", ["blocks", "band", "mixed-heads", "decode", "padding", "gqa"])
def test_fold_gradients_equal_eager(name, recompute, monkeypatch):
    """Gradients of q, k, v and the gates (through the folded channel) equal the eager
    path's in float64; with CHUNK_SCORES 1 every block is recomputed in the backward pass."""
    if recompute:
        monkeypatch.setattr(FO, "CHUNK_SCORES", 1)
    case = CASES[name]
    leaves = [t.requires_grad_(True) for t in inputs(case)]
    weight = torch.randn(B, len(case.shifts), case.q_len, case.dv, dtype=torch.float64)
    grads = []
    for backend in ("eager", "sdpa"):
        out = attend(case, *leaves, backend=backend)
        grads.append(torch.autograd.grad((out * weight).sum(), leaves))
    for name_, got, want in zip("qkvg", grads[1], grads[0], strict=True):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=0, msg=name_)


def test_float32_precision_holds_where_gates_sum_large():
    """1024 tokens, heads that forget slowly and fast (sums of the log gates from -2 to
    -3000): the fold in float32 is as close to the float64 oracle as the eager path's
    float32 (which subtracts split cumulative sums pair by pair). One channel of ``-c_j``
    with no blocks would carry errors of about |c| * 6e-8, 1e-4 here."""
    case = Case(1024, 1024, (7.0, 3.0, 0.0, -3.0))
    q, k, v, gates = inputs(case, torch.float32)
    assert float(gates.double().sum(-1).min()) < -1000
    want = oracle(case, q, k, v, gates)
    fold = (attend(case, q, k, v, gates).double() - want).abs().max()
    eager = (attend(case, q, k, v, gates, "eager").double() - want).abs().max()
    assert fold <= 4 * eager + 1e-7, (fold, eager)


def test_16_bit_on_cpu_widens_as_eager_does():
    case = CASES["blocks"]
    q, k, v, gates = inputs(case, torch.bfloat16)
    out = attend(case, q, k, v, gates)
    assert out.dtype == torch.bfloat16
    want = attend(case, q, k, v, gates, "eager")
    torch.testing.assert_close(out.float(), want.float(), atol=1e-2, rtol=0)


def test_traced_calls_keep_the_materialised_mask(monkeypatch):
    """Under torch.compile the blocks cannot be cut (they need the host to read c)."""
    monkeypatch.setattr(FO, "tracing", lambda: True)
    assert not FO.applies(torch.zeros(1, 1, 1, 4), FoXBias(1))
    monkeypatch.setattr(FO, "tracing", lambda: False)
    assert FO.applies(torch.zeros(1, 1, 1, 4), FoXBias(1))
    assert FO.applies(torch.zeros(1, 1, 1, 4, dtype=torch.bfloat16), FoXBias(1))


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.floats(min_value=0.0, max_value=40.0, allow_nan=False), min_size=1, max_size=60
    ),
    heads=st.integers(1, 3),
    first=st.integers(0, 5),
    limit=st.sampled_from([0.5, 4.0, 16.0]),
)
def test_blocks_rule(steps, heads, first, limit):
    """Blocks cover the queries in order; each is one row or falls by at most ``limit`` in
    every head, and is as long as it can be (one more row would fall further)."""
    decay = torch.tensor(steps, dtype=torch.float64)
    c = -torch.cumsum(torch.stack([decay * (1 + h) for h in range(heads)]), -1)[None]
    c = torch.cat([torch.zeros(1, heads, first, dtype=torch.float64), c - 0.0], dim=-1)
    q_len = len(steps)
    edges = FO.blocks(c, first, q_len, limit)
    assert edges[0] == 0 and edges[-1] == q_len
    assert all(a < b for a, b in itertools.pairwise(edges))
    rows = c[0, :, first:]
    for a, b in itertools.pairwise(edges):
        fall = float((rows[:, a] - rows[:, b - 1]).max())
        assert b - a == 1 or fall <= limit
        if b < q_len:
            assert float((rows[:, a] - rows[:, b]).max()) > limit


@pytest.mark.parametrize("norm", [0.5, 2.0, 8.0, 40.0])
@pytest.mark.parametrize("k_len", [16, 2048, 1 << 20])
def test_horizon_keeps_float32_weights_normal(norm, k_len):
    """float32: the kept keys' logits lie within 2B + u of their row's largest (B = 2 scale
    max|q| max|k|); u = 87 - 2B keeps every weight SDPA computes at least e^-87, a normal
    float (subnormals made its backward 10x slower), unless the skipped keys' weights would
    then reach float32's rounding of the row sum (u >= 17 + ln k); never above 110."""
    q = torch.zeros(1, 1, 2, 4)
    k = torch.zeros(1, 1, k_len, 4)
    q[..., 0], k[..., 0] = norm, norm
    scale = 0.5
    bound = 2 * scale * norm * norm
    u = FO._horizon(q, k, scale) - bound
    least = 17 + math.log(k_len)
    assert least - 1e-9 <= u <= 110
    assert u == pytest.approx(least) or 2 * bound + u <= 87 + 1e-9
    assert u == pytest.approx(min(110, max(least, 87 - 2 * bound)))
    assert FO._horizon(q.double(), k.double(), scale) == pytest.approx(bound + 760)


@pytest.mark.parametrize("name", ["blocks", "mixed-heads", "decode-blocks", "padding"])
def test_square_blocks_take_sdpas_causal_rule(name, monkeypatch):
    """A block whose first query sees no key before its own is square, and its causal rule
    is SDPA's own ``is_causal``: no mask is built for it. Every other causal block gets the
    mask; the answers are the oracle's
    (:func:`test_fold_matches_reference`)."""
    calls = []
    real = F.scaled_dot_product_attention

    def sdpa(q, k, v, attn_mask=None, is_causal=False, **kw):
        calls.append((q.shape[-2], k.shape[-2], is_causal, attn_mask))
        return real(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kw)

    monkeypatch.setattr(FO.F, "scaled_dot_product_attention", sdpa)
    case = CASES[name]
    attend(case, *inputs(case))
    assert len(calls) > 1
    for rows, keys, causal, mask in calls:
        assert (mask is None) == causal, (rows, keys, causal)
        if causal:
            assert rows == keys
        else:  # additive, in the queries' dtype; bool for padding and a batch of blocks
            assert mask.dtype in (torch.float64, torch.bool)
    if case.q_len == case.k_len and not case.padding:
        assert any(causal for _, _, causal, _ in calls)  # the first block, at least


@pytest.mark.parametrize("used", [(0, 1, 2), (0, 2), (1,)], ids=["all", "some", "one"])
def test_windows_sum_their_gradients_as_slices_do(used):
    """The blocks' overlapping windows of one tensor give it the gradient its slices would
    (windows whose outputs are unused count nothing), once and twice differentiated."""
    spans = ((0, 5), (3, 9), (2, 4))
    t = torch.randn(2, 3, 9, 4, dtype=torch.float64, requires_grad=True)
    weights = [torch.randn(2, 3, hi - lo, 4, dtype=torch.float64) for lo, hi in spans]

    def loss(windows):
        return sum(((windows[i] ** 2) * weights[i]).sum() for i in used)

    got = torch.autograd.grad(loss(FO._Windows.apply(spans, t)), t)[0]
    want = torch.autograd.grad(loss([t[:, :, lo:hi] for lo, hi in spans]), t)[0]
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)  # summed in another order
    assert torch.autograd.gradgradcheck(lambda x: FO._Windows.apply(spans, x)[used[0]] ** 2, (t,))


@pytest.mark.parametrize(
    "length, shift, backend, folds",
    [
        (128, -3.0, "auto", False),  # short and cut into blocks: the eager path, cheaper
        (128, 6.0, "auto", True),  # short, one block: folded
        (256, -3.0, "auto", False),  # 65 536 pairs a head: still eager
        (257, -3.0, "auto", True),  # one more token: folded
        (128, -3.0, "sdpa", True),  # asked for: folded
    ],
)
def test_auto_takes_eager_for_a_short_call_cut_into_blocks(
    length, shift, backend, folds, monkeypatch
):
    """``backend="auto"`` folds a gated term unless the call is short (at most
    ``EAGER_PAIRS`` pairs a head) and its gates would cut it into blocks; then it is the
    eager path's call, with the eager path's bits."""
    case = Case(length, length, (shift, shift))
    q, k, v, gates = inputs(case, torch.float32)
    calls = []
    real = FO.folded
    monkeypatch.setattr(FO, "folded", lambda *a: calls.append(1) or real(*a))
    got = attend(case, q, k, v, gates, backend=backend)
    assert bool(calls) == folds
    assert FO.eager_is_cheaper(FoXBias(2).gate_cumulative(gates), length, length) == (
        length * length <= FO.EAGER_PAIRS and shift < 0
    )
    if not folds:
        assert torch.equal(got, attend(case, q, k, v, gates, backend="eager"))
    torch.testing.assert_close(got.double(), oracle(case, q, k, v, gates), atol=1e-5, rtol=0)
