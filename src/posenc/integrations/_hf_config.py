"""Reading transformers configs: the posenc modules giving the same numbers.

:func:`rotary_from_config` reads a config the way transformers' rotary modules and
``modeling_rope_utils`` read it (transformers 5's ``rope_parameters`` as well as the
legacy ``rope_scaling`` / ``rope_theta`` / ``partial_rotary_factor`` / GPT-NeoX
``rotary_pct`` / ``rotary_emb_base`` attributes) and builds the equal
:class:`posenc.RotaryEmbedding`. :func:`scaling_from_transformers` turns one
``rope_scaling`` dict into posenc's scaling dataclass. Where transformers only logs a
warning (unknown rope type, unrecognised keys, a factor below 1) we raise
:class:`posenc.PosEncError`.

With the other ``_hf_*`` modules, this is the only place that knows transformers' spellings
(``rope_type``, ``original_max_position_embeddings``, ...): :mod:`posenc.rotary` reads
posenc's only. The public names are :mod:`posenc.integrations.transformers`'.

A config dict (``config.to_dict()`` or a ``config.json`` loaded with ``json``) needs no
transformers installed; a ``PretrainedConfig`` object is read through its attributes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from posenc._errors import PosEncError, check_choice, check_float, check_int
from posenc.integrations import _hf_families as _families
from posenc.rotary.frequencies import SCALINGS, Scaling, parse_scaling
from posenc.rotary.layout import LAYOUTS, Layout
from posenc.rotary.module import RotaryEmbedding
from posenc.rotary.nd import AxialRotaryEmbedding

__all__ = ["rope_layer_types", "rotary_from_config", "scaling_from_transformers"]

# Keys of rope_parameters that are not scaling parameters.
_GENERAL_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor", "mrope_section")
_ORIGINAL_CONTEXT_TYPES = ("llama3", "yarn", "longrope")  # transformers fills the original context
_DEFAULT_THETA = 10000.0  # transformers' RotaryEmbeddingConfigMixin.default_theta
_REQUIRED = {"yarn": ("factor",)}  # keys transformers' rope functions index (a KeyError there)


class _Reader:
    """Uniform access to a config object's attributes or a config dict's keys."""

    def __init__(self, config: Any) -> None:
        if not isinstance(config, Mapping) and not hasattr(config, "to_dict"):
            raise PosEncError(
                f"config must be a transformers config (PretrainedConfig) or its dict, got "
                f"{type(config).__name__}"
            )
        if not isinstance(config, Mapping):
            if hasattr(config, "get_text_config"):  # multimodal configs keep RoPE in the text part
                config = config.get_text_config()
            self._get = _object_getter(config)
            self.is_dict = False
        else:
            text = config.get("text_config")
            rope_keys = ("rope_parameters", "rope_scaling", "rope_theta", "head_dim", "hidden_size")
            if isinstance(text, Mapping) and not any(k in config for k in rope_keys):
                config = {**text, "model_type": text.get("model_type", config.get("model_type"))}
            legacy = _families.legacy_per_layer(str(config.get("model_type")), config.get)
            if legacy is not None:
                config = {**config, "rope_parameters": legacy, "rope_scaling": None}
            self._get = _dict_getter(config)
            self.is_dict = True
        self._config = config

    def get(self, key: str) -> Any:
        return self._get(key)

    def for_layer(self, layer_type: str | None, model_type: str) -> _Reader:
        """The reader of one layer type's config where attributes vary per layer (Gemma 4's
        ``per_layer_config``: the full-attention layers' ``head_dim``); else this reader."""
        config = self._config
        if layer_type is None:
            return self
        if not self.is_dict:
            varying = getattr(config, "per_layer_attributes", None) or ()
            if not set(varying) & set(_families.PER_LAYER_ROPE_KEYS):
                return self  # what varies per layer (NeoMME: sliding_window) is not read here
            try:
                return _Reader(config.per_layer_config[layer_type])
            except ValueError as error:  # not one of layer_types, or not alike across them
                raise PosEncError(f"layer_type {layer_type!r}: {error}") from None
        overrides = _families.layer_overrides(model_type, config.get, layer_type)
        return self if not overrides else _Reader({**config, **overrides})


def _object_getter(config: Any) -> Any:
    """``getattr(config, key, None)``, with transformers' refusal to read a per-layer
    attribute on the global config (``AmbiguousGlobalPerLayerAttributeError``) as
    :class:`PosEncError`."""

    def get(key: str) -> Any:
        try:
            return getattr(config, key, None)
        except RuntimeError as error:
            if type(error).__name__ != "AmbiguousGlobalPerLayerAttributeError":
                raise
            raise PosEncError(
                f"config attribute {key!r} varies per layer (config.per_layer_config); pass "
                f"layer_type="
            ) from None

    return get


