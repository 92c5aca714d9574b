"""transformers' spellings of a RoPE scaling, translated into posenc's.

posenc spells a scaling ``{"type": "yarn", "factor": 4.0, "original_max_position": 4096}``
(what :func:`posenc.rotary.frequencies.parse_scaling` reads). transformers spells the same
``{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}`` (its
``rope_scaling``; ``"type"`` in older configs, ``"su"`` for LongRoPE in early Phi-3 ones), and
transformers 5's ``rope_parameters`` add what is no scaling parameter: ``rope_theta``, and
for some families ``partial_rotary_factor``, ``mrope_section`` and ``mrope_interleaved``.

This module is the one translation, a pure function of dicts:

- :func:`is_transformers_spelling`: whether a dict is spelled transformers' way;
- :func:`posenc_spelling`: the dict of a ``rope_scaling`` in posenc's spelling (a key that is
  no scaling parameter refused, with what to pass instead);
- :func:`from_rope_parameters`: the same for a ``rope_parameters`` dict given to a rotary
  module or function, whose ``rope_theta`` (and ``partial_rotary_factor``, ``mrope_section``,
  ``mrope_interleaved``) must agree with what the caller was given.

:func:`posenc.integrations.transformers.scaling_from_transformers` is its public face;
:class:`posenc.RotaryEmbedding` reads ``scaling=`` through :func:`from_rope_parameters`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from posenc._errors import PosEncError, check_choice
from posenc.rotary.scalings._registry import SCALINGS

__all__ = [
    "GENERAL_KEYS",
    "Given",
    "from_rope_parameters",
    "is_transformers_spelling",
    "posenc_spelling",
    "scaling_type",
    "transformers_keys",
]

# transformers' key spellings -> posenc's; the type key is "type" or "rope_type".
KEY_ALIASES = {
    "original_max_position_embeddings": "original_max_position",
    "max_position_embeddings": "max_position",
}
TYPE_ALIASES = {"su": "longrope"}  # early Phi-3 configs
# Keys of a rope_parameters dict that are no scaling parameter -> what to pass instead.
GENERAL_KEYS = {
    "rope_theta": "pass it as base=",
    "partial_rotary_factor": "pass the rotary dim instead",
    "mrope_section": "pass it as sections= to RotaryEmbedding",
    "mrope_interleaved": "pass section_layout='interleaved' to RotaryEmbedding",
}
# Keys only transformers' spelling has (a dict holding one is read as transformers').
_TRANSFORMERS_KEYS = frozenset({"rope_type", *KEY_ALIASES, *GENERAL_KEYS})


def is_transformers_spelling(spec: Any) -> bool:
    """Whether ``spec`` is a dict in transformers' spelling: it has a key only transformers
    writes (``rope_type``, ``original_max_position_embeddings``, ``max_position_embeddings``,
    ``rope_theta``, ``partial_rotary_factor``, ``mrope_section``, ``mrope_interleaved``) or the
    type ``"su"``. posenc's spelling and a dataclass are not.

    Examples:
        >>> from posenc.rotary._spelling import is_transformers_spelling
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
    keys = sorted(k for k in spec if k in _TRANSFORMERS_KEYS)
    return [*keys, "type"] if spec.get("type") in TYPE_ALIASES else keys


def scaling_type(spec: Mapping[str, Any]) -> Any:
    """The scaling type of a dict in either spelling: ``rope_type`` or ``type`` (both given:
    they must agree; ``"su"`` is ``"longrope"``), one of ``"default"`` and the registry's.

    Raises:
        PosEncError: neither key, the two disagree, or an unknown type.
    """
    return _kind(dict(spec))


def _kind(spec: dict[str, Any]) -> Any:
    """The scaling type of ``spec`` (popped from it): ``rope_type`` or ``type``, which agree."""
    kinds = {_alias(spec.pop(k)) for k in ("type", "rope_type") if k in spec}
    if not kinds:
        raise PosEncError(
            f"scaling must hold a 'type' (or 'rope_type') key, got keys {sorted(spec)}"
        )
    if len(kinds) > 1:
        raise PosEncError(f"scaling 'type' and 'rope_type' disagree: {sorted(map(str, kinds))}")
    return check_choice("scaling type", kinds.pop(), ("default", *SCALINGS))


def _alias(kind: Any) -> Any:
    return TYPE_ALIASES.get(kind, kind) if isinstance(kind, str) else kind


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
        >>> from posenc.rotary._spelling import posenc_spelling
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


@dataclasses.dataclass(frozen=True)
class Given:
    """What a rotary module or function was given, that a ``rope_parameters`` dict may
    repeat (``None``: the caller has no such argument, so the dict may not hold it).

    Attributes:
        call: the caller's name, for the messages (``"RotaryEmbedding"``).
        base: its ``base``.
        head_dim, rotary_dim: its head dim and rotated channels.
        sections: its M-RoPE sections (``None``: none, so ``mrope_section`` is refused).
        section_layout: its M-RoPE section layout.
    """

    call: str
    base: float
    head_dim: int | None = None
    rotary_dim: int | None = None
    sections: Sequence[int] | None = None
    section_layout: str | None = None


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
        >>> from posenc.rotary._spelling import Given, from_rope_parameters
        >>> from_rope_parameters({"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
        ...                      Given("RotaryEmbedding", base=1e4))
        {'type': 'linear', 'factor': 2.0}
    """
    spec = dict(rope_parameters)
    general = {k: spec.pop(k) for k in GENERAL_KEYS if k in spec}
    if "rope_theta" in general and "type" not in spec and "rope_type" not in spec:
        spec["rope_type"] = "default"  # transformers' default rope type
    translated = posenc_spelling(spec)
    for key, value in general.items():
        if value is not None:
            _check_general(key, value, translated["type"], given)
    return translated


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
