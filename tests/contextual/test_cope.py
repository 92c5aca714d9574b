"""CoPE (contextual position encoding): attention, positions and bias against the float64
oracle on every path that takes it, gradients, memory of the chunked path, refusals,
properties, and the TinyTransformer integration (a table per layer)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.models import _lm_checks as lm

import posenc
from posenc import PosEncError
from posenc import reference as ref
from posenc._base import BiasEncoding, ContextualEncoding, GatedEncoding
from posenc.attend import dispatch as A
from posenc.attend import paths as P
from posenc.contextual import (
    POSITION_LOGITS,
    CoPEBias,
    cope_bias,
    cope_position_logits,
    cope_positions,
)
from posenc.contextual import cope_fused as CF
from posenc.models import TinyTransformer

B, H, D = 2, 4, 8
ATOL = {torch.float64: 1e-12, torch.float32: 1e-5}


# --- cases ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    q_len: int
    k_len: int
    causal: bool
    kv_heads: int = H
    mask: str | None = None  # "left": left padding, row 1 with no key for its first queries
    npos_max: int = 16  # > every position: no clamp
    position_logit: str = "scaled"
    scale: float | None = None


CASES = {
    "self-causal": Case(6, 6, True),
    "self-full": Case(6, 6, False),
    "decode-causal": Case(2, 7, True),
    "padding-causal": Case(6, 6, True, mask="left"),
    "padding-full": Case(5, 6, False, mask="left"),
    "gqa-causal": Case(6, 6, True, kv_heads=2),
    "mqa-decode": Case(3, 7, True, kv_heads=1),
    "unscaled-causal": Case(6, 6, True, position_logit="unscaled"),
    "unscaled-full": Case(5, 6, False, position_logit="unscaled"),
    "clamp-causal": Case(7, 7, True, npos_max=3),
    "clamp-full": Case(6, 6, False, npos_max=2),
    "scale-causal": Case(6, 6, True, scale=0.7),
}


def keep_mask(case: Case) -> torch.Tensor | None:
    """Left padding: row 0 pads 2 keys, row 1 pads every key but the last 2 (causal: its
    first queries see no key, output 0); in the full case row 1 pads every key."""
    if case.mask is None:
        return None
    keep = torch.ones(B, case.k_len, dtype=torch.bool)
    keep[0, :2] = False
    if case.causal:
        keep[1, : case.k_len - 2] = False
    else:
        keep[1] = False  # a batch row with no key at all
    return keep


def make_inputs(case: Case, dtype=torch.float64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, case.q_len, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, case.kv_heads, case.k_len, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, case.kv_heads, case.k_len, D, generator=g, dtype=torch.float64)
    table = torch.randn(case.npos_max, D, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype), table.to(dtype)


def make_cope(case: Case, table: torch.Tensor) -> CoPEBias:
    cope = CoPEBias(D, case.npos_max, position_logit=case.position_logit, dtype=table.dtype)
    with torch.no_grad():
        cope.weight.copy_(table)
    return cope


def oracle(case: Case, q, k, v, table) -> torch.Tensor:
    keep = keep_mask(case)
    out = ref.cope_attention(
        q.double().numpy(),
        k.double().numpy(),
        v.double().numpy(),
        table.double().numpy(),
        scale=case.scale,
        position_logit=case.position_logit,
        causal=case.causal,
        keep=None if keep is None else keep.numpy(),
    )
    return torch.from_numpy(out)


def run(case: Case, cope, q, k, v, backend: str) -> torch.Tensor:
    return posenc.attention(
        q,
        k,
        v,
        encoding=cope,
        causal=case.causal,
        attn_mask=keep_mask(case),
        scale=case.scale,
        backend=backend,
    )


@pytest.fixture
def one_row_blocks(monkeypatch):
    """The chunked path with a block of one query row (the default fits these sizes in one)."""
    monkeypatch.setattr(P, "CHUNK_SCORES", 1)


# --- attention against the oracle ---------------------------------------------------------


def test_clamp_cases_bind():
    """The clamp cases reach positions above npos_max - 1 before the clamp."""
    for name in ("clamp-causal", "clamp-full"):
        case = CASES[name]
        q, k, _, _ = make_inputs(case)
        p = ref.cope_positions(q.numpy(), k.numpy(), causal=case.causal)
        assert p.max() > case.npos_max - 1 + 0.5


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("backend", ["eager", "chunked", "auto"])
@pytest.mark.parametrize("name", list(CASES))
def test_attention_matches_reference(name, backend, dtype, one_row_blocks):
    case = CASES[name]
    q, k, v, table = make_inputs(case, dtype)
    cope = make_cope(case, table)
    out = run(case, cope, q, k, v, backend)
    assert out.shape == (B, H, case.q_len, D) and out.dtype == dtype
    want = oracle(case, q, k, v, table)
    torch.testing.assert_close(out.double(), want, atol=ATOL[dtype], rtol=0)
    keep = keep_mask(case)
    if keep is not None:  # rows with no key: exactly 0
        allowed = keep[:, None, :].expand(B, case.q_len, case.k_len)
        if case.causal:
            allowed = allowed & torch.ones(case.q_len, case.k_len, dtype=torch.bool).tril(
                case.k_len - case.q_len
            )
        empty = ~allowed.any(-1)  # [b, q]
        assert empty.any()
        assert torch.equal(
            out.permute(0, 2, 1, 3)[empty], torch.zeros_like(out.permute(0, 2, 1, 3)[empty])
        )


def test_table_in_another_dtype_is_used():
    """A float64 table with float32 inputs (and the reverse) gives the float64 answer."""
    case = CASES["gqa-causal"]
    q, k, v, table = make_inputs(case)
    want = oracle(case, q.float(), k.float(), v.float(), table.float())
    out = run(case, make_cope(case, table), q.float(), k.float(), v.float(), "eager")
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=0)
    out64 = run(case, make_cope(case, table.float()), q, k, v, "eager")
    assert out64.dtype == torch.float64
    torch.testing.assert_close(out64, oracle(case, q, k, v, table.float()), atol=1e-12, rtol=0)


# --- the pure functions ---------------------------------------------------------------------


@pytest.mark.parametrize("npos_max", [None, 3], ids=["unclamped", "clamped"])
@pytest.mark.parametrize(
    "name",
    [
        "self-causal",
        "self-full",
        "decode-causal",
        "padding-causal",
        "padding-full",
        "mqa-decode",
        "scale-causal",
    ],
)
def test_positions_match_reference(name, npos_max):
    case = CASES[name]
    q, k, _, _ = make_inputs(case)
    keep = keep_mask(case)
    got = cope_positions(
        q, k, npos_max=npos_max, scale=case.scale, causal=case.causal, attn_mask=keep
    )
    want = ref.cope_positions(
        q.numpy(),
        k.numpy(),
        scale=case.scale,
        causal=case.causal,
        keep=None if keep is None else keep.numpy(),
        npos_max=npos_max,
    )
    assert got.shape == (B, H, case.q_len, case.k_len) and got.dtype == torch.float64
    torch.testing.assert_close(got, torch.from_numpy(want), atol=1e-12, rtol=0)
    got32 = cope_positions(
        q.float(),
        k.float(),
        npos_max=npos_max,
        scale=case.scale,
        causal=case.causal,
        attn_mask=keep,
    )
    assert got32.dtype == torch.float32
    torch.testing.assert_close(got32.double(), torch.from_numpy(want), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", list(CASES))
def test_bias_matches_reference(name):
    case = CASES[name]
    q, k, _, table = make_inputs(case)
    keep = keep_mask(case)
    got = cope_bias(
        q,
        k,
        table,
        position_logit=case.position_logit,
        scale=case.scale,
        causal=case.causal,
        attn_mask=keep,
    )
    want = ref.cope_bias(
        q.numpy(),
        k.numpy(),
        table.numpy(),
        scale=case.scale,
        position_logit=case.position_logit,
        causal=case.causal,
        keep=None if keep is None else keep.numpy(),
    )
    assert got.shape == (B, H, case.q_len, case.k_len) and got.dtype == torch.float64
    torch.testing.assert_close(got, torch.from_numpy(want), atol=1e-12, rtol=0)


def test_positions_are_zero_on_masked_keys():
    """The documented "0 elsewhere": a padded key has no position, even when real keys
    follow it (as the oracle, and as cope_bias, which is 0 there)."""
    q, k = torch.zeros(1, 1, 1, 8), torch.zeros(1, 1, 3, 8)  # every gate 1/2
    keep = torch.tensor([[False, True, True]])
    p = cope_positions(q, k, causal=False, attn_mask=keep)
    assert torch.equal(p, torch.tensor([[[[0.0, 1.0, 0.5]]]]))


def test_zero_gates_count_halves():
    """q = 0: every gate is sigmoid(0) = 1/2, so p_ij = (i - j + 1) / 2 exactly."""
    q, k = torch.zeros(1, 1, 4, 8), torch.randn(1, 1, 4, 8)
    i, j = torch.arange(4)[:, None], torch.arange(4)[None, :]
    want = torch.where(j <= i, (i - j + 1) / 2, torch.zeros(())).float()
    assert torch.equal(cope_positions(q, k)[0, 0], want)


# --- gradients -------------------------------------------------------------------------------


@pytest.mark.parametrize("position_logit", ["scaled", "unscaled"])
@pytest.mark.parametrize("backend", ["eager", "chunked"])
def test_gradcheck(backend, position_logit, one_row_blocks):
    # The interpolation between floor(p) and floor(p) + 1 is continuous but has a kink at
    # every integer position (and at the clamp), so the function is only piecewise smooth:
    # central differences are exact up to O(eps^2) as long as no allowed position lies
    # within eps of an integer. The seed is fixed and that precondition asserted below
    # (positions on masked pairs do not matter: their logits are -inf). Tiny sizes, with a
    # value dim of 2: gradcheck runs a backward per output element.
    case = Case(3, 4, True, kv_heads=1, mask="left", position_logit=position_logit)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(B, 2, 3, 4, generator=g, dtype=torch.float64)
    k = torch.randn(B, 1, 4, 4, generator=g, dtype=torch.float64)
    v = torch.randn(B, 1, 4, 2, generator=g, dtype=torch.float64)
    table = torch.randn(6, 4, generator=g, dtype=torch.float64)
    keep = keep_mask(case)
    p = cope_positions(q, k, causal=True)
    allowed = p > 0
    assert (p[allowed] - p[allowed].round()).abs().min() > 1e-3  # far from the kinks
    cope = CoPEBias(4, 6, position_logit=position_logit, dtype=torch.float64)
    with torch.no_grad():
        cope.weight.copy_(table)
    assert keep is not None and not bool(keep.all())

    # The table enters as the module's own parameter (gradcheck perturbs its inputs in
    # place): the chunked path recomputes its blocks in backward from the module, so a
    # table swapped in only for the forward call (torch.func.functional_call) would not
    # be the one it differentiates.
    def fn(q, k, v, w):
        assert w is cope.weight
        return run(case, cope, q, k, v, backend)

    inputs = (*(t.clone().requires_grad_(True) for t in (q, k, v)), cope.weight)
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


def _grads(case: Case, backend: str, q, k, v, cope) -> list[torch.Tensor]:
    for t in (q, k, v):
        t.grad = None
        t.requires_grad_(True)
    cope.zero_grad()
    out = run(case, cope, q, k, v, backend)
    (out * torch.linspace(-1, 1, D)).sum().backward()
    return [t.grad.clone() for t in (q, k, v)] + [cope.weight.grad.clone()]


@pytest.mark.parametrize("name", ["padding-causal", "mqa-decode", "clamp-full", "unscaled-causal"])
def test_chunked_gradients_equal_eager(name, monkeypatch):
    monkeypatch.setattr(P, "CHUNK_SCORES", 8)  # a block of one row
    case = CASES[name]
    q, k, v, table = make_inputs(case, torch.float32)
    cope = make_cope(case, table)
    eager = _grads(case, "eager", q, k, v, cope)
    chunked = _grads(case, "chunked", q, k, v, cope)
    assert eager[3].abs().max() > 0  # the table gets a gradient
    for a, b in zip(eager, chunked, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


# --- memory of the chunked path ------------------------------------------------------------


def _saved_bytes(backend: str) -> int:
    """Bytes of the tensors autograd saves for backward (checkpointed blocks: their inputs)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 256, 16, generator=g).requires_grad_(True) for _ in range(3))
    cope = CoPEBias(16, 257)
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = posenc.attention(q, k, v, encoding=cope, causal=True, backend=backend)
    out.sum().backward()
    return total


