"""Mutation kinds of the bad-input matrix: each turns one valid argument into a bad (or edge)
one. A mutation is ``(kind, value, rule)``; ``rule`` says what the call may do:

- ``"raise"``: it must raise :class:`posenc.PosEncError` naming the argument;
- ``"either"``: raise that error, or return a correct result (finite from finite input);
- ``"nonfinite"``: like ``"either"``, but the input is not finite, so neither is the result
  required to be;
- ``"meta"``: raise that error, or return tensors on the meta device only (never values).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from typing import Any

import torch

# Integer arguments that may be negative (all others are sizes, counts or lengths).
SIGNED = frozenset({"offset", "seq_dim", "dim", "relative_position", "seed", "seeds", "shift"})
# String arguments whose text is free (any string is a valid value).
FREE_TEXT = frozenset({"path", "name", "source", "where"})
# Tensor arguments holding positions (lists, integers and NaN checks apply to them).
POSITION_LIKE = ("position", "grid", "distances", "seq_lens", "mask", "tokens")

# Mapping arguments that are transformers configs (any other key is allowed in them; each
# of their own keys is mutated instead).
CONFIGS = frozenset({"config"})
# A config key mutation's kind -> the key its message must name.
KEY_NAMES: dict[str, str] = {}

Mutation = tuple[str, Callable[[], Any], str]


def _positional(name: str) -> bool:
    return any(word in name for word in POSITION_LIKE)


def _int(name: str, value: int) -> Iterator[Mutation]:
    signed = name in SIGNED
    yield "type_str", lambda: str(value), "raise"
    yield "type_float", lambda: value + 0.5, "raise"
    yield "type_bool", lambda: True, "raise"
    yield "type_complex", lambda: value + 0j, "raise"
    yield "type_float_integral", lambda: float(value), "raise"
    yield "size_0", lambda: 0, "either"
    yield "size_neg", lambda: -1, "either" if signed else "raise"
    yield "size_huge", lambda: 10**12, "either"
    yield "size_2pow64", lambda: 2**64, "raise"


def _float(name: str, value: float) -> Iterator[Mutation]:
    yield "type_str", lambda: str(value), "raise"
    yield "type_bool", lambda: True, "raise"
    yield "type_complex", lambda: value + 0j, "raise"
    yield "nonfinite_nan", lambda: float("nan"), "raise"
    yield "nonfinite_inf", lambda: float("inf"), "either"
    yield "value_neg", lambda: -1.0, "either"
    yield "value_0", lambda: 0.0, "either"
    yield "value_huge", lambda: 1e300, "either"


def _str(name: str, value: str) -> Iterator[Mutation]:
    if name in FREE_TEXT:
        return
    yield "value_empty", lambda: "", "raise"
    yield "value_bogus", lambda: "bogus", "raise"
    yield "type_int", lambda: 3, "raise"


def _dtype(name: str, value: torch.dtype) -> Iterator[Mutation]:
    if value != torch.int64:
        yield "dtype_int64", lambda: torch.int64, "either" if _positional(name) else "raise"
    yield "dtype_bool", lambda: torch.bool, "raise"
    yield "dtype_complex", lambda: torch.complex64, "raise"
    yield "type_str", lambda: "float32", "raise"


def _device(name: str, value: Any) -> Iterator[Mutation]:
    yield "device_meta", lambda: "meta", "meta"
    if not torch.cuda.is_available():
        yield "device_cuda_missing", lambda: "cuda", "raise"
    yield "device_bogus", lambda: "bogus", "raise"
    yield "type_float", lambda: 1.5, "raise"


def _sequence(name: str, value: tuple | list) -> Iterator[Mutation]:
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    yield "container_dict", lambda: dict(enumerate(value)), "raise"
    if all(isinstance(v, Hashable) for v in value):  # a set of dicts cannot be made
        yield "container_set", lambda: set(value), "raise"
    yield "container_str", lambda: "ab", "raise"
    yield "size_0", lambda: type(value)(), "either"
    yield "container_nested", lambda: [list(value)], "raise"
    if ints:
        neg = "either" if name in SIGNED else "raise"
        yield "elem_neg", lambda: type(value)([-1, *value[1:]]), neg
        yield "elem_float", lambda: type(value)([value[0] + 0.5, *value[1:]]), "raise"
        yield "elem_huge", lambda: type(value)([10**12, *value[1:]]), "either"
        yield "elem_2pow64", lambda: type(value)([2**64, *value[1:]]), "raise"
        yield "elem_bool", lambda: type(value)([True, *value[1:]]), "raise"
        yield "elem_complex", lambda: type(value)([value[0] + 0j, *value[1:]]), "raise"
        yield "elem_float_integral", lambda: type(value)([float(value[0]), *value[1:]]), "raise"
    else:
        yield "elem_nan", lambda: type(value)([float("nan"), *value[1:]]), "raise"
        yield "elem_str", lambda: type(value)(["x", *value[1:]]), "raise"


def _tensor(name: str, value: torch.Tensor) -> Iterator[Mutation]:
    pos = _positional(name)
    floating = value.is_floating_point()
    yield "type_str", lambda: "tensor", "raise"
    yield "container_list", lambda: value.tolist(), "either" if pos else "raise"
    yield "shape_ndim_plus", lambda: value.unsqueeze(0).clone(), "either"
    if value.ndim:
        yield "shape_0d", lambda: value.reshape(-1)[0].clone(), "either"
        yield "shape_empty", lambda: value.narrow(0, 0, 0).clone(), "either"
    masks = "mask" in name or name == "keep"
    yield "dtype_bool", lambda: value.to(torch.bool), "either" if masks else "raise"
    yield "dtype_complex", lambda: value.to(torch.complex64), "raise"
    if floating:
        yield "dtype_int", lambda: value.round().to(torch.int64), "either"
        bad = "raise" if pos else "nonfinite"
        yield "nonfinite_nan", lambda: value.clone().fill_(float("nan")), bad
        yield "nonfinite_inf", lambda: value.clone().fill_(float("inf")), bad
    else:
        yield "dtype_float16", lambda: value.to(torch.float16), "either"
    if pos:
        yield "value_int64_max", lambda: torch.full_like(value, 2**62), "either"
    yield "device_meta", lambda: value.to("meta"), "meta"


def _mapping(name: str, value: dict) -> Iterator[Mutation]:
    yield "container_list", lambda: list(value.items()), "raise"
    yield "type_str", lambda: "bogus", "raise"
    if name in CONFIGS:
        yield from _config_keys(value)
    else:
        yield "value_unknown_key", lambda: {**value, "no_such_key": 1}, "raise"


def _config_keys(config: dict, prefix: str = "") -> Iterator[Mutation]:
    """Each key of a transformers config dict mutated in turn (one level into nested dicts,
    ``rope_scaling.factor``); the kind is ``key_<path>_<kind>``, and the message must name
    the key itself (:data:`KEY_NAMES` maps a kind to it)."""
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _nested(config, key, value, path)
            continue
        for kind, make, rule in mutations(key, value):
            KEY_NAMES[f"key_{path}_{kind}"] = key
            yield (
                f"key_{path}_{kind}",
                lambda key=key, make=make: {**config, key: make()},
                rule,
            )


def _nested(config: dict, key: str, value: dict, path: str) -> Iterator[Mutation]:
    for kind, make, rule in _config_keys(value, prefix=f"{path}."):
        yield kind, (lambda make=make: {**config, key: make()}), rule
    KEY_NAMES[f"key_{path}_type_str"] = key
    yield f"key_{path}_type_str", lambda: {**config, key: "bogus"}, "raise"


def _other(name: str, value: Any) -> Iterator[Mutation]:
    yield "type_int", lambda: 3, "raise"
    yield "type_str", lambda: "bogus", "raise"


def mutations(name: str, value: Any) -> list[Mutation]:
    """The mutation kinds that apply to argument ``name`` whose valid value is ``value``."""
    if value is None:
        return []
    if isinstance(value, bool):
        return [("type_str", lambda: "yes", "raise"), ("type_int", lambda: 2, "raise")]
    if name == "device":
        return list(_device(name, value))
    if isinstance(value, int):
        return list(_int(name, value))
    if isinstance(value, float):
        return list(_float(name, value))
    if isinstance(value, str):
        return list(_str(name, value))
    if isinstance(value, torch.dtype):
        return list(_dtype(name, value))
    if isinstance(value, torch.Tensor):
        return list(_tensor(name, value))
    if isinstance(value, (tuple, list)):
        return list(_sequence(name, value))
    if isinstance(value, dict):
        return list(_mapping(name, value))
    return list(_other(name, value))
