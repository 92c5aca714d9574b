"""Per-layer schedules of current models, as ``TinyTransformer(layers=...)`` lists.

- :func:`nope_every`: Llama 4 and SmolLM3 leave the rotary encoding out of every ``k``-th
  layer (``k = 4``: layers 4, 8, ... counted from 1), and Llama 4 gives its RoPE layers
  local (chunked) attention and its NoPE layers the attention temperature
  (:func:`posenc.models.layers.llama4_temperature`).
- :func:`local_global`: Gemma 3 alternates ``local`` sliding-window layers with RoPE base
  ``1e4`` and one global layer with base ``1e6`` (5 : 1, window 1024 in the 1B model).

Each returns one dict per layer (see :mod:`posenc.models.layers`); :data:`SCHEDULES`
names them for ``posenc lengthgen``. Every argument is checked before a layer is built, by
the rules the model applies to the result: at most
:data:`~posenc.models.transformer.MAX_LAYERS` layers, a window of at most
:data:`~posenc.models.layers.MAX_WINDOW` tokens, a temperature as
:func:`~posenc.models.layers.check_temperature` takes it, an encoding a registry name or
config (its keys those of its class).

Examples:
    >>> from posenc.models.schedules import nope_every
    >>> [layer.get("encoding") for layer in nope_every(4, 4)]
    [None, None, None, 'none']
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from posenc import registry
from posenc._errors import PosEncError, check_float, check_int
from posenc.models.layers import MAX_WINDOW, check_temperature
from posenc.models.transformer import MAX_LAYERS

__all__ = ["SCHEDULES", "local_global", "nope_every", "schedule"]


def nope_every(
    k: int,
    num_layers: int,
    *,
    window: int | None = None,
    temperature: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """NoPE on every ``k``-th layer (layers ``k, 2k, ...`` counted from 1), the model's
    encoding on the others.

    Args:
        k: the period, ``>= 1`` (``k = 1``: every layer NoPE).
        num_layers: layers of the model.
        window: sliding window of the encoded (non-NoPE) layers (Llama 4's local
            attention), or None.
        temperature: the NoPE layers' query temperature (Llama 4:
            ``{"type": "llama4", ...}``), or None.
    """
    k = check_int("k", k, min=1)
    num_layers = _check_num_layers(num_layers)
    if window is not None:
        window = check_int("window", window, min=1, max=MAX_WINDOW)
    check_temperature("temperature", temperature)
    out: list[dict[str, Any]] = []
    for i in range(num_layers):
        if (i + 1) % k == 0:
            layer: dict[str, Any] = {"encoding": "none"}
            if temperature is not None:
                layer["temperature"] = dict(temperature)
        else:
            layer = {} if window is None else {"window": window}
        out.append(layer)
    return out


def local_global(
    num_layers: int,
    *,
    ratio: int = 5,
    window: int = 1024,
    local_base: float = 1e4,
    global_base: float = 1e6,
    encoding: str | Mapping[str, Any] = "rope",
) -> list[dict[str, Any]]:
    """Gemma 3's ``ratio`` local layers (sliding window, RoPE base ``local_base``) to one
    global layer (full attention, base ``global_base``): layer ``i`` (from 0) is global when
    ``(i + 1) % (ratio + 1) == 0``. ``encoding`` is the rotary spec whose ``base`` each layer
    sets (default plain RoPE; a p-RoPE config keeps its fraction).

    Examples:
        >>> [layer["encoding"]["base"] for layer in local_global(4, ratio=1, window=8)]
        [10000.0, 1000000.0, 10000.0, 1000000.0]
    """
    num_layers = _check_num_layers(num_layers)
    ratio = check_int("ratio", ratio, min=0)
    window = check_int("window", window, min=1, max=MAX_WINDOW)
    local_base = check_float("local_base", local_base, min=1.0, min_exclusive=True)
    global_base = check_float("global_base", global_base, min=1.0, min_exclusive=True)
    spec = _check_encoding(encoding)
    cls = registry.class_of(spec)
    if "base" not in registry.parameters(cls)[0]:
        raise PosEncError(
            f"local_global sets a RoPE base per layer: encoding must be rotary with a base, "
            f"got {cls.name!r}"
        )
    out: list[dict[str, Any]] = []
    for i in range(num_layers):
        if (i + 1) % (ratio + 1) == 0:
            out.append({"encoding": {**spec, "base": global_base}})
        else:
            out.append({"encoding": {**spec, "base": local_base}, "window": window})
    return out


def _check_num_layers(num_layers: Any) -> int:
    return check_int("num_layers", num_layers, min=1, max=MAX_LAYERS)


def _check_encoding(encoding: Any) -> dict[str, Any]:
    """``encoding`` (a registry name or a config dict) as a config dict, its name known and
    its keys those its class takes (after the class' upgrade of older configs)."""
    if not isinstance(encoding, (str, Mapping)):
        raise PosEncError(
            f"encoding must be a registry name or a config dict, got {type(encoding).__name__}"
        )
    spec = {"name": encoding} if isinstance(encoding, str) else dict(encoding)
    cls = registry.class_of(spec)
    name, given = cls.upgrade_config({k: v for k, v in spec.items() if k != "name"})
    accepted, _ = registry.parameters(registry.get(name))
    unknown = sorted(set(given) - accepted)
    if unknown:
        raise PosEncError(
            f"encoding {name!r} has unknown keys {unknown}; allowed: {sorted(accepted)}"
        )
    return spec


#: Schedules by name, each ``f(num_layers, train_len, encoding) -> layers``, for ``posenc
#: lengthgen``: ``"nope-every-4"`` (Llama 4 / SmolLM3's NoPE layers), ``"nope-every-2"``,
#: ``"llama4"`` (NoPE every 4th layer, the RoPE layers local with a window of a quarter of
#: the training length, the NoPE layers with Llama 4's temperature from the training length
#: on), ``"local-global"`` (Gemma 3's 5 : 1 on the model's rotary encoding, its window a
#: quarter of the training length).
SCHEDULES: dict[str, Callable[[int, int, Mapping[str, Any]], list[dict[str, Any]]]] = {
    "nope-every-4": lambda layers, train_len, encoding: nope_every(4, layers),
    "nope-every-2": lambda layers, train_len, encoding: nope_every(2, layers),
    "llama4": lambda layers, train_len, encoding: nope_every(
        4,
        layers,
        window=max(1, train_len // 4),
        temperature={"type": "llama4", "floor_scale": float(train_len), "attn_scale": 0.1},
    ),
    "local-global": lambda layers, train_len, encoding: local_global(
        layers, window=max(1, train_len // 4), encoding=encoding
    ),
}


def schedule(
    name: str,
    num_layers: int,
    train_len: int,
    encoding: str | Mapping[str, Any] = "rope",
) -> list[dict[str, Any]]:
    """The schedule called ``name`` (one of :data:`SCHEDULES`) for a model of ``num_layers``
    layers (``<= MAX_LAYERS``) trained at ``train_len`` tokens (``<= MAX_WINDOW``) whose
    encoding is ``encoding`` (a registry name or a config dict).

    Examples:
        >>> [layer.get("window") for layer in schedule("llama4", 4, 64)]
        [16, 16, 16, None]
    """
    if not isinstance(name, str) or name not in SCHEDULES:
        listed = ", ".join(map(repr, SCHEDULES))
        raise PosEncError(f"name must be a schedule, one of {listed}, got {name!r}")
    num_layers = _check_num_layers(num_layers)
    train_len = check_int("train_len", train_len, min=1, max=MAX_WINDOW)
    return SCHEDULES[name](num_layers, train_len, _check_encoding(encoding))
