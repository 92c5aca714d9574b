"""RoPE frequencies and the context-extension scalings, one registry for all of them.

``inv_freq[i] = 1 / base^(2i / dim)`` for ``i < dim / 2`` (Su et al., 2021, RoFormer), where
``dim`` is the number of rotated channels. A *scaling* changes these frequencies (and
sometimes the scale of cos/sin) so that a model reaches past the context it was trained on.

Each scaling is registered once, in :data:`SCALINGS`, as a pair: a frozen parameter
dataclass validated in ``__post_init__`` and the function computing
``(inv_freq, attention_scale)`` from it. Parsing a config dict goes through that same
dataclass, so what is accepted and what is computed cannot drift apart.

The numbers are those of transformers' ``modeling_rope_utils`` for the names it shares
(``linear``, ``dynamic``, ``yarn``, ``longrope``, ``llama3``), edge rules included, computed
in float64 instead of float32. ``ntk`` is the static NTK-aware base change.

Shape: every function returns ``inv_freq`` ``[dim // 2]`` float64 on the CPU.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch

from posenc._errors import PosEncError, check_choice, check_float, check_int

__all__ = [
    "SCALINGS",
    "DynamicScaling",
    "LinearScaling",
    "Llama3Scaling",
    "LongRopeScaling",
    "NTKScaling",
    "Scaling",
    "YarnScaling",
    "parse_scaling",
    "rope_frequencies",
]

_frozen = dataclasses.dataclass(frozen=True, kw_only=True)


def _set(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)  # normalise a field of a frozen dataclass


def _factor(kind: str, value: Any) -> float:
    return check_float(f"{kind} scaling factor", value, min=1.0)


def _length(kind: str, name: str, value: Any) -> int:
    return check_int(f"{kind} scaling {name}", value, min=1)


# --- parameter dataclasses -------------------------------------------------------------------


@_frozen
class LinearScaling:
    """Position interpolation (kaiokendev; Chen et al., 2023): every frequency divided by ``factor``.

    Args:
        factor: how many times longer the context becomes, ``>= 1``.
    """

    factor: float
    type: str = dataclasses.field(default="linear", init=False)
    position_dependent: ClassVar[bool] = False

    def __post_init__(self) -> None:
        _set(self, "factor", _factor(self.type, self.factor))


@_frozen
class DynamicScaling:
    """Dynamic NTK (/u/emozilla): the base grows with the longest position of each call.

    For ``seq_len <= max_position`` the frequencies are the unscaled ones; beyond it
    ``base * (factor * seq_len / max_position - (factor - 1))^(dim / (dim - 2))``.

    Args:
        factor: ``>= 1``.
        max_position: the context length trained on (transformers' ``max_position_embeddings``).
    """

    factor: float
    max_position: int
    type: str = dataclasses.field(default="dynamic", init=False)
    position_dependent: ClassVar[bool] = True

    def __post_init__(self) -> None:
        _set(self, "factor", _factor(self.type, self.factor))
        _set(self, "max_position", _length(self.type, "max_position", self.max_position))


@_frozen
class NTKScaling:
    """Static NTK-aware scaling (/u/bloc97): ``base * factor^(dim / (dim - 2))``.

    Args:
        factor: ``>= 1``.
    """

    factor: float
    type: str = dataclasses.field(default="ntk", init=False)
    position_dependent: ClassVar[bool] = False

    def __post_init__(self) -> None:
        _set(self, "factor", _factor(self.type, self.factor))


@_frozen
class YarnScaling:
    """YaRN (Peng et al., 2023, arXiv:2309.00071): interpolate the low frequencies only,
    with a linear ramp between, and scale cos/sin by an attention factor.

    Args:
        factor: ``>= 1``; ``None`` takes ``max_position / original_max_position`` (as
            transformers does for DeepSeek-style configs).
        original_max_position: the context length trained on.
        beta_fast, beta_slow: rotation counts bounding the ramp (32 and 1 in the paper),
            ``0 < beta_slow <= beta_fast``.
        mscale, mscale_all_dim: DeepSeek's attention-factor terms. As in transformers the
            ratio ``get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)`` is used
            only when both are non-zero; otherwise ``0.1 * ln(factor) + 1``.
        attention_factor: set the cos/sin scale directly (``> 0``).
        truncate: round the ramp bounds outwards to whole channels (floor / ceil).
        max_position: only used when ``factor`` is ``None``.
    """

    factor: float | None = None
    original_max_position: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True
    max_position: int | None = None
    type: str = dataclasses.field(default="yarn", init=False)
    position_dependent: ClassVar[bool] = False

    def __post_init__(self) -> None:
        kind = self.type
        _set(
            self,
            "original_max_position",
            _length(kind, "original_max_position", self.original_max_position),
        )
        if self.max_position is not None:
            _set(self, "max_position", _length(kind, "max_position", self.max_position))
        if self.factor is None:
            if self.max_position is None:
                raise PosEncError(
                    "yarn scaling needs factor, or max_position to derive it from "
                    "(factor = max_position / original_max_position), got neither"
                )
            _set(self, "factor", self.max_position / self.original_max_position)
        _set(self, "factor", _factor(kind, self.factor))
        _set(
            self,
            "beta_fast",
            check_float("yarn scaling beta_fast", self.beta_fast, min=0.0, min_exclusive=True),
        )
        _set(
            self,
            "beta_slow",
            check_float("yarn scaling beta_slow", self.beta_slow, min=0.0, min_exclusive=True),
        )
        if self.beta_fast < self.beta_slow:
            raise PosEncError(
                f"yarn scaling beta_fast must be >= beta_slow ({self.beta_slow}), "
                f"got {self.beta_fast}"
            )
        for name in ("mscale", "mscale_all_dim"):
            if getattr(self, name) is not None:
                _set(self, name, check_float(f"yarn scaling {name}", getattr(self, name), min=0.0))
        if self.attention_factor is not None:
            _set(
                self,
                "attention_factor",
                check_float(
                    "yarn scaling attention_factor",
                    self.attention_factor,
                    min=0.0,
                    min_exclusive=True,
                ),
            )
        if not isinstance(self.truncate, bool):
            raise PosEncError(f"yarn scaling truncate must be True or False, got {self.truncate!r}")


@_frozen
class LongRopeScaling:
    """LongRoPE (Ding et al., 2024; Phi-3): one rescale factor per frequency, the short set
    within the original context and the long set once a call reaches past it.

    Args:
        short_factor, long_factor: ``dim / 2`` positive numbers each.
        original_max_position: the context length trained on; the long factors apply
            when ``seq_len > original_max_position`` (the largest position reaches it).
        factor: the context extension ratio (``>= 1``) for the attention scale
            ``sqrt(1 + ln(factor) / ln(original_max_position))`` (1 when ``factor == 1``);
            ``None`` takes ``max_position / original_max_position`` as transformers does.
        attention_factor: set the cos/sin scale directly (``> 0``).
        max_position: only used when ``factor`` is ``None``.
    """

    short_factor: tuple[float, ...]
    long_factor: tuple[float, ...]
    original_max_position: int
    factor: float | None = None
    attention_factor: float | None = None
    max_position: int | None = None
    type: str = dataclasses.field(default="longrope", init=False)
    position_dependent: ClassVar[bool] = True

    def __post_init__(self) -> None:
        kind = self.type
        for name in ("short_factor", "long_factor"):
            value = getattr(self, name)
            if isinstance(value, torch.Tensor):
                value = value.tolist()
            if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or not len(value):
                raise PosEncError(
                    f"{kind} scaling {name} must be a non-empty list of numbers, got {value!r}"
                )
            _set(
                self,
                name,
                tuple(
                    check_float(f"{kind} scaling {name}[{i}]", v, min=0.0, min_exclusive=True)
                    for i, v in enumerate(value)
                ),
            )
        if len(self.short_factor) != len(self.long_factor):
            raise PosEncError(
                f"{kind} scaling short_factor and long_factor must have the same length, "
                f"got {len(self.short_factor)} and {len(self.long_factor)}"
            )
        _set(
            self,
            "original_max_position",
            _length(kind, "original_max_position", self.original_max_position),
        )
        if self.max_position is not None:
            _set(self, "max_position", _length(kind, "max_position", self.max_position))
        if self.factor is None and self.max_position is None:
            raise PosEncError(
                "longrope scaling needs factor, or max_position to derive it from "
                "(factor = max_position / original_max_position), got neither"
            )
        if self.factor is not None:
            _set(self, "factor", _factor(kind, self.factor))
        elif self.max_position < self.original_max_position:  # type: ignore[operator]
            raise PosEncError(
                f"longrope scaling max_position must be >= original_max_position "
                f"({self.original_max_position}) when factor is not given, got {self.max_position}"
            )
        if self.attention_factor is not None:
            _set(
                self,
                "attention_factor",
                check_float(
                    "longrope scaling attention_factor",
                    self.attention_factor,
                    min=0.0,
                    min_exclusive=True,
                ),
            )


@_frozen
class Llama3Scaling:
    """Llama 3.1's scaling: wavelengths longer than ``original_max_position / low_freq_factor``
    are interpolated by ``factor``, shorter than ``original_max_position / high_freq_factor``
    kept, and those between blended smoothly.

    Args:
        factor: ``>= 1`` (8 for Llama 3.1).
        low_freq_factor: ``> 0`` (1 for Llama 3.1).
        high_freq_factor: ``> low_freq_factor`` (4 for Llama 3.1).
        original_max_position: the context length trained on (8192 for Llama 3.1).
    """

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position: int
    type: str = dataclasses.field(default="llama3", init=False)
    position_dependent: ClassVar[bool] = False

    def __post_init__(self) -> None:
        kind = self.type
        _set(self, "factor", _factor(kind, self.factor))
        _set(
            self,
            "low_freq_factor",
            check_float(
                "llama3 scaling low_freq_factor", self.low_freq_factor, min=0.0, min_exclusive=True
            ),
        )
        high = check_float("llama3 scaling high_freq_factor", self.high_freq_factor)
        if high <= self.low_freq_factor:
            raise PosEncError(
                f"llama3 scaling high_freq_factor must be > low_freq_factor "
                f"({self.low_freq_factor}), got {high}"
            )
        _set(self, "high_freq_factor", high)
        _set(
            self,
            "original_max_position",
            _length(kind, "original_max_position", self.original_max_position),
        )


Scaling = (
    LinearScaling | DynamicScaling | NTKScaling | YarnScaling | LongRopeScaling | Llama3Scaling
)
ScalingFn = Callable[[Any, int, float, "float | None"], "tuple[torch.Tensor, float]"]

# name -> (parameter dataclass, function(params, dim, base, seq_len) -> (inv_freq, scale))
SCALINGS: dict[str, tuple[type, ScalingFn]] = {}


def _register(params: type) -> Callable[[ScalingFn], ScalingFn]:
    """Register ``fn`` under ``params``' type name, together with ``params``."""

    def deco(fn: ScalingFn) -> ScalingFn:
        SCALINGS[params.type] = (params, fn)  # type: ignore[attr-defined]
        return fn

    return deco