def _dict_getter(config: Mapping[str, Any]) -> Any:
    """``config.get`` that also answers a key by its GPT-2-style alias (``n_embd``, ...)."""

    def get(key: str) -> Any:
        value = config.get(key)
        for alias in _families.DICT_ALIASES.get(key, ()) if value is None else ():
            value = config.get(alias)
            if value is not None:
                break
        return value

    return get


def _rope_parameters(cfg: _Reader, layer_type: str | None, model_type: str) -> dict[str, Any]:
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(rope, Mapping):
        raise PosEncError(f"config rope_parameters must be a dict, got {type(rope).__name__}")
    if model_type in _families.PER_LAYER_TYPE_ONLY:
        rope = _families.per_layer_type_rope(dict(rope), cfg.get("layer_types"))
    nested = [k for k, v in rope.items() if isinstance(v, Mapping) or v is None]
    if nested and len(nested) == len(rope):  # one dict per layer type (Gemma 3, ...)
        if layer_type is None:
            raise PosEncError(
                f"config has RoPE parameters per layer type; pass layer_type= one of "
                f"{', '.join(map(repr, nested))}"
            )
        check_choice("layer_type", layer_type, nested)
        if rope[layer_type] is None:
            raise PosEncError(f"layer_type {layer_type!r} has no RoPE (its parameters are None)")
        return dict(rope[layer_type])
    if layer_type is not None:
        raise PosEncError(
            f"layer_type must be None for a config with one set of RoPE "
            f"parameters, got {layer_type!r}"
        )
    return dict(rope)


def rope_layer_types(config: Any) -> list[str | None]:
    """The ``layer_type=`` values :func:`rotary_from_config` takes for ``config``: the layer
    types with RoPE parameters of their own (Gemma 3: ``"sliding_attention"``,
    ``"full_attention"``), or ``[None]`` for one set of parameters.

    Examples:
        >>> from posenc.integrations.transformers import rope_layer_types
        >>> rope_layer_types({"rope_parameters": {"full_attention": {"rope_theta": 1e6},
        ...                   "sliding_attention": {"rope_theta": 1e4}}})
        ['full_attention', 'sliding_attention']
        >>> rope_layer_types({"rope_theta": 1e4})
        [None]
    """
    rope = _Reader(config).get("rope_parameters") or _Reader(config).get("rope_scaling") or {}
    if not isinstance(rope, Mapping):
        return [None]
    nested = [k for k, v in rope.items() if isinstance(v, Mapping) or v is None]
    if nested and len(nested) == len(rope):
        return [k for k in nested if rope[k] is not None]
    return [None]


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


# --- transformers' scaling dicts -------------------------------------------------------------

# transformers' spellings -> posenc's; the type key is "type" or "rope_type".
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


