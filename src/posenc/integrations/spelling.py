"""transformers' spelling of a RoPE scaling and posenc's: one table, read both ways.

posenc spells a scaling ``{"type": "yarn", "factor": 4.0, "original_max_position": 4096}``
(what :func:`posenc.rotary.frequencies.parse_scaling` reads, or its dataclass).
transformers spells it ``{"rope_type": "yarn", "factor": 4.0,
"original_max_position_embeddings": 4096}`` (its ``rope_scaling``; ``"type"`` in older
configs, ``"su"`` for LongRoPE in early Phi-3 ones), and transformers 5's
``rope_parameters`` add what is no scaling parameter: ``rope_theta`` and, for some families,
``partial_rotary_factor``, ``mrope_section`` and ``mrope_interleaved``. The keys per
rope type are :data:`ROPE_TYPE_KEYS` (those transformers 5's ``modeling_rope_utils`` reads).

In (transformers -> posenc):

- :func:`is_transformers_spelling`: whether a dict is spelled transformers' way;
- :func:`posenc_spelling`: a ``rope_scaling`` dict in posenc's spelling;
- :func:`from_rope_parameters`: the same for a ``rope_scaling`` or ``rope_parameters``
  dict given to a rotary module, whose ``rope_theta`` (and ``partial_rotary_factor``,
  ``mrope_section``, ``mrope_interleaved``) must agree with the module's own arguments;
- :func:`read_transformers`: the reader :mod:`posenc.rotary.scalings.foreign` hands every
  scaling dict to, installed when this module is imported (the package imports it whenever ``posenc.rotary`` is imported, :func:`posenc._lazy.after_import`), so
  that :class:`posenc.RotaryEmbedding` takes transformers' spelling.

Out (posenc -> transformers):

- :func:`transformers_spelling`: a scaling as transformers' ``rope_scaling`` dict, the inverse
  of :func:`posenc_spelling`;
- :func:`to_rope_parameters`: a scaling with its base (and partial rotary factor) as a
  config's ``rope_parameters`` (``posenc extend --save``, the engines' emitters), with
  :func:`config_max_position` the ``max_position_embeddings`` the config must hold for it.

:func:`posenc.integrations.transformers.scaling_from_transformers` is the public face of the
way in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from posenc._errors import PosEncError, check_float, check_int
from posenc.rotary.frequencies import (
    SCALINGS,
    NTKScaling,
    Scaling,
    check_scaling_type,
    parse_scaling,
)
from posenc.rotary.scalings.foreign import Given, set_foreign_reader

__all__ = [
    "CONFIG_KEYS",
    "FIELD_KEYS",
    "GENERAL_KEYS",
    "KEY_ALIASES",
    "ROPE_TYPE_KEYS",
    "TYPE_ALIASES",
    "Given",
    "config_max_position",
    "from_rope_parameters",
    "is_transformers_spelling",
    "posenc_spelling",
    "read_transformers",
    "scaling_type",
    "to_rope_parameters",
    "transformers_keys",
    "transformers_spelling",
]

# --- the table ----------------------------------------------------------------------------

#: posenc's field -> transformers' key, where the two spell it differently (every other
#: field of a scaling dataclass is spelled alike).
FIELD_KEYS = {
    "original_max_position": "original_max_position_embeddings",
    "max_position": "max_position_embeddings",
}
#: transformers' key -> posenc's field.
KEY_ALIASES = {key: field for field, key in FIELD_KEYS.items()}
#: transformers' rope types posenc names otherwise (read only: written as posenc's name).
TYPE_ALIASES = {"su": "longrope"}  # early Phi-3 configs
#: Keys of transformers' spelling that are a config attribute in transformers, not a key of
#: ``rope_parameters``: dynamic NTK's trained context, YaRN's and LongRoPE's target length.
CONFIG_KEYS = ("max_position_embeddings",)
#: transformers' rope types and the keys its ``ROPE_INIT_FUNCTIONS`` read from
#: ``rope_parameters`` beside ``rope_type``, ``rope_theta`` and ``partial_rotary_factor``
#: (transformers 5.x ``modeling_rope_utils``; ``tests/integrations/test_spelling.py`` checks
#: them against the installed one). posenc's ``ntk`` has no rope type: it is written as the
#: base it amounts to.
ROPE_TYPE_KEYS: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": (
        "factor",
        "original_max_position_embeddings",
        "attention_factor",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
    ),
    "longrope": (
        "short_factor",
        "long_factor",
        "original_max_position_embeddings",
        "factor",
        "attention_factor",
    ),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "proportional": ("factor",),
}
#: Keys of a ``rope_parameters`` dict that are no scaling parameter -> what to pass instead.
GENERAL_KEYS = {
    "rope_theta": "pass it as base=",
    "partial_rotary_factor": "pass the rotary dim instead",
    "mrope_section": "pass it as sections= to RotaryEmbedding",
    "mrope_interleaved": "pass section_layout='interleaved' to RotaryEmbedding",
}
# Keys only transformers' spelling has (a dict holding one is read as transformers').
_TRANSFORMERS_KEYS = frozenset({"rope_type", *KEY_ALIASES, *GENERAL_KEYS})
_TYPE_KEYS = ("type", "rope_type")


# --- in: transformers -> posenc -----------------------------------------------------------


def is_transformers_spelling(spec: Any) -> bool:
    """Whether ``spec`` is a dict in transformers' spelling: it has a key only transformers
    writes (``rope_type``, ``original_max_position_embeddings``, ``max_position_embeddings``,
    ``rope_theta``, ``partial_rotary_factor``, ``mrope_section``, ``mrope_interleaved``) or the
    type ``"su"``. posenc's spelling and a dataclass are not.

    Examples:
        >>> from posenc.integrations.spelling import is_transformers_spelling
        >>> is_transformers_spelling({"rope_type": "linear", "factor": 2.0})
        True
        >>> is_transformers_spelling({"type": "linear", "factor": 2.0})
        False
    """
    return bool(transformers_keys(spec))


def transformers_keys(spec: Any) -> list[str]:
    """The keys of ``spec`` only transformers' spelling has, sorted (``"type"`` where its
    value is transformers' alias ``"su"``); ``[]`` for anything else."""
    if not isinstance(spec, Mapping):
        return []
    keys = sorted(k for k in spec if isinstance(k, str) and k in _TRANSFORMERS_KEYS)
    kind = spec.get("type")
    return [*keys, "type"] if isinstance(kind, str) and kind in TYPE_ALIASES else keys


