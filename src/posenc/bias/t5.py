"""T5's relative position buckets (Raffel et al., 2020) and the learned bias per bucket and head.

A relative position ``key - query`` is mapped to one of ``num_buckets`` buckets: half of
them (per direction, unless causal) hold exact small distances, the rest cover
distances up to ``max_distance`` on a log scale, and every farther distance shares the last
bucket. The bias of head ``h`` is ``table[bucket, h]``, a learned table.

Shapes: relative positions ``[*]`` -> buckets ``[*]``; positions ``[q]`` / ``[k]`` (or
``[b, q]`` / ``[b, k]``) -> bias ``[h, q, k]`` (or ``[b, h, q, k]``), float32.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import nn

from posenc._errors import (
    PosEncError,
    check_alloc,
    check_choice,
    check_factory,
    check_int,
    check_tensor,
)
from posenc.bias._common import (
    ExactConstants,
    PositionBias,
    canonical_pair,
    causal_option,
    check_integer_positions,
    check_pair,
    pairs,
)

__all__ = ["MAX_DISTANCE", "T5RelativeBias", "t5_relative_bias", "t5_relative_bucket"]

# The largest max_distance: the bucket lookup table holds 2 * max_distance + 1 int64 entries
# (16 MiB here), built once per module; every distance beyond it shares the last bucket.
MAX_DISTANCE = 1 << 20


def _check_options(num_buckets: int, max_distance: int, causal: bool) -> tuple[int, int]:
    """Validate the bucket options; they must leave every direction an exact bucket for 0 and
    a non-empty log range (T5's formula divides by ``log(max_distance / exact)``)."""
    check_choice("causal", causal, (True, False))
    num_buckets = check_int("num_buckets", num_buckets, min=2)
    if not causal and num_buckets < 4:
        raise PosEncError(
            "num_buckets must be >= 4 when causal=False (each direction gets half, and "
            f"a half needs an exact and a logarithmic bucket), got {num_buckets}"
        )
    max_distance = check_int("max_distance", max_distance, min=1, max=MAX_DISTANCE)
    if max_distance < num_buckets / 2:
        raise PosEncError(
            f"max_distance must be >= num_buckets / 2 ({num_buckets / 2:g}), got {max_distance}"
        )
    exact = (num_buckets if causal else num_buckets // 2) // 2
    if max_distance <= exact:
        raise PosEncError(
            f"max_distance must be > {exact} (the distances with exact buckets) for "
            f"num_buckets={num_buckets}, causal={causal}, got {max_distance}"
        )
    return num_buckets, max_distance


def t5_relative_bucket(
    relative_position: torch.Tensor,
    *,
    causal: bool | None = None,
    num_buckets: int = 32,
    max_distance: int = 128,
    bidirectional: bool | None = None,
) -> torch.Tensor:
    """T5's bucket of each relative position, computed exactly as T5 computes it.

    ``relative_position = key position - query position``. Both directions
    (``causal=False``, T5's encoder): buckets ``[0, n)`` hold keys at or before the query
    and ``[n, 2n)`` keys after it, ``n = num_buckets // 2``; ``causal=True`` (T5's decoder):
    every key after the query shares bucket 0 and all ``num_buckets`` buckets cover keys
    before it. Within a direction, distances below ``n / 2`` get their own bucket; larger
    ones are spaced logarithmically up to ``max_distance``, and all farther ones share the
    last bucket. The logarithm is taken in float32 as in T5 (Mesh TensorFlow and
    transformers), so buckets match checkpoints exactly, including the few distances that
    float32 rounding puts on the lower side of a bucket boundary.

    Args:
        relative_position: integer tensor of any shape.
        causal: ``False`` (the default): keys after the query get buckets of their own
            (encoders); ``True`` for causal decoders.
        num_buckets: ``>= 2`` (``>= 4`` when ``causal=False``).
        max_distance: ``>= num_buckets / 2``; distances from here on share the last bucket.
        bidirectional: deprecated spelling of ``causal=not bidirectional``, accepted with
            a ``DeprecationWarning``; giving both raises ``PosEncError``.

    Shape:
        ``[*]`` -> ``[*]`` int64 buckets in ``[0, num_buckets)``.

    Examples:
        >>> import torch, posenc
        >>> posenc.t5_relative_bucket(torch.tensor([-200, -20, -3, 0, 3, 20, 200]))
        tensor([15, 10,  3,  0, 19, 26, 31])
    """
    check_tensor("relative_position", relative_position)
    if (
        relative_position.is_floating_point()
        or relative_position.is_complex()
        or relative_position.dtype == torch.bool
    ):
        raise PosEncError(
            f"relative_position must be an integer tensor, got dtype {relative_position.dtype}"
        )
    causal = causal_option(causal, bidirectional, default=False)
    num_buckets, max_distance = _check_options(num_buckets, max_distance, causal)
    rel = relative_position.to(torch.long)
    buckets = torch.zeros_like(rel)
    if not causal:
        num_buckets //= 2
        buckets = buckets + (rel > 0).to(torch.long) * num_buckets
        rel = rel.abs()
    else:
        rel = -torch.clamp(rel, max=0)
    # rel >= 0 now. Half of the buckets hold the exact distances 0 .. max_exact - 1.
    max_exact = num_buckets // 2
    is_small = rel < max_exact
    # The other half: log-spaced up to max_distance. float32 log like T5, which decides the
    # side of a bucket boundary a distance falls on; log(0) = -inf only where is_small.
    log_ratio = torch.log(rel.float() / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).to(torch.long)
    large = torch.clamp(large, max=num_buckets - 1)
    return buckets + torch.where(is_small, rel, large)


def _lookup_table(num_buckets: int, max_distance: int, causal: bool) -> torch.Tensor:
    """Buckets of relative positions ``-max_distance .. max_distance`` (int64, on the CPU).

    Every relative position beyond ``+-max_distance`` is in the bucket of ``+-max_distance``,
    so clamping into this table gives T5's buckets with no logarithm at call time: the same
    integers on every device and in every attention path.
    """
    rel = torch.arange(-max_distance, max_distance + 1, device="cpu")
    return t5_relative_bucket(
        rel, causal=causal, num_buckets=num_buckets, max_distance=max_distance
    )


def _buckets(qp: torch.Tensor, kp: torch.Tensor, lut: torch.Tensor) -> torch.Tensor:
    """Buckets of ``kp - qp`` through the lookup table of :func:`_lookup_table`."""
    max_distance = (lut.shape[0] - 1) // 2
    rel = (kp - qp).clamp(-max_distance, max_distance)
    return lut[rel + max_distance]


def _gather(table: torch.Tensor, buckets: torch.Tensor) -> torch.Tensor:
    """``table[buckets, h]`` with heads in front: ``[q, k] -> [h, q, k]``, ``[b, q, k] ->
    [b, h, q, k]``; float32."""
    out = table.t().to(torch.float32)[:, buckets]  # [h, *buckets.shape]
    return out if buckets.ndim == 2 else out.movedim(0, 1)


def t5_relative_bias(
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    table: torch.Tensor,
    *,
    causal: bool | None = None,
    max_distance: int = 128,
    bidirectional: bool | None = None,
) -> torch.Tensor:
    """T5's bias: ``table[t5_relative_bucket(k - q), h]`` for every pair and head.

    Args:
        q_positions: integer query positions ``[q]`` or ``[b, q]``.
        k_positions: integer key positions ``[k]`` or ``[b, k]``.
        table: ``[num_buckets, h]`` bias per bucket and head (T5's
            ``relative_attention_bias.weight``).
        causal, max_distance, bidirectional: as in :func:`t5_relative_bucket`.

    Shape:
        ``[h, q, k]`` float32, or ``[b, h, q, k]`` when either position tensor is batched.

    Examples:
        >>> import torch
        >>> from posenc.bias import t5_relative_bias
        >>> table = torch.arange(8.0).reshape(4, 2)  # 4 buckets, 2 heads
        >>> t5_relative_bias(torch.arange(3), torch.arange(3), table, max_distance=4)[0]
        tensor([[0., 6., 6.],
                [2., 0., 6.],
                [2., 2., 0.]])
    """
    qpos, kpos = check_pair(q_positions, k_positions)
    check_integer_positions("T5 buckets", qpos, kpos)
    check_tensor("table", table, floating=True)
    if table.ndim != 2:
        raise PosEncError(f"table must be [num_buckets, h], got shape {tuple(table.shape)}")
    causal = causal_option(causal, bidirectional, default=False)
    if table.shape[0] < 2:
        raise PosEncError(f"table must have >= 2 rows (buckets), got shape {tuple(table.shape)}")
    if table.device.type == "meta":
        raise PosEncError("table must hold values, got a tensor on the meta device")
    _check_options(table.shape[0], max_distance, causal)  # max_distance, before the table
    lut = _lookup_table(table.shape[0], max_distance, causal).to(table.device)
    qp, kp = pairs(qpos, kpos, table.device)  # integers: int64
    return _gather(table, _buckets(qp, kp, lut))


class T5RelativeBias(ExactConstants, PositionBias):
    """T5's relative attention bias: a learned ``[num_buckets, num_heads]`` table indexed by
    the bucket of ``key - query`` position.

    ``weight`` has the layout of T5's ``relative_attention_bias.weight`` (copy it to port a
    checkpoint; T5 does not scale its logits, so use ``scale=1.0`` in attention). The bucket
    lookup table is a non-persistent int64 buffer, so buckets are identical on every device.

    Args:
        num_heads: number of attention heads, ``>= 1``.
        num_buckets, max_distance, causal: as in :func:`t5_relative_bucket`
            (``causal=True`` for decoders; the default ``False`` is T5's encoder).
        device, dtype: of the table (initialised from ``N(0, 0.02^2)``).
        bidirectional: deprecated spelling of ``causal=not bidirectional``, accepted with
            a ``DeprecationWarning``; saved configs that hold it load without one
            (:meth:`upgrade_config`).

    Shape:
        ``bias(q_len, k_len)`` -> ``[h, q_len, k_len]``; with ``[b, s]`` positions
        ``[b, h, q_len, k_len]``. Positions must be integers. When ``q_len < k_len`` and
        no positions are given the queries are the last ``q_len`` positions.

    Examples:
        >>> import torch, posenc
        >>> t5 = posenc.T5RelativeBias(4, num_buckets=8, max_distance=16)
        >>> t5.weight.shape
        torch.Size([8, 4])
        >>> t5.buckets(4)
        tensor([[0, 5, 6, 6],
                [1, 0, 5, 6],
                [2, 1, 0, 5],
                [2, 2, 1, 0]])
        >>> t5.bias(4).shape
        torch.Size([4, 4, 4])
    """

    name: ClassVar[str] = "t5"

    def __init__(
        self,
        num_heads: int,
        *,
        num_buckets: int = 32,
        max_distance: int = 128,
        causal: bool | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        bidirectional: bool | None = None,
    ) -> None:
        super().__init__()
        device, dtype = check_factory(device, dtype)
        self.num_heads = check_int("num_heads", num_heads, min=1)
        self.causal = causal_option(causal, bidirectional, default=False)
        self.num_buckets, self.max_distance = _check_options(num_buckets, max_distance, self.causal)
        shape = (self.num_buckets, self.num_heads)
        check_alloc("num_heads", self.num_heads, shape, dtype or torch.float32, device)
        self.weight = nn.Parameter(
            torch.empty(self.num_buckets, self.num_heads, device=device, dtype=dtype)
        )
        self.reset_parameters()
        self._install_constants(self.weight.device)
        self._set_config(
            num_heads=self.num_heads,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
            causal=self.causal,
        )

    @classmethod
    def upgrade_config(cls, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """posenc 0.1.0 wrote ``"bidirectional": b``; it loads as ``"causal": not b`` (no
        warning). A config holding both keys is passed on as it is (and refused)."""
        if "bidirectional" in args and "causal" not in args:
            args = dict(args)
            args["causal"] = not check_choice(
                "bidirectional", args.pop("bidirectional"), (True, False)
            )
        return cls.name, args

    @property
    def bidirectional(self) -> bool:
        """Deprecated: ``not causal`` (the option's old name)."""
        warnings.warn(
            "T5RelativeBias.bidirectional is deprecated, use causal (causal=not bidirectional)",
            DeprecationWarning,
            stacklevel=2,
        )
        return not self.causal

    bucket_lut: torch.Tensor

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight, std=0.02)

    def _constants(self) -> dict[str, torch.Tensor]:
        return {"bucket_lut": _lookup_table(self.num_buckets, self.max_distance, self.causal)}

    @property
    def _device(self) -> torch.device:
        return self.weight.device

    def buckets(
        self,
        q_len: int,
        k_len: int | None = None,
        *,
        q_positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The bucket of every (query, key) pair: ``[q, k]`` (or ``[b, q, k]``) int64."""
        qpos, kpos = self._resolve(q_len, k_len, q_positions, k_positions)
        check_integer_positions("T5 buckets", qpos, kpos)
        return _buckets(*pairs(qpos, kpos, self._device), self.bucket_lut)

    def _position_bias(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """The table entries of the pairs' buckets; resolved positions must be integers (the
        one rule checked here: a table lookup)."""
        qpos, kpos = canonical_pair(q_positions, k_positions, self._device)
        check_integer_positions("T5 buckets", qpos, kpos)
        return _gather(self.weight, _buckets(*pairs(qpos, kpos, self._device), self.bucket_lut))

    def score_mod_at(
        self, q_positions: torch.Tensor, k_positions: torch.Tensor
    ) -> Callable[..., torch.Tensor]:
        """:meth:`score_mod` of positions already resolved (no validation; integer
        positions, as in :meth:`bias_at`): the bucket of one pair from the two positions,
        then the head's entry of the table."""
        check_integer_positions("T5 buckets", q_positions, k_positions)
        q_at, k_at = self._index_positions(q_positions, k_positions)
        lut, table, max_distance = self.bucket_lut, self.weight, self.max_distance

        def t5_score_mod(score, b, h, q_idx, kv_idx):
            rel = (k_at(b, kv_idx) - q_at(b, q_idx)).clamp(-max_distance, max_distance)
            return score + table[lut[rel + max_distance], h].to(score.dtype)

        return t5_score_mod
