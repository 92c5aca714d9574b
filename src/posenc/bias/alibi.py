"""ALiBi (Press et al., 2022, "Train Short, Test Long"): a linear distance penalty per head.

``bias[h, i, j] = -m_h * (i - j)`` for query position ``i`` and key position ``j``, with
geometric head slopes ``m_h``; without a causal mask (``causal=False``, an encoder) the
bias is ``-m_h * |i - j|``.

Shapes: positions ``[q]`` / ``[k]`` (or ``[b, q]`` / ``[b, k]``) -> bias ``[h, q, k]``
(or ``[b, h, q, k]``), float32, added to the already scaled logits ``q k^T * scale``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch

from posenc._errors import PosEncError, check_choice, check_device, check_int, check_tensor
from posenc.bias._common import (
    ExactConstants,
    PositionBias,
    check_pair,
    distance,
    head_first,
    pairs,
    renamed,
)

__all__ = ["MAX_HEADS", "ALiBiBias", "alibi_bias", "alibi_slopes"]

# The most heads ALiBi gives slopes to (the slopes are a Python list, built head by head).
MAX_HEADS = 1 << 16
_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def _slope_values(num_heads: int) -> list[float]:
    """The paper's slopes in float64: ``2^(-8 k / n)``, ``k = 1..n`` for ``n`` a power of two.

    Other head counts take all slopes of the closest lower power of two ``p``, then the
    first ``num_heads - p`` odd-indexed slopes (1st, 3rd, ...) of ``2p`` heads.
    """
    p = 1 << (num_heads.bit_length() - 1)  # closest power of two <= num_heads
    values = [2.0 ** (-8.0 * k / p) for k in range(1, p + 1)]
    # Slopes 1, 3, 5, ... of 2p heads: 2^(-8 (2k - 1) / (2p)).
    values += [2.0 ** (-4.0 * (2 * k - 1) / p) for k in range(1, num_heads - p + 1)]
    return values


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi's head slopes, the geometric sequence of the paper.

    For ``n`` heads with ``n`` a power of two the slopes are ``2^(-8/n), 2^(-16/n), ...,
    2^(-8)``. For other ``n`` the paper takes the ``p`` slopes of the closest lower power of
    two ``p``, then the odd-indexed slopes (1st, 3rd, ...) of ``2p`` heads until there are
    ``n``. Values are computed in float64 and rounded once.

    Args:
        num_heads: number of attention heads, ``>= 1``.

    Shape:
        ``[num_heads]``, float32.

    Examples:
        >>> import posenc
        >>> posenc.alibi_slopes(4)
        tensor([0.2500, 0.0625, 0.0156, 0.0039])
        >>> posenc.alibi_slopes(3)
        tensor([0.0625, 0.0039, 0.2500])
    """
    num_heads = check_int("num_heads", num_heads, min=1, max=MAX_HEADS)
    return torch.tensor(_slope_values(num_heads), dtype=torch.float64).to(torch.float32)


def _check_slopes(slopes: torch.Tensor) -> torch.Tensor:
    check_tensor("slopes", slopes, floating=True)
    if slopes.ndim != 1 or slopes.numel() == 0:
        raise PosEncError(f"slopes must be a non-empty [h] tensor, got shape {tuple(slopes.shape)}")
    return slopes


def _alibi(slopes: torch.Tensor, d: torch.Tensor, causal: bool) -> torch.Tensor:
    """``-m * d`` (causal) or ``-m * |d|`` for distances ``d = i - j``; the one formula of both
    the materialised bias and the score_mod, so they round the same."""
    if not causal:
        d = d.abs()
    return -(slopes * d)


def alibi_bias(
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    slopes: torch.Tensor,
    *,
    causal: bool = True,
) -> torch.Tensor:
    """The ALiBi bias between query and key positions.

    ``causal=True`` gives ``-m_h * (i - j)`` for every pair, including keys after the
    query (``j > i``), where the same formula gives ``+m_h * (j - i)``: a causal mask hides
    those pairs, so their value never reaches the softmax. ``causal=False`` gives
    ``-m_h * |i - j|`` (attention in both directions, an encoder).

    Args:
        q_positions: query positions ``[q]`` or ``[b, q]``, integer or floating.
        k_positions: key positions ``[k]`` or ``[b, k]``.
        slopes: ``[h]`` head slopes, e.g. :func:`alibi_slopes`.
        causal: the formula for ``j > i``, as above.

    Shape:
        ``[h, q, k]`` float32, or ``[b, h, q, k]`` when either position tensor is batched.

    Examples:
        >>> import torch, posenc
        >>> from posenc.bias import alibi_bias
        >>> alibi_bias(torch.arange(3), torch.arange(3), torch.tensor([0.5]))
        tensor([[[-0.0000,  0.5000,  1.0000],
                 [-0.5000, -0.0000,  0.5000],
                 [-1.0000, -0.5000, -0.0000]]])
    """
    qpos, kpos = check_pair(q_positions, k_positions)
    slopes = _check_slopes(slopes)
    check_choice("causal", causal, (True, False))
    return _alibi_pairs(qpos, kpos, slopes, bool(causal))