def scaling_type(spec: Mapping[str, Any]) -> str:
    """The scaling type of a dict in either spelling: ``rope_type`` or ``type`` (both given:
    they must agree; ``"su"`` is ``"longrope"``), one of ``"default"`` and the registry's.

    Raises:
        PosEncError: neither key, the two disagree, or a type that is no scaling (or no
            string), naming the key.
    """
    return _kind(dict(spec))


def _kind(spec: dict[str, Any]) -> str:
    """The scaling type of ``spec`` (popped from it): ``rope_type`` or ``type``, which agree."""
    kinds = {}
    for key in _TYPE_KEYS:
        if key in spec:
            value = spec.pop(key)
            if isinstance(value, str):
                value = TYPE_ALIASES.get(value, value)
            kinds[key] = check_scaling_type(value, key)
    if not kinds:
        raise PosEncError(
            f"scaling must hold a 'type' (or 'rope_type') key, got keys {sorted(map(str, spec))}"
        )
    if len(set(kinds.values())) > 1:
        raise PosEncError(f"scaling 'type' and 'rope_type' disagree: {sorted(kinds.values())}")
    return next(iter(kinds.values()))


def posenc_spelling(rope_scaling: Mapping[str, Any]) -> dict[str, Any]:
    """A transformers ``rope_scaling`` dict in posenc's spelling (for ``parse_scaling``).

    The type is read from ``"rope_type"`` or ``"type"`` (both given: they must agree;
    ``"su"`` is LongRoPE), the keys in transformers' spellings
    (``original_max_position_embeddings``, ``max_position_embeddings``) or posenc's;
    ``truncate: None`` is false (transformers tests the value, so ``None`` is falsy) and any
    other ``None`` value counts as absent. ``{"rope_type": "default"}`` stays the type
    ``"default"`` (no scaling). A dict already in posenc's spelling comes back equal.

    Raises:
        PosEncError: no or an unknown type, a key that is no scaling parameter (such as
            ``rope_theta``, with what to do instead), an unknown key or one given in both
            spellings.

    Examples:
        >>> from posenc.integrations.spelling import posenc_spelling
        >>> posenc_spelling({"rope_type": "yarn", "factor": 4.0,
        ...                  "original_max_position_embeddings": 4096})
        {'type': 'yarn', 'factor': 4.0, 'original_max_position': 4096}
    """
    spec = dict(rope_scaling)
    kind = _kind(spec)
    if kind == "default":  # no scaling: parse_scaling refuses any parameter given
        return {"type": "default", **spec}
    cls, _ = SCALINGS[kind]
    fields = [f.name for f in dataclasses.fields(cls) if f.init]
    args: dict[str, Any] = {"type": kind}
    for key, value in spec.items():
        name = KEY_ALIASES.get(key, key)
        if name in GENERAL_KEYS and name not in fields:
            raise PosEncError(
                f"scaling key {key!r} is not a scaling parameter: {GENERAL_KEYS[name]}"
            )
        if name not in fields:
            raise PosEncError(
                f"scaling {kind!r} got unknown key {key!r}; allowed: {', '.join(fields)}"
            )
        if name in args:
            raise PosEncError(f"scaling {kind!r} got {name!r} twice (as {key!r} and its alias)")
        if value is None:
            if name == "truncate":
                args[name] = False  # transformers: rope_parameters.get("truncate", True) is falsy
            continue
        args[name] = value
    return args