def test_chunked_saves_far_less_than_eager(monkeypatch):
    monkeypatch.setattr(P, "CHUNK_SCORES", 2 * 256 * 32)  # 8 blocks of 32 rows
    eager, chunked = _saved_bytes("eager"), _saved_bytes("chunked")
    scores = 2 * 256 * 256 * 4  # one [1, 2, 256, 256] float32 tensor
    assert eager >= 4 * scores  # logits, gates, positions, probs, ...
    assert chunked < eager / 4
    assert chunked < 2 * scores  # about the size of one score matrix in all


# --- auto -----------------------------------------------------------------------------------


def test_auto_chooses_fused_on_cpu():
    """Auto takes the fused CPU path for CoPE at any size (tests/contextual/test_cope_fused.py
    holds its cases)."""
    case = CASES["gqa-causal"]
    q, _, _, table = make_inputs(case, torch.float32)
    assert A._choose("auto", q, make_cope(case, table), True, 0.0, B, case.k_len) == "fused"
    assert A._choose("auto", q, make_cope(case, table), True, 0.1, B, case.k_len) == "eager"


def test_auto_chooses_chunked_for_large_scores(monkeypatch):
    """Where the fused path cannot run (here: switched off), eager, or chunked once large."""
    monkeypatch.setattr(CF, "applies", lambda *args: False)
    case = CASES["gqa-causal"]
    q, k, v, table = make_inputs(case, torch.float32)
    cope = make_cope(case, table)
    scores_bytes = 4 * B * H * case.q_len * case.k_len
    calls = []
    for name in ("eager", "chunked"):
        real = getattr(A, name)

        def record(*args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(A, name, record)
    monkeypatch.setattr(A, "FLEX_MIN_BIAS_BYTES", scores_bytes)
    assert A._choose("auto", q, cope, True, 0.0, B, case.k_len) == "chunked"
    big = run(case, cope, q, k, v, "auto")
    monkeypatch.setattr(A, "FLEX_MIN_BIAS_BYTES", scores_bytes + 1)
    assert A._choose("auto", q, cope, True, 0.0, B, case.k_len) == "eager"
    small = run(case, cope, q, k, v, "auto")
    assert calls == ["chunked", "eager"]
    torch.testing.assert_close(big, small, atol=1e-6, rtol=0)


# --- refusals --------------------------------------------------------------------------------


def _qkv(q_len=3, k_len=3, d=D):
    return torch.randn(3, 1, 2, max(q_len, k_len), d).unbind(0)


def _meta_cope():
    with torch.device("meta"):
        return CoPEBias(D, 4)


_q, _k = torch.randn(2, 1, 2, 3, D).unbind(0)
_w = torch.zeros(4, D)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        pytest.param(
            lambda: posenc.attention(*_qkv(), encoding=CoPEBias(D, 4), backend="sdpa"),
            "encoding 'cope' is contextual .* use backend='eager', 'chunked' or 'auto'",
            id="backend-sdpa",
        ),
        pytest.param(
            lambda: posenc.attention(*_qkv(), encoding=CoPEBias(D, 4), backend="flex"),
            "encoding 'cope' is contextual",
            id="backend-flex",
        ),
        pytest.param(
            lambda: posenc.attention(
                *_qkv(), encoding=CoPEBias(D, 4), causal=True, gates=torch.zeros(1, 2, 3)
            ),
            r"gates are read by gated encodings \('fox'\); encoding 'cope' takes none",
            id="gates",
        ),
        pytest.param(
            lambda: posenc.attention(*_qkv(d=4), encoding=CoPEBias(D, 4)),
            "encoding 'cope' has head_dim=8; q has head dim 4",
            id="head-dim",
        ),
        pytest.param(
            lambda: posenc.attention(*_qkv(), encoding=_meta_cope()),
            "encoding 'cope' has its tensors on the meta device",
            id="meta-table",
        ),
        pytest.param(lambda: CoPEBias(0, 4), "head_dim must be >= 1, got 0", id="head-dim-0"),
        pytest.param(lambda: CoPEBias(D, 0), "npos_max must be >= 1, got 0", id="npos-max-0"),
        pytest.param(
            lambda: CoPEBias(D, 4, position_logit="x"),
            "position_logit must be one of 'scaled', 'unscaled', got 'x'",
            id="position-logit",
        ),
        pytest.param(
            lambda: cope_bias(_q, _k, _w, attn_mask=torch.ones(1, 4, dtype=torch.bool)),
            r"attn_mask must be a bool key padding mask \[b, k\] = \[1, 3\]",
            id="mask-shape",
        ),
        pytest.param(
            lambda: cope_bias(_q, _k, _w, attn_mask=torch.ones(1, 3)),
            r"attn_mask must be a bool key padding mask .* got torch.float32",
            id="mask-dtype",
        ),
        pytest.param(
            lambda: cope_bias(torch.randn(1, 2, 4, D), _k, _w, causal=True),
            r"causal needs q_len <= k_len .* got 4 > 3",
            id="causal-q-gt-k",
        ),
        pytest.param(
            lambda: cope_bias(_q, _k, torch.zeros(4, D - 1)),
            r"weight must be \[npos_max, 8\] \(the head dim of q\), got \(4, 7\)",
            id="table-shape",
        ),
        pytest.param(
            lambda: cope_bias(_q, _k, _w, position_logit="x"),
            "position_logit must be one of",
            id="bias-position-logit",
        ),
        pytest.param(
            lambda: cope_positions(_q, _k, npos_max=0),
            "npos_max must be >= 1, got 0",
            id="positions-npos-max",
        ),
        pytest.param(
            lambda: cope_positions(_q, torch.randn(1, 3, 3, D)),
            "k must be \\[b, h_kv, k, d\\] with the batch and head dim of q",
            id="positions-heads",
        ),
        pytest.param(lambda: cope_positions(_q, _k, scale=0.0), "scale must be > 0.0", id="scale"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(PosEncError, match=match):
        call()


# --- properties ------------------------------------------------------------------------------


def _random_case(data, *, causal=None):
    q_len = data.draw(st.integers(1, 6), label="q_len")
    k_len = data.draw(st.integers(q_len, 7), label="k_len")
    causal = data.draw(st.booleans(), label="causal") if causal is None else causal
    pad = data.draw(st.lists(st.integers(0, k_len), min_size=2, max_size=2), label="pad")
    keep = None
    if data.draw(st.booleans(), label="masked"):
        keep = torch.arange(k_len)[None, :] >= torch.tensor(pad)[:, None]  # left padding
    seed = data.draw(st.integers(0, 2**16), label="seed")
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 2, q_len, D, generator=g, dtype=torch.float64)
    k = torch.randn(2, 2, k_len, D, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, k_len, D, generator=g, dtype=torch.float64)
    return q, k, v, causal, keep


def _allowed(q_len, k_len, causal, keep):
    allowed = torch.ones(2, 1, q_len, k_len, dtype=torch.bool)
    if causal:
        allowed = allowed & torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len)
    if keep is not None:
        allowed = allowed & keep[:, None, None, :]
    return allowed


