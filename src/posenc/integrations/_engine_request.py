"""What every engine's spelling of a RoPE setting starts from (:mod:`posenc.integrations.engines`,
:mod:`posenc.integrations._engine_llama`): the request checked once, the setting's record, and
the attention factors transformers computes, which each engine spells its own way."""

from __future__ import annotations

import dataclasses
import math
import ntpath
import re
import shlex
from collections.abc import Mapping
from typing import Any

from posenc._errors import PosEncError, check_int, describe
from posenc.integrations.spelling import ROPE_TYPE_KEYS

__all__ = [
    "EngineSetting",
    "Request",
    "longrope_attention",
    "mscale",
    "num",
    "refuse",
    "request",
    "shell",
    "yarn_attention",
]

#: Keys of a rope_parameters dict that are no scaling parameter (transformers 5).
GENERAL = ("rope_type", "rope_theta", "partial_rotary_factor", "mrope_section", "mrope_interleaved")
_ARCH = re.compile(r"[a-z0-9][a-z0-9_-]*")


@dataclasses.dataclass(frozen=True)
class EngineSetting:
    """A RoPE setting in one engine's spelling.

    Attributes:
        engine: one of :data:`ENGINES`.
        command: the exact command line (``None`` for transformers).
        settings: the same as data (per engine: see :func:`engine_setting`).
        warnings: one line per known silent failure of this engine with this setting,
            each naming its source.
    """

    engine: str
    command: str | None
    settings: dict[str, Any]
    warnings: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Request:
    layers: dict[str | None, dict[str, Any]]  # {None: params} when flat
    trained: int
    target: int
    arch: str
    model: str

    def spelled(self, layers: Mapping[str | None, dict[str, Any]]) -> dict[str, Any]:
        """``layers`` in the shape the caller gave (flat, or nested per layer type)."""
        if None in layers:
            return dict(layers[None])
        return {str(k): dict(v) for k, v in layers.items()}

    def types(self) -> list[str]:
        return [p["rope_type"] for p in self.layers.values()]


def request(rope_parameters: Any, trained: Any, target: Any, arch: Any, model: Any) -> Request:
    trained = check_int("trained", trained, min=1)
    target = check_int("target", target, min=1)
    if not isinstance(arch, str) or not _ARCH.fullmatch(arch):
        raise PosEncError(f"arch must be a GGUF architecture name such as 'llama', got {arch!r}")
    if (
        not isinstance(model, str)
        or not model.strip()
        or model.startswith(("/", "\\", "~"))
        or ntpath.isabs(model)
        or any(ord(c) < 32 for c in model)
    ):
        raise PosEncError(
            f"model must be a file or folder name as shown in commands (no absolute path), "
            f"got {model!r}"
        )
    return Request(_layers(rope_parameters), trained, target, arch, model)


def _layers(given: Any) -> dict[str | None, dict[str, Any]]:
    """The layer types' dicts, checked: ``{None: dict}`` for a flat one."""
    if not isinstance(given, Mapping) or not given:
        raise PosEncError(f"rope_parameters must be a non-empty dict, got {describe(given)}")
    layers: dict[str | None, dict[str, Any]]
    if any(key in given for key in GENERAL):
        layers = {None: dict(given)}
    elif all(isinstance(k, str) and isinstance(v, Mapping) for k, v in given.items()):
        layers = {k: dict(v) for k, v in given.items()}
    else:
        raise PosEncError(
            "rope_parameters must hold 'rope_type' and 'rope_theta', or one such dict per "
            f"layer type, got keys {sorted(map(str, given))}"
        )
    for name, params in layers.items():
        _check_layer("rope_parameters" if name is None else f"rope_parameters[{name!r}]", params)
    return layers


#: The keys each rope type needs, numbers > 0 (LongRoPE's factors: lists of them).
_NEEDED = {
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor", "original_max_position_embeddings"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "longrope": ("short_factor", "long_factor", "original_max_position_embeddings"),
}


def _check_layer(where: str, params: dict[str, Any]) -> None:
    kind = params.get("rope_type")
    if kind not in ROPE_TYPE_KEYS:
        raise PosEncError(
            f"{where}['rope_type'] must be one of {', '.join(ROPE_TYPE_KEYS)}, got {kind!r}"
        )
    unknown = sorted(set(params) - set(GENERAL) - set(ROPE_TYPE_KEYS[kind]))
    if unknown:
        raise PosEncError(f"{where} holds keys rope_type {kind!r} does not take: {unknown}")
    for key in ("rope_theta", *_NEEDED.get(kind, ())):
        value = params.get(key)
        if key in ("short_factor", "long_factor"):  # a list of numbers
            items = value if isinstance(value, list) and value else [None]
        else:
            items = [value]
        for item in items:
            if isinstance(item, bool) or not isinstance(item, (int, float)) or not item > 0:
                raise PosEncError(
                    f"{where}[{key!r}] must be a number > 0 for rope_type {kind!r}, "
                    f"got {describe(value)}"
                )


def refuse(engine: str, kind: str, why: str) -> PosEncError:
    return PosEncError(f"engine {engine!r} cannot take scaling {kind!r}: {why}")


def mscale(factor: float, weight: float = 1.0) -> float:
    """YaRN's ``0.1 * weight * ln(factor) + 1`` (1 at factor <= 1), as transformers, vLLM
    and SGLang compute it (``yarn_get_mscale(factor, mscale=weight)``)."""
    return 1.0 if factor <= 1 else 0.1 * weight * math.log(factor) + 1.0


def yarn_attention(params: Mapping[str, Any]) -> float:
    """The factor transformers 5 puts on cos/sin for YaRN ``params``
    (``_compute_yarn_parameters``): ``attention_factor``, else the ratio of two mscales when
    ``mscale`` and ``mscale_all_dim`` are both given (and true), else ``0.1 ln(factor) + 1``."""
    factor = float(params["factor"])
    given = params.get("attention_factor")
    if given is not None:
        return float(given)
    weight, all_dim = params.get("mscale"), params.get("mscale_all_dim")
    if weight and all_dim:
        return mscale(factor, weight) / mscale(factor, all_dim)
    return mscale(factor)


def longrope_attention(params: Mapping[str, Any], target: int) -> float:
    """transformers' LongRoPE attention factor with ``max_position_embeddings = target``."""
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    original = params["original_max_position_embeddings"]
    factor = params.get("factor") or target / original
    return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))


def shell(argv: list[str], env: Mapping[str, str]) -> str:
    words = [f"{k}={shlex.quote(v)}" for k, v in env.items()] + [shlex.quote(a) for a in argv]
    return " ".join(words)


def num(value: float | int) -> str:
    return str(value) if isinstance(value, int) else repr(float(value))


# --- transformers -------------------------------------------------------------------------
