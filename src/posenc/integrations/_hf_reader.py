"""Reading a transformers config: an object's attributes or a ``config.json`` dict's keys alike.

:class:`ConfigReader` answers ``get(key)`` for both (multimodal configs: the text config;
GPT-2-style aliases; legacy per-layer-type dicts as transformers converts them; one layer
type's overrides), :func:`rope_parameters` the RoPE parameters of one layer type and
:func:`rope_layer_types` the layer types that have their own. The readers of the rotary
(:mod:`._hf_config`, :mod:`._hf_vision`) and of the query scales (:mod:`._hf_query_scale`)
all read through here.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from posenc._errors import PosEncError, check_choice, check_int
from posenc.integrations import _hf_families as _families
from posenc.integrations._hf_dict import ClassDefaults, class_defaults, known_model_types

__all__ = ["MAX_LAYERS", "ConfigReader", "first", "rope_layer_types", "rope_parameters"]

# The most layers a config may give (``num_hidden_layers``): per-layer lists (layer types,
# NoPE flags) are built from it. Published models have at most a few hundred.
MAX_LAYERS = 1 << 16


class ConfigReader:
    """Uniform access to a config object's attributes or a config dict's keys (``prefix``:
    where they sit, ``"text_config."`` for a composite's text part; :meth:`get_or_default`
    answers a key a dict lacks with its family's class default, :mod:`._hf_dict`)."""

    prefix = ""

    def __init__(self, config: Any) -> None:
        if not isinstance(config, Mapping) and not hasattr(config, "to_dict"):
            raise PosEncError(
                f"config must be a transformers config (PretrainedConfig) or its dict, got "
                f"{type(config).__name__}"
            )
        self._defaults: ClassDefaults | None = None
        if isinstance(config, Mapping):
            _check_dict(config)
        if not isinstance(config, Mapping):
            if hasattr(config, "get_text_config"):  # multimodal configs keep RoPE in the text part
                config = config.get_text_config()
            self._get = _object_getter(config)
            self._spell = lambda key: key
            self.is_dict = False
        else:
            text = _text_part(config)
            if text is not None:
                parent = config.get("model_type")
                self._defaults = class_defaults(text.get("model_type"), parent)
                config = {**text, "model_type": text.get("model_type", parent)}
                self.prefix = "text_config."
            else:
                self._defaults = class_defaults(config.get("model_type"))
            legacy = _families.legacy_per_layer(str(config.get("model_type")), config.get)
            if legacy is not None:
                config = {**config, "rope_parameters": legacy, "rope_scaling": None}
            self._spell = _dict_spelling(config, self._defaults)
            self._get = _dict_getter(config, self._spell)
            self.is_dict = True
        self._config = config

    def get(self, key: str) -> Any:
        return self._get(key)

    def get_or_default(self, key: str) -> Any:
        """``get(key)``, or for a dict that lacks it its family's class default (transformers'
        declared one, :mod:`._hf_dict`; None where there is none)."""
        value = self._get(key)
        if value is None and self._defaults is not None:
            value = self._defaults.default(key)
        return value

    def defaults_note(self) -> str:
        """For an error about a missing key: why the family's class defaults were not read
        (a dict read as it is), else nothing."""
        if not self.is_dict:
            return ""
        if self._defaults is not None:
            return f"; {self._defaults.name} declares no default for it"
        return (
            "; its family's class defaults were not read: transformers is not installed or "
            "does not know its model_type"
        )

    def where(self, *keys: str) -> str:
        """``keys`` as the config spells them and their place, joined: a dict's own name for
        a key (GPT-J's ``n_embd`` for ``hidden_size``) under its prefix
        (``text_config.head_dim``)."""
        return " and ".join(f"{self.prefix}{self._spell(k)}" for k in keys)

    def rope_key(self) -> str:
        """Where the config keeps its RoPE parameters, as :func:`rope_parameters` reads them:
        ``rope_parameters``, or legacy ``rope_scaling`` when that is what it gives."""
        legacy = not self.get("rope_parameters") and self.get("rope_scaling")
        return self.where("rope_scaling" if legacy else "rope_parameters")

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


_ROPE_KEYS = ("rope_parameters", "rope_scaling", "rope_theta", "head_dim", "hidden_size")


def _text_part(config: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ``text_config`` of a composite dict that keeps its RoPE there (None: read the
    dict itself)."""
    text = config.get("text_config")
    if isinstance(text, Mapping) and not any(k in config for k in _ROPE_KEYS):
        return text
    return None


def _check_dict(config: Mapping[str, Any]) -> None:
    """What a dict must hold before anything is built from it: a ``model_type`` (its text
    config's too), where it gives one, that names a transformers family
    (:func:`._hf_dict.known_model_types`), and at most :data:`MAX_LAYERS` layers."""
    text = config.get("text_config")
    for part, where in ((config, ""), (text, "text_config.")):
        if not isinstance(part, Mapping):
            continue
        model_type = part.get("model_type")
        if model_type is not None:
            _check_model_type(f"{where}model_type", model_type)
        layers = part.get("num_hidden_layers")
        if layers is not None:
            check_int(f"{where}num_hidden_layers", layers, min=0, max=MAX_LAYERS)


_EXAMPLE_MODEL_TYPES = ("llama", "qwen2", "gemma3_text", "gptj")


def _check_model_type(key: str, model_type: Any) -> None:
    """Refuse a ``model_type`` that is no string or names no transformers family (the
    family decides how the rest of the dict is read; none is guessed)."""
    if not isinstance(model_type, str):
        raise PosEncError(
            f"config {key} must be a string (a transformers family), got {model_type!r}"
        )
    known, source = known_model_types()
    if model_type in known:
        return
    close = difflib.get_close_matches(model_type, sorted(known), n=3)
    examples = close or [k for k in _EXAMPLE_MODEL_TYPES if k in known]
    hint = f"; {'close' if close else 'e.g.'}: {', '.join(map(repr, examples))}"
    raise PosEncError(
        f"config {key} must name a transformers family (one of the {len(known)} model types "
        f"{source} knows, transformers.CONFIG_MAPPING{hint}), got {model_type!r}"
    )


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


def _dict_getter(config: Mapping[str, Any], spell: Any) -> Any:
    """``config.get`` of a key under the name the dict gives it (:func:`_dict_spelling`)."""
    return lambda key: config.get(spell(key))


def _dict_spelling(config: Mapping[str, Any], defaults: ClassDefaults | None) -> Any:
    """The name under which ``config`` holds a key: the key itself, else its GPT-2-style
    alias (``n_embd``, ...) or the name its family's ``attribute_map`` gives it
    (``kv_channels``, ...), the first the dict gives a value; the key itself where none."""

    def spell(key: str) -> str:
        if config.get(key) is not None:
            return key
        spelled = None if defaults is None else defaults.spelling(key)
        aliases = (*_families.DICT_ALIASES.get(key, ()), *((spelled,) if spelled else ()))
        return next((a for a in aliases if config.get(a) is not None), key)

    return spell


def rope_parameters(cfg: ConfigReader, layer_type: str | None, model_type: str) -> dict[str, Any]:
    """A copy of the RoPE parameters of ``layer_type`` (``rope_parameters``, or legacy
    ``rope_scaling``; ``{}`` where neither): the one set of a flat config (``layer_type``
    None), or one layer type's of a config with a set per layer type."""
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if not isinstance(rope, Mapping):
        raise PosEncError(
            f"config {cfg.rope_key()} must be a dict (the RoPE parameters), got "
            f"{type(rope).__name__} {_short(rope)}"
        )
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


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def first(*values: Any) -> Any:
    """The first of ``values`` that is not None (None if all are): transformers' order of
    priority between a config's places for one value."""
    return next((v for v in values if v is not None), None)
