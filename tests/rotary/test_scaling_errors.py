"""Bad scaling specs and rope_frequencies calls: each error names the parameter, the rule
and the value, through parse_scaling and through scaling_from_transformers alike.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle

import pytest

import posenc
from posenc import PosEncError
from posenc.integrations.transformers import scaling_from_transformers
from posenc.rotary import DynamicScaling
from posenc.rotary.frequencies import SCALINGS

from ._scaling_cases import longrope_factors as _longrope_factors

# --- bad input ---------------------------------------------------------------------------------

LR = _longrope_factors(8)

YARN = {"type": "yarn", "factor": 2, "original_max_position": 8}
LONGROPE = {"type": "longrope", **LR, "original_max_position": 8}
LLAMA3 = {
    "type": "llama3",
    "factor": 8,
    "low_freq_factor": 1,
    "high_freq_factor": 4,
    "original_max_position": 8192,
}


def _longrope(short, long) -> dict:
    return {**LONGROPE, "short_factor": short, "long_factor": long, "factor": 2}


# id -> (scaling, the error's match); each case breaks one rule of a valid spec
BAD_SCALINGS = {
    "not-a-dict": ("linear", "scaling must be None, a dict"),
    "no-type": ({"factor": 2.0}, "must hold a 'type'"),
    "unknown-type": (
        {"type": "xpos", "factor": 2},
        "scaling type must be one of 'default', 'linear'",
    ),
    "unknown-key": (
        {"type": "linear", "factor": 2, "fator": 3},
        "unknown key 'fator'; allowed: factor",
    ),
    "default-with-params": ({"type": "default", "factor": 2}, "takes no parameters"),
    "linear-missing-factor": ({"type": "linear"}, "missing required key.*'factor'"),
    "linear-factor-below-1": (
        {"type": "linear", "factor": 0.5},
        r"linear scaling factor must be >= 1.0, got 0.5",
    ),
    "linear-factor-string": ({"type": "linear", "factor": "2"}, "factor must be a number"),
    "linear-factor-nan": ({"type": "linear", "factor": float("nan")}, "factor must be finite"),
    "ntk-factor-below-1": ({"type": "ntk", "factor": 0.9}, "ntk scaling factor must be >= 1.0"),
    "dynamic-missing-max": (
        {"type": "dynamic", "factor": 2},
        "missing required key.*'max_position'",
    ),
    "dynamic-max-zero": (
        {"type": "dynamic", "factor": 2, "max_position": 0},
        "max_position must be >= 1",
    ),
    "dynamic-factor-below-1": (
        {"type": "dynamic", "factor": 0, "max_position": 8},
        "factor must be >= 1.0",
    ),
    "yarn-missing-original": (
        {"type": "yarn", "factor": 2},
        "missing required key.*'original_max_position'",
    ),
    "yarn-no-factor": (
        {"type": "yarn", "original_max_position": 8},
        "needs factor, or max_position",
    ),
    "yarn-factor-below-1": ({**YARN, "factor": 0.5}, "factor must be >= 1.0"),
    "yarn-derived-factor-below-1": (
        {"type": "yarn", "original_max_position": 8, "max_position": 4},
        "factor must be >= 1.0, got 0.5",
    ),
    "yarn-beta-order": ({**YARN, "beta_fast": 1, "beta_slow": 2}, "beta_fast must be >= beta_slow"),
    "yarn-beta-zero": ({**YARN, "beta_slow": 0}, "beta_slow must be > 0.0"),
    "yarn-attention-zero": ({**YARN, "attention_factor": 0.0}, "attention_factor must be > 0.0"),
    "yarn-mscale-negative": ({**YARN, "mscale": -1}, "mscale must be >= 0.0"),
    "yarn-truncate-string": ({**YARN, "truncate": "yes"}, "truncate must be True or False"),
    "yarn-original-float": (
        {**YARN, "original_max_position": 8.5},
        "original_max_position must be an integer",
    ),
    "longrope-missing-long": (
        {"type": "longrope", "short_factor": [1.0], "original_max_position": 8, "factor": 2},
        "missing required key.*'long_factor'",
    ),
    "longrope-no-factor": (LONGROPE, "needs factor, or max_position"),
    "longrope-lengths": (_longrope([1.0], [1.0, 2.0]), "same length, got 1 and 2"),
    "longrope-empty": (_longrope([], []), "non-empty list"),
    "longrope-not-list": (_longrope(1.0, [1.0]), "short_factor must be a non-empty list"),
    "longrope-nonpositive": (_longrope([1.0, 0.0], [1.0, 2.0]), r"short_factor\[1\] must be > 0.0"),
    "longrope-factor-below-1": ({**LONGROPE, "factor": 0.5}, "factor must be >= 1.0"),
    "longrope-max-below-original": (
        {**LONGROPE, "max_position": 4},
        "max_position must be >= original_max_position",
    ),
    "llama3-missing": ({"type": "llama3", "factor": 8}, "missing required key.*'low_freq_factor'"),
    "llama3-high-lt-low": (
        {**LLAMA3, "low_freq_factor": 4, "high_freq_factor": 3},
        "high_freq_factor must be >= low_freq_factor",
    ),
    "llama3-low-zero": ({**LLAMA3, "low_freq_factor": 0}, "low_freq_factor must be > 0.0"),
    "llama3-factor-below-1": ({**LLAMA3, "factor": 0.5}, "factor must be >= 1.0"),
}


@pytest.mark.parametrize(("scaling", "match"), list(BAD_SCALINGS.values()), ids=list(BAD_SCALINGS))
def test_bad_scaling(scaling, match: str) -> None:
    with pytest.raises(PosEncError, match=match):
        posenc.rope_frequencies(8, scaling=scaling)


# transformers' spellings, read by scaling_from_transformers only
BAD_TRANSFORMERS = [
    ("type-disagrees", {"type": "linear", "rope_type": "yarn", "factor": 2}, "disagree"),
    ("no-type", {"factor": 2.0}, r"must hold a 'type' \(or 'rope_type'\) key"),
    ("not-a-dict", "linear", "rope_scaling must be None or a dict, got str"),
    ("rope-theta", {"type": "linear", "factor": 2, "rope_theta": 1e4}, "pass it as base="),
    (
        "mrope-section",
        {"rope_type": "default", "mrope_section": [1, 1]},
        "'default' takes no parameters",
    ),
    ("partial", {"rope_type": "linear", "factor": 2, "partial_rotary_factor": 0.5}, "rotary dim"),
    (
        "duplicate-alias",
        {
            "type": "yarn",
            "factor": 2,
            "original_max_position": 8,
            "original_max_position_embeddings": 8,
        },
        "twice",
    ),
    (
        "unknown-key",
        {"rope_type": "linear", "factor": 2, "fator": 3},
        "unknown key 'fator'; allowed: factor$",
    ),
    (
        "missing",
        {"rope_type": "dynamic", "factor": 2},
        "missing required key.*'max_position'",
    ),
]


@pytest.mark.parametrize(
    ("scaling", "match"), [c[1:] for c in BAD_TRANSFORMERS], ids=[c[0] for c in BAD_TRANSFORMERS]
)
def test_bad_transformers_scaling(scaling, match: str) -> None:
    with pytest.raises(PosEncError, match=match):
        scaling_from_transformers(scaling)


_BAD_DICTS = {name: case for name, case in BAD_SCALINGS.items() if isinstance(case[0], dict)}


@pytest.mark.parametrize(("scaling", "match"), list(_BAD_DICTS.values()), ids=list(_BAD_DICTS))
def test_scaling_from_transformers_refuses_what_parse_scaling_refuses(scaling, match) -> None:
    """Posenc's spellings read by either function give the same errors."""
    with pytest.raises(PosEncError, match=match):
        scaling_from_transformers(scaling)


