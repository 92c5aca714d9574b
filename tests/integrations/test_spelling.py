"""The spelling table of ``posenc.integrations.spelling``, both ways.

- The table against the installed transformers: its rope types and the keys each reads.
- posenc -> transformers -> posenc gives the same dataclass for every scaling of the registry
  (``ntk``, which transformers has no rope type for, comes back as its base: lossy by design,
  with the same frequencies bit for bit).
- transformers -> posenc -> transformers gives the same ``rope_parameters`` for every rope type
  transformers has (and legacy spellings their normal form).
- The frequencies: transformers' own ``ROPE_INIT_FUNCTIONS`` give the same ``inv_freq`` and
  attention factor, bit for bit, from the dict the table writes as from the dict it read;
  posenc's frequencies through transformers' spelling are those of posenc's dataclass bit for
  bit; against transformers' float32 functions they hold the same attention factor exactly and
  ``inv_freq`` within float32 rounding (posenc forms them in float64, transformers in float32,
  so up to a few float32 ulps apart: bit equality there is not to be had).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import warnings
from typing import Any

import pytest
import torch

from posenc import PosEncError
from posenc.integrations import spelling
from posenc.integrations.spelling import (
    Given,
    config_max_position,
    from_rope_parameters,
    to_rope_parameters,
    transformers_spelling,
)
from posenc.integrations.transformers import scaling_from_transformers
from posenc.rotary.frequencies import (
    SCALINGS,
    DynamicScaling,
    LinearScaling,
    Llama3Scaling,
    LongRopeScaling,
    NTKScaling,
    ProportionalScaling,
    YarnScaling,
    parse_scaling,
    rope_frequencies,
    rotated_frequencies,
)

transformers = pytest.importorskip("transformers")
from transformers.modeling_rope_utils import (  # noqa: E402
    ROPE_INIT_FUNCTIONS,
    RotaryEmbeddingConfigMixin,
)

HEAD_DIM, MAX_POS, ORIGINAL, THETA = 32, 256, 64, 10000.0
_HALF = HEAD_DIM // 2
_LR = {
    "short_factor": [1.0 + 0.05 * i for i in range(_HALF)],
    "long_factor": [1.0 + 0.7 * i for i in range(_HALF)],
}
_LR_POSENC = {k: tuple(v) for k, v in _LR.items()}

# --- the table against the installed transformers -------------------------------------------

_GENERAL = {"rope_type", "rope_theta", "partial_rotary_factor"}
# Keys transformers' function reads though its validator does not list them.
_READ_UNLISTED = {"proportional": {"factor"}}  # _compute_proportional_rope_parameters' .get


def _validator_keys(rope_type: str) -> set[str]:
    """The required and optional keys of transformers' ``_validate_<type>_rope_parameters``."""
    method = getattr(RotaryEmbeddingConfigMixin, f"_validate_{rope_type}_rope_parameters")
    tree = ast.parse(textwrap.dedent(inspect.getsource(method)))
    keys: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in ("required_keys", "optional_keys")
        ):
            keys |= {elt.value for elt in node.value.elts}  # type: ignore[attr-defined]
    return keys


def test_rope_types_are_transformers() -> None:
    assert set(spelling.ROPE_TYPE_KEYS) == {"default", *ROPE_INIT_FUNCTIONS}


@pytest.mark.parametrize("rope_type", ["default", *ROPE_INIT_FUNCTIONS])
def test_keys_per_rope_type_are_transformers(rope_type: str) -> None:
    ours = set(spelling.ROPE_TYPE_KEYS[rope_type])
    assert ours == _validator_keys(rope_type) - _GENERAL | _READ_UNLISTED.get(rope_type, set())


@pytest.mark.parametrize("kind", sorted(spelling.ROPE_TYPE_KEYS.keys() - {"default"}))
def test_every_field_of_a_scaling_has_a_key(kind: str) -> None:
    """Each field of posenc's dataclass is a key transformers reads, in rope_parameters or as
    a config attribute: nothing is lost on the way out."""
    cls, _ = SCALINGS[kind]
    for field in dataclasses.fields(cls):
        if field.init:
            key = spelling.FIELD_KEYS.get(field.name, field.name)
            assert key in (*spelling.ROPE_TYPE_KEYS[kind], *spelling.CONFIG_KEYS), field.name


# --- posenc -> transformers -> posenc ----------------------------------------------------------

