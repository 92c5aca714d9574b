"""KERPLE (Chi et al., 2022, "Kernelized Relative Positional Embedding for Length
Extrapolation"), logarithmic variant: ``bias[h, i, j] = -r1_h * log(1 + r2_h * |i - j|)``.

``r1, r2 > 0`` are learned per head. The bias is 0 at distance 0 and falls, ever more
slowly, with distance: a conditionally positive definite kernel shifted into a bias.

Shapes: positions ``[q]`` / ``[k]`` (or ``[b, q]`` / ``[b, k]``) -> bias ``[h, q, k]``
(or ``[b, h, q, k]``), float32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import nn

from posenc._errors import (
    PosEncError,
    check_alloc,
    check_factory,
    check_float,
    check_int,
    check_same_device,
    check_tensor,
    check_traced,
    tracing,
)
from posenc.bias._common import PositionBias, check_pair, distance, head_first, pairs, renamed

__all__ = ["KerpleBias", "kerple_bias"]


def _kerple(r1: torch.Tensor, r2: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """``-r1 * log(1 + r2 * |d|)`` in float32; the formula of the bias and the score_mod."""
    return -(r1.float() * torch.log1p(r2.float() * d.abs()))


def kerple_bias(
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    r1: torch.Tensor,
    r2: torch.Tensor,
) -> torch.Tensor:
    """The logarithmic KERPLE bias ``-r1_h * log(1 + r2_h * |i - j|)``.

    Args:
        q_positions: query positions ``[q]`` or ``[b, q]``, integer or floating.
        k_positions: key positions ``[k]`` or ``[b, k]``.
        r1, r2: ``[h]`` positive per-head parameters (checked, one host synchronisation).

    Shape:
        ``[h, q, k]`` float32, or ``[b, h, q, k]`` when either position tensor is batched.

    Examples:
        >>> import torch
        >>> from posenc.bias import kerple_bias
        >>> kerple_bias(torch.tensor([3]), torch.arange(4), torch.tensor([1.0]), torch.tensor([1.0]))
        tensor([[[-1.3863, -1.0986, -0.6931, -0.0000]]])
    """
    qpos, kpos = check_pair(q_positions, k_positions)
    for name, r in (("r1", r1), ("r2", r2)):
        check_tensor(name, r, floating=True)
        if r.ndim != 1 or r.numel() == 0:
            raise PosEncError(f"{name} must be a non-empty [h] tensor, got shape {tuple(r.shape)}")
    check_same_device(("r1", "r2"), r1, r2)
    if r1.shape != r2.shape:
        raise PosEncError(
            f"r1 and r2 must have the same shape [h], got {tuple(r1.shape)} and {tuple(r2.shape)}"
        )
    valid = (r1 > 0) & (r2 > 0) & torch.isfinite(r1) & torch.isfinite(r2)
    if tracing():  # torch.compile / export: the rule as a graph assertion
        check_traced(valid, "r1 and r2 must be finite and > 0")
    elif not bool(valid.all()):
        raise PosEncError("r1 and r2 must be finite and > 0, got a tensor with values <= 0 or NaN")
    return _kerple_pairs(qpos, kpos, r1, r2)


def _kerple_pairs(qpos, kpos, r1, r2) -> torch.Tensor:
    qp, kp = pairs(qpos, kpos, r1.device)
    d = distance(qp, kp).unsqueeze(-3)  # [1, q, k] or [b, 1, q, k]
    return _kerple(head_first(r1, d.ndim - 1), head_first(r2, d.ndim - 1), d)


class KerpleBias(PositionBias):
    """KERPLE (logarithmic) attention bias with learned per-head ``r1``, ``r2``.

    ``r1`` is initialised uniformly in ``(0, 2)`` and ``r2`` in ``(0, 1)``; both are clamped
    to ``>= eps`` wherever they are used, which keeps them positive during training. KERPLE
    is meant for causal attention; keys after the query get the value of the same distance
    before it (the causal mask hides them).

    Args:
        num_heads: number of attention heads, ``>= 1``.
        eps: the smallest value of ``r1`` and ``r2``, ``> 0``.
        device, dtype: of the parameters.

    Shape:
        ``bias(q_len, k_len)`` -> ``[h, q_len, k_len]``; with ``[b, s]`` positions
        ``[b, h, q_len, k_len]``. When ``q_len < k_len`` and no positions are given the
        queries are the last ``q_len`` positions.

    Examples:
        >>> import torch, posenc
        >>> kerple = posenc.KerpleBias(2)
        >>> with torch.no_grad():
        ...     _ = kerple.r1.fill_(1.0), kerple.r2.fill_(1.0)
        >>> kerple.bias(1, 4)[0]
        tensor([[-1.3863, -1.0986, -0.6931, -0.0000]], grad_fn=<SelectBackward0>)
    """

    name: ClassVar[str] = "kerple"

    def __init__(
        self,
        num_heads: int,
        *,
        eps: float = 1e-2,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        device, dtype = check_factory(device, dtype)
        self.num_heads = check_int("num_heads", num_heads, min=1)
        self.eps = check_float("eps", eps, min=0.0, min_exclusive=True)
        check_alloc(
            "num_heads", self.num_heads, (2, self.num_heads), dtype or torch.float32, device
        )
        self.r1 = nn.Parameter(torch.empty(self.num_heads, device=device, dtype=dtype))
        self.r2 = nn.Parameter(torch.empty(self.num_heads, device=device, dtype=dtype))
        self.reset_parameters()
        self._set_config(num_heads=self.num_heads, eps=self.eps)

    def reset_parameters(self) -> None:
        nn.init.uniform_(self.r1, 0.0, 2.0)
        nn.init.uniform_(self.r2, 0.0, 1.0)

    @property
    def _device(self) -> torch.device:
        return self.r1.device

    def _position_bias(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """``-r1 log(1 + r2 |i - j|)`` of resolved positions, ``r1``, ``r2`` clamped to ``eps``."""
        r1, r2 = self.r1.clamp(min=self.eps), self.r2.clamp(min=self.eps)
        return _kerple_pairs(q_positions, k_positions, r1, r2)

    def score_mod_at(
        self, q_positions: torch.Tensor, k_positions: torch.Tensor
    ) -> Callable[..., torch.Tensor]:
        """:meth:`score_mod` of positions already resolved (no validation): the bias of one
        pair from the head's ``r1``, ``r2`` and the two positions."""
        q_at, k_at = self._index_positions(q_positions, k_positions)
        r1, r2, eps = self.r1, self.r2, self.eps

        def kerple_score_mod(score, b, h, q_idx, kv_idx):
            d = distance(q_at(b, q_idx), k_at(b, kv_idx))
            bias = _kerple(r1[h].clamp(min=eps), r2[h].clamp(min=eps), d)
            return score + bias.to(score.dtype)

        return kerple_score_mod


def __getattr__(name: str) -> Any:
    return renamed(__name__, name, {"Kerple": KerpleBias})
