"""TinyTransformer's per-layer settings (posenc.models.layers) and the published schedules
(posenc.models.schedules): each option against the attention it stands for written out,
KV cache == full pass with every option, configs, refusals."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from tests.models import _lm_checks as lm

import posenc
from posenc import PosEncError
from posenc.models import TinyTransformer
from posenc.models.layers import allowed_counts, check_layer, llama4_temperature, window_keep
from posenc.models.schedules import SCHEDULES, local_global, nope_every, schedule

VOCAB, DIM, HEADS = 13, 16, 2


def sharpen(model: TinyTransformer) -> TinyTransformer:
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight.mul_(20)
    return model.eval()


def tokens(b=2, s=9, seed=0):
    return torch.randint(0, VOCAB, (b, s), generator=torch.Generator().manual_seed(seed))


LAYER_CASES = {
    "nope-every-2": dict(encoding="rope", num_layers=4, layers=nope_every(2, 4)),
    "nope-window-llama4": dict(
        encoding="rope",
        num_layers=4,
        layers=nope_every(4, 4, window=3, temperature={"type": "llama4", "floor_scale": 4}),
    ),
    "local-global": dict(encoding="rope", num_layers=3, layers=local_global(3, ratio=2, window=3)),
    "qk-norm-ssmax-alibi": dict(
        encoding="alibi",
        num_layers=2,
        layers=[{"qk_norm": True, "temperature": {"type": "ssmax"}}, {"window": 2}],
    ),
    "fox-window": dict(encoding="fox", num_layers=2, layers=[{"window": 4}, {}]),
    "cope-nope": dict(encoding="cope", num_layers=2, max_len=16, layers=[{}, {"encoding": "none"}]),
    "t5-per-layer": dict(encoding="t5", num_layers=2, layers=[{"encoding": "rope"}, {}]),
}


@pytest.mark.parametrize("case", LAYER_CASES, ids=list(LAYER_CASES))
def test_cache_equals_full_pass(case):
    model = sharpen(TinyTransformer(VOCAB, dim=DIM, num_heads=HEADS, **LAYER_CASES[case]))
    lm.cache_equals_full_pass(model, tokens())


@pytest.mark.parametrize("case", LAYER_CASES, ids=list(LAYER_CASES))
def test_left_padded_cache_equals_full_pass(case):
    model = sharpen(TinyTransformer(VOCAB, dim=DIM, num_heads=HEADS, **LAYER_CASES[case]))
    lm.left_padded_cache_equals_full_pass(model, tokens())


@pytest.mark.parametrize("case", LAYER_CASES, ids=list(LAYER_CASES))
def test_config_round_trip_and_training(case):
    model = TinyTransformer(VOCAB, dim=DIM, num_heads=HEADS, **LAYER_CASES[case])
    again = TinyTransformer.from_config(model.to_config())
    assert again.to_config() == model.to_config()
    again.load_state_dict(model.state_dict())
    t = tokens()
    with torch.no_grad():
        torch.testing.assert_close(again.eval()(t), model.eval()(t), atol=0, rtol=0)
    model.train()
    loss = F.cross_entropy(model(t).flatten(0, 1), t.roll(-1, 1).flatten())
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert missing == []


def _one_layer(layer, encoding="none", **kw):
    torch.manual_seed(0)
    return sharpen(
        TinyTransformer(
            VOCAB, dim=DIM, num_heads=HEADS, num_layers=1, encoding=encoding, layers=[layer], **kw
        )
    )


def _attention_by_hand(model, t, *, scale_q=None, keep=None, qk_norm=False):
    """The one layer's attention output before ``proj``, written out: ``[b, h, s, d]``."""
    attn = model.blocks[0].attn
    x = model.blocks[0].norm1(model.embed(t) * math.sqrt(DIM))
    b, s, _ = x.shape
    q, k, v = (
        u.view(b, s, HEADS, DIM // HEADS).transpose(1, 2) for u in attn.qkv(x).split(DIM, -1)
    )
    if qk_norm:
        q, k = attn.q_norm(q), attn.k_norm(k)
    if scale_q is not None:
        q = q * scale_q
    logits = q @ k.transpose(-1, -2) / math.sqrt(DIM // HEADS)
    allowed = torch.ones(s, s, dtype=torch.bool).tril()
    if keep is not None:
        allowed = allowed & keep
    logits = logits.masked_fill(~allowed, float("-inf"))
    return torch.softmax(logits, -1) @ v


def _captured(model, t):
    """What the layer's attention returned (the input of ``proj``)."""
    seen = {}
    hook = model.blocks[0].attn.proj.register_forward_pre_hook(
        lambda m, args: seen.setdefault("out", args[0])
    )
    with torch.no_grad():
        model(t)
    hook.remove()
    b, s, _ = seen["out"].shape
    return seen["out"].view(b, s, HEADS, DIM // HEADS).transpose(1, 2)


@pytest.mark.parametrize("window", [1, 2, 5, 100])
def test_window_is_the_banded_causal_mask(window):
    model, t = _one_layer({"window": window}), tokens()
    i, j = torch.arange(9)[:, None], torch.arange(9)[None, :]
    with torch.no_grad():
        want = _attention_by_hand(model, t, keep=(i - j) < window)
    torch.testing.assert_close(_captured(model, t), want, atol=1e-5, rtol=1e-5)


def test_qk_norm_normalises_each_head_before_attention():
    model, t = _one_layer({"qk_norm": True}), tokens()
    with torch.no_grad():
        model.blocks[0].attn.q_norm.weight.uniform_(0.5, 2.0)
        want = _attention_by_hand(model, t, qk_norm=True)
    torch.testing.assert_close(_captured(model, t), want, atol=1e-5, rtol=1e-5)
    q = torch.randn(2, HEADS, 9, DIM // HEADS)
    rms = q.pow(2).mean(-1, keepdim=True).add(torch.finfo(q.dtype).eps).rsqrt()
    torch.testing.assert_close(model.blocks[0].attn.k_norm(q), q * rms)  # gain 1 at init


def test_llama4_temperature_scales_queries_by_position():
    spec = {"type": "llama4", "floor_scale": 3.0, "attn_scale": 0.5}
    model, t = _one_layer({"temperature": spec}), tokens()
    p = torch.arange(9, dtype=torch.float64)
    scale = (1 + 0.5 * torch.log(torch.floor((p + 1) / 3) + 1)).float()  # transformers' formula
    with torch.no_grad():
        want = _attention_by_hand(model, t, scale_q=scale[:, None])
    torch.testing.assert_close(_captured(model, t), want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(llama4_temperature(p, floor_scale=3.0, attn_scale=0.5), scale)


def test_ssmax_multiplies_logits_by_s_log_n():
    model, t = _one_layer({"temperature": {"type": "ssmax", "init": 0.7}}), tokens()
    with torch.no_grad():
        model.blocks[0].attn.ssmax.copy_(torch.tensor([0.3, 1.2]))
        n = torch.arange(1, 10, dtype=torch.float32)  # causal: query i sees i + 1 keys
        s = torch.tensor([0.3, 1.2])
        want = _attention_by_hand(model, t, scale_q=(s[:, None] * n.log()[None, :])[..., None])
    torch.testing.assert_close(_captured(model, t), want, atol=1e-5, rtol=1e-5)


def test_allowed_counts_and_window_keep():
    keep = torch.tensor([[False, True, True, True]])[:, None, None, :]
    torch.testing.assert_close(
        allowed_counts(keep, True, 4, 4)[0, 0, :, 0], torch.tensor([1.0, 1.0, 2.0, 3.0])
    )  # a row with no key counts 1 (log 1 = 0)
    # the keys after a query are left to the causal mask of attention
    assert window_keep(2, 4, 2, causal=True, device=None).tolist() == [
        [False, True, True, True],
        [False, False, True, True],
    ]
    assert window_keep(3, 3, 2, causal=False, device=None).tolist() == [
        [True, True, False],
        [True, True, True],
        [False, True, True],
    ]


def test_layers_share_one_module_per_spec():
    model = TinyTransformer(
        VOCAB,
        dim=DIM,
        num_heads=HEADS,
        num_layers=6,
        encoding="rope",
        layers=local_global(6, ratio=2, window=4),
    )
    mods = [model.layer_encoding(i) for i in range(6)]
    assert [m.base for m in mods] == [1e4, 1e4, 1e6, 1e4, 1e4, 1e6]
    assert mods[0] is mods[1] is mods[3] and mods[2] is mods[5] and mods[0] is not mods[2]
    assert [b.attn.window for b in model.blocks] == [4, 4, None, 4, 4, None]


def test_schedules():
    assert [layer.get("encoding") for layer in nope_every(4, 8)] == [None] * 3 + ["none"] + [
        None
    ] * 3 + ["none"]
    assert schedule("nope-every-4", 4, 64) == nope_every(4, 4)
    assert [layer.get("window") for layer in schedule("local-global", 6, 64)] == [16] * 5 + [None]
    assert set(SCHEDULES) == {"nope-every-4", "nope-every-2", "llama4", "local-global"}
    llama4 = schedule("llama4", 8, 64)
    assert [layer.get("window") for layer in llama4] == [16, 16, 16, None] * 2
    assert [layer.get("temperature") for layer in llama4] == [None] * 3 + [
        {"type": "llama4", "floor_scale": 64.0, "attn_scale": 0.1}
    ] + [None] * 3 + [{"type": "llama4", "floor_scale": 64.0, "attn_scale": 0.1}]
    assert check_layer(0, {}) == {"window": None, "qk_norm": False, "temperature": None}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(layers=[{}]), r"layers must hold one dict per layer \(2\), got 1"),
        (dict(layers="none"), "layers must be a list of one dict per layer"),
        (dict(layers=[{}, 3]), r"layers\[1\] must be a dict, got 3"),
        (dict(layers=[{}, {"base": 2}]), r"layers\[1\] has unknown keys \['base'\]"),
        (dict(layers=[{"encoding": "sinusoidal"}, {}]), r"must be rotary, bias or 'none'"),
        (dict(layers=[{"window": 0}, {}]), r"layers\[0\]\['window'\] must be >= 1, got 0"),
        (
            dict(layers=[{"qk_norm": 1}, {}]),
            r"layers\[0\]\['qk_norm'\] must be True or False, got 1",
        ),
        (
            dict(layers=[{"temperature": {"type": "hot"}}, {}]),
            r"\['type'\] must be one of 'llama4', 'ssmax', got 'hot'",
        ),
        (
            dict(layers=[{"temperature": {"type": "ssmax", "s": 1}}, {}]),
            r"unknown keys \['s'\]",
        ),
        (
            dict(layers=[{"temperature": {"type": "llama4", "floor_scale": 0}}, {}]),
            r"floor_scale'\] must be > 0",
        ),
        (
            dict(layers=[{"encoding": posenc.build("rope", head_dim=8)}, {}]),
            "must be a registry name or a config dict",
        ),
    ],
    ids=[
        "length",
        "string",
        "not-dict",
        "unknown-key",
        "additive",
        "window-0",
        "qk-norm-int",
        "temperature-type",
        "temperature-key",
        "floor-scale-0",
        "module",
    ],
)
def test_bad_layers_are_refused(kwargs, match):
    with pytest.raises(PosEncError, match=match):
        TinyTransformer(VOCAB, dim=DIM, num_heads=HEADS, num_layers=2, encoding="rope", **kwargs)


def test_bad_schedules_are_refused():
    with pytest.raises(PosEncError, match="k must be >= 1"):
        nope_every(0, 4)
    with pytest.raises(PosEncError, match="name must be a schedule, one of"):
        schedule("gemma", 4, 64)
    with pytest.raises(PosEncError, match="local_base must be > 1"):
        local_global(4, local_base=1.0)
