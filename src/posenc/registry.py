"""Every encoding by name: ``build(spec)``, and ``to_config()`` / ``build(config)`` round trip.

The registry maps a name to the module path of its class, so ``import posenc``
stays light and the families below never import this module (arrows point down).

>>> import posenc
>>> pe = posenc.build("sinusoidal", dim=8)
>>> posenc.build(pe.to_config()).to_config() == pe.to_config()
True
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from posenc._base import Encoding
from posenc._errors import PosEncError

__all__ = ["ALIASES", "build", "get", "names"]

# name -> "module:Class". One line per encoding; keep sorted by kind.
_ENTRIES: dict[str, str] = {
    "none": "posenc.nope:NoPositionalEncoding",
    "sinusoidal": "posenc.sinusoidal:SinusoidalEmbedding",
    "learned": "posenc.learned:LearnedEmbedding",
    "index": "posenc.index:IndexEmbedding",
    # rotary
    "rope": "posenc.rotary.module:RotaryEmbedding",
    "xpos": "posenc.rotary.xpos:XPosEmbedding",
    "mrope": "posenc.rotary.nd:MultimodalRotaryEmbedding",
    "axial_rope": "posenc.rotary.nd:AxialRotaryEmbedding",
    # bias
    "alibi": "posenc.bias.alibi:ALiBi",
    "t5": "posenc.bias.t5:T5RelativeBias",
    "shaw": "posenc.bias.shaw:ShawRelative",
    "fire": "posenc.bias.fire:FIRE",
    "kerple": "posenc.bias.kerple:Kerple",
}

# Other spellings users reach for.
ALIASES: dict[str, str] = {"nope": "none"}


def names() -> list[str]:
    """The registered encoding names, in registry order."""
    return list(_ENTRIES)


def _canonical(name: Any) -> str:
    if not isinstance(name, str):
        raise PosEncError(f"name must be a string, got {name!r}")
    key = ALIASES.get(name.lower(), name.lower())
    if key not in _ENTRIES:
        raise PosEncError(f"name must be one of {', '.join(map(repr, _ENTRIES))}, got {name!r}")
    return key


def get(name: str) -> type[Encoding]:
    """The class registered under ``name`` (or an alias)."""
    module, _, cls = _ENTRIES[_canonical(name)].partition(":")
    return getattr(importlib.import_module(module), cls)


def build(spec: str | Mapping[str, Any] | Encoding, /, **kwargs: Any) -> Encoding:
    """Build an encoding from a name, a config dict (``{"name": ..., **args}``) or an instance.

    Keyword arguments are added to (and override) the config's arguments. An
    instance is returned as it is when no keyword arguments are given.
    """
    if isinstance(spec, Encoding):
        return spec if not kwargs else build(spec.to_config(), **kwargs)
    if isinstance(spec, str):
        name, args = spec, {}
    elif isinstance(spec, Mapping):
        if "name" not in spec:
            raise PosEncError(f"config must hold a 'name' key, got keys {sorted(spec)}")
        name, args = spec["name"], {k: v for k, v in spec.items() if k != "name"}
    else:
        raise PosEncError(
            f"spec must be a name, a config dict or an encoding, got {type(spec).__name__}"
        )
    cls = get(name)
    args.update(kwargs)
    try:
        return cls(**args)
    except TypeError as e:  # unknown or missing constructor argument
        raise PosEncError(f"cannot build {name!r} from arguments {sorted(args)}: {e}") from e
