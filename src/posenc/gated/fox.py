"""Forgetting attention (Lin et al., 2025, "Forgetting Transformer"): a data-dependent decay.

Each token ``t`` of each head has a forget gate ``f_t = sigmoid(w . x_t + b)`` computed by
the model from the layer input ``x_t``; query ``i`` sees key ``j`` through every gate after
it, ``prod_{l=j+1..i} f_l``, multiplied into the attention weights. In logits that is
the bias ``D_ij = sum_{l=j+1..i} log f_l = c_i - c_j`` with ``c`` the cumulative sum of
the log gates: ALiBi when every ``log f`` is the same ``-m``, but learned per token, so a
head can hold its memory across a span and drop it at a boundary. The paper trains it
with no other position encoding.

This module holds no parameters: the gates are the model's (``TinyTransformer`` gives
each layer a projection ``dim -> num_heads``), passed to :func:`posenc.attention` as
``gates`` (the log forget gates ``log f_t <= 0``, ``[b, h, k]``). The cumulative sums are
taken in float64 and split into a float32 head and tail, so ``c_i - c_j`` keeps float32
precision at any length instead of losing digits as ``c`` grows.

Shapes: ``gates [b, h, k]`` -> bias ``[b, h, q, k]`` (queries are the last ``q`` keys),
added to the scaled logits; causal only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch

from posenc._base import GatedEncoding
from posenc._errors import (
    PosEncError,
    check_alloc,
    check_int,
    check_tensor,
    check_traced,
    tracing,
)
from posenc.positions import causal_pairs

__all__ = ["FoXBias", "fox_bias", "fox_cumulative"]


def _sums(gates: torch.Tensor) -> torch.Tensor:
    """``c = cumsum(gates)`` over the keys, in float64 (differentiable)."""
    return gates.to(torch.float64).cumsum(-1)


def _cumulative(gates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``c = cumsum(gates)`` in float64 as float32 ``(head, tail)`` with ``head + tail = c``
    (float64 gates: ``c`` itself and zeros)."""
    c = _sums(gates)
    if gates.dtype == torch.float64:
        return c, torch.zeros_like(c)
    head = c.to(torch.float32)
    return head, (c - head.to(torch.float64)).to(torch.float32)


def fox_cumulative(gates: torch.Tensor) -> torch.Tensor:
    """``c_t = sum_{l <= t} gates_l`` (float64, ``[b, h, k]``): ``D_ij = c_i - c_j``.

    Args:
        gates: log forget gates ``[b, h, k]``, checked as :func:`fox_bias` checks them.

    Examples:
        >>> import torch
        >>> from posenc.gated import fox_cumulative
        >>> fox_cumulative(torch.full((1, 1, 3), -0.5))
        tensor([[[-0.5000, -1.0000, -1.5000]]], dtype=torch.float64)
    """
    return _sums(_check_gates(gates))


def _rows(
    head: torch.Tensor, tail: torch.Tensor, q_len: int, start: int, stop: int
) -> torch.Tensor:
    """``D`` of query rows ``start:stop`` (of ``q_len``, the last keys): ``[b, h, rows, k]``."""
    k_len = head.shape[-1]
    first = k_len - q_len + start
    qh, qt = head[..., first : first + stop - start], tail[..., first : first + stop - start]
    return (qh[..., :, None] - head[..., None, :]) + (qt[..., :, None] - tail[..., None, :])


_FLOAT32_MAX = float(torch.finfo(torch.float32).max)
_FLOAT64_MAX = float(torch.finfo(torch.float64).max)


