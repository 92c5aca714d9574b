"""posenc.attention (posenc.attend) against the float64 reference, for every encoding kind, case and path."""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass

import numpy as np
import pytest
import torch

import posenc
from posenc import PosEncError, reference
from posenc._base import BiasEncoding
from posenc.attend import dispatch as A
from posenc.attend import flex as FLEX
from posenc.attend import paths as P
from posenc.attend import prepare_encoding
from posenc.registry import get, names

ATOL = 2e-5  # float32 paths against the float64 reference
H, D = 4, 8

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


# --- encodings defined here: the BiasEncoding protocol on its own ----------------------


class SlopeBias(BiasEncoding):
    """-slope_h * |i - j| with a score_mod (what ALiBi-like encodings provide)."""

    name = "test_slope"

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.slopes = torch.linspace(0.1, 0.9, num_heads)
        self._set_config(num_heads=num_heads)

    def bias_at(self, q_positions, k_positions, *, q=None):
        dist = (q_positions[..., :, None] - k_positions[..., None, :]).abs().float()  # [.., q, k]
        slopes = self.slopes.to(dist.device)[:, None, None]
        return -slopes * (dist if dist.ndim == 2 else dist[:, None])

    def score_mod(self, q_positions, k_positions):
        slopes = self.slopes.to(q_positions.device)
        if q_positions.ndim == 1:

            def fn(score, b, h, q_idx, kv_idx):
                return score - slopes[h] * (q_positions[q_idx] - k_positions[kv_idx]).abs()

        else:

            def fn(score, b, h, q_idx, kv_idx):
                return score - slopes[h] * (q_positions[b, q_idx] - k_positions[b, kv_idx]).abs()

        return fn


