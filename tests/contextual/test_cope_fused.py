"""CoPE's fused CPU path (posenc.contextual.cope_fused) against the float64 oracle and eager.

Every case runs with blocks of a few query rows (several blocks, the last one short), and
asserts that the fused path ran; gradients of q, k, v and the table equal eager's."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import reference as ref
from posenc.attend import dispatch as A
from posenc.contextual import CoPEBias
from posenc.contextual import cope_fused as CF

pytestmark = pytest.mark.skipif(not CF.available(), reason="no C compiler: no fused CoPE")

ATOL = {torch.float64: 1e-12, torch.float32: 2e-5}


@dataclass(frozen=True)
class Case:
    b: int = 2
    h: int = 3
    q_len: int = 13
    k_len: int = 13
    d: int = 8
    causal: bool = True
    kv_heads: int = 3
    mask: str | None = None  # "left": left padding with rows that see no key
    npos_max: int = 32
    position_logit: str = "scaled"
    scale: float | None = None
    logit_shift: float = 0.0  # added to every q.k logit through q: gates near 1 or 0
    wider_values: int = 0  # d_v - d


CASES = {
    "causal": Case(),
    "full": Case(causal=False),
    "decode": Case(q_len=3, k_len=17),
    "one-query": Case(q_len=1, k_len=9),
    "padding": Case(mask="left"),
    "padding-full": Case(causal=False, mask="left"),
    "gqa": Case(h=4, kv_heads=2),
    "mqa-decode": Case(h=4, kv_heads=1, q_len=4, k_len=11),
    "unscaled": Case(position_logit="unscaled"),
    "clamp": Case(npos_max=3),
    "clamp-one": Case(npos_max=1),
    "scale": Case(scale=0.3),
    "open-gates": Case(logit_shift=12.0),  # every gate about 1: positions count tokens
    "shut-gates": Case(logit_shift=-12.0),  # positions near 0
    "values-wider": Case(wider_values=3),
}


def keep_mask(case: Case) -> torch.Tensor | None:
    if case.mask is None:
        return None
    keep = torch.ones(case.b, case.k_len, dtype=torch.bool)
    keep[0, :2] = False
    keep[1, : case.k_len - 2] = False  # causal: its first queries see no key
    return keep


def inputs(case: Case, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    q = randn(case.b, case.h, case.q_len, case.d)
    k = randn(case.b, case.kv_heads, case.k_len, case.d)
    v = randn(case.b, case.kv_heads, case.k_len, case.d + case.wider_values)
    if case.logit_shift:  # one channel of q and k carries the shift: q.k * scale += shift
        scale = case.scale or case.d**-0.5
        q[..., 0], k[..., 0] = case.logit_shift / scale, 1.0
    table = randn(case.npos_max, case.d)
    return [t.to(dtype) for t in (q, k, v, table)]


def cope_of(case: Case, table: torch.Tensor) -> CoPEBias:
    cope = CoPEBias(case.d, case.npos_max, position_logit=case.position_logit, dtype=table.dtype)
    with torch.no_grad():
        cope.weight.copy_(table)
    return cope


def run(case: Case, cope, q, k, v, backend="auto"):
    return posenc.attention(
        q, k, v, encoding=cope, causal=case.causal, attn_mask=keep_mask(case),
        scale=case.scale, backend=backend,
    )  # fmt: skip


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 2 query rows (for b * h * k around 80): several, the last one short."""
    monkeypatch.setattr(CF, "BLOCK_SCORES", 2 * 2 * 4 * 17)


@pytest.fixture
def fused_calls(monkeypatch):
    """The number of fused calls made (each case asserts it took the fused path)."""
    calls = []
    real = CF.fused

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(CF, "fused", spy)
    return calls


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference(name, dtype, small_blocks, fused_calls):
    case = CASES[name]
    q, k, v, table = inputs(case, dtype)
    out = run(case, cope_of(case, table), q, k, v)
    assert fused_calls == [1]
    keep = keep_mask(case)
    want = ref.cope_attention(
        *(t.double().numpy() for t in (q, k, v, table)), scale=case.scale,
        position_logit=case.position_logit, causal=case.causal,
        keep=None if keep is None else keep.numpy(),
    )  # fmt: skip
    assert out.dtype == dtype and out.shape == (case.b, case.h, case.q_len, v.shape[-1])
    torch.testing.assert_close(out.double(), torch.from_numpy(want), atol=ATOL[dtype], rtol=0)