BAD_CALLS = [
    ("odd-dim", {"dim": 7}, "dim must be even"),
    ("zero-dim", {"dim": 0}, "dim must be >= 2, got 0"),
    ("float-dim", {"dim": 8.0}, "dim must be an integer"),
    ("bool-dim", {"dim": True}, "dim must be an integer"),
    ("base-one", {"dim": 8, "base": 1.0}, "base must be > 1.0"),
    ("base-nan", {"dim": 8, "base": float("nan")}, "base must be finite"),
    ("seq-len-nan", {"dim": 8, "seq_len": float("nan")}, "seq_len must be finite"),
    ("seq-len-string", {"dim": 8, "seq_len": "10"}, "seq_len must be a number"),
    (
        "dynamic-dim-2",
        {"dim": 2, "scaling": DynamicScaling(factor=2, max_position=8), "seq_len": 20},
        "dim must be >= 4 for dynamic scaling",
    ),
    ("ntk-dim-2", {"dim": 2, "scaling": {"type": "ntk", "factor": 2}}, "dim must be >= 4 for ntk"),
    (
        "longrope-wrong-length",
        {"dim": 16, "scaling": {"type": "longrope", **LR, "original_max_position": 8, "factor": 2}},
        "must have length dim // 2 = 8, got 4",
    ),
]


