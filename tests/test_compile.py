"""Every encoding under ``torch.compile(fullgraph=True, dynamic=True)``, ``torch.export`` with a
dynamic sequence dimension, and ``torch.jit.trace`` of a position-dependent scaling.

Compiled: one graph (``fullgraph``: no graph break) compiled once for three sequence lengths
(no recompile), equal to eager in the forward pass and in the gradients of every input and
parameter. The compiled call runs first at each length, so a graph that mutates module state
(a cache) while tracing shows up as a recompile. Most cases use the ``aot_eager`` backend
(Dynamo + AOT autograd, no C++ compile); a few run Inductor.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch._dynamo as dynamo
from torch.utils._pytree import tree_leaves

import posenc
from posenc import registry
from posenc._base import ContextualEncoding, GatedEncoding
from posenc.models import TinyTransformer
from posenc.rotary.kernels import cpu_fast_path_enabled, enable_cpu_fast_path

B, H, D = 2, 4, 16
LENGTHS = (5, 7, 11)
MAX_LEN = 64
NTK = {"type": "dynamic", "factor": 2.0, "max_position": 8}
LONGROPE = {
    "type": "longrope",
    "short_factor": [1.0 + i / 8 for i in range(D // 2)],
    "long_factor": [2.0 + i for i in range(D // 2)],
    "original_max_position": 8,
    "max_position": 32,
}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    dynamo.reset()
    dynamo.utils.counters.clear()
    yield
    dynamo.reset()


@pytest.fixture
def plain_rotary():
    """The plain torch rotation (the CPU fused path off) for the duration of a test."""
    was = cpu_fast_path_enabled()
    enable_cpu_fast_path(False)
    yield
    enable_cpu_fast_path(was)


def _build(name: str, **kwargs):
    extra = {"sections": [4, 2, 2]} if name == "mrope" else {}
    fill = {"num_heads": H, "head_dim": D, "dim": D, "max_len": MAX_LEN, "npos_max": MAX_LEN}
    return posenc.build(name, fill=fill, **extra, **kwargs)


def _grads(out, inputs):
    """Gradients of a fixed random projection of ``out`` w.r.t. ``inputs`` (None: unused)."""
    leaves = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    gen = torch.Generator().manual_seed(1)
    loss = sum((t.float() * torch.randn(t.shape, generator=gen)).sum() for t in leaves)
    return torch.autograd.grad(loss, inputs, allow_unused=True)


def _check_compiled(fn, make, params=(), *, backend="aot_eager", lengths=LENGTHS, atol=1e-5):
    """``fn(*make(s))`` compiled once (fullgraph, dynamic) equals eager at every length, in
    its outputs and in the gradients of the inputs that require them and of ``params``."""
    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend=backend)
    for i, s in enumerate(lengths):
        args = make(s)
        wrt = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        wrt += [p for p in params if p.requires_grad]
        # compiled first, so state a trace left behind would show in eager; past the first
        # length a recompile raises
        with dynamo.config.patch(error_on_recompile=i > 0):
            out = compiled(*args)
        ref = fn(*args)
        for got, want in zip(tree_leaves(out), tree_leaves(ref), strict=True):
            torch.testing.assert_close(got, want, atol=atol, rtol=1e-5)
        if wrt:
            for got, want in zip(_grads(out, wrt), _grads(ref, wrt), strict=True):
                assert (got is None) == (want is None)
                if got is not None:
                    torch.testing.assert_close(got, want, atol=atol, rtol=1e-5)
    graphs = dynamo.utils.counters["stats"]["unique_graphs"]
    assert graphs <= 1, f"{graphs} graphs for lengths {lengths}"  # 0: nothing to compute
    assert not dynamo.utils.counters["graph_break"], dict(dynamo.utils.counters["graph_break"])


def _qkv(s: int, n: int = 3, grad: bool = True):
    return tuple(torch.randn(B, H, s, D, requires_grad=grad) for _ in range(n))


def _gates(s: int) -> torch.Tensor:
    """Log forget gates ``[b, h, s]`` of a gated encoding (FoX)."""
    return torch.nn.functional.logsigmoid(torch.randn(B, H, s)).requires_grad_(True)


def _module_call(name: str, enc):
    """``(fn, make)``: the encoding's own call, by kind."""
    kind = registry.get(name).kind
    if kind == "additive":
        return (lambda x: enc(x)), (lambda s: (torch.randn(B, s, D, requires_grad=True),))
    if kind == "rotary":
        return (lambda q, k: enc(q, k)), (lambda s: _qkv(s, 2))
    if isinstance(enc, ContextualEncoding):  # CoPE: from the logits, queries and keys

        def contextual(q, k):
            return enc.contextual_bias_at(
                (q * D**-0.5) @ k.transpose(-1, -2), q, k, allowed=None, scale=D**-0.5
            )

        return contextual, (lambda s: _qkv(s, 2))
    if isinstance(enc, GatedEncoding):  # FoX: from the gates
        return (lambda g: enc.gate_bias_at(g, g.shape[-1])), (lambda s: (_gates(s),))
    if kind == "bias" and enc.query_dependent:  # Shaw: the key term needs the scaled queries
        return (lambda q: enc.bias(q.shape[-2], q=q * D**-0.5)), (lambda s: _qkv(s, 1))
    if kind == "bias":
        return (lambda q: enc.bias(q.shape[-2])), (lambda s: _qkv(s, 1, grad=False))
    return (lambda x: enc(x)), (lambda s: (torch.randn(B, s, D, requires_grad=True),))