@settings(max_examples=40)
@given(data=st.data())
def test_positions_are_bounded_and_non_increasing(data):
    q, k, _, causal, keep = _random_case(data)
    p = cope_positions(q, k, causal=causal, attn_mask=keep)
    allowed = _allowed(q.shape[2], k.shape[2], causal, keep)
    # the allowed keys from j to the end of the row (the query, when causal)
    count = allowed.flip(-1).cumsum(-1).flip(-1).to(p.dtype)
    # non-increasing in j over the allowed keys (a key the query may not attend is 0)
    allowed = allowed.expand_as(p)
    for row, ok in zip(p.reshape(-1, p.shape[-1]), allowed.reshape(-1, p.shape[-1])):
        kept = row[ok]
        assert bool((kept[:-1] >= kept[1:]).all())
    assert bool((p[~allowed] == 0).all())
    assert bool((p >= 0).all()) and bool((p <= count).all())


@settings(max_examples=25)
@given(data=st.data())
def test_open_gates_count_tokens(data):
    """Every gate open (q . k huge): p_ij = i' - j + 1, exactly, on causal pairs."""
    q_len = data.draw(st.integers(1, 6))
    k_len = data.draw(st.integers(q_len, 8))
    q = torch.full((1, 2, q_len, D), 6.0, dtype=torch.float64)
    k = torch.full((1, 2, k_len, D), 6.0, dtype=torch.float64)  # logits 6 * 6 * 8 / sqrt(8)
    p = cope_positions(q, k, causal=True)
    i = torch.arange(q_len)[:, None] + (k_len - q_len)
    j = torch.arange(k_len)[None, :]
    want = torch.where(j <= i, i - j + 1, 0).to(torch.float64).expand(1, 2, q_len, k_len)
    assert torch.equal(p, want)