# id -> a scaling of posenc's registry, every field away from its default somewhere
POSENC_CASES: dict[str, Any] = {
    "linear": LinearScaling(factor=4.0),
    "dynamic": DynamicScaling(factor=2.0, max_position=MAX_POS),
    "yarn": YarnScaling(
        factor=4.0, original_max_position=ORIGINAL, beta_fast=16.0, beta_slow=2.0, truncate=False
    ),
    "yarn-mscale": YarnScaling(
        factor=32.0, original_max_position=ORIGINAL, mscale=0.707, mscale_all_dim=1.0
    ),
    "yarn-attention-factor": YarnScaling(
        factor=4.0, original_max_position=ORIGINAL, attention_factor=1.2
    ),
    "yarn-from-max-position": YarnScaling(original_max_position=ORIGINAL, max_position=MAX_POS),
    "longrope": LongRopeScaling(**_LR_POSENC, original_max_position=ORIGINAL, factor=4.0),
    "longrope-attention-factor": LongRopeScaling(
        **_LR_POSENC, original_max_position=ORIGINAL, factor=4.0, attention_factor=1.1
    ),
    "longrope-from-max-position": LongRopeScaling(
        **_LR_POSENC, original_max_position=ORIGINAL, max_position=MAX_POS
    ),
    "llama3": Llama3Scaling(
        factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=ORIGINAL
    ),
    "proportional": ProportionalScaling(factor=2.0),
    "proportional-default": ProportionalScaling(),
    "ntk": NTKScaling(factor=4.0),
}


def test_posenc_cases_cover_the_registry() -> None:
    assert {s.type for s in POSENC_CASES.values()} == set(SCALINGS)


@pytest.mark.parametrize("case", [c for c in POSENC_CASES if not c.startswith("ntk")])
def test_posenc_to_transformers_and_back(case: str) -> None:
    scaling = POSENC_CASES[case]
    spelled = transformers_spelling(scaling)
    assert spelled["rope_type"] == scaling.type
    assert scaling_from_transformers(spelled) == scaling
    assert transformers_spelling(dataclasses.asdict(scaling)) == spelled  # posenc's dict alike
    # as a config: rope_parameters, and max_position_embeddings beside them
    params = to_rope_parameters(scaling, base=THETA)
    kept = {k: v for k, v in spelled.items() if k not in spelling.CONFIG_KEYS}
    assert params == {"rope_theta": THETA, **kept}
    max_position = config_max_position(scaling)
    assert max_position == spelled.get("max_position_embeddings")
    read = params if max_position is None else {**params, "max_position_embeddings": max_position}
    back = from_rope_parameters(read, Given("test", THETA, HEAD_DIM, HEAD_DIM))
    assert parse_scaling(back) == scaling


def test_no_scaling_is_rope_type_default() -> None:
    assert transformers_spelling(None) == {"rope_type": "default"}
    assert scaling_from_transformers(transformers_spelling(None)) is None
    assert to_rope_parameters(None, base=THETA) == {"rope_type": "default", "rope_theta": THETA}
    assert config_max_position(None) is None


@pytest.mark.parametrize("rotary_dim", [4, 16, HEAD_DIM])
def test_ntk_goes_out_as_its_base(rotary_dim: int) -> None:
    """Lossy by design: transformers has no static NTK, so its base is written; read back,
    that is no scaling and the new base, whose frequencies are ntk's bit for bit."""
    scaling = POSENC_CASES["ntk"]
    params = to_rope_parameters(scaling, base=THETA, rotary_dim=rotary_dim)
    theta = THETA * 4.0 ** (rotary_dim / (rotary_dim - 2))
    assert params == {"rope_type": "default", "rope_theta": theta}
    back = from_rope_parameters(params, Given("test", theta))
    assert parse_scaling(back) is None
    ours, scale = rope_frequencies(rotary_dim, base=THETA, scaling=scaling)
    theirs, their_scale = rope_frequencies(rotary_dim, base=theta)
    assert torch.equal(ours, theirs) and scale == their_scale == 1.0


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: transformers_spelling(NTKScaling(factor=2.0)), "'ntk' has no transformers"),
        (lambda: to_rope_parameters({"type": "ntk", "factor": 2.0}, base=THETA), "rotary_dim"),
        (
            lambda: to_rope_parameters(None, base=THETA, rotary_dim=4, partial_rotary_factor=2.0),
            "partial_rotary_factor must be <= 1",
        ),
        (lambda: to_rope_parameters(None, base=0.5), "base must be > 1"),
        (lambda: transformers_spelling({"rope_type": "linear"}), "scaling_from_transformers"),
    ],
    ids=["ntk-spelling", "ntk-no-rotary-dim", "partial-factor", "base", "their-spelling"],
)
def test_out_refuses(call: Any, match: str) -> None:
    with pytest.raises(PosEncError, match=match):
        call()