@pytest.mark.parametrize("name", registry.names())
def test_module_compiles_once_for_every_length(name):
    enc = _build(name)
    fn, make = _module_call(name, enc)
    _check_compiled(fn, make, list(enc.parameters()))


ATTENTION = [n for n in registry.names() if registry.get(n).kind in ("rotary", "bias", "none")]


@pytest.mark.parametrize("name", ATTENTION)
def test_attention_compiles_once_for_every_length(name):
    enc = _build(name)
    if isinstance(enc, GatedEncoding):  # FoX: its gates are an input of every call

        def gated(q, k, v, g):
            return posenc.attention(q, k, v, encoding=enc, causal=True, gates=g)

        _check_compiled(gated, lambda s: (*_qkv(s), _gates(s)))
        return

    def fn(q, k, v):
        return posenc.attention(q, k, v, encoding=enc, causal=True)

    _check_compiled(fn, _qkv, list(enc.parameters()))


@pytest.mark.parametrize("name", ["rope", "xpos"])
def test_plain_rotary_path_compiles_once(name, plain_rotary):
    """The plain torch rotation (what runs where the fused CPU path cannot be built)."""
    enc = _build(name)
    _check_compiled(lambda q, k: enc(q, k), lambda s: _qkv(s, 2))


@pytest.mark.parametrize("name", ["rope", "t5"])
def test_attention_with_positions_and_padding_compiles_once(name):
    """Given positions (floating where the encoding takes them: their finiteness is a graph
    assertion) and a key padding mask."""
    enc = _build(name)
    coords = enc.position_coords if enc.kind == "rotary" else None

    def make(s):
        p = torch.arange(s) + 3
        p = p.double() + 0.5 if name == "rope" else p
        p = p if coords is None else p[:, None].repeat(1, coords)
        mask = torch.ones(B, s, dtype=torch.bool)
        mask[0, :2] = False
        return (*_qkv(s), p, mask)

    def fn(q, k, v, p, mask):
        return posenc.attention(
            q, k, v, encoding=enc, causal=True, q_positions=p, k_positions=p, attn_mask=mask
        )

    _check_compiled(fn, make, list(enc.parameters()))


