"""Forgetting attention (FoX): attention and bias against the float64 oracle on every path,
float32 precision at long lengths, gradients, refusals, properties, and the TinyTransformer
integration (a forget-gate projection per layer, gates cached with the keys)."""

from __future__ import annotations

import json
from dataclasses import dataclass

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
from posenc.attend import flex as FLEX
from posenc.attend import paths as P
from posenc.gated import FoXBias, fox_bias, fox_cumulative
from posenc.models import TinyTransformer

B, H, D = 2, 4, 8
ATOL = {torch.float64: 1e-12, torch.float32: 1e-5}

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


# --- cases ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    q_len: int
    k_len: int
    kv_heads: int = H
    mask: bool = False  # left padding; row 1 has no key for its first queries
    scale: float | None = None
    sharp: float = 2.0  # spread of the gate logits: log f = logsigmoid(sharp * N(0, 1))


CASES = {
    "self": Case(6, 6),
    "decode": Case(2, 7),
    "one-query": Case(1, 7),
    "padding": Case(6, 6, mask=True),
    "padding-decode": Case(3, 7, mask=True),
    "gqa": Case(6, 6, kv_heads=2),
    "mqa-decode": Case(3, 7, kv_heads=1),
    "scale": Case(6, 6, scale=0.7),
    "strong-gates": Case(6, 6, sharp=6.0),
}


def keep_mask(case: Case) -> torch.Tensor | None:
    if not case.mask:
        return None
    keep = torch.ones(B, case.k_len, dtype=torch.bool)
    keep[0, :2] = False
    keep[1, : case.k_len - 2] = False  # the first queries of row 1 see no key: output 0
    return keep


def make_inputs(case: Case, dtype=torch.float64, seed: int = 0, dv: int = D):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, case.q_len, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, case.kv_heads, case.k_len, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, case.kv_heads, case.k_len, dv, generator=g, dtype=torch.float64)
    logits = case.sharp * torch.randn(B, H, case.k_len, generator=g, dtype=torch.float64)
    gates = F.logsigmoid(logits)
    return q.to(dtype), k.to(dtype), v.to(dtype), gates.to(dtype)


def oracle(case: Case, q, k, v, gates) -> torch.Tensor:
    keep = keep_mask(case)
    out = ref.fox_attention(
        q.double().numpy(),
        k.double().numpy(),
        v.double().numpy(),
        gates.double().numpy(),
        scale=case.scale,
        keep=None if keep is None else keep.numpy(),
    )
    return torch.from_numpy(out)


def run(case: Case, q, k, v, gates, backend: str, fox: FoXBias | None = None):
    return posenc.attention(
        q,
        k,
        v,
        encoding=FoXBias(H) if fox is None else fox,
        causal=True,
        attn_mask=keep_mask(case),
        scale=case.scale,
        backend=backend,
        gates=gates,
    )


def empty_rows(case: Case) -> torch.Tensor | None:
    """``[b, q]``: the queries that may attend to no key."""
    keep = keep_mask(case)
    if keep is None:
        return None
    tri = torch.ones(case.q_len, case.k_len, dtype=torch.bool).tril(case.k_len - case.q_len)
    return ~(keep[:, None, :] & tri).any(-1)


@pytest.fixture
def one_row_blocks(monkeypatch):
    """The chunked path with a block of one query row (the default fits these sizes in one)."""
    monkeypatch.setattr(P, "CHUNK_SCORES", 1)


@pytest.fixture
def uncompiled_flex(monkeypatch):
    """Run the Flex path uncompiled (the same score_mods and block masks; no C++ build)."""
    monkeypatch.setattr(FLEX, "_FLEX_COMPILED", False)


# --- attention against the oracle ---------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("backend", ["eager", "chunked", "sdpa", "auto"])
@pytest.mark.parametrize("name", list(CASES))
def test_attention_matches_reference(name, backend, dtype, one_row_blocks):
    case = CASES[name]
    q, k, v, gates = make_inputs(case, dtype)
    out = run(case, q, k, v, gates, backend)
    assert out.shape == (B, H, case.q_len, D) and out.dtype == dtype
    torch.testing.assert_close(out.double(), oracle(case, q, k, v, gates), atol=ATOL[dtype], rtol=0)
    empty = empty_rows(case)
    if empty is not None:
        assert empty.any()
        rows = out.permute(0, 2, 1, 3)[empty]
        assert torch.equal(rows, torch.zeros_like(rows))


