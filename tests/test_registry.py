"""posenc.registry: every registered encoding builds, round-trips through JSON, and the
rebuilt module computes the same thing. Encodings added later are covered automatically:
constructor arguments are chosen from the signature (see ``_example_args``)."""

from __future__ import annotations

import inspect
import json
import warnings
from pathlib import Path

import pytest
import torch

import posenc
from posenc import registry
from posenc._base import ContextualEncoding, GatedEncoding

KINDS = {"additive", "rotary", "bias", "none"}

# Values for required constructor arguments, by parameter name. An encoding whose
# constructor needs an argument not listed here fails test_every_name_builds with a
# message saying which one to add.
EXAMPLE_ARGS = {
    "dim": 16,
    "head_dim": 16,
    "num_heads": 4,
    "max_len": 32,
    "npos_max": 32,
    "sections": [2, 3, 3],  # M-RoPE: frequencies per axis, summing to head_dim / 2
}


def _example_args(cls) -> dict:
    args = {}
    for p in inspect.signature(cls).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.default is not p.empty:
            continue
        if p.name not in EXAMPLE_ARGS:
            pytest.fail(
                f"{cls.__name__} needs constructor argument {p.name!r}: add an example value "
                f"to EXAMPLE_ARGS in tests/test_registry.py"
            )
        args[p.name] = EXAMPLE_ARGS[p.name]
    return args


def _outputs(module, generator_seed: int = 0):
    """What the module computes on fixed inputs, by kind (the protocols in ARCHITECTURE.md,
    "The protocols attention relies on")."""
    g = torch.Generator().manual_seed(generator_seed)
    module = module.eval()
    if module.kind in ("additive", "none"):
        dim = getattr(module, "dim", 16)
        return module(torch.randn(2, 5, dim, generator=g))
    if module.kind == "rotary":
        q = torch.randn(2, 3, 5, module.head_dim, generator=g)
        k = torch.randn(2, 3, 5, module.head_dim, generator=g)
        return torch.cat(module(q, k), dim=-1)
    if isinstance(module, ContextualEncoding):  # CoPE: from the logits, queries and keys
        q = torch.randn(2, 3, 5, module.head_dim, generator=g)
        k = torch.randn(2, 3, 5, module.head_dim, generator=g)
        logits = (q * 0.25) @ k.transpose(-1, -2)
        return module.contextual_bias_at(logits, q, k, allowed=None, scale=0.25)
    if isinstance(module, GatedEncoding):  # FoX: from per-token gates
        gates = torch.nn.functional.logsigmoid(torch.randn(2, module.num_heads, 5, generator=g))
        return module.gate_bias_at(gates, 5)
    if getattr(module, "query_dependent", False):
        q = torch.randn(2, module.num_heads, 5, module.head_dim, generator=g)
        return module.bias(5, q=q)
    return module.bias(5)


@pytest.fixture(params=registry.names())
def name(request):
    return request.param


def test_every_name_builds(name):
    cls = registry.get(name)
    module = posenc.build(name, **_example_args(cls))
    assert isinstance(module, cls) and isinstance(module, torch.nn.Module)
    assert cls.name == name, "the class' name attribute must be its registry name"
    assert cls.kind in KINDS


def test_every_name_round_trips_through_json(name):
    module = posenc.build(name, **_example_args(registry.get(name)))
    config = module.to_config()
    assert config["name"] == name
    text = json.dumps(config)  # JSON-serialisable, as it is
    again = posenc.build(json.loads(text))
    if name == "mrope":  # deprecated: its config loads as "rope" with sections, silently
        assert type(again) is posenc.RotaryEmbedding
        assert again.to_config() == {**config, "name": "rope"}
    else:
        assert type(again) is type(module)
        assert again.to_config() == config
        assert json.dumps(again.to_config()) == text
    # same state (parameters, persistent buffers) and, once loaded, the same computation
    state = module.state_dict()
    assert set(again.state_dict()) == set(state)
    again.load_state_dict(state)
    for key, value in again.state_dict().items():
        assert torch.equal(value, state[key]), key
    torch.testing.assert_close(_outputs(again), _outputs(module), atol=0, rtol=0)


def test_every_name_has_no_table_in_its_state_dict(name):
    """Tables are never saved: only learned weights (nn.Parameter) and the like are."""
    module = posenc.build(name, **_example_args(registry.get(name)))
    params = {k for k, _ in module.named_parameters()}
    assert set(module.state_dict()) <= params | {k for k, _ in module.named_buffers()}
    if module.kind == "additive" and name != "learned":
        assert module.state_dict() == {}


