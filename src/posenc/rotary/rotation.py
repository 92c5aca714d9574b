"""``Rotation``, what a rotary module computes once per forward pass (cos/sin of the query
and key positions), the rules for rotating queries and keys by one, and the rotation itself.

:meth:`posenc.RotaryEmbedding.rotation_at` makes a :class:`Rotation`;
:meth:`~posenc.RotaryEmbedding.rotate` checks q, k and the rotation here
(:func:`check_qk`, :func:`check_rotation`) and :func:`rotate_qk` turns them into kernel
calls: the same tokens in one fused pass over q and k, other tokens one tensor at a time.
Every rotary module (and :mod:`posenc.attend`, through the rotary protocol) rotates through
these, so a subclass with cos/sin of its own (xPos) only makes another :class:`Rotation`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from posenc._errors import PosEncError, check_last_dim, check_tensor
from posenc.rotary.kernels.checks import check_cos_sin
from posenc.rotary.kernels.dispatch import dispatch_rotary

__all__ = ["Rotation", "check_cos_sin_dtype", "check_qk", "check_rotation", "rotate_qk"]


class Rotation(NamedTuple):
    """cos/sin of the queries' and the keys' positions, one value per frequency
    (``[.., s, rotary_dim / 2]``), xPos scales included; ``cos_k is cos_q`` when the
    queries and keys are the same tokens (then rotated in one fused pass)."""

    cos_q: torch.Tensor
    sin_q: torch.Tensor
    cos_k: torch.Tensor
    sin_k: torch.Tensor


def check_cos_sin_dtype(dtype: object) -> None:
    """cos/sin are float32 (for float32, bf16 and fp16 q/k) or float64 (for float64)."""
    if dtype not in (torch.float32, torch.float64):
        raise PosEncError(f"dtype must be torch.float32 or torch.float64, got {dtype!r}")


def check_qk(q: Any, k: Any, seq_dim: int, head_dim: int) -> None:
    """Queries and keys: floating ``[b, h, s, d]`` (``[b, s, h, d]``) with ``d = head_dim``."""
    for name, x in (("q", q), ("k", k)):
        check_tensor(name, x, floating=True)
        if x.ndim != 4:
            layout = "[b, h, s, d]" if seq_dim == -2 else "[b, s, h, d]"
            raise PosEncError(
                f"{name} must be {layout} (seq_dim={seq_dim}), got shape {tuple(x.shape)}"
            )
        check_last_dim(name, x, head_dim)


def check_rotation(
    q: torch.Tensor, k: torch.Tensor, rotation: Any, seq_dim: int, half: int
) -> None:
    """``RotaryEmbedding.rotate``'s rules for ``rotation``: a :class:`Rotation` whose cos/sin
    fit ``q`` and ``k`` (on one device) and hold ``half`` frequencies each."""
    if not isinstance(rotation, Rotation):
        raise PosEncError(
            f"rotation must be a Rotation from RotaryEmbedding.rotation, got "
            f"{type(rotation).__name__}"
        )
    if k.device != q.device:
        raise PosEncError(f"k must be on q's device {q.device}, got {k.device}")
    check_cos_sin(q, rotation.cos_q, rotation.sin_q, seq_dim, name="q")
    check_cos_sin(k, rotation.cos_k, rotation.sin_k, seq_dim, name="k")
    for name, t in (("cos_q", rotation.cos_q), ("cos_k", rotation.cos_k)):
        if t.shape[-1] != half:
            raise PosEncError(
                f"rotation.{name} must have {half} frequencies (len(inv_freq)), got "
                f"shape {tuple(t.shape)}"
            )


def rotate_qk(
    q: torch.Tensor, k: torch.Tensor, rotation: Rotation, layout: str, seq_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``q`` and ``k`` rotated by ``rotation`` in the pairing ``layout`` (all checked):
    in one fused pass when they are the same tokens (``cos_k is cos_q``), else each by
    its own cos/sin."""
    if rotation.cos_k is rotation.cos_q:
        return dispatch_rotary(q, k, rotation.cos_q, rotation.sin_q, layout=layout, seq_dim=seq_dim)
    q_out, _ = dispatch_rotary(
        q, None, rotation.cos_q, rotation.sin_q, layout=layout, seq_dim=seq_dim
    )
    k_out, _ = dispatch_rotary(
        k, None, rotation.cos_k, rotation.sin_k, layout=layout, seq_dim=seq_dim
    )
    return q_out, k_out