@settings(max_examples=25)
@given(data=st.data(), backend=st.sampled_from(["eager", "chunked"]))
def test_zero_table_is_plain_attention(data, backend):
    q, k, v, causal, keep = _random_case(data)
    cope = CoPEBias(D, 9, dtype=torch.float64)  # the initial table is zero
    kw = dict(causal=causal, attn_mask=keep, backend=backend)
    out = posenc.attention(q, k, v, encoding=cope, **kw)
    plain = posenc.attention(q, k, v, encoding=None, **kw)
    assert torch.equal(out, plain)


@settings(max_examples=25)
@given(data=st.data())
def test_without_causal_mask_key_order_matters(data):
    k_len = data.draw(st.integers(3, 7), label="k_len")
    perm = data.draw(st.permutations(range(k_len)), label="perm")
    if perm == list(range(k_len)):
        perm = perm[1:] + perm[:1]
    seed = data.draw(st.integers(0, 2**16), label="seed")
    g = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(3, 1, 2, k_len, D, generator=g, dtype=torch.float64).unbind(0)
    perm = torch.tensor(perm)
    zero = CoPEBias(D, k_len + 1, dtype=torch.float64)
    cope = CoPEBias(D, k_len + 1, dtype=torch.float64)
    with torch.no_grad():
        cope.weight.copy_(2 * torch.randn(k_len + 1, D, generator=g, dtype=torch.float64))

    def attend(enc, kk, vv):
        return posenc.attention(q, kk, vv, encoding=enc, backend="eager")

    # a zero table sees no order (a sum over keys), a non-zero one does
    torch.testing.assert_close(
        attend(zero, k[:, :, perm], v[:, :, perm]), attend(zero, k, v), atol=1e-12, rtol=0
    )
    moved = (attend(cope, k[:, :, perm], v[:, :, perm]) - attend(cope, k, v)).abs().max()
    assert moved > 1e-4


