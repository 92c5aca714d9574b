"""The plain rotation: the formula, and the twin every engine is proven equal to, bit for bit.

The C loop, the Triton kernel and the optimised torch engine
(:mod:`posenc.rotary.kernels.torch_engine`) each compute exactly this function; the tests
hold each of them to it by one harness (``tests/rotary/_kernel_cases.py``,
``tests/rotary/test_engines.py``). It is written to be read, not to be fast: no caches, no
buffers, no private torch API.

Shapes: ``x`` is ``[b, h, s, d]`` (``seq_dim=-2``) or ``[b, s, h, d]`` (``seq_dim=-3``);
``cos``/``sin`` are ``[s, r/2]`` or ``[b, s, r/2]`` (``r <= d``, the rotary dim).
"""

from __future__ import annotations

from typing import Any

import torch

from posenc._deprecated import moved

__all__ = ["apply_rotary_torch"]

_MOVED_TO_CHECKS = tuple(
    "check_cos_sin check_devices check_inplace_memory check_rotary_dim check_rotary_input "
    "memory_range".split()
)
_MOVED_TO_ENGINE = ("paired", "rotate_paired", "rotate_torch")


def __getattr__(name: str) -> Any:
    if name in _MOVED_TO_ENGINE:
        return moved(__name__, name, "posenc.rotary.kernels.torch_engine", _MOVED_TO_ENGINE)
    return moved(__name__, name, "posenc.rotary.kernels.checks", _MOVED_TO_CHECKS)


def apply_rotary_torch(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    layout: str = "half",
    seq_dim: int = -2,
) -> torch.Tensor:
    """``x`` rotated by the angles whose cosines and sines are ``cos`` and ``sin``.

    Each pair ``(x1, x2)`` of the first ``r`` channels (``layout="half"``: channels ``i``
    and ``i + r/2``; ``"interleaved"``: ``2i`` and ``2i + 1``) becomes
    ``(x1 cos - x2 sin, x2 cos + x1 sin)``, computed in float32 (float64 for float64 x)
    with each product rounded before the sum and the result rounded once to x's dtype;
    channels past ``r`` are copied. Differentiable in x, cos and sin. No validation.

    Example:
        >>> x = torch.tensor([[[[1.0, 0.0]]]])  # [b, h, s, d] = [1, 1, 1, 2]
        >>> apply_rotary_torch(x, torch.zeros(1, 1), torch.ones(1, 1))  # a quarter turn
        tensor([[[[0., 1.]]]])
    """
    compute = torch.promote_types(x.dtype, torch.float32)
    half = cos.shape[-1]
    if cos.ndim == 3:  # [b, s, r/2]: [b, 1, s, r/2] or [b, s, 1, r/2]
        axis = 1 if seq_dim == -2 else 2
        cos, sin = cos.unsqueeze(axis), sin.unsqueeze(axis)
    elif seq_dim == -3:  # [s, r/2] against [b, s, h, d]: [s, 1, r/2]
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    c, s = cos.to(compute), sin.to(compute)
    x_rot = x[..., : 2 * half].to(compute)  # exact: every 16-bit value is a float32 one
    if layout == "half":
        x1, x2 = x_rot[..., :half], x_rot[..., half:]
    else:
        x1, x2 = x_rot[..., 0::2], x_rot[..., 1::2]
    o1 = x1 * c - x2 * s
    o2 = x2 * c + x1 * s
    if layout == "half":
        out = torch.cat([o1, o2], dim=-1)
    else:
        out = torch.stack([o1, o2], dim=-1).flatten(-2)
    return torch.cat([out.to(x.dtype), x[..., 2 * half :]], dim=-1)
