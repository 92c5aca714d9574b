"""Reading transformers configs: the posenc modules giving the same numbers.

:func:`rotary_from_config` reads a config the way transformers' rotary modules and
``modeling_rope_utils`` read it (transformers 5's ``rope_parameters`` as well as the
legacy ``rope_scaling`` / ``rope_theta`` / ``partial_rotary_factor`` / GPT-NeoX
``rotary_pct`` / ``rotary_emb_base`` attributes) and builds the equal
:class:`posenc.RotaryEmbedding`. :func:`scaling_from_transformers` turns one
``rope_scaling`` dict into posenc's scaling dataclass. Where transformers only logs a
warning (unknown rope type, unrecognised keys, a factor below 1) we raise
:class:`posenc.PosEncError`.

With the other ``_hf_*`` modules, this is the place that knows transformers' configs; the
translation of one scaling dict (``rope_type``, ``original_max_position_embeddings``, ...) is
the table of :mod:`posenc.integrations.spelling`, which :class:`posenc.RotaryEmbedding`
reads ``scaling=`` through too. The public names are :mod:`posenc.integrations.transformers`'.

A config dict (``config.to_dict()`` or a ``config.json`` loaded with ``json``) needs no
transformers installed; a ``PretrainedConfig`` object is read through its attributes (both
by :class:`~._hf_reader.ConfigReader`). A vision tower's axial rotary is read by
:mod:`._hf_vision`; :func:`rotary_from_config` reads the 1-D ones here, step by step (the
rope type, theta, the partial factor, the head and rotary dims, the scaling).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from posenc._errors import PosEncError, check_choice, check_float, check_int
from posenc.integrations import _hf_checks as _checks
from posenc.integrations import _hf_families as _families
from posenc.integrations import _hf_vision as _vision
from posenc.integrations._hf_reader import ConfigReader, first, rope_parameters
from posenc.integrations._hf_sizes import check_head_dim
from posenc.integrations.spelling import posenc_spelling
from posenc.rotary.frequencies import Scaling, parse_scaling
from posenc.rotary.layout import LAYOUTS, Layout
from posenc.rotary.module import RotaryEmbedding

__all__ = [
    "layer_rope_parameters",
    "rotary_from_config",
    "rotary_from_parameters",
    "scaling_from_transformers",
]

# Keys of rope_parameters that are not scaling parameters.
_GENERAL_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor", "mrope_section")
_ORIGINAL_CONTEXT_TYPES = ("llama3", "yarn", "longrope")  # transformers fills the original context
_DEFAULT_THETA = 10000.0  # transformers' RotaryEmbeddingConfigMixin.default_theta


# --- transformers' scaling dicts -------------------------------------------------------------


def scaling_from_transformers(rope_scaling: Mapping[str, Any] | None) -> Scaling | None:
    """posenc's scaling dataclass for a transformers ``rope_scaling`` dict (``None``: none).

    Reads the type from ``"rope_type"`` or ``"type"`` (both given: they must agree; ``"su"``
    is LongRoPE, as in early Phi-3 configs), the keys in transformers' spellings
    (``original_max_position_embeddings``, ``max_position_embeddings``) or posenc's, and
    ``truncate: None`` as false (transformers tests the value, so ``None`` is falsy); any
    other ``None`` value counts as absent. ``{"rope_type": "default"}`` is no scaling.
    ``max_position_embeddings``, a config attribute in transformers, goes in the dict here
    (dynamic NTK's length; YaRN's and LongRoPE's factor when ``factor`` is absent).
    :func:`rotary_from_config` reads a whole config; :class:`posenc.RotaryEmbedding` and
    :func:`posenc.integrations.transformers.patch` take such a dict (or a whole
    ``rope_parameters``) as ``scaling=``. The translation is
    :func:`posenc.integrations.spelling.posenc_spelling`'s.

    Raises:
        PosEncError: no or an unknown type, a key that is no scaling parameter (such as
            ``rope_theta``, with what to do instead), an unknown or repeated key, a
            missing required key, or a value the dataclass refuses.

    Examples:
        >>> from posenc.integrations.transformers import scaling_from_transformers
        >>> scaling_from_transformers({"rope_type": "linear", "factor": 4})
        LinearScaling(factor=4.0, type='linear')
        >>> scaling_from_transformers(
        ...     {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
        ... ).original_max_position
        4096
    """
    if rope_scaling is None:
        return None
    if not isinstance(rope_scaling, Mapping):
        raise PosEncError(f"rope_scaling must be None or a dict, got {type(rope_scaling).__name__}")
    return parse_scaling(posenc_spelling(rope_scaling))


def rotary_from_config(
    config: Any, *, layer_type: str | None = None, layout: Layout | None = None
) -> RotaryEmbedding:
    """The :class:`posenc.RotaryEmbedding` equal to a transformers model's rotary embedding.

    Everything is read from the config (an object or its dict; a multimodal config: its text
    config) in transformers' order of priority, with the facts transformers keeps in its
    modeling code per family (``model_type``): the pairing layout, which channels rotate,
    M-RoPE's sections. A vision config with rope type ``"axial"`` gives an
    :class:`~posenc.AxialRotaryEmbedding`. The keys read, and each family's facts:
    ``docs/porting.md``.

    Args:
        config: a ``transformers.PretrainedConfig`` or its dict (whose ``model_type`` must
            be a transformers family's).
        layer_type: for configs with RoPE parameters per layer type (Gemma 3's
            ``"full_attention"`` / ``"sliding_attention"``), which one.
        layout: ``None`` (the family's) or ``"half"`` / ``"interleaved"`` to override it
            (q/k projections permuted to match, see :mod:`posenc.rotary.porting`).

    Raises:
        PosEncError: a family posenc cannot express (naming its ``model_type``, before
            anything is built), an unknown ``model_type`` or rope type, missing, unknown or
            invalid keys (each named as the config spells it: GPT-J's ``n_embd``,
            ``rope_scaling.original_max_position_embeddings``).

    Examples:
        >>> from posenc.integrations.transformers import rotary_from_config
        >>> rope = rotary_from_config({
        ...     "hidden_size": 256, "num_attention_heads": 4, "max_position_embeddings": 4096,
        ...     "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5},
        ... })
        >>> rope.head_dim, rope.base, rope.scaling, rope.layout
        (64, 500000.0, LinearScaling(factor=2.0, type='linear'), 'half')
        >>> rotary_from_config({"model_type": "cohere", "hidden_size": 256,
        ...                     "num_attention_heads": 2}).layout
        'interleaved'
    """
    if layout is not None:
        check_choice("layout", layout, LAYOUTS)
    return _read(config, layer_type, layout, None)


def rotary_from_parameters(
    config: Any, rope: Mapping[str, Any], *, layer_type: str | None = None
) -> RotaryEmbedding:
    """:func:`rotary_from_config` of ``config`` with the RoPE parameters of ``layer_type``
    replaced by ``rope`` (a ``rope_parameters`` dict in transformers' spelling; the config's
    other attributes read as before): what a model of this config would rotate by, had its
    ``rope_parameters`` been edited so. ``patch(model, scaling=...)`` reads a
    transformers-spelled ``scaling`` through it.

    Raises:
        PosEncError: as :func:`rotary_from_config` (naming the ``model_type``).
    """
    if not isinstance(rope, Mapping):
        raise PosEncError(f"rope_parameters must be a dict, got {type(rope).__name__}")
    return _read(config, layer_type, None, dict(rope))


def layer_rope_parameters(config: Any, layer_type: str | None) -> dict[str, Any]:
    """A copy of the RoPE parameters ``config`` gives ``layer_type`` (``{}`` where none)."""
    cfg = ConfigReader(config)
    return rope_parameters(cfg, layer_type, str(cfg.get("model_type")))


def _read(
    config: Any, layer_type: str | None, layout: Layout | None, rope: dict[str, Any] | None
) -> RotaryEmbedding:
    cfg = ConfigReader(config)
    model_type = cfg.get("model_type")
    try:
        return _from_config(cfg, str(model_type), layer_type, layout, rope)
    except PosEncError as error:
        if model_type is None:
            raise
        raise PosEncError(f"model_type {model_type!r}: {error}") from None


def _from_config(
    cfg: ConfigReader,
    model_type: str,
    layer_type: str | None,
    layout: Layout | None,
    rope: dict[str, Any] | None,
) -> RotaryEmbedding:
    """The module of :func:`rotary_from_config` (``rope``: the RoPE parameters read instead
    of the config's, for :func:`rotary_from_parameters`)."""
    reason = _families.unsupported(model_type)
    if reason is not None:
        raise PosEncError(f"posenc cannot express this family's RoPE: {reason}")
    whole = _families.components(model_type)
    if whole is not None:
        raise PosEncError(whole)
    src = "rope_parameters"  # where the RoPE parameters are, for the messages
    if rope is None:
        rope = rope_parameters(cfg, layer_type, model_type)
        src = cfg.rope_key() + ("" if layer_type is None else f".{layer_type}")
    if _vision.is_axial(model_type, rope):
        return _vision.axial_from_config(model_type, cfg.get, rope, layout)
    cfg = cfg.for_layer(layer_type, model_type)
    pairing = (
        layout
        if layout is not None
        else _families.layout_of(model_type, cfg.get("rope_interleave"))
    )
    kind = _checks.rope_type(rope, src)
    base = _rope_theta(cfg, rope, src, model_type)
    partial = _partial_factor(cfg, rope, src, model_type)
    trailing = model_type in _families.TRAILING_ROTARY  # [nope | rope]: the whole head
    head_dim, mla = _head_dim(cfg, trailing)
    if kind == "proportional":
        _require_theta(cfg, rope, src)
    rotary_dim = _rotary_dim(cfg, model_type, kind, head_dim, mla, partial)
    base, rotary_dim = _odd_rotary_dim(kind, base, rotary_dim, head_dim, partial.factor)
    _checks.check_contexts(cfg, rope, src, rotary_dim)
    sections, section_layout = _checks.sections(cfg, rope, src, model_type, rotary_dim)
    return RotaryEmbedding(
        head_dim,
        base=base,
        rotary_dim=rotary_dim,
        layout=pairing,
        scaling=_scaling(cfg, kind, _scaling_parameters(rope, model_type)),
        sections=sections,
        partial="whole_head" if kind == "proportional" else "trailing" if trailing else "leading",
        section_layout=section_layout,
        direction="negative" if model_type in _families.NEGATIVE_DIRECTION else "positive",
    )


def _named(*places: tuple[str, Any]) -> tuple[str, Any]:
    """The first ``(name, value)`` of ``places`` whose value is not None (the last if none
    is): a value and the key it was read from, for the message about it."""
    return next((p for p in places if p[1] is not None), places[-1])


def _rope_theta(cfg: ConfigReader, rope: dict[str, Any], src: str, model_type: str) -> float:
    defaults = _families.MODEL_DEFAULTS.get(model_type, {})
    name, theta = _named(
        (f"{src}.rope_theta", rope.get("rope_theta")),
        (cfg.where("rope_theta"), cfg.get("rope_theta")),
        (cfg.where("rotary_emb_base"), cfg.get("rotary_emb_base")),
        ("rope_theta (the class default)", cfg.get_or_default("rope_theta")),
        (f"rope_theta (the {model_type!r} default)", defaults.get("rope_theta")),
        ("rope_theta", _DEFAULT_THETA),
    )
    return check_float(name, theta, min=1.0, min_exclusive=True)


@dataclasses.dataclass(frozen=True)
class _Partial:
    """``partial_rotary_factor`` as the config gives it (None: nowhere) and as used (1.0 then)."""

    given: float | None
    factor: float


def _partial_factor(cfg: ConfigReader, rope: dict[str, Any], src: str, model_type: str) -> _Partial:
    defaults = _families.MODEL_DEFAULTS.get(model_type, {})
    name, given = _named(
        (f"{src}.partial_rotary_factor", rope.get("partial_rotary_factor")),
        (cfg.where("partial_rotary_factor"), cfg.get("partial_rotary_factor")),
        (f"{src}.rotary_pct", rope.get("rotary_pct")),
        (cfg.where("rotary_pct"), cfg.get("rotary_pct")),
        ("partial_rotary_factor (the class default)", cfg.get_or_default("partial_rotary_factor")),
        (
            f"partial_rotary_factor (the {model_type!r} default)",
            defaults.get("partial_rotary_factor"),
        ),
    )
    factor = check_float(name, first(given, 1.0), min=0.0, max=1.0, min_exclusive=True)
    return _Partial(given, factor)


def _head_dim(cfg: ConfigReader, trailing: bool) -> tuple[int, int | None]:
    """The module's head dim (MLA: the rope part of each head, ``qk_rope_head_dim``, which
    transformers' attention rotates) and that rope part (None where not MLA), bounded by
    :data:`._hf_sizes.MAX_HEAD_DIM` (the error names the key it came from)."""
    mla = None if trailing else cfg.get_or_default("qk_rope_head_dim")
    if mla is not None:
        mla = check_head_dim(cfg.where("qk_rope_head_dim"), mla)
        return mla, mla
    head_dim = cfg.get_or_default("head_dim")
    if head_dim is not None:
        return check_head_dim(cfg.where("head_dim"), head_dim), None
    hidden, heads = cfg.get_or_default("hidden_size"), cfg.get_or_default("num_attention_heads")
    if hidden is None or heads is None:
        pair = ("hidden_size", "num_attention_heads")
        missing = [k for k, v in zip(pair, (hidden, heads)) if v is None]
        raise PosEncError(
            f"config must give {cfg.where('head_dim')}, or {cfg.where(*pair)} (missing "
            f"{cfg.where(*missing)}: add it to the config{cfg.defaults_note()})"
        )
    names = cfg.where("hidden_size"), cfg.where("num_attention_heads")
    hidden, heads = check_int(names[0], hidden, min=1), check_int(names[1], heads, min=1)
    quotient = f"head_dim ({names[0]} // {names[1]} = {hidden} // {heads})"
    return check_head_dim(quotient, hidden // heads), None


def _require_theta(cfg: ConfigReader, rope: dict[str, Any], src: str) -> None:
    if rope.get("rope_theta") is None and cfg.get("rope_theta") is None:
        raise PosEncError(
            f"rope type 'proportional' requires the key 'rope_theta' in {src} "
            f"(transformers raises KeyError), got keys {sorted(rope)}"
        )


def _rotary_dim(
    cfg: ConfigReader, model_type: str, kind: str, head_dim: int, mla: int | None, partial: _Partial
) -> int:
    """The rotated channels, as the family's rotary module counts them."""
    if kind == "proportional":  # transformers: int(partial * head_dim // 2) rotated pairs
        return 2 * int(partial.factor * head_dim // 2)
    rotary_dim = cfg.get_or_default("rotary_dim")
    if model_type in _families.ROTARY_DIM_ATTRIBUTE and rotary_dim is not None:
        return check_int(cfg.where("rotary_dim"), rotary_dim, min=2, max=head_dim)
    if mla is not None and model_type in _families.MLA_PARTIAL_OF:
        # Mistral 4 (head_dim = qk_nope + qk_rope), dots.3 (its head_dim): a factor of more
        if _families.MLA_PARTIAL_OF[model_type] == "head_dim":
            full = check_int("head_dim", cfg.get("head_dim"), min=2)
        else:
            full = check_int("qk_nope_head_dim", cfg.get("qk_nope_head_dim"), min=0) + head_dim
        fraction = head_dim / full if partial.given is None else partial.factor
        return check_int("the rotary dim", int(full * fraction), max=head_dim)
    return int(head_dim * partial.factor)


def _odd_rotary_dim(
    kind: str, base: float, rotary_dim: int, head_dim: int, partial: float
) -> tuple[float, int]:
    """``(base, rotary_dim)``: an odd rotary dim of default RoPE with a spare channel as
    transformers rotates it, else as given; anything else odd, or below 2, refused."""
    if rotary_dim % 2 and kind == "default" and rotary_dim + 1 <= head_dim:
        # transformers: inv_freq = base ** -(arange(0, dim, 2) / dim), (dim + 1) / 2 of them,
        # rotating dim + 1 channels; the same numbers as base ** ((dim + 1) / dim) over dim + 1
        return base ** ((rotary_dim + 1) / rotary_dim), rotary_dim + 1
    if rotary_dim < 2 or rotary_dim % 2:
        raise PosEncError(
            f"the rotary dim int(head_dim * partial_rotary_factor) = int({head_dim} * {partial}) "
            f"must be even and >= 2 (odd: only for rope type 'default' with a spare channel), "
            f"got {rotary_dim}"
        )
    return base, rotary_dim


def _scaling_parameters(rope: dict[str, Any], model_type: str) -> dict[str, Any]:
    """The RoPE parameters less those the family reads elsewhere (``llama_4_scaling_beta``:
    a query scale, :func:`query_scale_from_config`) or ignores (M-RoPE's interleave flags)."""
    if model_type in _families.LLAMA4_SCALING_BETA:
        rope = {k: v for k, v in rope.items() if k != "llama_4_scaling_beta"}
    if model_type in _families.MROPE_INTERLEAVED:
        rope = {k: v for k, v in rope.items() if k not in _families.MROPE_IGNORED_KEYS}
    return rope


def _scaling(cfg: ConfigReader, kind: str, rope: dict[str, Any]) -> Scaling | None:
    """posenc's scaling for the rope type: its parameters in transformers' spelling, with
    the context lengths transformers fills from the config."""
    if kind == "default":
        extra = sorted(
            k for k, v in rope.items() if v is not None and k not in (*_GENERAL_KEYS, "rotary_pct")
        )
        if extra:
            raise PosEncError(f"rope type 'default' takes no scaling parameters, got {extra}")
        return None
    spec = {k: v for k, v in rope.items() if k not in (*_GENERAL_KEYS, "rotary_pct")}
    spec["type"] = kind
    max_position = cfg.get_or_default("max_position_embeddings")
    if kind in _ORIGINAL_CONTEXT_TYPES:
        spec.pop("original_max_position", None)
        spec["original_max_position_embeddings"] = first(
            cfg.get("original_max_position_embeddings"),  # Phi-3: the attribute wins
            rope.get("original_max_position_embeddings"),
            rope.get("original_max_position"),
            max_position,
        )
    if max_position is not None and (
        kind == "dynamic" or (kind in ("yarn", "longrope") and rope.get("factor") is None)
    ):
        spec["max_position_embeddings"] = max_position
    return scaling_from_transformers(spec)
