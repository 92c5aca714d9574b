"""Issue 24: the schedules validate every argument before building a layer (and build
nothing unbounded), a KV cache refuses a call it does not fit (batch, layers, heads, device,
dtype) before anything is appended, and the query temperatures stay finite: Llama 4's at
negative (padding) positions, SSMax's and Llama 4's scales bounded."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc import PosEncError
from posenc.models import KVCache, TinyTransformer
from posenc.models.layers import MAX_WINDOW, llama4_temperature
from posenc.models.schedules import local_global, nope_every, schedule
from posenc.models.transformer import MAX_LAYERS
from posenc.registry import names

VOCAB, DIM, HEADS = 13, 16, 2

# --- schedules ----------------------------------------------------------------------------

UNBOUNDED = {
    "nope_every": lambda: nope_every(4, 10**12),
    "local_global": lambda: local_global(10**12),
    "schedule-llama4": lambda: schedule("llama4", 10**12, 64),
    "schedule-local-global": lambda: schedule("local-global", 10**12, 64),
}


@pytest.mark.parametrize("case", UNBOUNDED, ids=list(UNBOUNDED))
def test_schedules_bound_the_layer_count(case):
    """Was a MemoryError after building 10**12 dicts; now refused before the first."""
    with pytest.raises(PosEncError, match=rf"num_layers must be <= {MAX_LAYERS}, got {10**12}"):
        UNBOUNDED[case]()


def test_the_bound_is_the_model_s():
    layers = nope_every(4, MAX_LAYERS)
    assert len(layers) == MAX_LAYERS and layers[3] == {"encoding": "none"}
    with pytest.raises(PosEncError, match=f"num_layers must be <= {MAX_LAYERS}"):
        TinyTransformer(VOCAB, dim=DIM, num_heads=HEADS, num_layers=MAX_LAYERS + 1)


LATE = {
    "window-0": (lambda: nope_every(4, 4, window=0), r"window must be >= 1, got 0"),
    "window-huge": (
        lambda: nope_every(4, 4, window=MAX_WINDOW + 1),
        rf"window must be <= {MAX_WINDOW}",
    ),
    "window-str": (lambda: nope_every(4, 4, window="3"), "window must be an integer"),
    "temperature-type": (
        lambda: nope_every(4, 4, temperature={"type": "hot"}),
        r"temperature\['type'\] must be one of 'llama4', 'ssmax', got 'hot'",
    ),
    "temperature-key": (
        lambda: nope_every(4, 4, temperature={"type": "llama4", "s": 1}),
        r"temperature of type 'llama4' has unknown keys \['s'\]",
    ),
    "temperature-list": (
        lambda: nope_every(4, 4, temperature=[("type", "llama4")]),
        "temperature must be a dict",
    ),
    "local-window": (lambda: local_global(4, window=0), r"window must be >= 1, got 0"),
    "encoding-bogus": (
        lambda: schedule("nope-every-4", 4, 64, "bogus"),
        "encoding name must be one of",
    ),
    "encoding-int": (
        lambda: schedule("llama4", 4, 64, 3),
        "encoding must be a registry name or a config dict",
    ),
    "encoding-key": (
        lambda: schedule("local-global", 4, 64, {"name": "rope", "no_such_key": 1}),
        r"encoding 'rope' has unknown keys \['no_such_key'\]",
    ),
    "train-len-str": (lambda: schedule("llama4", 4, "x"), "train_len must be an integer, got 'x'"),
    "train-len-0": (lambda: schedule("llama4", 4, 0), "train_len must be >= 1, got 0"),
    "train-len-huge": (lambda: schedule("llama4", 4, 2**62), f"train_len must be <= {MAX_WINDOW}"),
    "name-int": (lambda: schedule(3, 4, 64), "name must be a schedule, one of .*, got 3"),
    "name-list": (lambda: schedule(["llama4"], 4, 64), "name must be a schedule"),
    "num-layers-0": (lambda: schedule("nope-every-2", 0, 64), "num_layers must be >= 1"),
}


@pytest.mark.parametrize("case", LATE, ids=list(LATE))
def test_schedules_validate_up_front(case):
    """Each was accepted (a TypeError for train_len) until TinyTransformer met the result."""
    call, match = LATE[case]
    with pytest.raises(PosEncError, match=match):
        call()


def test_valid_schedules_keep_their_layers():
    assert nope_every(2, 4, window=3) == [{"window": 3}, {"encoding": "none"}] * 2
    temperature = {"type": "llama4", "floor_scale": 8.0}
    assert nope_every(2, 2, temperature=temperature)[1] == {
        "encoding": "none",
        "temperature": temperature,
    }
    spec = {"name": "rope", "rotary_dim": 4}
    assert schedule("local-global", 2, 8, spec) == local_global(2, window=2, encoding=spec)
    assert schedule("nope-every-4", 4, 64, {"name": "alibi"}) == nope_every(4, 4)


# --- the KV cache ---------------------------------------------------------------------------

LM_ENCODINGS = [n for n in names() if n not in ("mrope", "axial_rope")]


def _model(name: str, **kw) -> TinyTransformer:
    torch.manual_seed(0)
    return TinyTransformer(VOCAB, dim=DIM, num_heads=HEADS, encoding=name, max_len=64, **kw).eval()


def _tokens(b: int, s: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (b, s), generator=torch.Generator().manual_seed(b * 10 + s))


def _state(cache: KVCache) -> list[torch.Tensor]:
    extra = [t for t in (cache.positions, cache.mask) if t is not None]
    return [*cache.keys, *cache.values, *cache.gates.values(), *extra]


@pytest.mark.parametrize("masked", [False, True], ids=["plain", "masked"])
@pytest.mark.parametrize("name", LM_ENCODINGS)
def test_cache_refuses_another_batch_size(name, masked):
    """Was a RuntimeError from torch.cat in every variant; now refused, the cache unchanged,
    and the cache still continues the first batch exactly."""
    model, t = _model(name), _tokens(2, 6)
    mask = torch.ones(2, 4, dtype=torch.bool) if masked else None
    with torch.no_grad():
        full = model(t)
        cache = KVCache()
        first = model(t[:, :4], attn_mask=mask, cache=cache)
        before = [x.clone() for x in _state(cache)]
        for b in (1, 3):
            with pytest.raises(PosEncError, match=rf"cache holds a batch of 2 .* batch size {b}"):
                model(_tokens(b, 1), cache=cache)
        assert all(torch.equal(x, y) for x, y in zip(_state(cache), before, strict=True))
        rest = model(t[:, 4:], cache=cache)
    torch.testing.assert_close(torch.cat([first, rest], dim=1), full, atol=1e-5, rtol=1e-5)


def test_cache_refuses_another_model_device_or_dtype():
    cache = KVCache()
    with torch.no_grad():
        _model("rope")(_tokens(2, 3), cache=cache)
        with pytest.raises(PosEncError, match=r"cache holds keys of 2 layers .* num_layers=3"):
            _model("rope", num_layers=3)(_tokens(2, 1), cache=cache)
        wide = TinyTransformer(VOCAB, dim=DIM, num_heads=4, encoding="rope").eval()
        with pytest.raises(PosEncError, match="cache holds keys of 2 heads of 8 channels"):
            wide(_tokens(2, 1), cache=cache)
        with pytest.raises(
            PosEncError, match=r"cache holds keys of dtype torch\.float32; .*float64"
        ):
            _model("rope").double()(_tokens(2, 1), cache=cache)
        cache.keys = [k.to("meta") for k in cache.keys]
        with pytest.raises(PosEncError, match="cache is on meta; tokens are on cpu"):
            _model("rope")(_tokens(2, 1), cache=cache)
    half_filled = KVCache()
    half_filled.keys = [torch.zeros(2, 2, 3, 8)]
    with pytest.raises(PosEncError, match="cache holds keys of 1 layers and no positions"):
        _model("rope")(_tokens(2, 1), cache=half_filled)


# --- temperatures -----------------------------------------------------------------------------


def _transformers_temperature(p: torch.Tensor, floor_scale: float, attn_scale: float):
    """transformers' Llama4TextAttention expression (its positions are never negative)."""
    return torch.log1p(torch.floor((p.float() + 1.0) / floor_scale)) * attn_scale + 1.0