# --- the functions ---------------------------------------------------------------------------


def _exponents(dim: int) -> torch.Tensor:
    """``2i / dim`` for ``i < dim / 2``, float64."""
    return torch.arange(0, dim, 2, dtype=torch.float64) / dim


def _default(dim: int, base: float) -> torch.Tensor:
    return 1.0 / base ** _exponents(dim)


def _ntk_exponent(kind: str, dim: int) -> float:
    if dim < 4:
        raise PosEncError(
            f"dim must be >= 4 for {kind} scaling (base exponent dim / (dim - 2)), got {dim}"
        )
    return dim / (dim - 2)


@_register(LinearScaling)
def _linear(p: LinearScaling, dim: int, base: float, seq_len: float | None):
    return _default(dim, base) / p.factor, 1.0


@_register(DynamicScaling)
def _dynamic(p: DynamicScaling, dim: int, base: float, seq_len: float | None):
    exponent = _ntk_exponent(p.type, dim)
    if seq_len is None or seq_len <= p.max_position:
        # exactly the unscaled frequencies (the formula below gives 1 only up to rounding),
        # as transformers' module keeps its original inv_freq within max_position
        return _default(dim, base), 1.0
    base = base * (p.factor * seq_len / p.max_position - (p.factor - 1)) ** exponent
    return _default(dim, base), 1.0