@pytest.mark.parametrize(
    ("kwargs", "match"), [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS]
)
def test_bad_call(kwargs, match: str) -> None:
    with pytest.raises(PosEncError, match=match):
        posenc.rope_frequencies(**kwargs)


# --- the dataclasses themselves (issue 24) ------------------------------------------------------

# every scaling dataclass with a valid set of its fields by name
VALID_FIELDS = {
    "linear": {"factor": 2.0},
    "ntk": {"factor": 2.0},
    "dynamic": {"factor": 2.0, "max_position": 16},
    "yarn": {"factor": 2.0, "original_max_position": 16},
    "llama3": {k: v for k, v in LLAMA3.items() if k != "type"},
    "longrope": {**{k: v for k, v in LONGROPE.items() if k != "type"}, "factor": 2.0},
    "proportional": {"factor": 2.0},
}


def _required(cls) -> list[str]:
    return [
        f.name
        for f in dataclasses.fields(cls)
        if f.init
        and (
            (f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
            or f.metadata.get("required")
        )
    ]


def test_every_scaling_is_covered():
    assert set(VALID_FIELDS) == set(SCALINGS)


MISSING_CASES = [(kind, name) for kind in VALID_FIELDS for name in _required(SCALINGS[kind][0])]


@pytest.mark.parametrize(
    ("kind", "name"), MISSING_CASES, ids=[f"{k}-{n}" for k, n in MISSING_CASES]
)
def test_a_missing_field_is_named(kind, name) -> None:
    """Llama3Scaling(factor=2) and its siblings were a TypeError."""
    cls = SCALINGS[kind][0]
    fields = {k: v for k, v in VALID_FIELDS[kind].items() if k != name}
    with pytest.raises(
        PosEncError, match=rf"{kind} scaling is missing required field\(s\) .*\b{name}\b"
    ):
        cls(**fields)


def test_llama3_names_every_missing_field() -> None:
    with pytest.raises(
        PosEncError,
        match=r"llama3 scaling is missing required field\(s\) low_freq_factor, high_freq_factor, "
        r"original_max_position; required: factor, low_freq_factor",
    ):
        posenc.rotary.Llama3Scaling(factor=2)


@pytest.mark.parametrize("kind", VALID_FIELDS)
def test_positional_and_unknown_fields_are_refused(kind) -> None:
    cls = SCALINGS[kind][0]
    with pytest.raises(PosEncError, match=rf"{kind} scaling takes its fields by name only"):
        cls(*VALID_FIELDS[kind].values())
    with pytest.raises(PosEncError, match=rf"{kind} scaling got unknown field\(s\) 'no_such'"):
        cls(**VALID_FIELDS[kind], no_such=1)
    with pytest.raises(PosEncError, match=rf"{kind} scaling got unknown field\(s\) 'type'"):
        cls(**VALID_FIELDS[kind], type=kind)


@pytest.mark.parametrize("kind", VALID_FIELDS)
def test_dataclasses_stay_frozen_dataclasses(kind) -> None:
    cls = SCALINGS[kind][0]
    p = cls(**VALID_FIELDS[kind])
    assert pickle.loads(pickle.dumps(p)) == p
    assert copy.deepcopy(p) == p
    assert dataclasses.replace(p) == p
    assert posenc.rotary.parse_scaling(dataclasses.asdict(p)) == p
    assert [f.name for f in dataclasses.fields(cls)][-1] == "type" and p.type == kind
    assert list(inspect.signature(cls).parameters) == [
        f.name for f in dataclasses.fields(cls) if f.init
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.type = "x"  # type: ignore[misc]