def _check_gates(gates: Any, num_heads: int | None = None, *, values: bool = True) -> torch.Tensor:
    """``gates``: a floating ``[b, h, k]`` tensor (``num_heads`` heads when given) of log
    forget gates ``<= 0`` whose sums over the keys stay finite in the dtype the cumulative
    sums are kept in (float64 for float64 gates, float32 otherwise): one host
    synchronisation, a graph assertion under ``torch.compile``."""
    check_tensor("gates", gates, floating=True)
    if gates.ndim != 3 or 0 in gates.shape:
        raise PosEncError(
            f"gates must be the log forget gates [b, h, k] (one per token and head), got shape "
            f"{tuple(gates.shape)}"
        )
    if num_heads is not None and gates.shape[1] != num_heads:
        raise PosEncError(
            f"gates must have {num_heads} heads (the encoding's num_heads), got shape "
            f"{tuple(gates.shape)}"
        )
    if values:
        _check_gate_values(gates)
    return gates


def _check_gate_values(gates: torch.Tensor) -> None:
    """Log forget gates are ``<= 0`` (NaN is not) and their sum over the keys (the last
    cumulative sum, the smallest) is ``>= -max`` of the cumulative sums' dtype (``-inf``
    is not)."""
    if gates.device.type == "meta":
        raise PosEncError("gates must hold values, got a tensor on the meta device")
    g = gates.detach()
    limit = _FLOAT64_MAX if g.dtype == torch.float64 else _FLOAT32_MAX
    positive = ~(g <= 0)  # NaN included
    overflow = ~(g.to(torch.float64).sum(-1) >= -limit)  # -inf and NaN included
    if tracing():
        check_traced(
            ~positive.any() & ~overflow.any(),
            "gates must be log forget gates <= 0 whose sums over the keys are finite",
        )
        return
    bad_positive, bad_sum = torch.stack([positive.any(), overflow.any()]).tolist()
    if bad_positive:
        worst = g[positive].flatten()[0].item()
        raise PosEncError(
            "gates must be log forget gates log f_t <= 0 (logsigmoid of the gate logits), "
            f"got a tensor holding {worst}"
        )
    if bad_sum:
        raise PosEncError(
            f"gates must sum to >= -{limit:.4g} over the keys (their cumulative sums are kept "
            f"in {'float64' if limit == _FLOAT64_MAX else 'float32'}), got a tensor holding "
            f"-inf or gates whose sum overflows, smallest gate {g.min().item()}"
        )


def fox_bias(gates: torch.Tensor, q_len: int | None = None) -> torch.Tensor:
    """Forgetting attention's bias ``D_ij = sum_{l=j+1..i'} gates_l`` (``i' = i + k - q``:
    the queries are the last ``q_len`` keys), ``-inf`` on the keys after the query.

    Args:
        gates: log forget gates ``log f_t <= 0``, ``[b, h, k]``, floating; their sum over
            the keys must be finite in the dtype of the cumulative sums (float64 for float64
            gates, else float32). Gates ``> 0``, NaN, ``-inf`` or an overflowing sum raise
            :class:`~posenc.PosEncError` (one host synchronisation).
        q_len: queries (default: every key is a query).

    Shape:
        ``[b, h, q_len, k]``, float32 (float64 for float64 gates).

    Examples:
        >>> import torch
        >>> from posenc.gated import fox_bias
        >>> fox_bias(torch.full((1, 1, 3), -0.5))[0, 0]  # a constant gate: ALiBi's slope 0.5
        tensor([[ 0.0000,    -inf,    -inf],
                [-0.5000,  0.0000,    -inf],
                [-1.0000, -0.5000,  0.0000]])
    """
    return _fox_bias(_check_gates(gates), q_len)


def _fox_bias(gates: torch.Tensor, q_len: Any) -> torch.Tensor:
    """:func:`fox_bias` of checked gates."""
    b, h, k_len = gates.shape
    q_len = k_len if q_len is None else check_int("q_len", q_len, min=1, max=k_len)
    check_alloc("gates", tuple(gates.shape), (b, h, q_len, k_len))
    bias = _rows(*_cumulative(gates), q_len, 0, q_len)
    return bias.masked_fill(~causal_pairs(q_len, k_len, device=gates.device), float("-inf"))