class QueryBias(BiasEncoding):
    """Query-dependent: (q * scale) . r_{clip(j - i)} (Shaw-style relative keys), no score_mod."""

    name = "test_query"
    query_dependent = True

    def __init__(self, num_heads: int, head_dim: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.table = torch.nn.Parameter(torch.randn(7, head_dim))
        self._set_config(num_heads=num_heads, head_dim=head_dim)

    def _rel(self, q_positions, k_positions):
        rel = (k_positions[..., None, :] - q_positions[..., :, None]).clamp(-3, 3) + 3
        return self.table[rel]  # [.., q, k, d]

    def bias(self, q_len, k_len=None, *, q_positions=None, k_positions=None, q=None):
        qpos, kpos = posenc.positions.resolve_pair(q_len, k_len, q_positions, k_positions)
        return self.bias_at(qpos, kpos, q=q)

    def bias_at(self, q_positions, k_positions, *, q=None):
        r = self._rel(q_positions, k_positions)
        if r.ndim == 3:
            return torch.einsum("bhqd,qkd->bhqk", q, r.to(q.dtype))
        return torch.einsum("bhqd,bqkd->bhqk", q, r.to(q.dtype))


class ValueBias(QueryBias):
    """Also value-dependent: adds sum_j p_ij r_{clip(j - i)} to probs @ v."""

    name = "test_value"
    value_dependent = True

    def value_bias_at(self, probs, q_positions, k_positions):
        r = self._rel(q_positions, k_positions).to(probs.dtype)
        if r.ndim == 3:
            return torch.einsum("bhqk,qkd->bhqd", probs, r)
        return torch.einsum("bhqk,bqkd->bhqd", probs, r)


def _registered(kind: str, skip: tuple[str, ...] = ()) -> list[str]:
    return [n for n in names() if get(n).kind == kind and n not in skip]


def _positional(name: str) -> bool:
    """A bias of positions alone: the contextual CoPE and the gated FoX have their own
    reference tests (tests/contextual/test_cope.py, tests/gated/test_fox.py)."""
    return issubclass(get(name), BiasEncoding)


# mrope / axial_rope rotate by N-D positions ([..., s, n_axes]); attention's positions are 1-D.
ROTARY = _registered("rotary", skip=("mrope", "axial_rope"))
BIAS = [n for n in _registered("bias") if _positional(n)]
ENCODINGS = ["none", *ROTARY, *BIAS, "test_slope", "test_query", "test_value"]
LOCAL = {"test_slope": SlopeBias, "test_query": QueryBias, "test_value": ValueBias}


def get_or_none(name: str):
    return LOCAL.get(name) or get(name)


def make_encoding(name: str):
    if name in LOCAL:
        cls = LOCAL[name]
        takes = inspect.signature(cls.__init__).parameters
        return cls(H, D) if "head_dim" in takes else cls(H)
    return posenc.build(name, fill={"num_heads": H, "head_dim": D})


# --- cases --------------------------------------------------------------------------------


@dataclass
class Case:
    q_len: int
    k_len: int
    causal: bool
    kv_heads: int = H
    mask: str | None = None  # None | "padding" ([b, k]) | "full" ([b, 1, q, k])
    batched_positions: bool = False


CASES = {
    "self": Case(6, 6, False),
    "self-causal": Case(6, 6, True),
    "decode": Case(3, 9, True),
    "cross": Case(5, 4, False),
    "gqa-causal": Case(6, 6, True, kv_heads=2),
    "mqa-decode": Case(1, 7, True, kv_heads=1),
    "padding-causal": Case(6, 6, True, mask="padding", batched_positions=True),
    "padding-decode": Case(2, 8, True, mask="padding", batched_positions=True),
    "full-mask": Case(5, 7, False, mask="full"),
}


def make_inputs(case: Case):
    b = 2
    q = torch.randn(b, H, case.q_len, D)
    k = torch.randn(b, case.kv_heads, case.k_len, D)
    v = torch.randn(b, case.kv_heads, case.k_len, D)
    kw: dict = {"causal": case.causal}
    if case.mask == "padding":  # left padding: row 1 starts with 3 pad tokens
        keep = torch.ones(b, case.k_len, dtype=torch.bool)
        keep[1, :3] = False
        kw["attn_mask"] = keep
    elif case.mask == "full":
        keep = torch.rand(b, 1, case.q_len, case.k_len) > 0.3
        keep[0, 0, 1] = False  # a query that sees no key: output 0
        kw["attn_mask"] = keep
    if case.batched_positions:
        kpos = posenc.positions.from_attention_mask(kw["attn_mask"]) + torch.tensor([[0], [5]])
        kw["k_positions"] = kpos
        kw["q_positions"] = kpos[:, case.k_len - case.q_len :]
    return q, k, v, kw


def expected(name: str, enc, q, k, v, kw) -> torch.Tensor:
    """The float64 reference: reference rotation for rotary, the encoding's bias (float64
    copy of the module for query- and value-dependent ones) for bias encodings."""
    q_len, k_len = q.shape[2], k.shape[2]
    kpos = kw.get("k_positions", torch.arange(k_len))
    qpos = kw.get(
        "q_positions", kpos[..., k_len - q_len :] if q_len <= k_len else torch.arange(q_len)
    )
    mask = kw.get("attn_mask")
    if mask is not None and mask.ndim == 2:
        mask = mask[:, None, None, :]
    scale = 1 / np.sqrt(D)
    q64, k64, v64 = q.double(), k.double(), v.double()
    bias = value_term = None
    if enc is not None and enc.kind == "rotary":
        q64, k64 = reference.rotary.rotary_qk(
            q64.numpy(),
            k64.numpy(),
            qpos.numpy(),
            kpos.numpy(),
            enc.inv_freq.numpy(),
            layout=enc.layout,
            attention_scale=enc.attention_scale,
            xpos_scale_base=getattr(enc, "scale_base", None),
        )
        q64, k64 = torch.from_numpy(q64), torch.from_numpy(k64)
    elif enc is not None and enc.kind == "bias":
        enc64 = copy.deepcopy(enc).double()
        extra = {"q": q64 * scale} if enc.query_dependent else {}
        with torch.no_grad():
            bias = enc64.bias(q_len, k_len, q_positions=qpos, k_positions=kpos, **extra)
        bias = bias.double().numpy()
        if enc.value_dependent:

            def value_term(p):
                with torch.no_grad():
                    t = enc64.value_bias(torch.from_numpy(p), q_positions=qpos, k_positions=kpos)
                return t.numpy()

    out = reference.attention(
        q64.numpy(),
        k64.numpy(),
        v64.numpy(),
        bias=bias,
        causal=kw["causal"],
        mask=None if mask is None else mask.numpy(),
        value_term=value_term,
    )
    return torch.from_numpy(out)


def _refused(name: str, backend: str) -> bool:
    return backend in ("sdpa", "flex") and name == "test_value"


@pytest.fixture
def uncompiled_flex(monkeypatch):
    """Run the Flex path uncompiled (the same score_mods and block masks; no C++ build)."""
    monkeypatch.setattr(FLEX, "_FLEX_COMPILED", False)


def check_path(name: str, case: Case, backend: str) -> None:
    enc = make_encoding(name)
    q, k, v, kw = make_inputs(case)
    if _refused(name, backend):
        with pytest.raises(PosEncError, match="value-dependent"):
            posenc.attention(q, k, v, encoding=enc, backend=backend, **kw)
        return
    with torch.no_grad():  # Flex on CPU is inference-only
        out = posenc.attention(q, k, v, encoding=enc, backend=backend, **kw)
    assert out.shape == (2, H, case.q_len, D) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), expected(name, enc, q, k, v, kw), atol=ATOL, rtol=0)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", ENCODINGS)
