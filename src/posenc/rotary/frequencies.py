"""RoPE frequencies and the context-extension scalings, one registry for all of them.

``inv_freq[i] = 1 / base^(2i / dim)`` for ``i < dim / 2`` (Su et al., 2021, RoFormer), where
``dim`` is the number of rotated channels. A *scaling* changes these frequencies (and
sometimes the scale of cos/sin) so that a model reaches past the context it was trained on.

Each scaling is registered once, in :data:`SCALINGS`, as a pair: a frozen parameter
dataclass validated in ``__post_init__`` and the function computing
``(inv_freq, attention_scale)`` from it, side by side in one module of
:mod:`posenc.rotary.scalings`. Parsing a config dict goes through that same dataclass, so
what is accepted and what is computed cannot drift apart. A scaling whose frequencies
depend on the positions of a call (``dynamic``, ``longrope``) says how in its dataclass'
``call_frequencies``, which :class:`posenc.RotaryEmbedding` asks on every call.

The numbers are those of transformers' ``modeling_rope_utils`` for the names it shares
(``linear``, ``dynamic``, ``yarn``, ``longrope``, ``llama3``, ``proportional``), edge rules
included, computed in float64 instead of float32. ``ntk`` is the static NTK-aware base change.
:func:`parse_scaling` reads posenc's spelling only. Another library's spelling is known to
:mod:`posenc.integrations` alone (:mod:`posenc.integrations.spelling`), which reads it for
:class:`posenc.RotaryEmbedding` through the one hook of :mod:`.scalings.foreign`
(:func:`rope_frequencies` takes transformers' spelling that way too, deprecated: a
:class:`DeprecationWarning`, and refused from the next release).

Shape: :func:`rope_frequencies` returns ``inv_freq`` ``[dim // 2]``, :func:`rotated_frequencies`
``[rotary_dim // 2]``, float64 on the CPU; :func:`parse_scaling` a parameter dataclass.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from posenc._errors import PosEncError, check_alloc, check_float, check_int, describe
from posenc.rotary.scalings._registry import SCALINGS, ScalingParams, default_frequencies
from posenc.rotary.scalings.foreign import Given, read_foreign
from posenc.rotary.scalings.linear import LinearScaling
from posenc.rotary.scalings.llama3 import Llama3Scaling
from posenc.rotary.scalings.longrope import LongRopeScaling
from posenc.rotary.scalings.ntk import DynamicScaling, NTKScaling
from posenc.rotary.scalings.proportional import ProportionalScaling
from posenc.rotary.scalings.yarn import YarnScaling

__all__ = [
    "SCALINGS",
    "DynamicScaling",
    "LinearScaling",
    "Llama3Scaling",
    "LongRopeScaling",
    "NTKScaling",
    "ProportionalScaling",
    "Scaling",
    "ScalingParams",
    "YarnScaling",
    "check_scaling_type",
    "parse_scaling",
    "rope_frequencies",
    "rotated_frequencies",
]

Scaling = (
    LinearScaling
    | DynamicScaling
    | NTKScaling
    | YarnScaling
    | LongRopeScaling
    | Llama3Scaling
    | ProportionalScaling
)

# Where a dict in another library's spelling is read (named in the errors below).
_ELSEWHERE = (
    "a transformers config's scaling dict is read by "
    "posenc.integrations.transformers.scaling_from_transformers, and RotaryEmbedding(scaling=) "
    "takes it as is"
)
_DEPRECATED_SPELLING = (
    "rope_frequencies(scaling=...) in transformers' spelling (keys {keys}) is deprecated and will "
    "be refused in the next release: use posenc's spelling ({{'type': ..., "
    "'original_max_position': ...}}) or "
    "posenc.integrations.transformers.scaling_from_transformers(...)"
)


def _classes() -> tuple[type, ...]:
    return tuple(cls for cls, _ in SCALINGS.values())


def check_scaling_type(value: Any, key: str = "type") -> str:
    """A scaling type as a dict gives it under ``key`` (``"type"``; transformers' dicts:
    ``"rope_type"`` too): ``"default"`` or a name of :data:`SCALINGS`.

    Raises:
        PosEncError: anything else (a string no scaling has, or no string), naming
            ``scaling[key]``.
    """
    choices = ("default", *SCALINGS)
    if not isinstance(value, str) or value not in choices:
        listed = ", ".join(map(repr, choices))
        where = f"scaling[{key!r}]"
        if not isinstance(value, str):
            where += f" must be a string, not {type(value).__name__}"
        raise PosEncError(f"scaling type must be one of {listed}, got {describe(value)} ({where})")
    return value


def parse_scaling(scaling: Any) -> Scaling | None:
    """Turn a scaling spec into its parameter dataclass (``None`` for no scaling).

    Args:
        scaling: ``None``; one of the dataclasses (returned as is); or a dict holding
            ``"type"`` and the dataclass' fields by name (what ``dataclasses.asdict`` of one
            gives, and what a module's ``to_config()`` saves). ``{"type": "default"}`` means
            no scaling; keys whose value is ``None`` count as absent. For transformers'
            dicts use :func:`posenc.integrations.transformers.scaling_from_transformers`.

    Raises:
        PosEncError: no or an unknown type, an unknown key (naming the allowed ones), a
            missing required key, or a value the dataclass refuses.

    Examples:
        >>> from posenc.rotary.frequencies import parse_scaling
        >>> parse_scaling({"type": "linear", "factor": 4})
        LinearScaling(factor=4.0, type='linear')
    """
    if scaling is None:
        return None
    if isinstance(scaling, _classes()):
        return scaling  # type: ignore[return-value]
    if not isinstance(scaling, Mapping):
        raise PosEncError(
            f"scaling must be None, a dict with a 'type' key or one of "
            f"{', '.join(cls.__name__ for cls in _classes())}, got {type(scaling).__name__}"
        )
    spec = dict(scaling)
    if "type" not in spec:
        raise PosEncError(
            f"scaling must hold a 'type' key, got keys {sorted(map(str, spec))} ({_ELSEWHERE})"
        )
    kind = check_scaling_type(spec.pop("type"))
    if kind == "default":
        extra = sorted(k for k, v in spec.items() if v is not None)
        if extra:
            raise PosEncError(f"scaling type 'default' takes no parameters, got {extra}")
        return None
    cls, _ = SCALINGS[kind]
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in spec:
        if key not in fields:
            raise PosEncError(
                f"scaling {kind!r} got unknown key {key!r}; allowed: {', '.join(fields)} "
                f"({_ELSEWHERE})"
            )
    args = {key: value for key, value in spec.items() if value is not None}
    required = [
        n
        for n, f in fields.items()
        if (f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
        or f.metadata.get("required")
    ]
    missing = [n for n in required if n not in args]
    if missing:
        optional = [n for n in fields if n not in required]
        raise PosEncError(
            f"scaling {kind!r} is missing required key(s) {', '.join(map(repr, missing))}; "
            f"required: {', '.join(required)}; optional: {', '.join(optional) or 'none'}"
        )
    return cls(**args)  # type: ignore[no-any-return]


def rope_frequencies(
    dim: int,
    *,
    base: float = 10000.0,
    scaling: Scaling | Mapping[str, Any] | None = None,
    seq_len: float | None = None,
) -> tuple[torch.Tensor, float]:
    """RoPE inverse frequencies and the cos/sin scale, for any registered scaling.

    Args:
        dim: the rotary dim (number of rotated channels), even and ``>= 2``; for
            ``proportional`` the head dim, which its exponents span (a rotary module keeps
            the first ``rotary_dim / 2`` of the ``dim / 2`` frequencies).
        base: the wavelength base, ``> 1``.
        scaling: ``None``, a dict such as ``{"type": "linear", "factor": 2.0}`` or a
            dataclass (see :func:`parse_scaling`); types: ``linear``, ``dynamic``, ``ntk``,
            ``yarn``, ``longrope``, ``llama3``, ``proportional``. A dict in transformers'
            spelling (``rope_type``, ``original_max_position_embeddings``, ...; a
            ``rope_theta`` must equal ``base``) is deprecated: read with a
            :class:`DeprecationWarning`, refused from the next release.
        seq_len: the largest position of the call plus one; read only by the
            position-dependent scalings (``dynamic``, ``longrope``). ``None`` gives the state
            before any call, as transformers' rotary modules hold it at construction:
            dynamic unscaled, longrope with the short factors.

    Returns:
        ``(inv_freq, attention_scale)``: float64 frequencies on the CPU and the factor
        cos/sin are multiplied by (1.0 except for yarn and longrope).

    Shape:
        ``inv_freq``: ``[dim // 2]``.

    Examples:
        >>> import posenc
        >>> inv_freq, scale = posenc.rope_frequencies(4, base=100.0)
        >>> inv_freq, scale
        (tensor([1.0000, 0.1000], dtype=torch.float64), 1.0)
        >>> posenc.rope_frequencies(4, base=100.0, scaling={"type": "linear", "factor": 2})[0]
        tensor([0.5000, 0.0500], dtype=torch.float64)
    """
    dim = check_int("dim", dim, min=2)
    if dim % 2:
        raise PosEncError(f"dim must be even (the rotary dim pairs channels), got {dim}")
    check_alloc("dim", dim, (4, dim), torch.float64)  # a few [dim / 2] float64 vectors
    base = check_float("base", base, min=1.0, min_exclusive=True)
    if isinstance(seq_len, torch.Tensor) and seq_len.numel() == 1:
        if seq_len.dtype == torch.bool or seq_len.is_complex() or seq_len.device.type == "meta":
            raise PosEncError(f"seq_len must be a real number, got {seq_len!r}")
        seq_len = seq_len.item()  # one host synchronisation (dynamic scaling needs the value)
    if isinstance(seq_len, bool):
        raise PosEncError(f"seq_len must be a number (the largest position + 1), got {seq_len!r}")
    if seq_len is not None and not isinstance(seq_len, float) and hasattr(seq_len, "__index__"):
        seq_len = int(seq_len)
    if seq_len is not None:
        seq_len = check_float("seq_len", seq_len, min=-(2.0**63), max=2.0**63)
    params = parse_scaling(_read_deprecated(scaling, base))
    if params is None:
        return default_frequencies(dim, base), 1.0
    _, fn = SCALINGS[params.type]
    inv_freq, scale = fn(params, dim, base, seq_len)
    return inv_freq, float(scale)


def _read_deprecated(scaling: Any, base: float) -> Any:
    """``scaling``, or a dict in another library's spelling read by the foreign reader (with
    a :class:`DeprecationWarning`, also when the reader refuses it)."""
    try:
        translated = read_foreign(scaling, Given("rope_frequencies", base))
    except PosEncError:
        _warn_deprecated(scaling)
        raise
    if translated is None:
        return scaling
    _warn_deprecated(scaling)
    return translated


def _warn_deprecated(scaling: Mapping[str, Any]) -> None:
    keys = ", ".join(sorted(map(str, scaling)))
    warnings.warn(_DEPRECATED_SPELLING.format(keys=keys), DeprecationWarning, stacklevel=4)


def rotated_frequencies(
    head_dim: int,
    rotary_dim: int,
    *,
    base: float = 10000.0,
    scaling: Scaling | Mapping[str, Any] | None = None,
    seq_len: float | None = None,
) -> tuple[torch.Tensor, float]:
    """The frequencies of the ``rotary_dim / 2`` rotated pairs of a ``head_dim`` head:
    :func:`rope_frequencies` over ``rotary_dim`` channels, or for a scaling whose exponents
    span the whole head (``proportional``) over ``head_dim``, of which the first
    ``rotary_dim / 2`` (the highest) are kept.

    Shape: ``inv_freq`` ``[rotary_dim // 2]``.

    Examples:
        >>> from posenc.rotary.frequencies import rotated_frequencies
        >>> rotated_frequencies(8, 4, base=10000.0, scaling={"type": "proportional"})[0]
        tensor([1.0000, 0.1000], dtype=torch.float64)
        >>> rotated_frequencies(8, 4, base=10000.0)[0]  # GPT-NeoX's partial rotary
        tensor([1.0000, 0.0100], dtype=torch.float64)
    """
    head_dim = check_int("head_dim", head_dim, min=2)
    check_alloc("head_dim", head_dim, (4, head_dim), torch.float64)
    params = parse_scaling(scaling)
    span = "rotary_dim" if params is None else params.frequency_span
    dim = head_dim if span == "head_dim" else rotary_dim
    inv_freq, scale = rope_frequencies(dim, base=base, scaling=params, seq_len=seq_len)
    return inv_freq[: check_int("rotary_dim", rotary_dim, min=2, max=dim) // 2], scale