def test_llama4_temperature_is_one_at_negative_positions():
    """Was -inf at p in [-F-1, -2] and NaN below (log1p of -1 and less)."""
    p = torch.tensor([-(2**40), -100, -10, -9, -2, -1, 0, 6, 7, 8, 23, 1000])
    got = llama4_temperature(p, floor_scale=8.0, attn_scale=0.1)
    want = torch.where(p < 0, 1.0, _transformers_temperature(p.clamp_min(0), 8.0, 0.1))
    torch.testing.assert_close(got, want, atol=0, rtol=1e-6)
    torch.testing.assert_close(got[p >= 0], _transformers_temperature(p[p >= 0], 8.0, 0.1))


PADDED = {  # row 1's padding slots and the (negative) positions they are given
    "left": (slice(0, 4), [-40, -9, -3, -2]),
    "right": (slice(4, 7), [-5, -5, -5]),
    "middle": (slice(2, 4), [-3, -3]),
}


@pytest.mark.parametrize("where", PADDED)
def test_llama4_layers_give_finite_logits_with_padding_at_negative_positions(where):
    """Padding given negative positions: its queries were scaled by -inf or NaN, and the
    logits of padded rows that see real keys (right, middle) were NaN; now finite, and the
    real tokens' logits equal those with the padding at position 0."""
    layers = nope_every(2, 2, temperature={"type": "llama4", "floor_scale": 2.0})
    model = _model("rope", num_layers=2, layers=layers)
    pads, values = PADDED[where]
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, pads] = False
    negative = torch.arange(7).repeat(2, 1)
    negative[1, pads] = torch.tensor(values)
    t = _tokens(2, 7)
    with torch.no_grad():
        got = model(t, negative, attn_mask=mask)
        want = model(t, negative.clamp_min(0), attn_mask=mask)
    assert bool(torch.isfinite(got).all())
    torch.testing.assert_close(got[mask], want[mask], atol=0, rtol=0)


