"""The class defaults of a config dict's family, read from transformers where installed.

A published ``config.json`` holds only what differs from its config class's defaults
(``save_pretrained`` writes the diff): Gemma 3's ``text_config`` gives no ``head_dim``, no
``num_attention_heads`` and no ``rope_theta``, which ``Gemma3TextConfig`` declares. Where
transformers is installed and knows the dict's ``model_type`` (or, for a composite's
``text_config`` without one, its parent's text sub-config), :func:`class_defaults` reads that
class's declared defaults (its dataclass fields, ``default_theta``) and ``attribute_map``
(``n_positions`` for ``max_position_embeddings``, ``kv_channels`` for ``head_dim``);
:class:`~._hf_reader.ConfigReader` answers a key the dict lacks from them. Values transformers
derives in ``__post_init__`` (Llama's ``head_dim = hidden_size // num_attention_heads``) are
not defaults: the reader derives them from the dict, and every value the dict gives is read
and checked as given, so an error names the dict's own key.

Nothing is built from the dict, nothing is downloaded, no code from a checkpoint runs.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any

from posenc.integrations._hf_model_types import MODEL_TYPES, MODEL_TYPES_VERSION

__all__ = ["ClassDefaults", "class_defaults", "known_model_types"]


@dataclasses.dataclass(frozen=True)
class ClassDefaults:
    """A config class's declared defaults (``fields``: name -> value) and its
    ``attribute_map`` (a standard name -> the name its dicts spell)."""

    name: str
    fields: Mapping[str, Any]
    attribute_map: Mapping[str, str]

    def spelling(self, key: str) -> str | None:
        """The name the family's dicts give ``key`` (None: ``key`` itself)."""
        alias = self.attribute_map.get(key)
        return alias if isinstance(alias, str) else None

    def default(self, key: str) -> Any:
        """The class's default of ``key`` (None where it declares none)."""
        value = self.fields.get(self.spelling(key) or key)
        return value if value is not dataclasses.MISSING else None


def class_defaults(model_type: Any, parent_model_type: Any = None) -> ClassDefaults | None:
    """The declared defaults of ``model_type``'s config class, or of the text sub-config of
    ``parent_model_type``'s class when ``model_type`` is None (a ``text_config`` naming none);
    ``None`` where transformers is not installed or knows neither."""
    cls = _config_class(model_type, parent_model_type)
    if cls is None:
        return None
    fields: dict[str, Any] = {}
    if dataclasses.is_dataclass(cls):
        fields = {f.name: f.default for f in dataclasses.fields(cls)}
    theta = getattr(cls, "default_theta", None)
    if isinstance(theta, (int, float)) and fields.get("rope_theta") is None:
        fields["rope_theta"] = float(theta)  # transformers fills rope_parameters with it
    attribute_map = getattr(cls, "attribute_map", None)
    return ClassDefaults(
        cls.__name__, fields, dict(attribute_map) if isinstance(attribute_map, Mapping) else {}
    )


def known_model_types() -> tuple[frozenset[str], str]:
    """The ``model_type`` names a config dict may give, and where they come from (for a
    message): transformers 5.25's (:data:`._hf_model_types.MODEL_TYPES`) and, where
    transformers is installed, its own ``CONFIG_MAPPING``'s."""
    mapping = _config_mapping()
    source = f"transformers {MODEL_TYPES_VERSION}"
    if mapping is None:
        return MODEL_TYPES, source
    names = frozenset(k for k in mapping.keys() if isinstance(k, str))
    if names <= MODEL_TYPES:
        return MODEL_TYPES, source
    version = _installed_version()
    return MODEL_TYPES | names, f"{source} and the installed transformers {version}"


def _installed_version() -> str:
    import transformers

    return str(getattr(transformers, "__version__", "?"))


def _config_mapping() -> Any:
    """transformers' ``CONFIG_MAPPING`` (None where transformers is not installed)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from transformers import CONFIG_MAPPING
    except ImportError:
        return None
    return CONFIG_MAPPING


def _config_class(model_type: Any, parent_model_type: Any) -> Any:
    mapping = _config_mapping()
    if mapping is None:
        return None
    if isinstance(model_type, str):
        return _mapped(mapping, model_type)
    parent = _mapped(mapping, parent_model_type) if isinstance(parent_model_type, str) else None
    sub_configs = getattr(parent, "sub_configs", None)
    text = sub_configs.get("text_config") if isinstance(sub_configs, Mapping) else None
    return text if isinstance(text, type) else None


def _mapped(mapping: Any, model_type: str) -> Any:
    try:
        return mapping[model_type]
    except KeyError:
        return None