@_register(NTKScaling)
def _ntk(p: NTKScaling, dim: int, base: float, seq_len: float | None):
    return _default(dim, base * p.factor ** _ntk_exponent(p.type, dim)), 1.0


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@_register(YarnScaling)
def _yarn(p: YarnScaling, dim: int, base: float, seq_len: float | None):
    factor = float(p.factor)  # type: ignore[arg-type]
    if p.attention_factor is not None:
        scale = p.attention_factor
    elif p.mscale and p.mscale_all_dim:  # transformers: both set and non-zero
        scale = _yarn_mscale(factor, p.mscale) / _yarn_mscale(factor, p.mscale_all_dim)
    else:
        scale = _yarn_mscale(factor)

    def correction_dim(rotations: float) -> float:
        # the channel index whose wavelength fits `rotations` times in the original context
        return (
            dim
            * math.log(p.original_max_position / (rotations * 2 * math.pi))
            / (2 * math.log(base))
        )

    low, high = correction_dim(p.beta_fast), correction_dim(p.beta_slow)
    if p.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)  # transformers clamps at dim - 1, not dim/2 - 1
    if low == high:
        high += 0.001  # avoid dividing by zero, as transformers does
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation = _default(dim, base)  # high frequencies (ramp 0): unchanged
    interpolation = extrapolation / factor  # low frequencies (ramp 1): position interpolation
    return interpolation * ramp + extrapolation * (1 - ramp), float(scale)