# --- config ----------------------------------------------------------------------------------


def test_config_round_trip():
    cope = CoPEBias(D, 12, position_logit="unscaled")
    config = json.loads(json.dumps(cope.to_config()))
    assert config == {"name": "cope", "head_dim": D, "npos_max": 12, "position_logit": "unscaled"}
    twin = posenc.build(config)
    assert isinstance(twin, CoPEBias) and twin.to_config() == config
    assert twin.weight.shape == (12, D) and torch.equal(twin.weight, torch.zeros(12, D))
    assert isinstance(twin, ContextualEncoding) and twin.per_layer and twin.num_heads is None


def test_protocol_is_contextual_only():
    """CoPE implements the contextual protocol and nothing that would have to raise: no
    bias of positions, no gates."""
    cope = CoPEBias(D, 4)
    assert isinstance(cope, ContextualEncoding) and cope.kind == "bias"
    assert not isinstance(cope, (BiasEncoding, GatedEncoding))
    for method in ("bias", "bias_at", "score_mod_at", "gate_bias_at"):
        assert not hasattr(cope, method), method


# --- TinyTransformer -------------------------------------------------------------------------

VOCAB, DIM, HEADS = 13, 16, 2


def make_model(num_layers: int = 2, **kw) -> TinyTransformer:
    model = TinyTransformer(
        VOCAB, dim=DIM, num_heads=HEADS, num_layers=num_layers, encoding="cope", max_len=16, **kw
    ).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # sharper attention and non-zero tables, so CoPE matters
        for i, block in enumerate(model.blocks):
            block.attn.qkv.weight.mul_(30)
            table = model.layer_encoding(i).weight
            table.copy_(torch.randn(table.shape, generator=g))
    return model