def test_matches_reference(name, case, backend):
    check_path(name, CASES[case], backend)


# Flex traces each score_mod / mask_mod with dynamo (seconds each, compiled or not), so
# its cases share one shape: every encoding once on the case that has it all (causal
# decoding, GQA, left padding, batched positions), and every mask form once.
FLEX_CASE = Case(3, 9, True, kv_heads=2, mask="padding", batched_positions=True)


@pytest.mark.parametrize("name", ["none", *ROTARY, *BIAS, "test_slope", "test_query", "test_value"])
def test_flex_matches_reference(name, uncompiled_flex):
    check_path(name, FLEX_CASE, "flex")


@pytest.mark.parametrize("case", ["self", "decode", "gqa-causal", "full-mask"])
def test_flex_mask_forms(case, uncompiled_flex):
    check_path("test_slope", CASES[case], "flex")


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("name", ["none", *ROTARY, *BIAS, "test_query", "test_value"])
def test_gradients_match_eager(name, backend):
    """Training paths: gradients of q, k, v (and the encoding's parameters) agree with eager."""
    if _refused(name, backend):
        pytest.skip("value-dependent encodings run eager only")
    enc = make_encoding(name)
    q, k, v, kw = make_inputs(CASES["padding-causal"])
    grads = []
    for path in ("eager", backend):
        for t in (q, k, v):
            t.grad = None
            t.requires_grad_(True)
        enc.zero_grad()
        out = posenc.attention(q, k, v, encoding=enc, backend=path, **kw)
        (out * torch.linspace(-1, 1, D)).sum().backward()
        grads.append(
            [t.grad.clone() for t in (q, k, v)] + [p.grad.clone() for p in enc.parameters()]
        )
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


#: Biases of positions alone (no query in them): what the chunked path takes.
CHUNKABLE = [n for n in [*BIAS, "test_slope"] if not get_or_none(n).query_dependent]


def _grads_of(enc, backend: str, q, k, v, kw) -> list[torch.Tensor]:
    """Gradients of q, k, v and of every parameter of ``enc`` through one attention call."""
    for t in (q, k, v):
        t.grad = None
        t.requires_grad_(True)
    enc.zero_grad()
    out = posenc.attention(q, k, v, encoding=enc, backend=backend, **kw)
    (out * torch.linspace(-1, 1, D)).sum().backward()
    return [out.detach(), *(t.grad.clone() for t in (q, k, v))] + [
        p.grad.clone() for p in enc.parameters()
    ]


@pytest.mark.parametrize("case", ["padding-causal", "decode", "full-mask"])
@pytest.mark.parametrize("name", CHUNKABLE)
def test_chunked_backward_matches_eager(name, case, monkeypatch):
    """Issue 24: the chunked path's backward with a learned bias (T5, Kerple, FIRE) raised
    CheckpointError (the prepared bias, kept after the first block, made a recomputed block
    save other tensors than its forward). Output and every gradient, parameters' included,
    equal the eager path's, over blocks of two query rows."""
    monkeypatch.setattr(P, "CHUNK_SCORES", 2 * 2 * H * CASES[case].k_len)  # two rows a block
    enc = make_encoding(name)
    torch.manual_seed(0)
    q, k, v, kw = make_inputs(CASES[case])
    eager = _grads_of(enc, "eager", q, k, v, kw)
    chunked = _grads_of(enc, "chunked", q, k, v, kw)
    assert len(eager) == 4 + len(list(enc.parameters()))
    for a, b in zip(eager, chunked, strict=True):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)