def grads(case: Case, backend: str, q, k, v, table):
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    cope = cope_of(case, table)
    out = run(case, cope, *leaves, backend=backend)
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)
    (out * weights).sum().backward()
    return [out.detach()] + [t.grad for t in leaves] + [cope.weight.grad]


@pytest.mark.parametrize("name", list(CASES))
def test_gradients_equal_eager(name, small_blocks, fused_calls):
    case = CASES[name]
    q, k, v, table = inputs(case, torch.float64)
    fused = grads(case, "auto", q, k, v, table)
    eager = grads(case, "eager", q, k, v, table)
    assert fused_calls == [1]
    assert eager[4].abs().max() > 0 or case.npos_max == 1  # the table learns
    for what, a, b in zip(("out", "q", "k", "v", "table"), fused, eager, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0, msg=f"{name}: {what}")


def test_gradcheck(small_blocks):
    case = Case(b=2, h=2, kv_heads=2, q_len=5, k_len=7, d=4, npos_max=6, mask="left")
    q, k, v, table = inputs(case, torch.float64)
    cope = cope_of(case, table)

    def fn(q, k, v, w):
        assert w is cope.weight
        return run(case, cope, q, k, v)

    leaves = (*(t.requires_grad_(True) for t in (q, k, v)), cope.weight)
    assert torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-7, rtol=1e-5)


def test_float32_as_close_to_float64_as_eager():
    """At 512 tokens (gates summed over hundreds of keys) the float32 fused answer is as
    close to the float64 one as float32 eager is (within 2x), output and gradients."""
    case = Case(b=1, h=2, kv_heads=2, q_len=512, k_len=512, d=16, npos_max=513)
    q, k, v, table = inputs(case, torch.float64, seed=3)
    truth = grads(case, "eager", q, k, v, table)
    low = [t.float() for t in (q, k, v, table)]
    fused, eager = grads(case, "auto", *low), grads(case, "eager", *low)
    for what, f, e, t in zip(("out", "q", "k", "v", "table"), fused, eager, truth, strict=True):
        err, floor = (f.double() - t).abs().max(), (e.double() - t).abs().max()
        assert err <= 2 * floor + 1e-6, f"{what}: {err:.3g} against eager's {floor:.3g}"


def test_saves_no_score_matrix():
    """Saved for backward: q, k, v, the table, the output and two numbers a row."""
    s, d = 512, 16
    q, k, v = (torch.randn(1, 2, s, d).requires_grad_(True) for _ in range(3))
    cope = CoPEBias(d, s + 1)
    saved = 0

    def pack(t):
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = posenc.attention(q, k, v, encoding=cope, causal=True)
    out.sum().backward()
    rows = 2 * s  # h * s query rows
    assert saved == 4 * (4 * rows * d + (s + 1) * d + 2 * rows)  # q, k, v, out; table; 2 a row
    assert saved < 4 * rows * s / 4  # a quarter of one [h, s, s] float32 score matrix


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_16_bit_is_widened_like_eager(dtype, fused_calls):
    case = CASES["padding"]
    q, k, v, table = inputs(case, dtype)
    cope = cope_of(case, table.float())
    out = run(case, cope, q, k, v)
    assert fused_calls == [1] and out.dtype == dtype
    torch.testing.assert_close(out, run(case, cope, q, k, v, backend="eager"), atol=0, rtol=0)


def test_nan_gives_nan_like_eager(fused_calls):
    case = CASES["causal"]
    q, k, v, table = inputs(case, torch.float32)
    q[0, 1, 4, 2] = float("nan")
    out = run(case, cope_of(case, table), q, k, v)
    assert fused_calls == [1]
    want = run(case, cope_of(case, table), q, k, v, backend="eager")
    assert torch.equal(out.isnan(), want.isnan()) and out[0, 1, 4].isnan().all()
    torch.testing.assert_close(out, want, atol=2e-5, rtol=0, equal_nan=True)