@pytest.mark.parametrize("scaling", [NTK, LONGROPE], ids=["dynamic_ntk", "longrope"])
@pytest.mark.parametrize("given", [False, True], ids=["default_positions", "positions"])
def test_position_dependent_rope_compiles_once(scaling, given):
    """Largest positions on both sides of the scalings' threshold (8): the frequencies are
    chosen on the device, in the graph."""
    rope = posenc.RotaryEmbedding(D, scaling=scaling)

    def fn(q, k, *p):
        return rope(q, k, *p)

    def make(s):
        q, k = _qkv(s, 2)
        return (q, k, torch.arange(s) * 2) if given else (q, k)

    _check_compiled(fn, make, lengths=(5, 7, 11) if not given else (3, 5, 9))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "padded"),
    [("rope", True), ("alibi", False), ("learned", True)],
    ids=["rope-left_padded", "alibi", "learned-left_padded"],
)
def test_tiny_transformer_compiles_once(name, padded):
    """Padded: a 0/1 mask and positions from it (``positions.from_attention_mask``, traced)."""
    torch.manual_seed(0)
    model = TinyTransformer(13, dim=32, num_layers=1, num_heads=H, encoding=name, max_len=MAX_LEN)

    def make(s):
        mask = torch.ones(B, s, dtype=torch.long)
        mask[0, :2] = 0
        return torch.randint(0, 13, (B, s)), mask

    def fn(tokens, mask):
        if not padded:
            return model(tokens)
        return model(tokens, posenc.positions.from_attention_mask(mask), attn_mask=mask)

    _check_compiled(fn, make, list(model.parameters()))


@pytest.mark.slow
@pytest.mark.parametrize(
    "case", ["rope", "rope_dynamic_ntk", "alibi_attention", "tiny_transformer"]
)
def test_inductor(case):
    """The same checks with the Inductor backend (C++ on this CPU) on a few cases, forward
    only (the gradients are checked above; Inductor's backward would double the time)."""
    torch.manual_seed(0)
    if case.startswith("rope"):
        rope = posenc.RotaryEmbedding(D, scaling=NTK if case.endswith("ntk") else None)
        fn, make = (lambda q, k: rope(q, k)), (lambda s: _qkv(s, 2, False))
    elif case == "alibi_attention":
        enc = _build("alibi")
        fn = lambda q, k, v: posenc.attention(q, k, v, encoding=enc, causal=True)  # noqa: E731
        make = lambda s: _qkv(s, 3, False)  # noqa: E731
    else:
        model = TinyTransformer(13, dim=32, num_layers=1, num_heads=H, encoding="rope")
        fn, make = (lambda t: model(t)), (lambda s: (torch.randint(0, 13, (B, s)),))
    with torch.no_grad():
        _check_compiled(fn, make, backend="inductor")


# --- torch.export -----------------------------------------------------------------------------


class _Rotate(torch.nn.Module):
    def __init__(self, rope):
        super().__init__()
        self.rope = rope

    def forward(self, q, k):
        return self.rope(q, k)


class _Bias(torch.nn.Module):
    def __init__(self, bias):
        super().__init__()
        self.enc = bias

    def forward(self, q):
        return self.enc.bias(q.shape[-2])


def _export_cases():
    seq = {2: torch.export.Dim("s", min=2, max=MAX_LEN - 1)}
    tokens = {1: torch.export.Dim("s", min=2, max=MAX_LEN - 1)}
    embeds = {1: torch.export.Dim("s", min=2, max=MAX_LEN - 1)}
    return {
        "rope": (lambda: _Rotate(posenc.RotaryEmbedding(D)), lambda s: _qkv(s, 2, False), seq),
        "rope_dynamic_ntk": (
            lambda: _Rotate(posenc.RotaryEmbedding(D, scaling=NTK)),
            lambda s: _qkv(s, 2, False),
            seq,
        ),
        "t5_bias": (lambda: _Bias(_build("t5")), lambda s: _qkv(s, 1, False), seq),
        "alibi_bias": (lambda: _Bias(_build("alibi")), lambda s: _qkv(s, 1, False), seq),
        "learned": (lambda: _build("learned"), lambda s: (torch.randn(B, s, D),), embeds),
        "tiny_transformer": (
            lambda: TinyTransformer(13, dim=32, num_layers=1, num_heads=H, encoding="rope"),
            lambda s: (torch.randint(0, 13, (B, s)),),
            tokens,
        ),
    }