def from_rope_parameters(rope_parameters: Mapping[str, Any], given: Given) -> dict[str, Any]:
    """A transformers ``rope_scaling`` or ``rope_parameters`` dict in posenc's spelling, its
    keys that are no scaling parameter checked against what the caller was given:
    ``rope_theta`` must equal ``base``, ``partial_rotary_factor`` must rotate ``rotary_dim``
    of the ``head_dim`` channels (``proportional``: ``2 * int(factor * head_dim // 2)``),
    ``mrope_section`` must equal ``sections`` and ``mrope_interleaved`` must match
    ``section_layout``. A dict holding ``rope_theta`` but no type is rope type
    ``"default"``, as transformers reads it.

    Raises:
        PosEncError: one of them disagrees (naming the argument to pass instead), or what
            :func:`posenc_spelling` refuses.

    Examples:
        >>> from posenc.integrations.spelling import Given, from_rope_parameters
        >>> from_rope_parameters({"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
        ...                      Given("RotaryEmbedding", base=1e4))
        {'type': 'linear', 'factor': 2.0}
    """
    spec = dict(rope_parameters)
    general = {k: spec.pop(k) for k in GENERAL_KEYS if k in spec}
    if "rope_theta" in general and not any(k in spec for k in _TYPE_KEYS):
        spec["rope_type"] = "default"  # transformers' default rope type
    translated = posenc_spelling(spec)
    for key, value in general.items():
        if value is not None:
            _check_general(key, value, translated["type"], given)
    return translated


def read_transformers(spec: Mapping[str, Any], given: Given) -> dict[str, Any] | None:
    """The foreign reader of the rotary room (:mod:`posenc.rotary.scalings.foreign`):
    ``spec`` in posenc's spelling when it is in transformers' (:func:`from_rope_parameters`),
    ``None`` otherwise."""
    return from_rope_parameters(spec, given) if is_transformers_spelling(spec) else None