class _Other(CoPEBias):
    def contextual_bias_at(self, logits, q, k, *, allowed, scale):
        return 2 * super().contextual_bias_at(logits, q, k, allowed=allowed, scale=scale)


@pytest.mark.parametrize(
    "why", ["dropout", "switched-off", "subclass", "explicit-eager", "explicit-chunked"]
)
def test_other_calls_take_eager_or_chunked(why, monkeypatch, fused_calls):
    case = CASES["causal"]
    q, k, v, table = inputs(case, torch.float32)
    cope = cope_of(case, table)
    kw = {"encoding": cope, "causal": True}
    if why == "dropout":
        kw["dropout_p"] = 0.1
    elif why == "switched-off":
        monkeypatch.setattr(CF, "_state", False)
    elif why == "subclass":
        kw["encoding"] = other = _Other(case.d, case.npos_max)
        other.load_state_dict(cope.state_dict())
    else:
        kw["backend"] = why.split("-")[1]
    out = posenc.attention(q, k, v, **kw)
    assert fused_calls == [] and out.shape == q.shape
    if why == "subclass":  # its own term is used
        plain = posenc.attention(q, k, v, encoding=cope, causal=True)
        assert not torch.allclose(out, plain)


def test_failed_build_logs_once_and_keeps_eager(monkeypatch, caplog):
    def broken():
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(CF, "_state", None)
    monkeypatch.setattr(CF, "_load", broken)
    with caplog.at_level(logging.WARNING, logger="posenc"):
        assert not CF.available() and not CF.available()
    assert [r.getMessage() for r in caplog.records] == [
        "posenc: CoPE's fused CPU path is off: no compiler here"
    ]
    case = CASES["causal"]
    q, _, _, table = inputs(case, torch.float32)
    assert A._choose("auto", q, cope_of(case, table), True, 0.0, case.b, case.k_len) == "eager"


def test_environment_switch_turns_it_off(monkeypatch):
    monkeypatch.setattr(CF, "_state", None)
    monkeypatch.setenv("POSENC_CPU_FAST_PATH", "0")
    assert not CF.available()


def test_traced_calls_take_eager():
    case = CASES["causal"]
    q, k, v, table = inputs(case, torch.float32)
    cope = cope_of(case, table)
    fn = torch.compile(lambda q, k, v: posenc.attention(q, k, v, encoding=cope, causal=True))
    torch.testing.assert_close(fn(q, k, v), run(case, cope, q, k, v), atol=2e-5, rtol=0)


@settings(max_examples=25, deadline=None)
@given(
    q_len=st.integers(1, 9),
    extra=st.integers(0, 6),
    causal=st.booleans(),
    npos=st.integers(1, 12),
    shift=st.sampled_from([-8.0, 0.0, 3.0, 8.0]),
    padded=st.booleans(),
    rows=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_fused_equals_eager_property(q_len, extra, causal, npos, shift, padded, rows, seed):
    """For any shape, mask, clamp, block size and gate level, fused equals eager (float64),
    output and gradients."""
    case = Case(
        b=2, h=2, kv_heads=1, q_len=q_len, k_len=q_len + extra, d=4, causal=causal,
        mask="left" if padded and q_len + extra > 2 else None, npos_max=npos,
        logit_shift=shift,
    )  # fmt: skip
    real = CF.BLOCK_SCORES
    CF.BLOCK_SCORES = rows * 2 * 2 * case.k_len
    try:
        q, k, v, table = inputs(case, torch.float64, seed)
        fused, eager = grads(case, "auto", q, k, v, table), grads(case, "eager", q, k, v, table)
    finally:
        CF.BLOCK_SCORES = real
    for a, b in zip(fused, eager, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


@pytest.mark.parametrize("name", ["BLOCK_SCORES", "applies", "available", "fused"])
def test_old_module_keeps_its_names_for_one_release(name):
    import posenc.attend.cope_fused as old

    message = rf"posenc\.attend\.cope_fused\.{name} moved to posenc\.contextual\.cope_fused"
    with pytest.warns(DeprecationWarning, match=message):
        assert getattr(old, name) is getattr(CF, name)
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        old.nothing  # noqa: B018
