"""Relative position representations (Shaw et al., 2018): learned vectors of clipped distance.

Each relative distance ``j - i`` (key minus query position), clipped to
``[-max_distance, max_distance]``, has a learned key vector ``a^K`` and, optionally, a value
vector ``a^V``, shared by all heads as in the paper. Attention becomes

``e_ij = (q_i . k_j + q_i . a^K_ij) * scale``  and  ``z_i = sum_j p_ij (v_j + a^V_ij)``,

so the key term is a bias that depends on the query (``q_i . a^K_ij`` with the scaled
query) and the value term adds ``sum_j p_ij a^V_ij`` to the attention output.

Shapes: ``q: [b, h, q, d]``, tables ``[2 * max_distance + 1, d]``, positions ``[q]`` / ``[k]``
(or ``[b, q]`` / ``[b, k]``) -> logits ``[b, h, q, k]``; ``probs: [b, h, q, k]`` -> ``[b, h, q, d]``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from posenc._base import BiasEncoding
from posenc._errors import (
    PosEncError,
    check_alloc,
    check_choice,
    check_factory,
    check_int,
    check_same_device,
    check_tensor,
)
from posenc.bias._common import (
    canonical_pair,
    check_integer_positions,
    check_module_device,
    check_pair,
    pairs,
    renamed,
    resolve_pair,
)

__all__ = ["ShawRelativeBias", "shaw_relative_logits", "shaw_relative_values"]


def _check_table(name: str, table: torch.Tensor, head_dim: int | None = None) -> int:
    """Validate a ``[2 K + 1, d]`` table (``d == head_dim`` when given); returns ``K``."""
    check_tensor(name, table, floating=True)
    if table.ndim != 2 or table.shape[0] % 2 == 0:
        raise PosEncError(
            f"{name} must be [2 * max_distance + 1, d] (an odd number of rows), "
            f"got shape {tuple(table.shape)}"
        )
    if head_dim is not None and table.shape[1] != head_dim:
        raise PosEncError(
            f"{name} must have last dimension {head_dim} (the head dim), got shape "
            f"{tuple(table.shape)}"
        )
    return (table.shape[0] - 1) // 2


def _check_4d(name: str, x: torch.Tensor, what: str) -> torch.Tensor:
    check_tensor(name, x, floating=True)
    if x.ndim != 4 or x.shape[0] < 1:
        raise PosEncError(f"{name} must be {what} with b >= 1, got shape {tuple(x.shape)}")
    return x


def _check_index(
    q_positions: torch.Tensor, k_positions: torch.Tensor, shape: tuple[int, int, int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate integer positions that fit ``shape = (b, h, q, k)``."""
    qpos, kpos = check_pair(q_positions, k_positions)
    check_integer_positions("Shaw relative positions", qpos, kpos)
    b, _, q_len, k_len = shape
    if qpos.shape[-1] != q_len or kpos.shape[-1] != k_len:
        raise PosEncError(
            f"q_positions and k_positions must have lengths {q_len} and {k_len}, got shapes "
            f"{tuple(qpos.shape)} and {tuple(kpos.shape)}"
        )
    for name, p in (("q_positions", qpos), ("k_positions", kpos)):
        if p.ndim == 2 and p.shape[0] not in (1, b):
            raise PosEncError(
                f"{name} of shape [b, s] must have b == {b} (the batch size) or 1, "
                f"got shape {tuple(p.shape)}"
            )
    return qpos, kpos


def _index(
    qpos: torch.Tensor,
    kpos: torch.Tensor,
    max_distance: int,
    shape: tuple[int, int, int, int],
    device: torch.device,
) -> torch.Tensor:
    """Row of the table for every pair, ``clip(j - i) + K``, expanded to ``[b, h, q, k]``."""
    qp, kp = pairs(qpos, kpos, device)  # integers: int64
    rows = (kp - qp).clamp(-max_distance, max_distance) + max_distance  # [q, k] or [b', q, k]
    rows = rows.unsqueeze(-3)  # [1, q, k] or [b', 1, q, k]
    return rows.expand(shape)