@pytest.mark.parametrize("name", ["padding-decode", "gqa"])
def test_flex_matches_reference(name, uncompiled_flex):
    case = CASES[name]
    q, k, v, gates = make_inputs(case, torch.float32)
    with torch.no_grad():  # Flex on CPU is inference-only
        out = run(case, q, k, v, gates, "flex")
    torch.testing.assert_close(out.double(), oracle(case, q, k, v, gates), atol=1e-5, rtol=0)


def test_flex_compiled():
    """The real compiled kernel, once: decoding, GQA and left padding at once."""
    case = Case(3, 7, kv_heads=2, mask=True)
    q, k, v, gates = make_inputs(case, torch.float32)
    with torch.no_grad():
        out = run(case, q, k, v, gates, "flex")
    torch.testing.assert_close(out.double(), oracle(case, q, k, v, gates), atol=1e-5, rtol=0)


@pytest.mark.parametrize("backend", ["eager", "chunked", "sdpa"])
def test_float64_gates_with_float32_inputs(backend):
    """Gates of any floating dtype are accepted (not checked against q's): float64 gates
    with float32 q, k, v give the float32 answer on every path, as SDPA does."""
    case = CASES["decode"]
    q, k, v, gates = make_inputs(case)
    out = run(case, q.float(), k.float(), v.float(), gates, backend)
    assert out.dtype == torch.float32
    want = oracle(case, q.float(), k.float(), v.float(), gates)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=0)


def test_auto_choice_folds_at_any_size(monkeypatch):
    """auto: FoX's term is separable, so SDPA (the term folded into the keys) at any size."""
    case = CASES["gqa"]
    q = make_inputs(case, torch.float32)[0]
    monkeypatch.setattr(A, "FLEX_MIN_BIAS_BYTES", 1)
    for grad, dropout in [(True, 0.0), (False, 0.0), (False, 0.1)]:
        assert A._choose("auto", q, FoXBias(H), grad, dropout, B, case.k_len) == "sdpa"