def _check_general(key: str, value: Any, kind: str, given: Given) -> None:
    """Refuse a ``rope_parameters`` key that disagrees with the caller's own argument."""
    where = f"{given.call}: scaling's {key}"
    if key == "rope_theta":
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value != given.base:
            raise PosEncError(
                f"{where} must equal base={given.base!r} (the base is an argument of its own: "
                f"pass base={value!r}), got {value!r}"
            )
    elif key == "partial_rotary_factor":
        if given.head_dim is None or given.rotary_dim is None:
            raise PosEncError(f"{where} is not taken here: {GENERAL_KEYS[key]}, got {value!r}")
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise PosEncError(f"{where} must be a number, got {value!r}")
        half = kind == "proportional"
        rotated = 2 * int(value * given.head_dim // 2) if half else int(given.head_dim * value)
        if rotated != given.rotary_dim:
            raise PosEncError(
                f"{where} {value!r} rotates {rotated} of the {given.head_dim} channels, but "
                f"rotary_dim is {given.rotary_dim}: pass rotary_dim={rotated}"
            )
    elif key == "mrope_section":
        listed = list(value) if isinstance(value, (list, tuple)) else value
        if given.sections is None or listed != list(given.sections):
            raise PosEncError(
                f"{where} must equal sections={given.sections!r} (pass sections={listed!r}), "
                f"got {value!r}"
            )
    else:  # mrope_interleaved
        wanted = "interleaved" if value else "contiguous"
        if given.sections is None or given.section_layout != wanted:
            raise PosEncError(
                f"{where} {value!r} needs M-RoPE sections with section_layout={wanted!r}, got "
                f"sections={given.sections!r}, section_layout={given.section_layout!r}"
            )


# --- out: posenc -> transformers ----------------------------------------------------------


def transformers_spelling(scaling: Scaling | Mapping[str, Any] | None) -> dict[str, Any]:
    """A scaling (a dataclass or posenc's dict; ``None``: none) as transformers'
    ``rope_scaling`` dict, the inverse of :func:`posenc_spelling`: ``rope_type``, then each
    field under transformers' key (:data:`FIELD_KEYS`), a tuple as a list. A field at its
    default is left out (posenc's defaults are transformers': YaRN's ``beta_fast`` 32,
    ``beta_slow`` 1, ``truncate`` true; p-RoPE's ``factor`` 1), and so is one that is
    ``None``. ``max_position_embeddings`` is a key here, as :func:`posenc_spelling` reads it;
    in a config it is an attribute (see :func:`to_rope_parameters`).

    Raises:
        PosEncError: what :func:`~posenc.rotary.frequencies.parse_scaling` refuses, or
            ``ntk``, which has no rope type (:func:`to_rope_parameters` writes it as a base).

    Examples:
        >>> from posenc.integrations.spelling import transformers_spelling
        >>> transformers_spelling({"type": "yarn", "factor": 4.0, "original_max_position": 64})
        {'rope_type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': 64}
    """
    params = parse_scaling(scaling)
    if params is None:
        return {"rope_type": "default"}
    if params.type not in ROPE_TYPE_KEYS:
        raise PosEncError(
            f"scaling {params.type!r} has no transformers rope_type: "
            "to_rope_parameters writes it as the base it amounts to"
        )
    spelled: dict[str, Any] = {"rope_type": params.type}
    for field in dataclasses.fields(params):
        value = getattr(params, field.name)
        if not field.init or value is None or _at_default(field, value):
            continue
        spelled[FIELD_KEYS.get(field.name, field.name)] = (
            list(value) if isinstance(value, tuple) else value
        )
    return spelled


def _at_default(field: dataclasses.Field[Any], value: Any) -> bool:
    default = field.default
    if default is dataclasses.MISSING or default is None:
        return False
    return type(value) is type(default) and bool(value == default)


def to_rope_parameters(
    scaling: Scaling | Mapping[str, Any] | None,
    *,
    base: float,
    rotary_dim: int | None = None,
    partial_rotary_factor: float | None = None,
) -> dict[str, Any]:
    """A scaling, its base and partial rotary factor as a transformers config's
    ``rope_parameters``: ``rope_type``, ``rope_theta``, ``partial_rotary_factor`` (when
    given) and :func:`transformers_spelling`'s keys less :data:`CONFIG_KEYS` (a config
    attribute: :func:`config_max_position`).

    Static NTK (``ntk``), which transformers has no rope type for, is written as the base it
    amounts to: ``rope_type: "default"`` with ``rope_theta = base * factor ** (d / (d - 2))``,
    ``d = rotary_dim``. Its frequencies are posenc's bit for bit, but reading the dict back
    gives no scaling and that base: this direction is lossy by design for ``ntk``.

    Raises:
        PosEncError: what :func:`~posenc.rotary.frequencies.parse_scaling` refuses, a
            ``base`` that is no number ``> 1``, ``ntk`` without ``rotary_dim`` (``>= 4``).

    Examples:
        >>> from posenc.integrations.spelling import to_rope_parameters
        >>> to_rope_parameters({"type": "linear", "factor": 2.0}, base=1e4)
        {'rope_type': 'linear', 'rope_theta': 10000.0, 'factor': 2.0}
        >>> to_rope_parameters({"type": "ntk", "factor": 4.0}, base=1e4, rotary_dim=4)
        {'rope_type': 'default', 'rope_theta': 160000.0}
    """
    params = parse_scaling(scaling)
    base = check_float("base", base, min=1.0, min_exclusive=True)
    out: dict[str, Any] = {"rope_type": "default", "rope_theta": base}
    if partial_rotary_factor is not None:
        factor = check_float(
            "partial_rotary_factor", partial_rotary_factor, min=0.0, min_exclusive=True, max=1.0
        )
        out["partial_rotary_factor"] = factor
    if isinstance(params, NTKScaling):
        if rotary_dim is None:
            raise PosEncError(
                "rotary_dim is needed to write scaling 'ntk' (rope_theta = base * factor ** "
                "(rotary_dim / (rotary_dim - 2))), got None"
            )
        dim = check_int("rotary_dim", rotary_dim, min=4)
        out["rope_theta"] = base * params.factor ** (dim / (dim - 2))
        return out
    spelled = transformers_spelling(params)
    out.update({k: v for k, v in spelled.items() if k not in CONFIG_KEYS})
    return out


def config_max_position(scaling: Scaling | Mapping[str, Any] | None) -> int | None:
    """The ``max_position_embeddings`` a transformers config must hold for ``scaling``
    (transformers reads it from the config, not from ``rope_parameters``): dynamic NTK's
    ``max_position`` (the trained context), YaRN's and LongRoPE's when given; ``None``:
    the scaling reads none."""
    params = parse_scaling(scaling)
    value = getattr(params, "max_position", None)
    return None if value is None else int(value)


set_foreign_reader(read_transformers)