@pytest.mark.parametrize("case", list(_export_cases()))
def test_export_with_a_dynamic_sequence_dimension(case):
    torch.manual_seed(0)
    build, make, dims = _export_cases()[case]
    module = build()
    example = make(6)
    shapes = tuple(dims for _ in example)
    program = torch.export.export(module, example, dynamic_shapes=shapes)
    exported = program.module()
    for s in (5, 13):  # neither the example's length nor each other's
        args = make(s)
        for got, want in zip(tree_leaves(exported(*args)), tree_leaves(module(*args)), strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# --- checks under tracing -----------------------------------------------------------------------


def test_bad_input_still_raises_posenc_error_eagerly_and_fails_compiled():
    """Data-dependent checks are graph assertions when traced: out-of-range positions of a
    learned table raise (a RuntimeError with the rule) instead of reading past the table."""
    learned = _build("learned")
    x = torch.randn(B, 6, D)
    bad = torch.arange(6) + MAX_LEN
    with pytest.raises(posenc.PosEncError, match="max_len"):
        learned(x, bad)
    compiled = torch.compile(lambda x, p: learned(x, p), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x, torch.arange(6)), learned(x, torch.arange(6)))
    with pytest.raises(RuntimeError, match="max_len"):
        compiled(x, bad)
    nan = torch.tensor([0.0, float("nan"), 2.0, 3.0, 4.0, 5.0])
    rope = posenc.RotaryEmbedding(D)
    q = torch.randn(B, H, 6, D)
    with pytest.raises(posenc.PosEncError, match="finite"):
        rope(q, q, nan)
    rotate = torch.compile(lambda q, p: rope(q, q, p), fullgraph=True, backend="aot_eager")
    with pytest.raises(RuntimeError, match="finite"):
        rotate(q, nan)


def test_tokens_out_of_vocabulary_fail_compiled():
    model = TinyTransformer(13, dim=32, num_layers=1, num_heads=H, encoding="rope")
    compiled = torch.compile(lambda t: model(t), fullgraph=True, backend="aot_eager")
    with pytest.raises(RuntimeError, match="vocab_size"):
        compiled(torch.full((B, 5), 13))


# --- torch.jit.trace ----------------------------------------------------------------------------


def _check_jit_trace(scaling=NTK):
    rope = posenc.RotaryEmbedding(D, scaling=scaling)
    q, k = _qkv(6, 2, False)
    with pytest.warns(torch.jit.TracerWarning):  # the validation's host reads, traced away
        traced = torch.jit.trace(
            lambda q, k, p: rope(q, k, p), (q, k, torch.arange(6)), check_trace=False
        )
    for s, scale in ((6, 1), (6, 5), (9, 3), (4, 1)):
        q, k = _qkv(s, 2, False)
        p = torch.arange(s) * scale
        for got, want in zip(traced(q, k, p), rope(q, k, p), strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scaling", [NTK, LONGROPE], ids=["dynamic_ntk", "longrope"])
def test_jit_trace_of_position_dependent_rope_holds_at_every_length(scaling, plain_rotary):
    """The frequencies follow the traced positions (computed on the device, not read once
    on the host while tracing), below and beyond the scaling's threshold."""
    _check_jit_trace(scaling)


def test_jit_trace_through_the_fused_cpu_path():
    """The same with the CPU fused path on (the default where it builds)."""
    if not cpu_fast_path_enabled():
        pytest.skip("the fused CPU path is not available (no C compiler)")
    _check_jit_trace()


def test_compiled_before_the_first_eager_call_does_not_recompile():
    """A fresh process compiles RoPE before any eager rotation: the CPU switch is decided
    outside the trace (a constant of the graph), so the later eager call, which is the
    first to read the switch eagerly, leaves the compiled graph valid."""
    code = """
import torch, torch._dynamo as dynamo, posenc
dynamo.config.error_on_recompile = True
rope = posenc.RotaryEmbedding(16)
f = torch.compile(rope, fullgraph=True, dynamic=True, backend="aot_eager")
for s in (5, 9):
    q = torch.randn(1, 2, s, 16)
    f(q, q)
q = torch.randn(1, 2, 7, 16)
want = rope(q, q)
got = f(q, q)
assert all(torch.equal(a, b) for a, b in zip(got, want))
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]