def test_chunked_backward_of_the_issue():
    """The call of issue 24, whole gradients against eager (q, and T5's table)."""
    t5 = posenc.T5RelativeBias(2, causal=True)
    grads = []
    for backend in ("eager", "chunked"):
        q = torch.linspace(-1, 1, 64).reshape(1, 2, 4, 8).requires_grad_(True)
        t5.zero_grad()
        posenc.attention(q, q, q, encoding=t5, causal=True, backend=backend).sum().backward()
        grads.append((q.grad, t5.weight.grad.clone()))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)


def test_chunked_backward_with_a_prepared_bias(monkeypatch):
    """A PreparedEncoding whose bias an earlier call computed (the layers of one forward
    pass): the chunked path's gradients still reach the table, as the eager path's do."""
    monkeypatch.setattr(P, "CHUNK_SCORES", 1)  # a block of one row
    grads = []
    for backend in ("eager", "chunked"):
        t5 = posenc.T5RelativeBias(H, causal=True)
        torch.nn.init.normal_(t5.weight, generator=torch.Generator().manual_seed(1))
        torch.manual_seed(0)
        q, k, v, _ = make_inputs(CASES["self-causal"])
        prep = prepare_encoding(t5, q_len=6, num_heads=H, head_dim=D)
        for t in (q, k, v):
            t.requires_grad_(True)
        first = posenc.attention(q, k, v, encoding=prep, causal=True, backend=backend)
        second = posenc.attention(q, k, v, encoding=prep, causal=True, backend=backend)
        (first * second).sum().backward()
        grads.append([q.grad, k.grad, v.grad, t5.weight.grad])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_dtypes(dtype, backend):
    enc = make_encoding(BIAS[0] if BIAS else "test_slope")
    q, k, v, kw = make_inputs(CASES["self-causal"])
    want = expected(
        "bias", enc, q.to(dtype).double(), k.to(dtype).double(), v.to(dtype).double(), kw
    )
    out = posenc.attention(
        q.to(dtype), k.to(dtype), v.to(dtype), encoding=enc, backend=backend, **kw
    )
    assert out.dtype == dtype
    atol = {torch.bfloat16: 3e-2, torch.float64: 1e-10}[dtype]
    torch.testing.assert_close(out.double(), want, atol=atol, rtol=0)


# --- order: attention alone cannot see it ---------------------------------------------------


@pytest.mark.parametrize("name", ["none", *ROTARY, *BIAS])
def test_permutation(name):
    enc = make_encoding(name)
    q, k, v = torch.randn(3, 1, H, 8, D).unbind(0)
    perm = torch.tensor([3, 0, 7, 1, 5, 2, 6, 4])
    out = posenc.attention(q, k, v, encoding=enc)
    permuted = posenc.attention(q[:, :, perm], k[:, :, perm], v[:, :, perm], encoding=enc)
    if name == "none":  # permuting the tokens only permutes the outputs
        torch.testing.assert_close(permuted, out[:, :, perm], atol=1e-6, rtol=0)
    else:  # the encoding tells the positions apart
        assert (permuted - out[:, :, perm]).abs().max() > 1e-3


# --- the Flex path -----------------------------------------------------------------------


def test_flex_compiled():
    """The real compiled kernel, once (a C++ build: seconds): a registered bias encoding
    with causal decoding, GQA, left padding and batched positions at once."""
    check_path(BIAS[0] if BIAS else "test_slope", FLEX_CASE, "flex")


def test_flex_refuses_cpu_training():
    q, k, v, kw = make_inputs(CASES["self-causal"])
    q.requires_grad_(True)
    with pytest.raises(PosEncError, match="no backward on CPU"):
        posenc.attention(q, k, v, backend="flex", **kw)
    with pytest.raises(PosEncError, match="no dropout"):
        with torch.no_grad():
            posenc.attention(q, k, v, backend="flex", dropout_p=0.1, **kw)