def shaw_relative_logits(
    q: torch.Tensor,
    table: torch.Tensor,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
) -> torch.Tensor:
    """The key term ``q_i . a^K[clip(j - i) + K]`` of every query, key pair and head.

    Computed as ``q @ table^T`` (``[b, h, q, 2K + 1]``) and a gather, never an
    ``[q, k, d]`` tensor. ``K`` (``max_distance``) is read from the table's rows.

    Args:
        q: queries ``[b, h, q, d]``, already multiplied by the attention scale.
        table: relative key vectors ``[2 * max_distance + 1, d]``; row ``r`` is distance
            ``r - max_distance``.
        q_positions: integer query positions ``[q]`` or ``[b, q]``.
        k_positions: integer key positions ``[k]`` or ``[b, k]``.

    Shape:
        ``[b, h, q, k]`` float32.

    Examples:
        >>> import torch
        >>> from posenc.bias import shaw_relative_logits
        >>> table = torch.tensor([[-1.0], [0.0], [1.0]])  # distances -1, 0, 1 (and beyond)
        >>> q = torch.ones(1, 1, 3, 1)
        >>> shaw_relative_logits(q, table, torch.arange(3), torch.arange(3))[0, 0]
        tensor([[ 0.,  1.,  1.],
                [-1.,  0.,  1.],
                [-1., -1.,  0.]])
    """
    _check_4d("q", q, "[b, h, q, d]")
    max_distance = _check_table("table", table, q.shape[-1])
    check_same_device(("q", "table"), q, table)
    b, h, q_len, _ = q.shape
    k_len = (
        k_positions.shape[-1] if isinstance(k_positions, torch.Tensor) and k_positions.ndim else -1
    )
    qpos, kpos = _check_index(q_positions, k_positions, (b, h, q_len, k_len))
    return _logits(q, table, qpos, kpos, max_distance)


def _logits(
    q: torch.Tensor, table: torch.Tensor, qpos: torch.Tensor, kpos: torch.Tensor, max_distance: int
) -> torch.Tensor:
    """:func:`shaw_relative_logits` of checked inputs."""
    b, h, q_len, _ = q.shape
    index = _index(qpos, kpos, max_distance, (b, h, q_len, kpos.shape[-1]), q.device)
    per_distance = q.to(torch.float32) @ table.to(torch.float32).t()  # [b, h, q, 2K + 1]
    return torch.gather(per_distance, -1, index)


def shaw_relative_values(
    probs: torch.Tensor,
    table: torch.Tensor,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
) -> torch.Tensor:
    """The value term ``sum_j p_ij a^V[clip(j - i) + K]`` of every query and head.

    The probabilities are first summed per distance (``[b, h, q, 2K + 1]``), then multiplied
    by the table, never an ``[q, k, d]`` tensor.

    Args:
        probs: attention probabilities ``[b, h, q, k]``.
        table: relative value vectors ``[2 * max_distance + 1, d]``.
        q_positions, k_positions: integer positions as in :func:`shaw_relative_logits`.

    Shape:
        ``[b, h, q, d]`` float32 (added to ``probs @ v``).

    Examples:
        >>> import torch
        >>> from posenc.bias import shaw_relative_values
        >>> table = torch.tensor([[-1.0], [0.0], [1.0]])
        >>> probs = torch.full((1, 1, 2, 2), 0.5)
        >>> shaw_relative_values(probs, table, torch.arange(2), torch.arange(2))[0, 0]
        tensor([[ 0.5000],
                [-0.5000]])
    """
    _check_4d("probs", probs, "[b, h, q, k]")
    max_distance = _check_table("table", table)
    check_same_device(("probs", "table"), probs, table)
    b, h, q_len, k_len = probs.shape
    qpos, kpos = _check_index(q_positions, k_positions, (b, h, q_len, k_len))
    return _values(probs, table, qpos, kpos, max_distance)