@_register(LongRopeScaling)
def _longrope(p: LongRopeScaling, dim: int, base: float, seq_len: float | None):
    if len(p.short_factor) != dim // 2:
        raise PosEncError(
            f"longrope scaling short_factor and long_factor must have length dim // 2 = "
            f"{dim // 2}, got {len(p.short_factor)}"
        )
    factor = p.factor if p.factor is not None else p.max_position / p.original_max_position  # type: ignore[operator]
    if p.attention_factor is not None:
        scale = p.attention_factor
    elif factor <= 1.0:
        scale = 1.0
    else:
        scale = math.sqrt(1 + math.log(factor) / math.log(p.original_max_position))
    long = seq_len is not None and seq_len > p.original_max_position
    ext = torch.tensor(p.long_factor if long else p.short_factor, dtype=torch.float64)
    return 1.0 / (ext * base ** _exponents(dim)), float(scale)


@_register(Llama3Scaling)
def _llama3(p: Llama3Scaling, dim: int, base: float, seq_len: float | None):
    inv_freq = _default(dim, base)
    low_freq_wavelen = p.original_max_position / p.low_freq_factor
    high_freq_wavelen = p.original_max_position / p.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / p.factor, inv_freq)
    smooth = (p.original_max_position / wavelen - p.low_freq_factor) / (
        p.high_freq_factor - p.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / p.factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, smoothed, scaled), 1.0


# --- parsing ---------------------------------------------------------------------------------

# transformers' spellings -> ours; the type key is "type" or "rope_type".
_KEY_ALIASES = {
    "original_max_position_embeddings": "original_max_position",
    "max_position_embeddings": "max_position",
}
_TYPE_ALIASES = {"su": "longrope"}  # early Phi-3 configs
_NOT_SCALING = {
    "rope_theta": "pass it as base=",
    "partial_rotary_factor": "pass the rotary dim instead",
    "mrope_section": "pass it as sections= to RotaryEmbedding",
}


def _type_names() -> tuple[str, ...]:
    return ("default", *SCALINGS)