# --- transformers -> posenc -> transformers ----------------------------------------------------


def _rp(rope_type: str, **keys: Any) -> dict[str, Any]:
    return {"rope_type": rope_type, "rope_theta": THETA, **keys}


# id -> (rope_parameters in transformers' normal form, the config's max_position_embeddings
# the scaling reads, or None)
TF_CASES: dict[str, tuple[dict[str, Any], int | None]] = {
    "default": (_rp("default"), None),
    "default-partial": (_rp("default", partial_rotary_factor=0.5), None),
    "linear": (_rp("linear", factor=4.0), None),
    "linear-partial": (_rp("linear", factor=2.0, partial_rotary_factor=0.5), None),
    "dynamic": (_rp("dynamic", factor=2.0), MAX_POS),
    "yarn": (
        _rp(
            "yarn",
            factor=4.0,
            original_max_position_embeddings=ORIGINAL,
            beta_fast=16.0,
            beta_slow=2.0,
            truncate=False,
        ),
        None,
    ),
    "yarn-mscale": (
        _rp(
            "yarn",
            factor=32.0,
            original_max_position_embeddings=ORIGINAL,
            mscale=0.707,
            mscale_all_dim=1.0,
        ),
        None,
    ),
    "yarn-attention-factor": (
        _rp("yarn", factor=4.0, original_max_position_embeddings=ORIGINAL, attention_factor=1.2),
        None,
    ),
    "longrope": (
        _rp("longrope", **_LR, original_max_position_embeddings=ORIGINAL, factor=4.0),
        None,
    ),
    "longrope-attention-factor": (
        _rp(
            "longrope",
            **_LR,
            original_max_position_embeddings=ORIGINAL,
            factor=4.0,
            attention_factor=1.1,
        ),
        None,
    ),
    "longrope-phi3": (  # no factor: max_position_embeddings / original
        _rp("longrope", **_LR, original_max_position_embeddings=ORIGINAL),
        MAX_POS,
    ),
    "llama3": (
        _rp(
            "llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=ORIGINAL,
        ),
        None,
    ),
    "proportional": (_rp("proportional", partial_rotary_factor=0.5), None),
    "proportional-factor": (_rp("proportional", partial_rotary_factor=0.25, factor=2.0), None),
}


def test_transformers_cases_cover_its_rope_types() -> None:
    assert {rp["rope_type"] for rp, _ in TF_CASES.values()} == {"default", *ROPE_INIT_FUNCTIONS}


def _rotary_dim(rp: dict[str, Any]) -> int:
    factor = rp.get("partial_rotary_factor", 1.0)
    if rp["rope_type"] == "proportional":
        return 2 * int(factor * HEAD_DIM // 2)
    return int(HEAD_DIM * factor)


def _read(rp: dict[str, Any], max_position: int | None) -> Any:
    """posenc's scaling of a transformers ``rope_parameters`` (the config attribute with it)."""
    spec = rp if max_position is None else {**rp, "max_position_embeddings": max_position}
    given = Given("test", rp["rope_theta"], HEAD_DIM, _rotary_dim(rp))
    return parse_scaling(from_rope_parameters(spec, given))


def _written(scaling: Any, rp: dict[str, Any]) -> dict[str, Any]:
    return to_rope_parameters(
        scaling,
        base=rp["rope_theta"],
        rotary_dim=_rotary_dim(rp),
        partial_rotary_factor=rp.get("partial_rotary_factor"),
    )


@pytest.mark.parametrize("case", list(TF_CASES))
def test_transformers_to_posenc_and_back(case: str) -> None:
    rp, max_position = TF_CASES[case]
    scaling = _read(rp, max_position)
    assert _written(scaling, rp) == rp
    assert config_max_position(scaling) == max_position
    if scaling is not None:  # the rope_scaling spelling (no rope_theta) round-trips alike
        spelled = transformers_spelling(scaling)
        assert scaling_from_transformers(spelled) == scaling


# id -> (a legacy or lenient transformers spelling, its normal form)
NORMAL_FORMS = {
    "legacy-type": ({"type": "linear", "factor": 4}, {"rope_type": "linear", "factor": 4.0}),
    "both-type-keys": (
        {"type": "linear", "rope_type": "linear", "factor": 4.0},
        {"rope_type": "linear", "factor": 4.0},
    ),
    "su": (
        {"rope_type": "su", **_LR, "original_max_position_embeddings": ORIGINAL, "factor": 4.0},
        {
            "rope_type": "longrope",
            **_LR,
            "original_max_position_embeddings": ORIGINAL,
            "factor": 4.0,
        },
    ),
    "defaults-left-out": (
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": ORIGINAL,
            "beta_fast": 32,
            "beta_slow": 1,
            "truncate": True,
        },
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL},
    ),
    "truncate-none-is-false": (
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 8,
            "truncate": None,
        },
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 8,
            "truncate": False,
        },
    ),
    "posenc-key-names": (
        {"rope_type": "yarn", "factor": 4.0, "original_max_position": ORIGINAL},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL},
    ),
    "yarn-factor-from-max-position": (
        {
            "rope_type": "yarn",
            "original_max_position_embeddings": 64,
            "max_position_embeddings": 256,
        },
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "max_position_embeddings": 256,
        },
    ),
    "default": ({"rope_type": "default"}, {"rope_type": "default"}),
}