def scaling_from_transformers(rope_scaling: Mapping[str, Any] | None) -> Scaling | None:
    """posenc's scaling dataclass for a transformers ``rope_scaling`` dict (``None``: none).

    Reads the type from ``"rope_type"`` or ``"type"`` (both given: they must agree; ``"su"``
    is LongRoPE, as in early Phi-3 configs), the keys in transformers' spellings
    (``original_max_position_embeddings``, ``max_position_embeddings``) or posenc's, and
    ``truncate: None`` as false (transformers tests the value, so ``None`` is falsy); any
    other ``None`` value counts as absent. ``{"rope_type": "default"}`` is no scaling.
    ``max_position_embeddings``, a config attribute in transformers, goes in the dict here
    (dynamic NTK's length; YaRN's and LongRoPE's factor when ``factor`` is absent).
    :func:`rotary_from_config` reads a whole config.

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
    spec = dict(rope_scaling)
    kinds = {spec.pop(k) for k in ("type", "rope_type") if k in spec}
    if not kinds:
        raise PosEncError(
            f"scaling must hold a 'type' (or 'rope_type') key, got keys {sorted(spec)}"
        )
    if len(kinds) > 1:
        raise PosEncError(f"scaling 'type' and 'rope_type' disagree: {sorted(map(str, kinds))}")
    kind = kinds.pop()
    kind = _TYPE_ALIASES.get(kind, kind) if isinstance(kind, str) else kind
    check_choice("scaling type", kind, ("default", *SCALINGS))
    if kind == "default":
        extra = sorted(k for k, v in spec.items() if v is not None)
        if extra:
            raise PosEncError(f"scaling type 'default' takes no parameters, got {extra}")
        return None
    cls, _ = SCALINGS[kind]
    fields = [f.name for f in dataclasses.fields(cls) if f.init]
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
    return parse_scaling({"type": kind, **args})


def rotary_from_config(
    config: Any, *, layer_type: str | None = None, layout: Layout | None = None
) -> RotaryEmbedding:
    """The :class:`posenc.RotaryEmbedding` equal to a transformers model's rotary embedding.

    Everything is read from the config (an object or its dict; multimodal configs: the text
    config), in transformers' order of priority: ``rope_parameters`` (or legacy
    ``rope_scaling``) with its ``rope_type`` (or ``type``), ``rope_theta`` and
    ``partial_rotary_factor``; then the attributes ``rope_theta`` / ``rotary_emb_base``,
    ``partial_rotary_factor`` / ``rotary_pct``; ``head_dim`` (or ``hidden_size //
    num_attention_heads``), ``max_position_embeddings`` (dynamic NTK's length; YaRN's and
    LongRoPE's factor when it is ``None``; the original context of llama3 / yarn / longrope
    when that is absent), a top-level ``original_max_position_embeddings`` (Phi-3: it takes
    priority, as in transformers) and ``mrope_section`` (Qwen2-VL's M-RoPE, with the
    family's default sections; positions are then ``[..., s, 3]``, i.e. transformers'
    ``position_ids[3, b, s]`` moved last). Per family (``model_type``):

    - the pairing layout: ``"interleaved"`` for the families whose attention pairs
      ``(2i, 2i + 1)`` (Cohere, GLM, GLM-4, ERNIE 4.5, Helium, GPT-J, CodeGen, Llama 4,
      DeepSeek-V2, Moonshine, ...) and for DeepSeek-V3-style MLA with ``rope_interleave``
      (its class default when a dict omits it); ``"half"`` otherwise;
    - the rotary channels: GPT-J / CodeGen's ``rotary_dim`` (the first ``rotary_dim``
      channels rotate, the rest pass through), MLA's ``qk_rope_head_dim`` (the module's
      ``head_dim`` is then the rope part of each head, which is what transformers'
      attention rotates), else ``int(head_dim * partial_rotary_factor)`` (first channels);
      an odd value (GLM-4-MoE: 21) rotates ``dim + 1`` channels with exponents ``2i / dim``
      as transformers does, i.e. ``base ** ((dim + 1) / dim)`` over ``dim + 1`` channels;
      Mistral 4's MLA: ``int((qk_nope + qk_rope) * partial_rotary_factor)`` of the rope part;
      DeepSeek-V4: the *last* ``int(head_dim * partial_rotary_factor)`` channels
      (``partial="trailing"``, interleaved pairs);
    - rope type ``proportional`` (p-RoPE: Gemma 4's and LFM3's full attention): ``2 *
      int(partial_rotary_factor * head_dim // 2)`` rotated channels with the frequencies of
      the whole head, paired across it (``partial="whole_head"``; ``inv_freq`` is
      transformers' ``[head_dim / 2]`` with zeros);
    - a head dim per layer type (Gemma 4's ``per_layer_config`` / ``global_head_dim``: the
      full-attention layers' 512) is read for ``layer_type``;
    - interleaved M-RoPE (Qwen3-VL, Qwen3.5, Qwen3-Omni, Cosmos 3 Edge, HY-V4-VL, Cohere
      Compass, Qwen4-exp: ``section_layout="interleaved"``, whatever ``mrope_interleaved``
      says, as their modules ignore it), contiguous for Qwen2-VL, GLM-4V, PaddleOCR-VL;
    - ``llama_4_scaling_beta`` (Ministral 3, Mistral 4) is a query scale, no rotation: read
      by :func:`posenc.integrations.transformers.query_scale_from_config`.

    A vision config with rope type ``"axial"`` (its ``rope_parameters`` or, for a dict, the
    class default of its ``model_type``) gives an :class:`~posenc.AxialRotaryEmbedding`
    with ``head_dim / 2`` channels per axis, positions ``[..., s, 2]`` (transformers'
    ``position_ids[s, 2]``, rows (h, w)), ``"half"`` pairs (Qwen2-VL to Qwen3-VL, GLM-4V,
    PaddleOCR-VL, dots.3, MLCD, ...) and ``"interleaved"`` ones for SAM 2 / SAM 3 (the memory
    attention's head dim); MiniMax-M3-VL: ``[..., s, 3]`` (t, h, w), ``2 * (head_dim // 6)``
    channels per axis, the rest unrotated.

    Args:
        config: a ``transformers.PretrainedConfig`` or its dict.
        layer_type: for configs with RoPE parameters per layer type (Gemma 3's
            ``"full_attention"`` / ``"sliding_attention"``), which one.
        layout: ``None`` (read from the family, above) or ``"half"`` / ``"interleaved"`` to
            override it (q/k projections permuted to the other layout, see
            :mod:`posenc.rotary.porting`; DeepSeek-V3.2's indexer rotates ``"half"``).

    One difference is deliberate: transformers' ``dynamic`` module keeps the largest
    frequencies it has computed until a call is shorter than ``max_position_embeddings``,
    so its output depends on earlier calls; posenc computes them from each call's largest
    position. The two agree on a fresh module and whenever lengths only grow.

    Raises:
        PosEncError: (naming the ``model_type`` where the config has one) a family posenc
            cannot express (nanochat's -theta, ERNIE 4.5 VL's H, W, T section order, Pixtral's
            and Gemma 4's vision RoPE, ...; checked before anything is built), an unknown
            rope type, missing keys (yarn's ``factor``, proportional's ``rope_theta``) or
            unknown keys, invalid values.

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
        >>> rotary_from_config({"model_type": "qwen2_vl_vision", "embed_dim": 1280,
        ...                     "num_attention_heads": 16}).axis_dims  # Qwen2-VL's vision
        (40, 40)
    """
    if layout is not None:
        check_choice("layout", layout, LAYOUTS)
    cfg = _Reader(config)
    model_type = cfg.get("model_type")
    try:
        return _from_config(cfg, str(model_type), layer_type, layout)
    except PosEncError as error:
        if model_type is None:
            raise
        raise PosEncError(f"model_type {model_type!r}: {error}") from None


def _from_config(
    cfg: _Reader, model_type: str, layer_type: str | None, layout: Layout | None
) -> RotaryEmbedding:
    reason = _families.unsupported(model_type)
    if reason is not None:
        raise PosEncError(f"posenc cannot express this family's RoPE: {reason}")
    rope = _rope_parameters(cfg, layer_type, model_type)
    kind = _first(rope.get("rope_type"), rope.get("type"))
    if kind == "axial" or (kind is None and model_type in _families.AXIAL_DEFAULT):
        d, n, dims, pairs, base = _families.axial_layout(model_type, cfg.get, rope)
        return AxialRotaryEmbedding(d, n, base=base, layout=layout or pairs, axis_dims=dims)
    cfg = cfg.for_layer(layer_type, model_type)
    defaults = _families.MODEL_DEFAULTS.get(model_type, {})
    pairing: Layout = (
        layout
        if layout is not None
        else _families.layout_of(model_type, cfg.get("rope_interleave"))  # type: ignore[assignment]
    )

    kind = _first(rope.get("rope_type"), rope.get("type"), "default")  # rope_type wins
    if kind == "mrope":  # Qwen2-VL's legacy spelling of default RoPE with sections
        kind = "default"
    missing = [k for k in _REQUIRED.get(kind, ()) if k not in rope]
    if missing:
        raise PosEncError(
            f"rope type {kind!r} requires the key(s) {missing} in rope_parameters "
            f"(transformers raises KeyError), got keys {sorted(rope)}"
        )
    base = check_float(
        "rope_theta",
        _first(
            rope.get("rope_theta"),
            cfg.get("rope_theta"),
            cfg.get("rotary_emb_base"),
            defaults.get("rope_theta"),
            _DEFAULT_THETA,
        ),
        min=1.0,
        min_exclusive=True,
    )
    partial_given = _first(
        rope.get("partial_rotary_factor"),
        cfg.get("partial_rotary_factor"),
        rope.get("rotary_pct"),
        cfg.get("rotary_pct"),
        defaults.get("partial_rotary_factor"),
    )
    partial = check_float(
        "partial_rotary_factor",
        _first(partial_given, 1.0),
        min=0.0,
        max=1.0,
        min_exclusive=True,
    )

    trailing = model_type in _families.TRAILING_ROTARY  # [nope | rope]: the whole head
    mla = None if trailing else cfg.get("qk_rope_head_dim")
    head_dim = _first(mla, cfg.get("head_dim"))  # MLA: the rope part
    if head_dim is None:
        hidden, heads = cfg.get("hidden_size"), cfg.get("num_attention_heads")
        if hidden is None or heads is None:
            raise PosEncError("config must give head_dim, or hidden_size and num_attention_heads")
        head_dim = check_int("hidden_size", hidden, min=1) // check_int(
            "num_attention_heads", heads, min=1
        )
    head_dim = check_int("head_dim", head_dim, min=2)
    if kind == "proportional":  # transformers: int(partial * head_dim // 2) rotated pairs
        if rope.get("rope_theta") is None and cfg.get("rope_theta") is None:
            raise PosEncError(
                f"rope type 'proportional' requires the key 'rope_theta' in rope_parameters "
                f"(transformers raises KeyError), got keys {sorted(rope)}"
            )
        rotary_dim = 2 * int(partial * head_dim // 2)
    elif model_type in _families.ROTARY_DIM_ATTRIBUTE and cfg.get("rotary_dim") is not None:
        rotary_dim = check_int("rotary_dim", cfg.get("rotary_dim"), min=2, max=head_dim)
    elif mla is not None and model_type in _families.MLA_PARTIAL_OF:
        # Mistral 4 (head_dim = qk_nope + qk_rope), dots.3 (its head_dim): a factor of more
        if _families.MLA_PARTIAL_OF[model_type] == "head_dim":
            full = check_int("head_dim", cfg.get("head_dim"), min=2)
        else:
            full = check_int("qk_nope_head_dim", cfg.get("qk_nope_head_dim"), min=0) + head_dim
        fraction = head_dim / full if partial_given is None else partial
        rotary_dim = check_int("the rotary dim", int(full * fraction), max=head_dim)
    else:
        rotary_dim = int(head_dim * partial)
    if rotary_dim % 2 and kind == "default" and rotary_dim + 1 <= head_dim:
        # transformers: inv_freq = base ** -(arange(0, dim, 2) / dim), (dim + 1) / 2 of them,
        # rotating dim + 1 channels; the same numbers as base ** ((dim + 1) / dim) over dim + 1
        base, rotary_dim = base ** ((rotary_dim + 1) / rotary_dim), rotary_dim + 1
    if rotary_dim < 2 or rotary_dim % 2:
        raise PosEncError(
            f"the rotary dim int(head_dim * partial_rotary_factor) = int({head_dim} * {partial}) "
            f"must be even and >= 2 (odd: only for rope type 'default' with a spare channel), "
            f"got {rotary_dim}"
        )

    sections = _first(
        rope.get("mrope_section"),
        cfg.get("mrope_section"),
        _families.MROPE_DEFAULT_SECTIONS.get(model_type),
    )
    if model_type in _families.LLAMA4_SCALING_BETA:  # a query scale: query_scale_from_config
        rope.pop("llama_4_scaling_beta", None)
    interleaved_sections = model_type in _families.MROPE_INTERLEAVED
    if interleaved_sections:
        rope = {k: v for k, v in rope.items() if k not in _families.MROPE_IGNORED_KEYS}

    scaling: Scaling | None = None
    if kind != "default":
        spec = {k: v for k, v in rope.items() if k not in (*_GENERAL_KEYS, "rotary_pct")}
        spec["type"] = kind
        max_position = cfg.get("max_position_embeddings")
        if kind in _ORIGINAL_CONTEXT_TYPES:
            original = _first(
                cfg.get("original_max_position_embeddings"),  # Phi-3: the attribute wins
                rope.get("original_max_position_embeddings"),
                rope.get("original_max_position"),
                max_position,
            )
            spec.pop("original_max_position", None)
            spec["original_max_position_embeddings"] = original
        if max_position is not None and (
            kind == "dynamic" or (kind in ("yarn", "longrope") and rope.get("factor") is None)
        ):
            spec["max_position_embeddings"] = max_position
        scaling = scaling_from_transformers(spec)
    else:
        extra = sorted(
            k for k, v in rope.items() if v is not None and k not in (*_GENERAL_KEYS, "rotary_pct")
        )
        if extra:
            raise PosEncError(f"rope type 'default' takes no scaling parameters, got {extra}")

    return RotaryEmbedding(
        head_dim,
        base=base,
        rotary_dim=rotary_dim,
        layout=pairing,
        scaling=scaling,
        sections=None if sections is None else list(sections),
        partial="whole_head" if kind == "proportional" else "trailing" if trailing else "leading",
        section_layout="interleaved" if interleaved_sections and sections else "contiguous",
    )