def tokens(b=2, s=9, seed=0):
    return torch.randint(0, VOCAB, (b, s), generator=torch.Generator().manual_seed(seed))


def test_model_cache_equals_full_pass():
    model, t = make_model(), tokens()
    full, cache = lm.cache_equals_full_pass(model, t)
    with torch.no_grad():
        without = TinyTransformer.from_config(model.to_config()).eval()(t)  # zero tables
    assert (without - full).abs().max() > 1e-3  # the tables matter
    assert cache.length == 9


def test_model_cache_equals_full_pass_left_padded():
    lm.left_padded_cache_equals_full_pass(make_model(), tokens(s=8))


def test_model_generate_cache_equals_recompute():
    lm.generate_cache_equals_recompute(make_model(), tokens(s=4))


def test_model_has_a_table_per_layer():
    model = TinyTransformer(
        VOCAB, dim=DIM, num_heads=HEADS, num_layers=3, encoding="cope", max_len=16
    )
    tables = [model.layer_encoding(i).weight for i in range(3)]
    assert len({id(t) for t in tables}) == 3
    assert len({t.data_ptr() for t in tables}) == 3
    keys = sorted(k for k in model.state_dict() if k.endswith(".weight") and "enc" in k)
    assert keys == ["encoding.weight", "layer_encodings.1.weight", "layer_encodings.2.weight"]
    assert model.layer_encoding(0) is model.encoding
    for t in tables:
        assert t.shape == (17, DIM // HEADS) and torch.equal(t, torch.zeros_like(t))
    params = {id(p) for p in model.parameters()}
    assert all(id(t) in params for t in tables)


def test_model_npos_max():
    assert make_model().encoding.npos_max == 17  # max_len + 1, as the paper
    model = TinyTransformer(
        VOCAB, dim=DIM, num_heads=HEADS, encoding={"name": "cope", "npos_max": 5}, max_len=16
    )
    assert [model.layer_encoding(i).npos_max for i in range(2)] == [5, 5]


def test_model_config_round_trip():
    lm.config_round_trip(make_model(num_layers=3), tokens())


def test_model_trains_and_every_table_learns():
    """A counting task (how many 1s so far): AdamW lowers the loss; each table gets a gradient."""
    torch.manual_seed(0)
    model = TinyTransformer(8, dim=32, num_layers=2, num_heads=4, encoding="cope", max_len=12)
    model.train()
    x = torch.randint(1, 3, (16, 12))  # tokens 1 and 2
    y = (x == 1).cumsum(-1).clamp(max=7)

    def every_table_has_a_gradient():
        for i in range(model.num_layers):
            grad = model.layer_encoding(i).weight.grad
            assert grad is not None and grad.abs().max() > 0

    lm.trains(
        lambda: F.cross_entropy(model(x).flatten(0, 1), y.flatten()),
        torch.optim.AdamW(model.parameters(), lr=1e-2),
        40,
        after_first_backward=every_table_has_a_gradient,
    )
    for i in range(model.num_layers):
        assert model.layer_encoding(i).weight.abs().max() > 0


# --- issue 24: NaN, overflow, a meta mask, the module call, cope_position_logits ----------

_Q = torch.randn(1, 2, 4, 8, generator=torch.Generator().manual_seed(5))
_W = torch.randn(16, 8, generator=torch.Generator().manual_seed(6))


@pytest.mark.parametrize("scale", [1e308, 1e38])
@pytest.mark.parametrize("fn", ["cope_bias", "cope_positions", "module", "attention"])
def test_finite_input_overflowing_scale_is_refused_by_name(fn, scale):
    """scale=1e308 made the logits inf / NaN and CoPE indexed its table at int64's minimum
    (RuntimeError: index -9223372036854775808 is out of bounds)."""
    calls = {
        "cope_bias": lambda: cope_bias(_Q, _Q, _W, scale=scale),
        "cope_positions": lambda: cope_positions(_Q, _Q, npos_max=16, scale=scale),
        "module": lambda: _module(_W)(_Q, _Q, scale=scale),
        "attention": lambda: posenc.attention(
            _Q, _Q, _Q, encoding=_module(_W), causal=True, scale=scale
        ),
    }
    with pytest.raises(PosEncError, match=r"scale"):
        calls[fn]()


def _module(table: torch.Tensor) -> CoPEBias:
    cope = CoPEBias(table.shape[1], table.shape[0])
    with torch.no_grad():
        cope.weight.copy_(table)
    return cope


@pytest.mark.parametrize("where", ["q", "k"])
def test_nan_in_gives_nan_out_not_an_index_error(where):
    """A NaN activation (head 1, token 2): NaN exactly where it reaches (q: that query's
    visible keys; k: the keys up to it, for the queries that see it, as positions count
    from the key to the query), the reference of the clean input everywhere else."""
    q, k = _Q.double().clone(), _Q.double().clone()
    clean = (q.numpy().copy(), k.numpy().copy())
    (q if where == "q" else k)[0, 1, 2, 3] = float("nan")
    want = torch.from_numpy(ref.cope_bias(*clean, _W.double().numpy(), causal=True))
    want_pos = torch.from_numpy(ref.cope_positions(*clean, causal=True))
    reached = torch.zeros(1, 2, 4, 4, dtype=torch.bool)
    if where == "q":
        reached[0, 1, 2, :3] = True
    else:
        reached[0, 1, 2:, :3] = True
    want[reached], want_pos[reached] = float("nan"), float("nan")
    got = cope_bias(q, k, _W.double())
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0, equal_nan=True)
    pos = cope_positions(q, k)
    torch.testing.assert_close(pos, want_pos, atol=1e-12, rtol=0, equal_nan=True)