@pytest.mark.parametrize("case", list(NORMAL_FORMS))
def test_transformers_spelling_comes_back_in_normal_form(case: str) -> None:
    given, normal = NORMAL_FORMS[case]
    assert transformers_spelling(scaling_from_transformers(given)) == normal


def test_rope_theta_alone_is_rope_type_default() -> None:
    scaling = parse_scaling(from_rope_parameters({"rope_theta": THETA}, Given("test", THETA)))
    assert to_rope_parameters(scaling, base=THETA) == {"rope_type": "default", "rope_theta": THETA}


# --- the frequencies: transformers' own functions ----------------------------------------------


def _transformers_frequencies(rp: dict[str, Any], max_position: int | None, seq_len: int | None):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.LlamaConfig(
            hidden_size=HEAD_DIM * 4,
            num_attention_heads=4,
            head_dim=HEAD_DIM,
            max_position_embeddings=max_position or MAX_POS,
            rope_parameters=dict(rp),
        )
        if rp["rope_type"] == "default":
            return LlamaRotaryEmbedding.compute_default_rope_parameters(config, seq_len=seq_len)
        return ROPE_INIT_FUNCTIONS[rp["rope_type"]](config, None, seq_len)


# transformers' default function (Llama's) rotates the whole head: no partial rotary there
_PARITY = [c for c in TF_CASES if c != "default-partial"]
_SEQ_LENS = {"construction": None, "past-max": 4 * MAX_POS}


@pytest.mark.parametrize("seq", list(_SEQ_LENS))
@pytest.mark.parametrize("case", _PARITY)
def test_frequencies_as_transformers_computes_them(case: str, seq: str) -> None:
    rp, max_position = TF_CASES[case]
    seq_len = _SEQ_LENS[seq]
    scaling = _read(rp, max_position)
    theirs, their_scale = _transformers_frequencies(rp, max_position, seq_len)
    # the dict the table writes means to transformers what the dict it read did, bit for bit
    again, again_scale = _transformers_frequencies(_written(scaling, rp), max_position, seq_len)
    assert torch.equal(again, theirs) and again_scale == their_scale
    # posenc's through transformers' spelling: those of its dataclass' own spelling, bit for bit
    rotary_dim = _rotary_dim(rp)
    ours, scale = rotated_frequencies(
        HEAD_DIM, rotary_dim, base=THETA, scaling=scaling, seq_len=seq_len
    )
    own = None if scaling is None else dataclasses.asdict(scaling)
    same, same_scale = rotated_frequencies(
        HEAD_DIM, rotary_dim, base=THETA, scaling=own, seq_len=seq_len
    )
    assert torch.equal(ours, same) and scale == same_scale
    # against transformers' float32 functions: the same factor, inv_freq within float32 rounding
    assert scale == their_scale
    kept = theirs[: rotary_dim // 2]
    assert not theirs[rotary_dim // 2 :].any()  # p-RoPE's unrotated pairs: zero frequencies
    torch.testing.assert_close(ours.float(), kept, rtol=1e-6, atol=0)


def test_ntk_written_as_its_base_is_ntk_to_transformers() -> None:
    scaling = POSENC_CASES["ntk"]
    rp = to_rope_parameters(scaling, base=THETA, rotary_dim=HEAD_DIM)
    theirs, their_scale = _transformers_frequencies(rp, None, None)
    ours, scale = rope_frequencies(HEAD_DIM, base=THETA, scaling=scaling)
    assert scale == their_scale == 1.0
    torch.testing.assert_close(ours.float(), theirs, rtol=1e-6, atol=0)