@pytest.mark.parametrize(
    ("temperature", "match"),
    [
        ({"type": "ssmax", "init": 1e308}, r"\['init'\] must be <= 1000000.0, got 1e\+308"),
        ({"type": "ssmax", "init": -1e308}, r"\['init'\] must be >= -1000000.0"),
        ({"type": "llama4", "attn_scale": 1e300}, r"\['attn_scale'\] must be <= 1000000.0"),
    ],
    ids=["ssmax-huge", "ssmax-negative-huge", "llama4-attn-scale"],
)
def test_temperature_scales_are_bounded(temperature, match):
    """SSMax init=1e308 was a RuntimeError (no float32 parameter holds it)."""
    with pytest.raises(PosEncError, match=match):
        _model("rope", num_layers=1, layers=[{"temperature": temperature}])


def test_ssmax_at_the_bound_is_finite():
    model = _model("rope", num_layers=1, layers=[{"temperature": {"type": "ssmax", "init": 1e6}}])
    with torch.no_grad():
        assert bool(torch.isfinite(model(_tokens(2, 5))).all())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(positions=[0, 1]), "positions must be a torch.Tensor"),
        (dict(positions=torch.tensor([0.0, float("nan")])), "positions must be finite"),
        (dict(floor_scale=0.0), "floor_scale must be > 0"),
        (dict(attn_scale=-1.0), "attn_scale must be >= 0"),
        (dict(attn_scale="0.1"), "attn_scale must be a number"),
    ],
    ids=["list", "nan", "floor-0", "attn-negative", "attn-str"],
)
def test_llama4_temperature_validates(kwargs, match):
    args = {"positions": torch.arange(3), "floor_scale": 8.0, "attn_scale": 0.1, **kwargs}
    positions = args.pop("positions")
    with pytest.raises(posenc.PosEncError, match=match):
        llama4_temperature(positions, **args)
