"""The contextual and gated protocols on their own: a new member of either, defined here and
registered nowhere, works in posenc.attention (every path its protocol allows) and in
TinyTransformer without either knowing it, and is compared whole-tensor against a float64
softmax written out by hand."""

from __future__ import annotations

import math
from typing import ClassVar

import pytest
import torch
from tests.models import _lm_checks as lm

import posenc
from posenc import PosEncError
from posenc._base import BiasEncoding, ContextualEncoding, GatedEncoding
from posenc.attend import flex as FLEX
from posenc.attend import paths as P
from posenc.models import TinyTransformer

B, H, S, D = 2, 3, 7, 8


class LogitDamp(ContextualEncoding):
    """A contextual term of the logits alone: ``-damping * relu(logits)`` (any heads)."""

    name: ClassVar[str] = "test_logit_damp"
    num_heads = None

    def __init__(self, damping: float = 0.5) -> None:
        super().__init__()
        self.damping = damping
        self._set_config(damping=damping)

    def contextual_bias_at(self, logits, q, k, *, allowed, scale):
        return -self.damping * logits.clamp(min=0)


class HalfForget(GatedEncoding):
    """A gated term: half the sum of the gates between key and query, ``(c_i - c_j) / 2``."""

    name: ClassVar[str] = "test_half_forget"

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self._set_config(num_heads=num_heads)

    def check_gates(self, gates, b, k_len, device):
        if tuple(gates.shape) != (b, self.num_heads, k_len):
            raise PosEncError(f"gates must be [{b}, {self.num_heads}, {k_len}], got shape")
        return gates

    def gate_bias_at(self, gates, q_len, *, start=0, stop=None):
        stop = q_len if stop is None else stop
        c = gates.to(torch.float64).cumsum(-1)
        first = c.shape[-1] - q_len
        rows = c[..., first + start : first + stop]
        return ((rows[..., :, None] - c[..., None, :]) / 2).float()

    def gate_score_mod_at(self, gates, q_len):
        c = gates.to(torch.float64).cumsum(-1).float().contiguous()
        first = c.shape[-1] - q_len

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + (c[b, h, first + q_idx] - c[b, h, kv_idx]) / 2

        return score_mod


def _qkv(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, S, D, generator=g) * 2 for _ in range(3))


def _gates(seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.logsigmoid(torch.randn(B, H, S, generator=g))


def _softmax_by_hand(q, k, v, term) -> torch.Tensor:
    """float64 ``softmax(q k^T / sqrt(d) + term(logits) + causal mask) v``."""
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    logits = q @ k.transpose(-1, -2) / math.sqrt(D)
    logits = logits + term(logits)
    future = torch.ones(S, S, dtype=torch.bool).triu(1)
    return torch.softmax(logits.masked_fill(future, float("-inf")), dim=-1) @ v


def test_members_implement_only_their_protocol():
    for enc, protocol in ((LogitDamp(), ContextualEncoding), (HalfForget(H), GatedEncoding)):
        assert isinstance(enc, protocol) and not isinstance(enc, BiasEncoding)
        assert enc.kind == "bias" and not hasattr(enc, "bias_at")


@pytest.mark.parametrize("backend", ["auto", "eager", "chunked"])
def test_new_contextual_member_in_attention(backend, monkeypatch):
    monkeypatch.setattr(P, "CHUNK_SCORES", 2 * B * H * S)  # blocks of two query rows
    q, k, v = _qkv()
    out = posenc.attention(q, k, v, encoding=LogitDamp(), causal=True, backend=backend)
    want = _softmax_by_hand(q, k, v, lambda logits: -0.5 * logits.clamp(min=0))
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=0)


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_new_contextual_member_refuses_paths_without_logits(backend):
    with pytest.raises(PosEncError, match="is contextual"):
        posenc.attention(*_qkv(), encoding=LogitDamp(), causal=True, backend=backend)


@pytest.mark.parametrize("backend", ["auto", "sdpa", "eager", "chunked", "flex"])
def test_new_gated_member_in_attention(backend, monkeypatch):
    monkeypatch.setattr(P, "CHUNK_SCORES", 2 * B * H * S)
    monkeypatch.setattr(FLEX, "_FLEX_COMPILED", False)
    q, k, v = _qkv()
    gates = _gates()
    with torch.no_grad():  # Flex has no backward on CPU
        out = posenc.attention(
            q, k, v, encoding=HalfForget(H), causal=True, gates=gates, backend=backend
        )
    c = gates.to(torch.float64).cumsum(-1)
    want = _softmax_by_hand(q, k, v, lambda _: (c[..., :, None] - c[..., None, :]) / 2)
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=0)