def test_auto_choice_without_fold(monkeypatch):
    """auto for a gated term that does not fold: SDPA for small scores; above
    FLEX_MIN_BIAS_BYTES Flex without gradients, the chunked path with them (no Flex
    backward on CPU)."""
    case = CASES["gqa"]
    q, k, v, gates = make_inputs(case, torch.float32)
    fox = FoXBias(H)
    monkeypatch.setattr(FoXBias, "separable", False)
    scores_bytes = 4 * B * H * case.q_len * case.k_len
    calls = []
    for name in ("eager", "chunked", "sdpa", "_flex"):
        real = getattr(A, name)

        def record(*args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(A, name, record)
    monkeypatch.setattr(FLEX, "_FLEX_COMPILED", False)
    want = oracle(case, q, k, v, gates)
    monkeypatch.setattr(A, "FLEX_MIN_BIAS_BYTES", scores_bytes + 1)
    assert A._choose("auto", q, fox, True, 0.0, B, case.k_len) == "sdpa"
    outs = [run(case, q, k, v, gates, "auto", fox)]
    monkeypatch.setattr(A, "FLEX_MIN_BIAS_BYTES", scores_bytes)
    assert A._choose("auto", q, fox, False, 0.0, B, case.k_len) == "flex"
    assert A._choose("auto", q, fox, True, 0.0, B, case.k_len) == "chunked"
    assert A._choose("auto", q, fox, False, 0.1, B, case.k_len) == "chunked"  # dropout
    with torch.no_grad():
        outs.append(run(case, q, k, v, gates, "auto", fox))
    outs.append(run(case, q.requires_grad_(True), k, v, gates, "auto", fox))
    assert calls == ["sdpa", "_flex", "chunked"]
    for out in outs:
        torch.testing.assert_close(out.detach().double(), want, atol=1e-5, rtol=0)


# --- the bias ------------------------------------------------------------------------------


@pytest.mark.parametrize("q_len", [None, 1, 3], ids=["self", "one-query", "decode"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_bias_matches_reference(q_len, dtype):
    g = torch.Generator().manual_seed(0)
    gates = F.logsigmoid(2 * torch.randn(B, H, 7, generator=g, dtype=torch.float64)).to(dtype)
    got = fox_bias(gates, q_len)
    want = torch.from_numpy(ref.fox_bias(gates.double().numpy(), 7 if q_len is None else q_len))
    assert got.shape == want.shape and got.dtype == dtype
    torch.testing.assert_close(got.double(), want, atol=ATOL[dtype], rtol=0)
    assert torch.equal(got.isinf(), want.isinf())


def test_module_gate_bias_equals_fox_bias_rows():
    gates = F.logsigmoid(torch.randn(B, H, 7))
    fox = FoXBias(H)
    full = fox_bias(gates, 4)
    rows = fox.gate_bias_at(gates, 4)
    causal = ~full.isinf()
    assert torch.equal(rows[causal], full[causal])
    assert torch.equal(fox.gate_bias_at(gates, 4, start=1, stop=3), rows[..., 1:3, :])
    torch.testing.assert_close(fox_cumulative(gates), gates.double().cumsum(-1), atol=0, rtol=0)


def test_constant_gates_are_alibi():
    """log f = -m for every token: D_ij = -m (i - j), exactly (power-of-two slopes)."""
    slopes = [0.5, 0.25, 2.0**-6]
    gates = -torch.tensor(slopes)[None, :, None].expand(1, 3, 9).contiguous()
    bias = fox_bias(gates, 5)[0]  # [h, 5, 9]: queries 4..8
    alibi = posenc.ALiBiBias(3, slopes=slopes).bias(5, 9)
    i = torch.arange(5)[:, None] + 4
    j = torch.arange(9)[None, :]
    causal = (j <= i).expand(3, 5, 9)
    assert torch.equal(bias[causal], alibi[causal])
    m = torch.tensor(slopes)[:, None, None]
    assert torch.equal(bias[causal], (-m * (i - j)).expand(3, 5, 9)[causal])
    assert bool((bias[~causal] == float("-inf")).all())


def test_float32_precision_at_long_length():
    """200_000 tokens with log f about -1e-3: c reaches about -300, where a float32 ulp is
    3e-5. The float64 cumsum split into a float32 head and tail keeps c_i - c_j of nearby
    pairs (|D| ~ 1e-3) to ~1e-9; a plain float32 cumsum loses it to ~1e-5."""
    n = 200_000
    g = torch.Generator().manual_seed(0)
    gates = (-1e-3 * (0.5 + torch.rand(1, 1, n, generator=g))).float()  # [-1.5e-3, -5e-4]
    bias = fox_bias(gates, 4)[0, 0]  # [4, n]: queries n-4 .. n-1
    exact = gates[0, 0].double()
    plain = gates[0, 0].cumsum(-1)  # float32 (torch's cumsum rounds each c_t to float32)
    got, want, naive = [], [], []
    for row in range(4):
        i = n - 4 + row
        for j in range(i - 8, i + 1):
            got.append(bias[row, j].item())
            want.append(exact[j + 1 : i + 1].sum().item())
            naive.append((plain[i] - plain[j]).item())
    got, want, naive = (torch.tensor(x, dtype=torch.float64) for x in (got, want, naive))
    assert want.min() < -5e-3 and plain[-1] < -100
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    assert (naive - want).abs().max() > 1e-6  # what the split avoids


# --- gradients -------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["eager", "sdpa", "chunked"])
def test_gradcheck(backend, one_row_blocks):
    # Tiny sizes and a value dim of 2: gradcheck runs a backward per output element.
    case = Case(3, 4, kv_heads=1, mask=True)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(B, 2, 3, 4, generator=g, dtype=torch.float64)
    k = torch.randn(B, 1, 4, 4, generator=g, dtype=torch.float64)
    v = torch.randn(B, 1, 4, 2, generator=g, dtype=torch.float64)
    gates = F.logsigmoid(torch.randn(B, 2, 4, generator=g, dtype=torch.float64))
    fox = FoXBias(2)

    def fn(q, k, v, gates):
        return posenc.attention(
            q,
            k,
            v,
            encoding=fox,
            causal=True,
            attn_mask=keep_mask(case),
            backend=backend,
            gates=gates,
        )

    inputs = tuple(t.clone().requires_grad_(True) for t in (q, k, v, gates))
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("backend", ["sdpa", "chunked"])
def test_float32_gradients_equal_eager(backend, monkeypatch):
    monkeypatch.setattr(P, "CHUNK_SCORES", 8)  # a block of one row
    case = CASES["padding-decode"]
    q, k, v, gates = make_inputs(case, torch.float32)
    grads = []
    for path in ("eager", backend):
        inputs = [t.clone().requires_grad_(True) for t in (q, k, v, gates)]
        out = run(case, *inputs, path)
        (out * torch.linspace(-1, 1, D)).sum().backward()
        grads.append([t.grad for t in inputs])
    assert grads[0][3].abs().max() > 0
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


# --- refusals --------------------------------------------------------------------------------

_q, _k, _v = torch.randn(3, 1, 2, 3, D).unbind(0)
_g = torch.zeros(1, 2, 3)


def _attend(gates=_g, encoding=None, **kw):
    kw.setdefault("causal", True)
    encoding = FoXBias(2) if encoding is None else encoding
    return posenc.attention(_q, _k, _v, encoding=encoding, gates=gates, **kw)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        pytest.param(
            lambda: _attend(gates=None),
            r"encoding 'fox' is gated: pass gates=\[b, h, k\]",
            id="gates-missing",
        ),
        pytest.param(
            lambda: _attend(causal=False),
            "encoding 'fox' is causal only: pass causal=True",
            id="not-causal",
        ),
        pytest.param(
            lambda: _attend(gates=torch.zeros(1, 3, 3)),
            r"gates must have 2 heads \(the encoding's num_heads\), got shape \(1, 3, 3\)",
            id="heads",
        ),
        pytest.param(
            lambda: _attend(gates=torch.zeros(2, 2, 3)),
            r"gates must be \[b, h, k\] = \[1, 2, 3\], got shape \(2, 2, 3\)",
            id="batch",
        ),
        pytest.param(
            lambda: _attend(gates=torch.zeros(1, 2, 4)),
            r"gates must be \[b, h, k\] = \[1, 2, 3\], got shape \(1, 2, 4\)",
            id="length",
        ),
        pytest.param(
            lambda: _attend(gates=torch.zeros(1, 2)),
            r"gates must be the log forget gates \[b, h, k\] .* got shape \(1, 2\)",
            id="ndim",
        ),
        pytest.param(
            lambda: _attend(gates=torch.zeros(1, 2, 3, device="meta")),
            "gates must be on cpu .* got meta",
            id="device",
        ),
        pytest.param(
            lambda: _attend(gates=torch.zeros(1, 2, 3, dtype=torch.long)),
            "gates must have a floating-point dtype",
            id="dtype",
        ),
        pytest.param(
            lambda: posenc.attention(_q, _k, _v, causal=True, gates=_g),
            r"gates are read by gated encodings \('fox'\); no encoding takes none",
            id="no-encoding",
        ),
        pytest.param(
            lambda: _attend(encoding="alibi"),
            "gates are read by gated encodings .* encoding 'alibi' takes none",
            id="alibi",
        ),
        pytest.param(
            lambda: _attend(encoding=FoXBias(3)),
            "encoding 'fox' has num_heads=3; it must equal the number of query heads, 2",
            id="encoding-heads",
        ),
        pytest.param(
            lambda: posenc.attention(
                _q.clone().requires_grad_(True),
                _k,
                _v,
                encoding=FoXBias(2),
                causal=True,
                gates=_g,
                backend="flex",
            ),
            "no backward on CPU",
            id="flex-training",
        ),
        pytest.param(lambda: FoXBias(0), "num_heads must be >= 1, got 0", id="num-heads-0"),
        pytest.param(lambda: fox_bias(_g, 4), "q_len must be <= 3, got 4", id="q-len"),
        pytest.param(
            lambda: fox_bias(torch.zeros(3)),
            r"gates must be the log forget gates \[b, h, k\]",
            id="bias-ndim",
        ),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(PosEncError, match=match):
        call()


# --- properties ------------------------------------------------------------------------------


def _random_gates(data, dtype):
    k_len = data.draw(st.integers(1, 12), label="k_len")
    q_len = data.draw(st.integers(1, k_len), label="q_len")
    sharp = data.draw(st.floats(0.1, 20.0), label="sharp")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    g = torch.Generator().manual_seed(seed)
    logits = sharp * torch.randn(2, 3, k_len, generator=g, dtype=torch.float64)
    return F.logsigmoid(logits).to(dtype), q_len


@settings(max_examples=50)
@given(data=st.data(), dtype=st.sampled_from([torch.float32, torch.float64]))
def test_bias_is_non_positive_on_causal_pairs(data, dtype):
    gates, q_len = _random_gates(data, dtype)
    bias = fox_bias(gates, q_len)
    k_len = gates.shape[-1]
    causal = torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len).expand_as(bias)
    assert bool((bias[causal] <= 0).all())
    assert bool((bias[~causal] == float("-inf")).all())
    diagonal = bias[..., torch.arange(q_len), torch.arange(q_len) + (k_len - q_len)]
    assert torch.equal(diagonal, torch.zeros_like(diagonal))


@settings(max_examples=50)
@given(data=st.data(), dtype=st.sampled_from([torch.float32, torch.float64]))
def test_decay_composes(data, dtype):
    """D_ij = D_il + D_lj for j <= l <= i (every token a query)."""
    gates, _ = _random_gates(data, dtype)
    n = gates.shape[-1]
    bias = fox_bias(gates).double()  # [b, h, n, n]
    i, mid, j = torch.meshgrid(torch.arange(n), torch.arange(n), torch.arange(n), indexing="ij")
    ok = (j <= mid) & (mid <= i)
    lhs = bias[..., i[ok], j[ok]]
    rhs = bias[..., i[ok], mid[ok]] + bias[..., mid[ok], j[ok]]
    atol = 1e-12 if dtype == torch.float64 else 1e-6 * max(1.0, float(-lhs.min()))
    torch.testing.assert_close(lhs, rhs, atol=atol, rtol=0)


# --- config ----------------------------------------------------------------------------------


def test_config_round_trip():
    fox = FoXBias(6)
    config = json.loads(json.dumps(fox.to_config()))
    assert config == {"name": "fox", "num_heads": 6}
    twin = posenc.build(config)
    assert isinstance(twin, FoXBias) and twin.to_config() == config
    assert isinstance(twin, GatedEncoding) and list(twin.parameters()) == []


def test_protocol_is_gated_only():
    """Forgetting attention implements the gated protocol and nothing that would have to
    raise: no bias of positions, no contextual term."""
    fox = FoXBias(2)
    assert isinstance(fox, GatedEncoding) and fox.kind == "bias"
    assert not isinstance(fox, (BiasEncoding, ContextualEncoding))
    for method in ("bias", "bias_at", "score_mod_at", "contextual_bias_at"):
        assert not hasattr(fox, method), method


# --- TinyTransformer -------------------------------------------------------------------------

VOCAB, DIM, HEADS = 13, 16, 2


def make_model(**kw) -> TinyTransformer:
    model = TinyTransformer(VOCAB, dim=DIM, num_heads=HEADS, encoding="fox", max_len=64, **kw)
    model.eval()
    with torch.no_grad():  # sharper attention and gates that differ per token
        for block in model.blocks:
            block.attn.qkv.weight.mul_(30)
            block.attn.forget.weight.mul_(100)
    return model


def tokens(b=2, s=9, seed=0):
    return torch.randint(0, VOCAB, (b, s), generator=torch.Generator().manual_seed(seed))


def test_model_cache_equals_full_pass():
    _, cache = lm.cache_equals_full_pass(make_model(), tokens())
    assert sorted(cache.gates) == [0, 1]
    assert all(g.shape == (2, HEADS, 9) and bool((g <= 0).all()) for g in cache.gates.values())
    assert cache.gates[0].std() > 0.1  # the gates differ per token


def test_model_cache_equals_full_pass_left_padded():
    _, cache = lm.left_padded_cache_equals_full_pass(make_model(), tokens(s=8))
    for g in cache.gates.values():  # padding forgets nothing
        assert torch.equal(g[1, :, :3], torch.zeros(HEADS, 3))
        assert bool((g[:, :, 3:] < 0).all()) and bool((g[0] < 0).all())


def test_model_padding_changes_nothing_for_real_tokens():
    """A left-padded row equals the same row unpadded (padding keys masked, gates 0)."""
    model, t = make_model(), tokens(s=8)
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[1, :3] = False
    pos = posenc.positions.from_attention_mask(mask)
    with torch.no_grad():
        padded = model(t, pos, attn_mask=mask)[1, 3:]
        alone = model(t[1:, 3:])[0]
    torch.testing.assert_close(padded, alone, atol=1e-5, rtol=1e-5)


def test_model_generate_cache_equals_recompute():
    lm.generate_cache_equals_recompute(make_model(), tokens(s=4))


def test_model_forget_gates_per_layer():
    model = TinyTransformer(VOCAB, dim=64, num_heads=4, num_layers=3, encoding="fox")
    forgets = [block.attn.forget for block in model.blocks]
    assert len({id(f) for f in forgets}) == 3
    for f in forgets:
        assert isinstance(f, torch.nn.Linear) and f.weight.shape == (4, 64)
        assert abs(f.weight.std().item() - 0.02) < 0.004  # std 0.02 over 256 values
        assert torch.equal(f.bias, torch.zeros(4))
    keys = sorted(k for k in model.state_dict() if "forget" in k)
    assert keys == [f"blocks.{i}.attn.forget.{p}" for i in range(3) for p in ("bias", "weight")]
    assert model.encoding.num_heads == 4
    plain = TinyTransformer(VOCAB, dim=64, num_heads=4, encoding="alibi")
    assert all(block.attn.forget is None for block in plain.blocks)


def test_model_config_round_trip():
    config = lm.config_round_trip(make_model(), tokens())
    assert config["encoding"] == {"name": "fox", "num_heads": HEADS}


def test_model_trains_and_forget_gates_learn():
    """A copy task: AdamW lowers the loss; every forget projection gets a gradient."""
    torch.manual_seed(0)
    model = TinyTransformer(8, dim=32, num_layers=2, num_heads=4, encoding="fox", max_len=16)
    model.train()

    def every_forget_gate_has_a_gradient():
        for block in model.blocks:
            for p in block.attn.forget.parameters():
                assert p.grad is not None and p.grad.abs().max() > 0

    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    lm.trains(lm.copy_loss(model), opt, 30, after_first_backward=every_forget_gate_has_a_gradient)


# --- issue 24: every entry point checks the gates' values -------------------------------

_FOX_ENTRY = {
    "fox_bias": lambda g: fox_bias(g),
    "fox_cumulative": lambda g: fox_cumulative(g),
    "FoXBias.forward": lambda g: FoXBias(g.shape[1])(g),
    "FoXBias.check_gates": lambda g: FoXBias(g.shape[1]).check_gates(g, 1, g.shape[2], g.device),
    **{
        f"attention-{backend}": (
            lambda g, backend=backend: posenc.attention(
                *torch.randn(3, 1, g.shape[1], g.shape[2], D).unbind(0),
                encoding=FoXBias(g.shape[1]),
                causal=True,
                gates=g,
                backend=backend,
            )
        )
        for backend in ("auto", "eager", "sdpa", "chunked")
    },
}


def _gates_holding(value: float, dtype=torch.float32) -> torch.Tensor:
    g = torch.full((1, 2, 4), -0.25, dtype=dtype)
    g[0, 1, 2] = value
    return g


_BAD_GATES = {
    "positive": (lambda: _gates_holding(0.5), r"gates must be log forget gates .* <= 0 .* 0\.5"),
    "nan": (lambda: _gates_holding(float("nan")), r"gates must be log forget gates .* nan"),
    "plus-inf": (lambda: _gates_holding(float("inf")), r"gates must be log forget gates .* inf"),
    "minus-inf": (lambda: _gates_holding(float("-inf")), r"gates must sum to >= -3\.403e\+38"),
    # each gate is a float32, but their sum (-4e38) is not: the split sums were -inf, D NaN
    "sum-overflows": (
        lambda: torch.full((1, 2, 4), -1e38),
        r"gates must sum to >= -3\.403e\+38 over the keys .* float32",
    ),
    "sum-overflows-float64": (
        lambda: torch.full((1, 2, 4), -1e308, dtype=torch.float64),
        r"gates must sum to >= -1\.798e\+308 over the keys .* float64",
    ),
    "shape": (lambda: torch.zeros(3), r"gates must be the log forget gates \[b, h, k\]"),
    "empty": (lambda: torch.zeros(1, 2, 0), r"gates must be the log forget gates \[b, h, k\]"),
    "dtype": (lambda: torch.zeros(1, 2, 4, dtype=torch.long), "gates must have a floating-point"),
    "not-a-tensor": (lambda: [[[0.0]]], "gates must be a torch.Tensor, got list"),
}


# the module and attention calls build their other arguments from the gates' shape
_SHAPELESS = ("shape", "empty", "not-a-tensor")


@pytest.mark.parametrize(
    ("entry", "bad"),
    [
        (entry, bad)
        for entry in _FOX_ENTRY
        for bad in _BAD_GATES
        if entry.startswith("fox_") or bad not in _SHAPELESS
    ],
)
def test_every_entry_point_refuses_bad_gates(entry, bad):
    make, match = _BAD_GATES[bad]
    g = make()
    with pytest.raises(PosEncError, match=match):
        _FOX_ENTRY[entry](g)


@pytest.mark.parametrize("entry", ["fox_bias", "fox_cumulative", "FoXBias.forward"])
def test_meta_gates_are_refused_by_name(entry):
    with pytest.raises(PosEncError, match="gates must hold values, got a tensor on the meta"):
        _FOX_ENTRY[entry](torch.zeros(1, 2, 4, device="meta"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_extreme_valid_gates_give_the_reference(dtype):
    """Gates of 0 (logsigmoid saturates there) and gates whose sum just fits the dtype of the
    cumulative sums: accepted, finite wherever the key is visible, equal to the oracle."""
    big = -1e38 if dtype == torch.float32 else -1e307
    # (the huge gates come last: below them a float64 cumulative sum of ~1e38 has no digits
    # left for the small ones, a precision limit of c_i - c_j, not an overflow)
    g = torch.tensor([[[-0.5, 0.0, -0.25, big, big], [0.0, -1.0, 0.0, 0.0, 2 * big]]], dtype=dtype)
    got = fox_bias(g, 3)
    want = torch.from_numpy(ref.fox_bias(g.double().numpy(), 3)).to(dtype)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    visible = torch.isfinite(want)
    assert bool(torch.isfinite(got[visible]).all())
    torch.testing.assert_close(FoXBias(2)(g, 3), got, rtol=0, atol=0)
    torch.testing.assert_close(fox_cumulative(g), g.double().cumsum(-1), rtol=0, atol=0)


def test_module_call_is_fox_bias():
    g = F.logsigmoid(torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(3)))
    torch.testing.assert_close(FoXBias(3)(g), fox_bias(g), rtol=0, atol=0)
    torch.testing.assert_close(FoXBias(3)(g, q_len=2), fox_bias(g, 2), rtol=0, atol=0)
    with pytest.raises(PosEncError, match=r"gates must have 2 heads \(the encoding's num_heads\)"):
        FoXBias(2)(g)