def test_names_and_aliases():
    names = registry.names()
    assert names[:4] == ["none", "sinusoidal", "learned", "index"]
    assert len(names) == len(set(names))
    assert registry.get("nope") is posenc.NoPositionalEncoding
    assert registry.get("SINUSOIDAL") is posenc.SinusoidalEmbedding
    assert isinstance(posenc.build("nope"), posenc.NoPositionalEncoding)


def test_build_kwargs_override_the_config():
    pe = posenc.build({"name": "sinusoidal", "dim": 8, "base": 100.0}, base=500.0)
    assert pe.to_config()["base"] == 500.0 and pe.dim == 8


def test_build_an_instance():
    pe = posenc.SinusoidalEmbedding(8)
    assert posenc.build(pe) is pe
    other = posenc.build(pe, layout="half")
    assert other is not pe and other.layout == "half" and other.dim == 8


@pytest.mark.parametrize(
    ("spec", "kwargs", "match"),
    [
        (
            "rotary-magic",
            {},
            r"name must be one of 'none', 'sinusoidal', 'learned', 'index'.*got 'rotary-magic'",
        ),
        ({"dim": 8}, {}, r"encoding config must hold a 'name' key, got keys \['dim'\]"),
        (42, {}, "encoding must be a registry name, a config dict or an Encoding module, got int"),
        ({"name": 3}, {}, "name must be a string, got 3"),
        ("sinusoidal", {}, r"cannot build 'sinusoidal' from arguments \[\]"),
        (
            "sinusoidal",
            {"dim": 8, "colour": "red"},
            r"cannot build 'sinusoidal' from arguments \['colour', 'dim'\]",
        ),
        ("sinusoidal", {"dim": 0}, "dim must be >= 1, got 0"),
    ],
)
def test_build_bad_input(spec, kwargs, match):
    with pytest.raises(posenc.PosEncError, match=match):
        posenc.build(spec, **kwargs)


# --- configs written by posenc 0.1.0 still load -------------------------------------------

SAVED = json.loads((Path(__file__).parent / "data" / "configs_0_1_0.json").read_text())


def _saved_inputs():
    g = torch.Generator().manual_seed(SAVED["inputs"]["seed"])
    q = torch.randn(*SAVED["inputs"]["q"], generator=g)
    k = torch.randn(*SAVED["inputs"]["k"], generator=g)
    x = torch.randn(*SAVED["inputs"]["x"], generator=g)
    return q, k, x


def _saved_output(module, name: str) -> torch.Tensor:
    q, k, x = _saved_inputs()
    p = torch.arange(5)
    with torch.no_grad():
        if module.kind in ("additive", "none"):
            return module(x)
        if module.kind == "rotary":
            pos = {
                "mrope": torch.stack([p, 2 * p, p % 2], -1),
                "axial_rope": torch.stack([p, p % 2], -1),
            }
            return torch.cat(module(q, k, pos[name]) if name in pos else module(q, k), -1)
        return module.bias(5)


@pytest.mark.parametrize(
    "index", range(len(SAVED["configs"])), ids=[c["name"] for c in SAVED["configs"]]
)
def test_saved_0_1_0_config_builds(index):
    """Every config 0.1.0 wrote builds without a warning and computes what 0.1.0 computed
    (parameter-free encodings; learned ones are compared by config)."""
    config = SAVED["configs"][index]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module = posenc.build(config).eval()
    assert module.kind == registry.get(config["name"]).kind
    again = posenc.build(json.loads(json.dumps(module.to_config())))
    assert again.to_config() == module.to_config()
    want = SAVED["outputs"][index]
    if want is None:  # learned parameters: random at build time, not saved in a config
        assert any(True for _ in module.parameters())
        return
    got = _saved_output(module, config["name"])
    torch.testing.assert_close(
        got.double(), torch.tensor(want, dtype=torch.float64), rtol=0, atol=0
    )


#: Encodings registered after 0.1.0: no config of theirs was written by it.
NEW_SINCE_0_1_0 = {"cope", "fox"}


def test_saved_configs_cover_every_encoding():
    assert {c["name"] for c in SAVED["configs"]} == set(registry.names()) - NEW_SINCE_0_1_0