def test_new_gated_member_needs_its_gates():
    with pytest.raises(PosEncError, match="is gated: pass gates"):
        posenc.attention(*_qkv(), encoding=HalfForget(H), causal=True)
    with pytest.raises(PosEncError, match=r"gates must be \[2, 3, 7\]"):
        posenc.attention(*_qkv(), encoding=HalfForget(H), causal=True, gates=_gates()[:1])


def _model(encoding) -> TinyTransformer:
    model = TinyTransformer(13, dim=16, num_heads=2, num_layers=2, encoding=encoding).eval()
    with torch.no_grad():  # sharper attention, so the term matters
        for block in model.blocks:
            block.attn.qkv.weight.mul_(30)
    return model


def _tokens(s: int = 9) -> torch.Tensor:
    return torch.randint(0, 13, (2, s), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("make", [LogitDamp, lambda: HalfForget(2)], ids=["contextual", "gated"])
def test_new_members_in_tiny_transformer(make):
    """Unregistered members run in the model: the KV cache equals the full pass (also
    left-padded), and the term changes the logits."""
    model = _model(make())
    full, _ = lm.cache_equals_full_pass(model, _tokens())
    lm.left_padded_cache_equals_full_pass(model, _tokens(8))
    plain = _model("none")
    plain.load_state_dict(model.state_dict(), strict=False)
    with torch.no_grad():
        assert (plain(_tokens()) - full).abs().max() > 1e-3
    gated = isinstance(model.encoding, GatedEncoding)
    assert all((block.attn.forget is not None) == gated for block in model.blocks)


# --- issue 24: calling a logit encoding module (nn.Module's forward) -----------------------


class OffsetBias(BiasEncoding):
    """A bias of positions defining only bias_at: its call is the base's bias()."""

    name = "test_offset"

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads

    def bias_at(self, q_positions, k_positions, *, q=None):
        d = (q_positions[:, None] - k_positions[None, :]).float()
        return d.expand(self.num_heads, *d.shape)


def _bias_calls():
    """(module, its call, the method the call must equal), for every registered bias."""
    q = torch.randn(1, 4, 5, 8, generator=torch.Generator().manual_seed(2))
    kpos = torch.arange(7) * 2
    cases = {
        "alibi": (posenc.ALiBiBias(4), {}),
        "t5": (posenc.T5RelativeBias(4), {}),
        "fire": (posenc.FIREBias(4), {}),
        "kerple": (posenc.KerpleBias(4), {}),
        "shaw": (posenc.ShawRelativeBias(4, 8), {"q": q}),
        "test_offset": (OffsetBias(4), {}),
    }
    for name, (enc, extra) in cases.items():
        kw = {"k_positions": kpos, **extra}
        yield (
            name,
            lambda enc=enc, kw=kw: enc(5, 7, **kw),
            lambda enc=enc, kw=kw: enc.bias(5, 7, **kw),
        )


@pytest.mark.parametrize(
    ("call", "method"), [c[1:] for c in _bias_calls()], ids=[c[0] for c in _bias_calls()]
)
def test_a_bias_module_call_is_its_bias(call, method):
    """module(...) raised NotImplementedError (nn.Module has no forward); it is bias()."""
    got, want = call(), method()
    assert got.shape[-2:] == (5, 7)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_every_registered_logit_encoding_defines_forward():
    """Each registered bias-kind class answers module(...) with its term, never
    nn.Module's NotImplementedError."""
    from posenc.registry import get, names

    for name in names():
        cls = get(name)
        if cls.kind == "bias":
            assert cls.forward is not torch.nn.Module.forward, name
            assert cls.forward.__doc__, name


@pytest.mark.parametrize(
    ("make", "args", "match"),
    [
        (LogitDamp, _qkv()[:2], "LogitDamp defines no forward \\(its term from q and k\\)"),
        (
            lambda: HalfForget(H),
            (_gates(),),
            "HalfForget defines no forward \\(its term from the gates\\)",
        ),
    ],
    ids=["contextual", "gated"],
)
def test_a_member_without_forward_says_what_to_call(make, args, match):
    with pytest.raises(PosEncError, match=match + ".*posenc.attention"):
        make()(*args)
