"""Reading a transformers config: an object's attributes or a ``config.json`` dict's keys alike.

:class:`ConfigReader` answers ``get(key)`` for both (multimodal configs: the text config;
GPT-2-style aliases; legacy per-layer-type dicts as transformers converts them; one layer
type's overrides), :func:`rope_parameters` the RoPE parameters of one layer type and
:func:`rope_layer_types` the layer types that have their own. The readers of the rotary
(:mod:`._hf_config`, :mod:`._hf_vision`) and of the query scales (:mod:`._hf_query_scale`)
all read through here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from posenc._errors import PosEncError, check_choice
from posenc.integrations import _hf_families as _families

__all__ = ["ConfigReader", "first", "rope_layer_types", "rope_parameters"]


class ConfigReader:
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

    def for_layer(self, layer_type: str | None, model_type: str) -> ConfigReader:
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
                return ConfigReader(config.per_layer_config[layer_type])
            except ValueError as error:  # not one of layer_types, or not alike across them
                raise PosEncError(f"layer_type {layer_type!r}: {error}") from None
        overrides = _families.layer_overrides(model_type, config.get, layer_type)
        return self if not overrides else ConfigReader({**config, **overrides})


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


def rope_parameters(cfg: ConfigReader, layer_type: str | None, model_type: str) -> dict[str, Any]:
    """A copy of the RoPE parameters of ``layer_type`` (``rope_parameters``, or legacy
    ``rope_scaling``; ``{}`` where neither): the one set of a flat config (``layer_type``
    None), or one layer type's of a config with a set per layer type."""
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(rope, Mapping):
        raise PosEncError(f"config rope_parameters must be a dict, got {type(rope).__name__}")
    if model_type in _families.PER_LAYER_TYPE_ONLY:
        rope = _families.per_layer_type_rope(dict(rope), cfg.get("layer_types"))
    nested = _layer_type_keys(rope)
    if nested is not None:  # one dict per layer type (Gemma 3, ...)
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
    cfg = ConfigReader(config)
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(rope, Mapping):
        return [None]
    nested = _layer_type_keys(rope)
    return [None] if nested is None else [k for k in nested if rope[k] is not None]


def _layer_type_keys(rope: Mapping[str, Any]) -> list[str] | None:
    """The layer types of RoPE parameters given per layer type (every value a dict, or None
    for a type without RoPE); None for one flat set."""
    nested = [k for k, v in rope.items() if isinstance(v, Mapping) or v is None]
    return nested if nested and len(nested) == len(rope) else None


def first(*values: Any) -> Any:
    """The first of ``values`` that is not None (None if all are): transformers' order of
    priority between a config's places for one value."""
    return next((v for v in values if v is not None), None)