def _alibi_pairs(
    qpos: torch.Tensor, kpos: torch.Tensor, slopes: torch.Tensor, causal: bool
) -> torch.Tensor:
    """:func:`alibi_bias` of checked positions and slopes, on the slopes' device."""
    qp, kp = pairs(qpos, kpos, slopes.device)
    d = distance(qp, kp)  # [q, k] or [b, q, k]
    m = head_first(slopes.to(torch.float32), d.ndim)  # [h, 1, 1] or [1, h, 1, 1]
    return _alibi(m, d.unsqueeze(-3), causal)


class ALiBiBias(ExactConstants, PositionBias):
    """ALiBi attention bias with the paper's slopes (or your own).

    The slopes are a non-persistent float32 buffer rebuilt exactly after every ``.to()``, so
    ``module.to(torch.bfloat16)`` moves them but does not lower them; the bias is float32.

    Args:
        num_heads: number of attention heads, ``>= 1``.
        causal: ``True``: ``-m (i - j)`` (the paper; a causal mask hides ``j > i``);
            ``False``: ``-m |i - j|`` for attention without a causal mask.
        slopes: ``num_heads`` non-negative slopes instead of :func:`alibi_slopes`.
        device: where the slopes live (default: the default device).

    Shape:
        ``bias(q_len, k_len)`` -> ``[h, q_len, k_len]``; with ``[b, s]`` positions
        ``[b, h, q_len, k_len]``. When ``q_len < k_len`` and no positions are given the
        queries are the last ``q_len`` positions (decoding with a KV cache).

    Examples:
        >>> import posenc
        >>> alibi = posenc.ALiBiBias(2)
        >>> alibi.bias(3)[0]  # head 0, slope 2^-4
        tensor([[-0.0000,  0.0625,  0.1250],
                [-0.0625, -0.0000,  0.0625],
                [-0.1250, -0.0625, -0.0000]])
        >>> alibi.bias(1, 3).shape  # one decoding step over three keys
        torch.Size([2, 1, 3])
    """

    name: ClassVar[str] = "alibi"

    def __init__(
        self,
        num_heads: int,
        *,
        causal: bool = True,
        slopes: Sequence[float] | torch.Tensor | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        device = check_device("device", device)
        self.num_heads = check_int("num_heads", num_heads, min=1, max=MAX_HEADS)
        self.causal = bool(check_choice("causal", causal, (True, False)))
        if slopes is None:
            values = _slope_values(self.num_heads)
        else:
            values = self._given_slopes(slopes)
        self._slope_values = tuple(values)
        self._install_constants(device)
        self._set_config(
            num_heads=self.num_heads,
            causal=self.causal,
            slopes=None if slopes is None else list(values),
        )

    def _given_slopes(self, slopes: Sequence[float] | torch.Tensor) -> list[float]:
        if isinstance(slopes, torch.Tensor):
            if slopes.ndim != 1:
                raise PosEncError(
                    f"slopes must be a 1-D [h] tensor, got shape {tuple(slopes.shape)}"
                )
            slopes = slopes.tolist()
        if isinstance(slopes, (str, bytes)) or not isinstance(slopes, Sequence):
            raise PosEncError(f"slopes must be a sequence of numbers, got {slopes!r}")
        if len(slopes) != self.num_heads:
            raise PosEncError(
                f"slopes must have num_heads ({self.num_heads}) values, got {len(slopes)}"
            )
        values = []
        for i, s in enumerate(slopes):
            if isinstance(s, bool) or not isinstance(s, (int, float)):
                raise PosEncError(f"slopes[{i}] must be a number, got {s!r}")
            if not (0.0 <= float(s) <= _FLOAT32_MAX):
                raise PosEncError(
                    f"slopes[{i}] must be finite and >= 0, got {s} (finite in float32, the "
                    "slopes' dtype)"
                )
            values.append(float(s))
        return values

    def _constants(self) -> dict[str, torch.Tensor]:
        return {"slopes": torch.tensor(self._slope_values, dtype=torch.float64).float()}

    slopes: torch.Tensor

    @property
    def _device(self) -> torch.device:
        return self.slopes.device

    def _position_bias(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """``-m (i - j)`` (or ``-m |i - j|``) of resolved positions, on the slopes' device."""
        return _alibi_pairs(q_positions, k_positions, self.slopes, self.causal)

    def score_mod_at(
        self, q_positions: torch.Tensor, k_positions: torch.Tensor
    ) -> Callable[..., torch.Tensor]:
        """:meth:`score_mod` of positions already resolved (no validation): the bias of one
        pair from the head's slope and the two positions."""
        q_at, k_at = self._index_positions(q_positions, k_positions)
        slopes, causal = self.slopes, self.causal

        def alibi_score_mod(score, b, h, q_idx, kv_idx):
            d = distance(q_at(b, q_idx), k_at(b, kv_idx))
            return score + _alibi(slopes[h], d, causal).to(score.dtype)

        return alibi_score_mod


def __getattr__(name: str) -> Any:
    return renamed(__name__, name, {"ALiBi": ALiBiBias})