def parse_scaling(scaling: Any) -> Scaling | None:
    """Turn a scaling spec into its parameter dataclass (``None`` for no scaling).

    Args:
        scaling: ``None``; one of the dataclasses (returned as is); or a dict holding
            ``"type"`` (or transformers' ``"rope_type"``) and the parameters, in posenc's
            or transformers' spellings (``"original_max_position_embeddings"``,
            ``"max_position_embeddings"``). ``{"type": "default"}`` means no scaling. Keys
            whose value is ``None`` count as absent, except ``truncate``, which transformers
            reads as false.

    Examples:
        >>> from posenc.rotary.frequencies import parse_scaling
        >>> parse_scaling({"rope_type": "linear", "factor": 4})
        LinearScaling(factor=4.0, type='linear')
    """
    if scaling is None:
        return None
    if isinstance(scaling, tuple(cls for cls, _ in SCALINGS.values())):
        return scaling  # type: ignore[return-value]
    if not isinstance(scaling, Mapping):
        raise PosEncError(
            f"scaling must be None, a dict with a 'type' key or one of "
            f"{', '.join(cls.__name__ for cls, _ in SCALINGS.values())}, "
            f"got {type(scaling).__name__}"
        )
    spec = dict(scaling)
    kinds = {spec.pop(k) for k in ("type", "rope_type") if k in spec}
    if not kinds:
        raise PosEncError(
            f"scaling must hold a 'type' (or 'rope_type') key, got keys {sorted(spec)}"
        )
    if len(kinds) > 1:
        raise PosEncError(f"scaling 'type' and 'rope_type' disagree: {sorted(map(str, kinds))}")
    kind = kinds.pop()
    kind = _TYPE_ALIASES.get(kind, kind) if isinstance(kind, str) else kind
    check_choice("scaling type", kind, _type_names())
    if kind == "default":
        extra = sorted(k for k, v in spec.items() if v is not None)
        if extra:
            raise PosEncError(f"scaling type 'default' takes no parameters, got {extra}")
        return None
    cls, _ = SCALINGS[kind]
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    args: dict[str, Any] = {}
    for key, value in spec.items():
        name = _KEY_ALIASES.get(key, key)
        if name in _NOT_SCALING and name not in fields:
            raise PosEncError(
                f"scaling key {key!r} is not a scaling parameter: {_NOT_SCALING[name]}"
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
    required = [
        n
        for n, f in fields.items()
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [n for n in required if n not in args]
    if missing:
        optional = [n for n in fields if n not in required]
        raise PosEncError(
            f"scaling {kind!r} is missing required key(s) {', '.join(map(repr, missing))}; "
            f"required: {', '.join(required)}; optional: {', '.join(optional) or 'none'}"
        )
    return cls(**args)


def rope_frequencies(
    dim: int,
    *,
    base: float = 10000.0,
    scaling: Scaling | Mapping[str, Any] | None = None,
    seq_len: float | None = None,
) -> tuple[torch.Tensor, float]:
    """RoPE inverse frequencies and the cos/sin scale, for any registered scaling.

    Args:
        dim: the rotary dim (number of rotated channels), even and ``>= 2``.
        base: the wavelength base (transformers' ``rope_theta``), ``> 1``.
        scaling: ``None``, a dict such as ``{"type": "linear", "factor": 2.0}`` or a
            dataclass (see :func:`parse_scaling`); types: ``linear``, ``dynamic``, ``ntk``,
            ``yarn``, ``longrope``, ``llama3``.
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
    base = check_float("base", base, min=1.0, min_exclusive=True)
    if isinstance(seq_len, torch.Tensor) and seq_len.numel() == 1:
        seq_len = seq_len.item()  # one host synchronisation (dynamic scaling needs the value)
    if seq_len is not None and not isinstance(seq_len, float) and hasattr(seq_len, "__index__"):
        seq_len = int(seq_len)
    if seq_len is not None:
        seq_len = check_float("seq_len", seq_len)
    params = parse_scaling(scaling)
    if params is None:
        return _default(dim, base), 1.0
    _, fn = SCALINGS[params.type]
    inv_freq, scale = fn(params, dim, base, seq_len)
    return inv_freq, float(scale)
