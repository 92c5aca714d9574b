"""Per-layer settings of :class:`~posenc.models.TinyTransformer`: what current models vary
from layer to layer around the position encoding.

A layer's settings are a dict (``TinyTransformer(layers=[...])``, one per layer) with any of:

- ``"encoding"``: a rotary, bias or ``"none"`` spec replacing the model's encoding in that
  layer (Llama 4 / SmolLM3: ``"none"`` every 4th layer; Gemma 3: a RoPE base per layer).
- ``"window"``: sliding-window attention: a query sees the ``window`` most recent keys
  (itself included; in an encoder, keys less than ``window`` tokens away on either side).
  Counted in tokens of the sequence, padding included.
- ``"qk_norm"``: RMS-normalise each head's queries and keys (a learned gain of
  ``head_dim``, before the rotation: OLMo 2, Qwen 3, Gemma 3).
- ``"temperature"``: scale the queries by a length-dependent temperature:

  - ``{"type": "llama4", "floor_scale": F, "attn_scale": a}``: Llama 4's attention
    temperature tuning, ``q * (1 + a * log(floor((p + 1) / F) + 1))`` at query position
    ``p`` (transformers' ``Llama4TextAttention``, on its NoPE layers; defaults there
    ``F = 8192``, ``a = 0.1``; ``a <= 1e6``; 1 at negative positions);
  - ``{"type": "ssmax", "init": s0}``: Scalable-Softmax (Nakanishi, 2025), logits
    ``* s_h log n`` with ``n`` the keys the query may attend and ``s_h`` learned per head
    (initialised to ``s0``, default 0.43, the value of the paper's Figure 1;
    ``|s0| <= 1e6``). It scales
    ``q . k``; a bias encoding's term is added after.

Layer dicts are validated (and completed with their defaults) by :func:`check_layer`;
:mod:`posenc.models.schedules` builds the published schedules.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from posenc._errors import (
    PosEncError,
    check_bool,
    check_choice,
    check_float,
    check_int,
    check_positions,
)
from posenc.attend.paths import allowed_pairs

__all__ = [
    "LAYER_KEYS",
    "MAX_SCALE",
    "MAX_WINDOW",
    "TEMPERATURES",
    "allowed_counts",
    "check_layer",
    "check_temperature",
    "llama4_temperature",
    "llama4_temperature_at",
    "ssmax_factor",
    "window_keep",
]

#: The keys a layer's settings may hold.
LAYER_KEYS = ("encoding", "window", "qk_norm", "temperature")

#: Query temperatures a layer may use, with their parameters and defaults.
TEMPERATURES: dict[str, dict[str, float]] = {
    "llama4": {"floor_scale": 8192.0, "attn_scale": 0.1},
    "ssmax": {"init": 0.43},
}

#: The widest sliding window a layer takes (in tokens).
MAX_WINDOW = 1 << 40

#: The largest ``attn_scale`` (Llama 4) and ``|init|`` (SSMax) a temperature takes: beyond
#: them the query factor leaves float32 (``1e308`` would not even fit a float32 parameter).
MAX_SCALE = 1e6


def check_temperature(name: str, spec: Any) -> dict[str, Any] | None:
    """A temperature spec (``name`` is how the caller calls it, e.g.
    ``layers[0]['temperature']``) validated and completed with its defaults, or None."""
    if spec is None:
        return None
    if not isinstance(spec, Mapping) or "type" not in spec:
        raise PosEncError(
            f"{name} must be a dict with a 'type' "
            f"({', '.join(map(repr, TEMPERATURES))}), got {spec!r}"
        )
    kind = check_choice(f"{name}['type']", spec["type"], tuple(TEMPERATURES))
    defaults = TEMPERATURES[kind]
    unknown = sorted(set(spec) - {"type", *defaults})
    if unknown:
        raise PosEncError(
            f"{name} of type {kind!r} has unknown keys {unknown}; allowed: {['type', *defaults]}"
        )
    out: dict[str, Any] = {"type": kind}
    for key, default in defaults.items():
        key_name = f"{name}['{key}']"
        value = spec.get(key, default)
        if key == "floor_scale":
            out[key] = check_float(key_name, value, min=0.0, min_exclusive=True)
        elif key == "attn_scale":
            out[key] = check_float(key_name, value, min=0.0, max=MAX_SCALE)
        else:  # SSMax's init
            out[key] = check_float(key_name, value, min=-MAX_SCALE, max=MAX_SCALE)
    return out


def check_layer(index: int, layer: Any) -> dict[str, Any]:
    """Layer ``index``'s settings validated, with ``window`` / ``qk_norm`` / ``temperature``
    filled in (``None`` / ``False`` / ``None``); ``"encoding"`` is kept as given (the model
    builds it)."""
    where = f"layers[{index}]"
    if not isinstance(layer, Mapping):
        raise PosEncError(f"{where} must be a dict, got {layer!r}")
    unknown = sorted(set(layer) - set(LAYER_KEYS))
    if unknown:
        raise PosEncError(f"{where} has unknown keys {unknown}; allowed: {list(LAYER_KEYS)}")
    out: dict[str, Any] = {}
    if layer.get("encoding") is not None:
        out["encoding"] = layer["encoding"]
    window = layer.get("window")
    out["window"] = (
        None if window is None else check_int(f"{where}['window']", window, min=1, max=MAX_WINDOW)
    )
    out["qk_norm"] = check_bool(f"{where}['qk_norm']", layer.get("qk_norm", False))
    out["temperature"] = check_temperature(f"{where}['temperature']", layer.get("temperature"))
    return out


def llama4_temperature(
    positions: torch.Tensor, *, floor_scale: float, attn_scale: float
) -> torch.Tensor:
    """Llama 4's query temperature ``1 + attn_scale * log(floor((p + 1) / floor_scale) + 1)``
    at positions ``p`` (float32, the shape of ``positions``).

    It is 1 at every position below ``floor_scale - 1``, negative ones included (the step
    count ``floor((p + 1) / floor_scale)`` is taken as 0 there): transformers computes it
    from ``arange(s) + past tokens``, never negative, and a padded slot given a negative
    position must not turn its query into ``-inf`` or NaN.

    Args:
        positions: integer or floating positions, any shape (finite).
        floor_scale: the step, ``> 0`` (8192 in Llama 4).
        attn_scale: the strength, in ``[0, 1e6]`` (0.1 in Llama 4).

    Examples:
        >>> import torch
        >>> llama4_temperature(torch.tensor([-9, 0, 7, 8, 23]), floor_scale=8, attn_scale=0.1)
        tensor([1.0000, 1.0000, 1.0693, 1.0693, 1.1386])
    """
    check_positions("positions", positions, ndims=None)
    floor_scale = check_float("floor_scale", floor_scale, min=0.0, min_exclusive=True)
    attn_scale = check_float("attn_scale", attn_scale, min=0.0, max=MAX_SCALE)
    return llama4_temperature_at(positions, floor_scale=floor_scale, attn_scale=attn_scale)


def llama4_temperature_at(
    positions: torch.Tensor, *, floor_scale: float, attn_scale: float
) -> torch.Tensor:
    """:func:`llama4_temperature` of checked arguments (validates nothing: the model's
    positions were checked once per forward, its settings by :func:`check_layer`)."""
    p = positions.to(torch.float64)
    steps = torch.floor((p + 1.0) / floor_scale).clamp_min(0.0)
    return (torch.log1p(steps) * attn_scale + 1.0).float()


def window_keep(q_len: int, k_len: int, window: int, *, causal: bool, device: Any) -> torch.Tensor:
    """Sliding-window pairs ``[q, k]`` (True = may attend): query ``i`` is key ``k - q + i``
    and sees keys fewer than ``window`` tokens before it (and, not ``causal``, after it;
    with ``causal`` the keys after it are left to attention's causal mask)."""
    i = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
    j = torch.arange(k_len, device=device)[None, :]
    near = i - j < window
    return near if causal else near & (j - i < window)


def allowed_counts(keep: torch.Tensor | None, causal: bool, q_len: int, k_len: int) -> torch.Tensor:
    """How many keys each query may attend, ``[b|1, 1, q, 1]`` float32, from the causal
    rule and ``keep [b|1, 1|h, q|1, k]`` (at least 1: SSMax's ``log n``)."""
    device = keep.device if keep is not None else None
    allowed, empty = allowed_pairs(keep, causal, q_len, k_len, device)  # attention's own rule
    if allowed is None:
        return torch.full((1, 1, q_len, 1), float(k_len), device=device)
    counts = allowed.sum(-1, keepdim=True)  # [.., q|1, 1]
    if empty is not None:  # rows that see no key (opened up by the rule) count 1
        counts = counts.masked_fill(empty, 1)
    counts = counts.reshape((1,) * (4 - counts.ndim) + tuple(counts.shape))  # 4-D
    return counts.expand(*counts.shape[:2], q_len, 1).float()


def ssmax_factor(s: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """SSMax's query factor ``s_h log n``: ``s [h]``, ``counts [b|1, 1, q, 1]`` ->
    ``[b|1, h, q, 1]``."""
    return s.float()[None, :, None, None] * torch.log(counts)
