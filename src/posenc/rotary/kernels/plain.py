"""The plain torch rotation: the twin every fast path is proven equal to, bit for bit.

It lives beside the Triton and CPU kernels (as flash-attention's ``ops`` do) so that the
kernels never import the code that calls them: :mod:`posenc.rotary.apply` and
:class:`posenc.RotaryEmbedding` call :func:`posenc.rotary.kernels.dispatch_rotary`, which
picks a fused path or :func:`apply_rotary_torch`.

Shapes: ``x`` is ``[b, h, s, d]`` (``seq_dim=-2``) or ``[b, s, h, d]`` (``seq_dim=-3``);
``cos``/``sin`` are ``[s, r/2]`` or ``[b, s, r/2]``, broadcast over heads through views.
"""

from __future__ import annotations

import torch

from posenc._errors import PosEncError, check_tensor

__all__ = ["apply_rotary_torch", "check_cos_sin"]


def check_cos_sin(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, seq_dim: int) -> None:
    """Validate ``cos``/``sin`` for ``x``: floating, the same shape, ``[s, r/2]`` or
    ``[b, s, r/2]`` with ``s`` x's sequence length and ``b`` its batch size (or 1)."""
    check_tensor("cos", cos, floating=True)
    check_tensor("sin", sin, floating=True)
    if cos.shape != sin.shape:
        raise PosEncError(
            f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    seq_len, batch = x.shape[seq_dim], x.shape[0]
    if cos.ndim not in (2, 3) or cos.shape[-2] != seq_len:
        raise PosEncError(
            f"cos must be [s, r/2] or [b, s, r/2] with s == {seq_len} (x's sequence length), "
            f"got shape {tuple(cos.shape)}"
        )
    if cos.ndim == 3 and cos.shape[0] not in (1, batch):
        raise PosEncError(
            f"cos of shape [b, s, r/2] must have b == {batch} (x's batch size) or 1, "
            f"got shape {tuple(cos.shape)}"
        )


def apply_rotary_torch(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    layout: str = "half",
    seq_dim: int = -2,
) -> torch.Tensor:
    """Plain torch rotation (no validation): the reference the fast paths are tested against.

    ``x: [b, h, s, d]`` or ``[b, s, h, d]``; ``cos, sin: [s, r/2]`` or ``[b, s, r/2]``.
    """
    half = cos.shape[-1]
    rotary_dim = 2 * half
    compute = torch.promote_types(x.dtype, torch.float32)  # float32 math for bf16/fp16
    # Views that broadcast over heads: [.., s, r/2] -> [b|1, 1, s, r/2] or [b|1, s, 1, r/2].
    if cos.ndim == 2:
        cos, sin = cos[None], sin[None]  # [1, s, r/2]
    head_axis = 1 if seq_dim == -2 else 2
    c = cos.unsqueeze(head_axis).to(compute)
    s = sin.unsqueeze(head_axis).to(compute)
    x_rot = x[..., :rotary_dim]  # a view; channels past rotary_dim are untouched
    if layout == "half":
        x1, x2 = x_rot[..., :half].to(compute), x_rot[..., half:].to(compute)
    else:
        x1, x2 = x_rot[..., 0::2].to(compute), x_rot[..., 1::2].to(compute)
    o1 = x1 * c - x2 * s  # [b, h, s, r/2]
    o2 = x2 * c + x1 * s
    if layout == "half":
        out = torch.cat([o1, o2], dim=-1)
    else:
        out = torch.stack([o1, o2], dim=-1).flatten(-2)  # (o1_0, o2_0, o1_1, o2_1, ...)
    out = out.to(x.dtype)  # the one rounding to x's dtype
    if rotary_dim < x.shape[-1]:
        out = torch.cat([out, x[..., rotary_dim:]], dim=-1)
    return out