class FoXBias(GatedEncoding):
    """Forgetting attention's data-dependent decay (see the module docs).

    A :class:`~posenc._base.GatedEncoding`: :func:`posenc.attention` needs ``gates`` (the
    log forget gates ``[b, h, k]`` of the keys' tokens) and ``causal=True``; the positions
    it is given are not read. :func:`fox_bias` is the same term as a pure function of the
    gates. ``TinyTransformer(encoding="fox")`` computes the gates in every layer
    as ``logsigmoid(x W_f + b_f)``, ``W_f`` of shape ``[dim, num_heads]`` (the paper's
    forget gate), and caches them with the keys.

    Calling the module, ``fox(gates, q_len=None)``, returns its term (:meth:`forward`,
    :func:`fox_bias` with the heads checked). :meth:`check_gates` is what attention calls
    first; :meth:`gate_bias_at`, :meth:`gate_score_mod_at` and :meth:`gate_cumulative` (FoX is
    ``separable``: SDPA folds its term into the keys) are the protocol's methods of
    gates it has checked and validate nothing.

    Args:
        num_heads: heads of the queries (and of the gates).

    Examples:
        >>> import torch, posenc
        >>> fox = posenc.build("fox", num_heads=2)
        >>> q, k, v = torch.randn(3, 1, 2, 5, 8).unbind(0)
        >>> gates = torch.nn.functional.logsigmoid(torch.randn(1, 2, 5))
        >>> posenc.attention(q, k, v, encoding=fox, causal=True, gates=gates).shape
        torch.Size([1, 2, 5, 8])
    """

    name: ClassVar[str] = "fox"
    separable: ClassVar[bool] = True

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads, min=1)
        self._set_config(num_heads=self.num_heads)

    def check_gates(self, gates: Any, b: int, k_len: int, device: torch.device) -> torch.Tensor:
        """Raise unless ``gates`` is ``[b, num_heads, k_len]`` floating on ``device``, of log
        forget gates ``<= 0`` whose sums over the keys are finite (as :func:`fox_bias`
        checks them: one host synchronisation)."""
        gates = _check_gates(gates, self.num_heads, values=False)
        if gates.shape[0] != b or gates.shape[2] != k_len:
            raise PosEncError(
                f"gates must be [b, h, k] = [{b}, {self.num_heads}, {k_len}], got shape "
                f"{tuple(gates.shape)}"
            )
        if gates.device != device:
            raise PosEncError(f"gates must be on {device} (that of q), got {gates.device}")
        _check_gate_values(gates)
        return gates

    def forward(self, gates: torch.Tensor, q_len: int | None = None) -> torch.Tensor:
        """``module(gates, q_len)``: the term itself, :func:`fox_bias` of ``gates``
        ``[b, num_heads, k]`` (checked as there, and for ``num_heads`` heads), ``-inf`` on
        the keys after the query: ``[b, h, q_len, k]``."""
        return _fox_bias(_check_gates(gates, self.num_heads), q_len)

    def gate_bias_at(
        self, gates: torch.Tensor, q_len: int, *, start: int = 0, stop: int | None = None
    ) -> torch.Tensor:
        """``D`` of query rows ``start:stop`` (default all ``q_len``), no mask: ``[b, h, rows, k]``."""
        stop = q_len if stop is None else stop
        return _rows(*_cumulative(gates), q_len, start, stop)

    def gate_score_mod_at(self, gates: torch.Tensor, q_len: int) -> Callable[..., torch.Tensor]:
        """:meth:`gate_bias_at` from indices: the split cumulative sums, gathered per pair."""
        head, tail = _cumulative(gates)
        first = head.shape[-1] - q_len
        qh, qt = head[..., first:].contiguous(), tail[..., first:].contiguous()
        kh, kt = head.contiguous(), tail.contiguous()

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + (
                (qh[b, h, q_idx] - kh[b, h, kv_idx]) + (qt[b, h, q_idx] - kt[b, h, kv_idx])
            )

        return score_mod

    def gate_cumulative(self, gates: torch.Tensor) -> torch.Tensor:
        """``c = cumsum(gates)`` in float64 (``[b, h, k]``): the term is ``c_i - c_j``."""
        return _sums(gates)