def test_auto_choice(monkeypatch):
    """auto: Flex for a large bias with a score_mod and no gradients, else SDPA / eager."""
    monkeypatch.setattr(A, "FLEX_MIN_BIAS_BYTES", 1)
    q = torch.randn(1, H, 4, D)
    slope, query, value = SlopeBias(H), QueryBias(H, D), ValueBias(H, D)
    with torch.no_grad():
        assert A._choose("auto", q, slope, False, 0.0, 1, 4) == "flex"
        assert A._choose("auto", q, query, False, 0.0, 1, 4) == "sdpa"  # no score_mod
        assert A._choose("auto", q, None, False, 0.0, 1, 4) == "sdpa"
    assert A._choose("auto", q, slope, True, 0.0, 1, 4) == "sdpa"  # CPU training
    assert A._choose("auto", q, slope, False, 0.1, 1, 4) == "sdpa"  # dropout
    assert A._choose("auto", q, value, False, 0.0, 1, 4) == "eager"
    assert A._choose("auto", q.double(), slope, False, 0.0, 1, 4) == "sdpa"
    monkeypatch.setattr(A, "FLEX_MIN_BIAS_BYTES", 4 * H * 4 * 4 + 1)
    assert A._choose("auto", q, slope, False, 0.0, 1, 4) == "sdpa"  # small bias: SDPA


@pytest.mark.parametrize("name", ["none", *ROTARY, *BIAS, "test_value"])
def test_auto_matches_reference(name):
    check_path(name, FLEX_CASE, "auto")


def test_auto_under_grad_trains():
    """A T5-like encoding with parameters: auto must not pick Flex on CPU when training."""
    enc = QueryBias(H, D)
    q, k, v, kw = make_inputs(CASES["self-causal"])
    out = posenc.attention(q, k, v, encoding=enc, **kw)
    out.sum().backward()
    assert enc.table.grad is not None and enc.table.grad.abs().sum() > 0


def test_dropout():
    q, k, v, _ = make_inputs(CASES["self"])
    torch.manual_seed(1)
    a = posenc.attention(q, k, v, dropout_p=0.5, backend="eager")
    torch.manual_seed(1)
    b = posenc.attention(q, k, v, dropout_p=0.5, backend="eager")
    torch.testing.assert_close(a, b)
    assert (a - posenc.attention(q, k, v)).abs().max() > 1e-3


def test_names_and_configs_are_built():
    q, k, v, kw = make_inputs(CASES["self-causal"])
    rope = posenc.attention(q, k, v, encoding="rope", **kw)
    cfg = posenc.attention(q, k, v, encoding={"name": "rope", "base": 10000.0}, **kw)
    torch.testing.assert_close(rope, cfg, atol=0, rtol=0)
    torch.testing.assert_close(
        posenc.attention(q, k, v, encoding="none", **kw),
        posenc.attention(q, k, v, **kw),
        atol=0,
        rtol=0,
    )


# --- bad input ---------------------------------------------------------------------------


def _qkv(b=2, h=H, hk=H, sq=5, sk=5, d=D):
    return torch.randn(b, h, sq, d), torch.randn(b, hk, sk, d), torch.randn(b, hk, sk, d)


