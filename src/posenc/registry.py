"""Every encoding by name: ``build(spec)``, and ``to_config()`` / ``build(config)`` round trip.

This is the one place a name or a config becomes a module: :func:`posenc.attention`,
``TinyTransformer`` and :mod:`posenc.analysis` all call :func:`build`, so every caller
reads specs the same way and raises the same errors. The registry maps a name to the
module path of its class, so ``import posenc`` stays light and the families below never
import this module (arrows point down).

>>> import posenc
>>> pe = posenc.build("sinusoidal", dim=8)
>>> posenc.build(pe.to_config()).to_config() == pe.to_config()
True
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Mapping
from typing import Any

from posenc._base import Encoding
from posenc._errors import PosEncError

__all__ = ["ALIASES", "build", "class_of", "get", "names", "parameters"]

# name -> "module:Class". One line per encoding; keep sorted by kind.
_ENTRIES: dict[str, str] = {
    "none": "posenc.nope:NoPositionalEncoding",
    "sinusoidal": "posenc.sinusoidal:SinusoidalEmbedding",
    "learned": "posenc.learned:LearnedEmbedding",
    "index": "posenc.index:IndexEmbedding",
    # rotary
    "rope": "posenc.rotary.module:RotaryEmbedding",
    "xpos": "posenc.rotary.xpos:XPosEmbedding",
    "mrope": "posenc.rotary.nd:MultimodalRotaryEmbedding",  # deprecated: "rope" with sections=
    "axial_rope": "posenc.rotary.nd:AxialRotaryEmbedding",
    # bias
    "alibi": "posenc.bias.alibi:ALiBiBias",
    "t5": "posenc.bias.t5:T5RelativeBias",
    "shaw": "posenc.bias.shaw:ShawRelativeBias",
    "fire": "posenc.bias.fire:FIREBias",
    "kerple": "posenc.bias.kerple:KerpleBias",
    # bias: contextual and gated
    "cope": "posenc.contextual.cope:CoPEBias",
    "fox": "posenc.gated.fox:FoXBias",
}

# Other spellings users reach for.
ALIASES: dict[str, str] = {"nope": "none"}

Spec = str | Mapping[str, Any] | Encoding


def names() -> list[str]:
    """The registered encoding names, in registry order."""
    return list(_ENTRIES)


def _canonical(name: Any) -> str:
    if not isinstance(name, str):
        raise PosEncError(f"encoding name must be a string, got {name!r}")
    key = ALIASES.get(name.lower(), name.lower())
    if key not in _ENTRIES:
        raise PosEncError(
            f"encoding name must be one of {', '.join(map(repr, _ENTRIES))}, got {name!r}"
        )
    return key


@functools.cache
def _load(key: str) -> type[Encoding]:
    module, _, cls = _ENTRIES[key].partition(":")
    return getattr(importlib.import_module(module), cls)


def get(name: str) -> type[Encoding]:
    """The class registered under ``name`` (or an alias)."""
    return _load(_canonical(name))


def _split(spec: Any) -> tuple[str, dict[str, Any]]:
    """``(name, constructor arguments)`` of a registry name or a config dict."""
    if isinstance(spec, str):
        return spec, {}
    if isinstance(spec, Mapping):
        if "name" not in spec:
            raise PosEncError(f"encoding config must hold a 'name' key, got keys {sorted(spec)}")
        return spec["name"], {k: v for k, v in spec.items() if k != "name"}
    raise PosEncError(
        "encoding must be a registry name, a config dict or an Encoding module, "
        f"got {type(spec).__name__}"
    )


def class_of(spec: Spec) -> type[Encoding]:
    """The class ``spec`` (a name, a config dict or an instance) builds, without building it:
    its ``kind`` and :func:`parameters` are known before any module exists."""
    if isinstance(spec, Encoding):
        return type(spec)
    return get(_split(spec)[0])


_PARAMETERS: dict[type[Encoding], tuple[frozenset[str], frozenset[str]]] = {}


def parameters(cls: type[Encoding]) -> tuple[frozenset[str], frozenset[str]]:
    """``(accepted, required)``: the constructor argument names of ``cls``, and those of
    them without a default (read once per class)."""
    if cls not in _PARAMETERS:
        accepted, required = set(), set()
        for p in inspect.signature(cls).parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            accepted.add(p.name)
            if p.default is p.empty:
                required.add(p.name)
        _PARAMETERS[cls] = frozenset(accepted), frozenset(required)
    return _PARAMETERS[cls]


def build(
    spec: Spec,
    /,
    *args: Any,
    fill: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> Encoding:
    """Build an encoding from a name, a config dict (``{"name": ..., **args}``) or an instance.

    Args:
        spec: a registry name (or alias), a config dict as :meth:`Encoding.to_config`
            writes it (configs written by earlier posenc versions are upgraded by the
            class's :meth:`~posenc._base.Encoding.upgrade_config`), or an instance.
        fill: values the caller knows (``num_heads``, ``head_dim``, ``dim``, ...): each is
            passed when the constructor takes it and the spec leaves it out; a spec that
            sets one to another value raises ``PosEncError``. ``None`` values are skipped.
        defaults: passed like ``fill`` when the spec leaves them out, but a spec may set
            them to anything.
        **kwargs: constructor arguments added to (and overriding) the spec's, by name
            only (``build("rope", 8)`` is refused: ``build("rope", head_dim=8)``).

    An instance is returned as it is when no keyword arguments are given (``fill`` and
    ``defaults`` are for names and configs).

    Examples:
        >>> import posenc
        >>> posenc.build("alibi", fill={"num_heads": 4, "head_dim": 8}).num_heads
        4
    """
    if args:
        raise PosEncError(
            f"build takes the encoding and then arguments by name only (e.g. "
            f"build('rope', head_dim=64)), got {len(args)} more positional argument(s) "
            f"{args!r}"
        )
    for name_, mapping in (("fill", fill), ("defaults", defaults)):
        if mapping is not None and not isinstance(mapping, Mapping):
            raise PosEncError(f"{name_} must be a dict of arguments, got {mapping!r}")
    if isinstance(spec, Encoding):
        return spec if not kwargs else build(spec.to_config(), **kwargs)
    name, given = _split(spec)
    cls = get(name)
    name, given = cls.upgrade_config(given)
    cls = get(name)
    given.update(kwargs)
    accepted, _ = parameters(cls)
    for key, value in (fill or {}).items():
        if value is None or key not in accepted:
            continue
        if key not in given:
            given[key] = value
        elif given[key] != value:
            raise PosEncError(
                f"encoding {name!r}: {key} must be {value} here (set by the caller), "
                f"got {given[key]!r}"
            )
        # else the spec's own value stays, for the constructor to check (16.0 equals 16)
    for key, value in (defaults or {}).items():
        if key in accepted and key not in given:
            given[key] = value
    try:
        return cls(**given)
    except TypeError as e:  # unknown or missing constructor argument
        raise PosEncError(f"cannot build {name!r} from arguments {sorted(given)}: {e}") from e