def test_attention_with_a_nan_activation_gives_nan_rows_not_an_index_error():
    q = _Q.clone()
    q[0, 0, 1, 0] = float("nan")
    out = posenc.attention(q, _Q, _Q, encoding=_module(_W), causal=True, backend="eager")
    assert bool(out[0, 0, 1].isnan().all())
    clean = posenc.attention(_Q, _Q, _Q, encoding=_module(_W), causal=True, backend="eager")
    torch.testing.assert_close(out[0, 1], clean[0, 1], rtol=0, atol=0)  # head 1: untouched


def test_largest_finite_scale_that_fits_equals_the_reference():
    """A large scale that does not overflow is taken as it is."""
    q, w = _Q.double() * 1e-3, _W.double()
    got = cope_bias(q, q, w, scale=1e6)
    want = torch.from_numpy(ref.cope_bias(q.numpy(), q.numpy(), w.numpy(), scale=1e6, causal=True))
    torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-12)


def test_meta_attn_mask_is_refused_by_name():
    keep = torch.ones(1, 4, dtype=torch.bool, device="meta")
    for call in (
        lambda: cope_bias(_Q, _Q, _W, attn_mask=keep),
        lambda: cope_positions(_Q, _Q, attn_mask=keep),
    ):
        with pytest.raises(
            PosEncError, match="attn_mask must hold values, got a tensor on the meta"
        ):
            call()


def test_meta_inputs_give_a_meta_result():
    q = _Q.to("meta")
    out = cope_bias(
        q, q, _W.to("meta"), attn_mask=torch.ones(1, 4, dtype=torch.bool, device="meta")
    )
    assert out.device.type == "meta" and out.shape == (1, 2, 4, 4)