BAD = {
    "q-not-tensor": (lambda: ([[1.0]], *_qkv()[1:]), {}, "q must be a torch.Tensor"),
    "q-int": (
        lambda: (torch.ones(2, H, 5, D, dtype=torch.long), *_qkv()[1:]),
        {},
        "floating-point",
    ),
    "q-3d": (lambda: (torch.randn(H, 5, D), *_qkv()[1:]), {}, r"q must be \[b, h, s, d\]"),
    "dtypes": (lambda: (_qkv()[0].double(), *_qkv()[1:]), {}, "share one dtype"),
    "batch": (lambda: (_qkv(b=3)[0], *_qkv()[1:]), {}, "same batch size"),
    "head-dim": (lambda: (_qkv(d=4)[0], *_qkv()[1:]), {}, "k must have head dim 4"),
    "kv-lengths": (lambda: (_qkv()[0], _qkv()[1], _qkv(sk=6)[2]), {}, "k and v must have the same"),
    "gqa-heads": (lambda: _qkv(hk=3), {}, "must divide the number of query heads"),
    "causal-cross": (lambda: _qkv(sq=6, sk=5), {"causal": True}, "needs q_len <= k_len"),
    "causal-type": (lambda: _qkv(), {"causal": 1}, "causal must be a bool"),
    "backend": (lambda: _qkv(), {"backend": "flash"}, "backend must be one of"),
    "scale": (lambda: _qkv(), {"scale": 0.0}, "scale must be > 0"),
    "dropout": (lambda: _qkv(), {"dropout_p": 1.0}, "dropout_p must be < 1"),
    "dropout-neg": (lambda: _qkv(), {"dropout_p": -0.1}, "dropout_p must be >= 0"),
    "additive": (lambda: _qkv(), {"encoding": posenc.SinusoidalEmbedding(8)}, "is additive"),
    "additive-name": (lambda: _qkv(), {"encoding": "sinusoidal"}, "is additive"),
    "encoding-type": (
        lambda: _qkv(),
        {"encoding": 3},
        "encoding must be a registry name, a config dict or an Encoding module, got int",
    ),
    "unknown-name": (lambda: _qkv(), {"encoding": "alibo"}, "name must be one of"),
    "bias-heads": (lambda: _qkv(), {"encoding": SlopeBias(H + 1)}, "num_heads=5; it must equal"),
    "q-positions": (
        lambda: _qkv(),
        {"q_positions": torch.arange(4)},
        "q_positions must have length 5",
    ),
    "k-positions": (
        lambda: _qkv(),
        {"k_positions": torch.arange(6)},
        "k_positions must have length 5",
    ),
    "positions-batch": (lambda: _qkv(), {"k_positions": torch.zeros(3, 5)}, "b == 2"),
    "positions-nan": (lambda: _qkv(), {"k_positions": torch.full((5,), float("nan"))}, "finite"),
    "mask-float": (lambda: _qkv(), {"attn_mask": torch.zeros(2, 5)}, "attn_mask must be a bool"),
    "mask-2d": (
        lambda: _qkv(),
        {"attn_mask": torch.ones(5, 5, dtype=torch.bool)},
        r"\[b, k\] = \[2, 5\]",
    ),
    "mask-4d": (
        lambda: _qkv(),
        {"attn_mask": torch.ones(2, 3, 5, 5, dtype=torch.bool)},
        r"\[b\|1, h\|1",
    ),
    "mask-3d": (lambda: _qkv(), {"attn_mask": torch.ones(2, 5, 5, dtype=torch.bool)}, "got shape"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input(case):
    make, kwargs, match = BAD[case]
    q, k, v = make()
    with pytest.raises(PosEncError, match=match):
        posenc.attention(q, k, v, **kwargs)


def test_bad_encoding_config():
    q, k, v = _qkv()
    with pytest.raises(PosEncError, match="head_dim must be 8 here"):
        posenc.attention(q, k, v, encoding={"name": "rope", "head_dim": 4})
    with pytest.raises(PosEncError, match="encoding config must hold a 'name' key"):
        posenc.attention(q, k, v, encoding={"heads": 2})


# --- issue 24: a scale whose logits overflow ---------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "scale", "match"),
    [
        (
            torch.float32,
            1e308,
            r"scale must be <= 4\.254e\+37 \(scale \* head_dim finite in torch\.float32",
        ),
        (
            torch.float64,
            1e308,
            r"scale must be <= 2\.247e\+307 \(scale \* head_dim finite in torch\.float64",
        ),
        (torch.float16, 1e4, r"scale must be <= 8188 \(scale \* head_dim finite in torch\.float16"),
    ],
)
@pytest.mark.parametrize("backend", ["auto", "eager", "sdpa", "chunked"])
def test_overflowing_scale_is_refused_by_name(backend, dtype, scale, match):
    """scale=1e308 gave a NaN output from finite q, k, v."""
    q, k, v = (t.to(dtype) for t in _qkv())
    with pytest.raises(PosEncError, match=match):
        posenc.attention(q, k, v, scale=scale, backend=backend, encoding="alibi")


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_largest_scale_allowed_gives_the_reference(backend):
    """At the bound, unit-size q and k keep finite logits: the float64 reference's output."""
    q, k, v = _qkv()
    q, k = q / q.abs().amax(), k / k.abs().amax()  # entries in [-1, 1]
    q, k, v = q.double(), k.double(), v.double()
    scale = float(torch.finfo(torch.float64).max) / D / 4  # headroom for the softmax's shift
    out = posenc.attention(q, k, v, scale=scale, backend=backend)
    logits = np.einsum("bhqd,bhkd->bhqk", q.numpy() * scale, k.numpy())
    logits -= logits.max(-1, keepdims=True)
    probs = np.exp(logits)
    want = (probs / probs.sum(-1, keepdims=True)) @ v.numpy()
    torch.testing.assert_close(out, torch.from_numpy(want), atol=1e-12, rtol=0)