def _values(
    probs: torch.Tensor,
    table: torch.Tensor,
    qpos: torch.Tensor,
    kpos: torch.Tensor,
    max_distance: int,
) -> torch.Tensor:
    """:func:`shaw_relative_values` of checked inputs."""
    b, h, q_len, k_len = probs.shape
    index = _index(qpos, kpos, max_distance, (b, h, q_len, k_len), probs.device)
    per_distance = torch.zeros(
        b, h, q_len, table.shape[0], dtype=torch.float32, device=probs.device
    ).scatter_add(-1, index, probs.to(torch.float32))  # [b, h, q, 2K + 1]
    return per_distance @ table.to(torch.float32)


class ShawRelativeBias(BiasEncoding):
    """Shaw et al.'s relative position representations for keys (and optionally values).

    A query-dependent bias (``query_dependent = True``): :meth:`bias` needs the scaled
    queries ``q``. With ``values=True`` it is also value-dependent and :meth:`value_bias`
    gives the term added to ``probs @ v``. The tables are parameters shared by all heads
    (as in the paper), initialised from ``N(0, 0.02^2)``. :meth:`bias_at` and
    :meth:`value_bias_at` take positions already resolved by
    :func:`posenc.positions.resolve_pair` (what attention calls) and validate none.

    Args:
        num_heads: number of attention heads, ``>= 1`` (checked against ``q``).
        head_dim: size of each head, ``>= 1``.
        max_distance: the clipping distance ``K >= 1``; distances beyond share the edge rows.
        values: also learn relative value vectors.
        device, dtype: of the tables.

    Shape:
        ``bias(q_len, k_len, q=[b, h, q_len, d])`` -> ``[b, h, q_len, k_len]``;
        ``value_bias(probs=[b, h, q, k])`` -> ``[b, h, q, d]``. Positions must be integers.
        When ``q_len < k_len`` and no positions are given the queries are the last ``q_len``.

    Examples:
        >>> import torch, posenc
        >>> shaw = posenc.ShawRelativeBias(4, 8, max_distance=2, values=True)
        >>> shaw.rel_k.shape
        torch.Size([5, 8])
        >>> q = torch.randn(1, 4, 3, 8)
        >>> shaw.bias(3, q=q).shape
        torch.Size([1, 4, 3, 3])
        >>> shaw.value_bias(torch.rand(1, 4, 3, 3).softmax(-1)).shape
        torch.Size([1, 4, 3, 8])
    """

    name: ClassVar[str] = "shaw"
    query_dependent: ClassVar[bool] = True

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        *,
        max_distance: int = 16,
        values: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        device, dtype = check_factory(device, dtype)
        self.num_heads = check_int("num_heads", num_heads, min=1)
        self.head_dim = check_int("head_dim", head_dim, min=1)
        self.max_distance = check_int("max_distance", max_distance, min=1)
        values = bool(check_choice("values", values, (True, False)))
        # Instance attribute: whether attention must call value_bias.
        self.value_dependent = values
        rows = 2 * self.max_distance + 1
        name = "max_distance" if rows > self.head_dim else "head_dim"
        value = self.max_distance if rows > self.head_dim else self.head_dim
        check_alloc(name, value, (2, rows, self.head_dim), dtype or torch.float32, device)
        self.rel_k = nn.Parameter(torch.empty(rows, self.head_dim, device=device, dtype=dtype))
        self.rel_v: nn.Parameter | None
        if values:
            self.rel_v = nn.Parameter(torch.empty(rows, self.head_dim, device=device, dtype=dtype))
        else:
            self.register_parameter("rel_v", None)
        self.reset_parameters()
        self._set_config(
            num_heads=self.num_heads,
            head_dim=self.head_dim,
            max_distance=self.max_distance,
            values=values,
        )

    def reset_parameters(self) -> None:
        nn.init.normal_(self.rel_k, std=0.02)
        if self.rel_v is not None:
            nn.init.normal_(self.rel_v, std=0.02)

    def _check_input(
        self, name: str, x: torch.Tensor, what: str, table_name: str, table: torch.Tensor
    ) -> None:
        """``x`` (``what``: ``[b, h, ., .]`` with ``num_heads`` heads) and the module's table
        it meets: the table holds values and lives on ``x``'s device."""
        _check_4d(name, x, what)
        if x.shape[1] != self.num_heads:
            raise PosEncError(
                f"{name} must have {self.num_heads} heads (num_heads) in dim 1, got shape "
                f"{tuple(x.shape)}"
            )
        check_module_device(table.device)
        check_same_device((name, f"the module's table {table_name}"), x, table)

    def bias(
        self,
        q_len: int,
        k_len: int | None = None,
        *,
        q_positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
        q: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The key term ``q_i . a^K_ij`` ``[b, h, q, k]`` (float32) for the scaled queries ``q``."""
        q = self._query(q)
        self._check_input("q", q, "[b, h, q, d]", "rel_k", self.rel_k)
        if q.shape[-1] != self.rel_k.shape[-1]:
            raise PosEncError(
                f"q must have head_dim ({self.rel_k.shape[-1]}) channels in dim 3, got shape "
                f"{tuple(q.shape)}"
            )
        if q.shape[2] != q_len:
            raise PosEncError(
                f"q must have q_len ({q_len}) queries in dim 2, got shape {tuple(q.shape)}"
            )
        qpos, kpos = resolve_pair(
            q_len, k_len, q_positions, k_positions, device=q.device, batch=q.shape[0]
        )
        return self.bias_at(qpos, kpos, q=q)

    def bias_at(
        self,
        q_positions: torch.Tensor,
        k_positions: torch.Tensor,
        *,
        q: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """:meth:`bias` of positions already resolved by :func:`posenc.positions.resolve_pair`
        for the queries ``q [b, h, q, d]`` (no validation of the positions beyond the dtype
        rule of a table lookup: integers)."""
        q = self._query(q)
        max_distance = _check_table("table", self.rel_k, q.shape[-1])
        qpos, kpos = self._integers(q_positions, k_positions, q.device)
        return _logits(q, self.rel_k, qpos, kpos, max_distance)

    def value_bias(
        self,
        probs: torch.Tensor,
        *,
        q_positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The value term ``sum_j p_ij a^V_ij`` ``[b, h, q, d]`` (float32), added to ``probs @ v``."""
        self._check_input("probs", probs, "[b, h, q, k]", "rel_v", self._value_table())
        b, _, q_len, k_len = probs.shape
        qpos, kpos = resolve_pair(
            q_len, k_len, q_positions, k_positions, device=probs.device, batch=b
        )
        return self.value_bias_at(probs, qpos, kpos)

    def value_bias_at(
        self, probs: torch.Tensor, q_positions: torch.Tensor, k_positions: torch.Tensor
    ) -> torch.Tensor:
        """:meth:`value_bias` of positions already resolved by
        :func:`posenc.positions.resolve_pair` (no validation beyond integer positions)."""
        table = self._value_table()
        qpos, kpos = self._integers(q_positions, k_positions, probs.device)
        return _values(probs, table, qpos, kpos, self.max_distance)

    def _query(self, q: torch.Tensor | None) -> torch.Tensor:
        if q is None:
            raise PosEncError(
                "q must be given: ShawRelativeBias is query-dependent, bias() needs the scaled "
                "queries q * scale [b, h, q, d]"
            )
        return q

    def _value_table(self) -> torch.Tensor:
        if self.rel_v is None:
            raise PosEncError(
                "value_bias needs relative value vectors: build ShawRelativeBias with values=True"
            )
        return self.rel_v

    @staticmethod
    def _integers(
        qpos: torch.Tensor, kpos: torch.Tensor, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Resolved positions on ``device`` as int64, refusing floating ones (they index a
        table): the one check of the positions here, on the dtype alone (no host sync)."""
        qpos, kpos = canonical_pair(qpos, kpos, device)
        check_integer_positions("Shaw relative positions", qpos, kpos)
        return qpos, kpos


def __getattr__(name: str) -> Any:
    return renamed(__name__, name, {"ShawRelative": ShawRelativeBias})