def test_module_call_is_cope_bias():
    keep = torch.tensor([[False, True, True, True]])
    for position_logit in POSITION_LOGITS:
        cope = CoPEBias(8, 16, position_logit=position_logit)
        with torch.no_grad():
            cope.weight.copy_(_W)
        want = cope_bias(_Q, _Q, _W, position_logit=position_logit, scale=0.5, attn_mask=keep)
        got = cope(_Q, _Q, scale=0.5, attn_mask=keep)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    with pytest.raises(PosEncError, match=r"q must be a non-empty \[b, h, s, d\]"):
        CoPEBias(8, 16)(torch.zeros(2, 4, 8), _Q)


def test_position_logits_match_the_reference_interpolation():
    q, w = _Q.double(), _W.double()
    p = cope_positions(q, q, npos_max=16)
    got = cope_position_logits(q, w, p)
    fixed = (q @ w.T).numpy()  # [b, h, q, npos]
    lo = np.floor(p.numpy()).astype(np.int64)
    hi = np.minimum(lo + 1, 15)
    frac = p.numpy() - lo
    z_lo, z_hi = np.take_along_axis(fixed, lo, -1), np.take_along_axis(fixed, hi, -1)
    torch.testing.assert_close(
        got, torch.from_numpy(z_lo + frac * (z_hi - z_lo)), atol=1e-12, rtol=0
    )


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda: cope_position_logits(_Q, _W, torch.full((1, 2, 4, 4), float("nan"))),
            r"positions must be finite and in \[0, 15\]",
        ),
        (
            lambda: cope_position_logits(_Q, _W, torch.full((1, 2, 4, 4), 15.5)),
            r"positions must be finite and in \[0, 15\]",
        ),
        (
            lambda: cope_position_logits(_Q, _W, torch.full((1, 2, 4, 4), -1.0)),
            r"positions must be finite and in \[0, 15\]",
        ),
        (
            lambda: cope_position_logits(_Q, _W, torch.zeros(1, 2, 3, 4)),
            r"positions must be \[1, 2, 4, k\]",
        ),
        (
            lambda: cope_position_logits(_Q, _W, torch.zeros(1, 2, 4, 4, dtype=torch.long)),
            "positions must have a floating-point",
        ),
        (
            lambda: cope_position_logits(_Q, _W, torch.zeros(1, 2, 4, 0)),
            "positions must hold >= 1 key",
        ),
        (
            lambda: cope_position_logits(_Q, _W[:, :4], torch.zeros(1, 2, 4, 4)),
            r"weight must be \[npos_max, 8\]",
        ),
        (
            lambda: cope_position_logits(_Q.long(), _W, torch.zeros(1, 2, 4, 4)),
            "q must have a floating-point",
        ),
        (
            lambda: cope_position_logits(_Q[0, 0, 0], _W, torch.zeros(4)),
            r"q must be a non-empty \[\.\., q, d\]",
        ),
        (
            lambda: cope_position_logits(_Q, _W, torch.zeros(1, 2, 4, 4, device="meta")),
            "positions must be on cpu",
        ),
    ],
    ids=[
        "nan",
        "above",
        "negative",
        "shape",
        "dtype",
        "no-key",
        "weight",
        "q-dtype",
        "q-1d",
        "meta",
    ],
)
def test_position_logits_bad_input(call, match):
    with pytest.raises(PosEncError, match=match):
        call()


def test_nan_in_a_padded_key_stays_out():
    """Gates were masked by a product (NaN * 0 = NaN): a NaN in a padded key's slot made
    every row NaN. Now the padded key is out, and the result is the clean one, bit for bit."""
    k = _Q.clone()
    k[0, :, 0] = float("nan")  # key 0 is padding
    keep = torch.tensor([[False, True, True, True]])
    clean = _Q.clone()
    clean[0, :, 0] = 0.0
    for call in (
        lambda k: cope_bias(_Q, k, _W, attn_mask=keep),
        lambda k: cope_positions(_Q, k, attn_mask=keep),
        lambda k: posenc.attention(
            _Q, k, clean, encoding=_module(_W), causal=True, attn_mask=keep, backend="eager"
        ),
    ):
        torch.testing.assert_close(call(k), call(clean), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"head_dim": 10**12, "npos_max": 6}, r"^head_dim=1000000000000 would allocate"),
        ({"head_dim": 8, "npos_max": 10**12}, r"^npos_max=1000000000000 would allocate"),
    ],
)
def test_a_huge_table_names_the_size_that_asks_for_it(kwargs, match):
    """head_dim=1e12 was refused as npos_max=6 (the sibling)."""
    with pytest.raises(PosEncError, match=match):
        CoPEBias(**kwargs)
