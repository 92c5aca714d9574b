"""What some transformers families multiply their queries by, beside RoPE, and which layers
apply RoPE at all.

Two families of models scale each query by a function of its position, which is no rotation
(q and k rotate; only q is scaled, so the logits grow with the query's position):

- Llama 4's NoPE layers (``attn_temperature_tuning``; Nakanishi, 2025, "Scalable-Softmax Is
  Superior for Attention"): ``1 + attn_scale * ln(1 + floor((p + 1) / floor_scale))``;
- Ministral 3 and Mistral 4 (``rope_parameters["llama_4_scaling_beta"]``), on every layer:
  ``1 + beta * ln(1 + floor(p / original_max_position_embeddings))``.

Both are :class:`QueryScale` ``1 + beta * ln(1 + floor((p + offset) / length))``;
:func:`query_scale_from_config` reads it from a config (``None``: the queries are not
scaled), :func:`rope_layers` says which layers rotate (Llama 4, SmolLM3 and Mistral Large 4's
``no_rope_layers``, per-layer-type parameters set to ``None``), and
:func:`softmax_scale_factor` is the one number DeepSeek's MLA families multiply their softmax
scale by for YaRN (``mscale(factor, mscale_all_dim) ** 2``: 1.874 for DeepSeek-V3).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from posenc._errors import (
    PosEncError,
    check_dtype,
    check_float,
    check_int,
    check_positions,
    check_tensor,
)
from posenc.integrations import _hf_families as _families
from posenc.integrations._hf_reader import ConfigReader, rope_parameters

__all__ = ["QueryScale", "query_scale_from_config", "rope_layers", "softmax_scale_factor"]


@dataclasses.dataclass(frozen=True)
class QueryScale:
    """Queries multiplied by ``1 + beta * ln(1 + floor((p + offset) / length))`` at position
    ``p`` (1 below ``length - offset``; a step up at each multiple of ``length``).

    Args:
        beta: the strength (Llama 4's ``attn_scale``, Mistral's ``llama_4_scaling_beta``),
            in ``[-1e6, 1e6]``.
        length: the step, in ``(0, 2^63]`` (``floor_scale``;
            ``original_max_position_embeddings``).
        offset: added to the positions first (Llama 4: 1; Mistral: 0), ``|offset| <= 2^63``.

    Examples:
        >>> import torch
        >>> from posenc.integrations.transformers import QueryScale
        >>> QueryScale(beta=0.1, length=4.0)(torch.tensor([0, 3, 4, 8, 12]))
        tensor([1.0000, 1.0000, 1.0693, 1.1099, 1.1386], dtype=torch.float64)
    """

    beta: float
    length: float
    offset: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "beta", check_float("beta", self.beta, min=-1e6, max=1e6))
        length = check_float("length", self.length, min=0.0, min_exclusive=True, max=2.0**63)
        object.__setattr__(self, "length", length)
        offset = check_float("offset", self.offset, min=-(2.0**63), max=2.0**63)
        object.__setattr__(self, "offset", offset)

    def __call__(self, positions: torch.Tensor, *, dtype: torch.dtype = torch.float64) -> Any:
        """The scale at ``positions`` (int or float, any shape), computed in float64 and
        returned in ``dtype`` (floating); multiply ``q: [b, h, s, d]`` by
        ``scale[:, None, :, None]`` for ``[b, s]`` positions. It is 1 wherever
        ``p + offset < length`` (negative positions included: transformers computes it from
        ``arange(s) + past tokens``, never negative, and a padded slot given a negative
        position keeps its query as it is).

        Shape: ``[*P]`` -> ``[*P]``.
        """
        check_positions("positions", positions, ndims=None)
        check_tensor("positions", positions)
        check_dtype("dtype", dtype)
        p = positions.to(torch.float64)
        # no step below the first (negative positions, padding): 1 there, never -inf or NaN
        steps = torch.floor((p + self.offset) / self.length).clamp_min(0.0)
        return (1.0 + self.beta * torch.log1p(steps)).to(dtype)


def query_scale_from_config(config: Any, *, layer_idx: int | None = None) -> QueryScale | None:
    """The :class:`QueryScale` a transformers model multiplies its queries by in layer
    ``layer_idx``, or ``None`` where it multiplies nothing.

    Ministral 3 / Mistral 4 scale every layer by ``rope_parameters["llama_4_scaling_beta"]``
    over ``original_max_position_embeddings`` (transformers indexes both: missing, it
    fails); Llama 4 its NoPE layers (``no_rope_layers[layer_idx] == 0``) when
    ``attn_temperature_tuning`` (class defaults: ``True``, ``attn_scale`` 0.1,
    ``floor_scale`` 8192), from the positions ``arange(s) + past tokens``.

    Raises:
        PosEncError: a family that scales per layer without ``layer_idx``, a layer index out
            of range, a missing or invalid key.

    Examples:
        >>> from posenc.integrations.transformers import query_scale_from_config
        >>> query_scale_from_config({"model_type": "ministral3", "rope_parameters": {
        ...     "rope_type": "yarn", "factor": 16.0, "rope_theta": 1e6,
        ...     "original_max_position_embeddings": 16384, "llama_4_scaling_beta": 0.1}})
        QueryScale(beta=0.1, length=16384.0, offset=0.0)
        >>> query_scale_from_config({"model_type": "llama4_text", "num_hidden_layers": 8},
        ...                         layer_idx=3)
        QueryScale(beta=0.1, length=8192.0, offset=1.0)
        >>> query_scale_from_config({"model_type": "llama4_text", "num_hidden_layers": 8},
        ...                         layer_idx=0) is None  # a RoPE layer
        True
    """
    cfg = ConfigReader(config)
    model_type = str(cfg.get("model_type"))
    try:
        return _query_scale(cfg, model_type, layer_idx)
    except PosEncError as error:
        raise PosEncError(f"model_type {model_type!r}: {error}") from None


def _query_scale(cfg: ConfigReader, model_type: str, layer_idx: int | None) -> QueryScale | None:
    if model_type in _families.LLAMA4_SCALING_BETA:
        rope = cfg.get("rope_parameters") or {}
        missing = [
            k for k in ("llama_4_scaling_beta", "original_max_position_embeddings") if k not in rope
        ]
        if missing:
            raise PosEncError(
                f"rope_parameters must hold {missing} (transformers reads them for the query "
                f"scale), got keys {sorted(rope)}"
            )
        return QueryScale(
            beta=rope["llama_4_scaling_beta"], length=rope["original_max_position_embeddings"]
        )
    temperature = _families.NOPE_TEMPERATURE.get(model_type)
    if temperature is None:
        return None
    if layer_idx is None:
        raise PosEncError("the query scale differs per layer (NoPE layers); pass layer_idx=")
    uses_rope = rope_layers(cfg)[_layer(cfg, layer_idx)]
    tuning = cfg.get("attn_temperature_tuning")
    if uses_rope or not (temperature["attn_temperature_tuning"] if tuning is None else tuning):
        return None
    scale, floor = cfg.get("attn_scale"), cfg.get("floor_scale")
    return QueryScale(
        beta=temperature["attn_scale"] if scale is None else scale,
        length=temperature["floor_scale"] if floor is None else floor,
        offset=1.0,
    )


def _layer(cfg: ConfigReader, layer_idx: Any) -> int:
    layers = check_int("num_hidden_layers", cfg.get("num_hidden_layers"), min=1)
    return check_int("layer_idx", layer_idx, min=0, max=layers - 1)


def rope_layers(config: Any) -> list[bool]:
    """Per layer (``num_hidden_layers`` of them): whether its attention applies RoPE.

    ``no_rope_layers`` (Llama 4, SmolLM3, Mistral Large 4: ``1`` = RoPE, ``0`` = NoPE; absent,
    every ``no_rope_layer_interval``-th layer (class default 4) is NoPE), else the layer
    types whose RoPE parameters are ``None``, else every layer.

    Examples:
        >>> from posenc.integrations.transformers import rope_layers
        >>> rope_layers({"model_type": "smollm3", "num_hidden_layers": 8})
        [True, True, True, False, True, True, True, False]
        >>> rope_layers({"model_type": "llama", "num_hidden_layers": 2})
        [True, True]
    """
    cfg = config if isinstance(config, ConfigReader) else ConfigReader(config)
    layers = check_int("num_hidden_layers", cfg.get("num_hidden_layers"), min=1)
    model_type = str(cfg.get("model_type"))
    flags = cfg.get("no_rope_layers")
    if model_type in _families.NO_ROPE_LAYERS:
        if not flags:  # transformers: None (or, Llama 4, empty) gives the default pattern
            interval = check_int(
                "no_rope_layer_interval",
                cfg.get("no_rope_layer_interval") or _families.NO_ROPE_LAYERS[model_type],
                min=1,
            )
            return [(i + 1) % interval != 0 for i in range(layers)]
        if not isinstance(flags, (list, tuple)) or len(flags) < layers:
            raise PosEncError(
                f"no_rope_layers must be a list of at least num_hidden_layers = {layers} flags, "
                f"got {flags!r}"
            )
        return [
            bool(check_int(f"no_rope_layers[{i}]", f, min=0, max=1))
            for i, f in enumerate(flags[:layers])
        ]
    rope = cfg.get("rope_parameters")
    kinds = cfg.get("layer_types")
    if isinstance(rope, dict) and isinstance(kinds, (list, tuple)) and len(kinds) >= layers:
        nested = rope and all(isinstance(v, dict) or v is None for v in rope.values())
        if nested:
            return [rope.get(kind) is not None for kind in kinds[:layers]]
    return [True] * layers


def softmax_scale_factor(config: Any, *, layer_type: str | None = None) -> float:
    """What a family's attention multiplies its softmax scale ``qk_head_dim ** -0.5`` by,
    beside what RoPE's ``attention_scale`` does to q and k: DeepSeek-V2 / V3's MLA and its
    descendants (``yarn_apply_mscale``) take ``mscale ** 2`` with ``mscale = 0.1 *
    mscale_all_dim * ln(factor) + 1`` (1 for ``factor <= 1``) when the rope type is not
    ``"default"`` and ``mscale_all_dim`` is non-zero; every other case is 1.0.

    DeepSeek-V3's published YaRN (``factor`` 40, ``mscale`` = ``mscale_all_dim`` = 1) gives
    ``(0.1 ln 40 + 1) ** 2 = 1.874``; its rotary ``attention_scale`` is then 1 (the ratio
    ``mscale / mscale_all_dim``), so all of YaRN's temperature sits in this number.

    Raises:
        PosEncError: ``mscale_all_dim`` without ``factor`` (transformers indexes it), a
            value that is not a number.

    Examples:
        >>> from posenc.integrations.transformers import softmax_scale_factor
        >>> round(softmax_scale_factor({"model_type": "deepseek_v3", "rope_scaling": {
        ...     "type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
        ...     "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1}}), 3)
        1.874
        >>> softmax_scale_factor({"model_type": "llama", "rope_scaling": {
        ...     "type": "yarn", "factor": 40, "mscale_all_dim": 1.0}})
        1.0
    """
    cfg = ConfigReader(config)
    model_type = str(cfg.get("model_type"))
    if model_type not in _families.MLA_SOFTMAX_MSCALE:
        return 1.0
    try:
        rope = rope_parameters(cfg, layer_type, model_type)
        kind = rope.get("rope_type", rope.get("type", "default"))
        mscale_all_dim = rope.get("mscale_all_dim") or 0
        if kind == "default" or not mscale_all_dim:
            return 1.0
        if rope.get("factor") is None:
            raise PosEncError(
                f"rope_parameters must hold 'factor' with mscale_all_dim (transformers reads "
                f"it for the softmax scale), got keys {sorted(rope)}"
            )
        factor = check_float("factor", rope["factor"])
        weight = check_float("mscale_all_dim", mscale_all_dim)
    except PosEncError as error:
        raise PosEncError(f"model_type {model_type!r}: {error}") from None
    mscale = 1.0 if factor <= 1 else 0.1 * weight * math.log(factor) + 1.0
    return mscale * mscale
