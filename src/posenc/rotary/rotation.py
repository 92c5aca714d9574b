"""``Rotation``, what a rotary module computes once per forward pass (cos/sin of the query
and key positions), and the argument rules :class:`posenc.RotaryEmbedding` shares with its
subclasses."""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import torch

from posenc._errors import PosEncError

__all__ = ["Rotation"]


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


def renamed_positions(q_positions: Any, positions: Any, stacklevel: int) -> Any:
    """``q_positions``, or the deprecated keyword ``positions`` (its 0.1.0 name) if given;
    ``stacklevel`` points the warning at the caller's line."""
    if positions is None:
        return q_positions
    if q_positions is not None:
        raise PosEncError(
            "q_positions and positions (its deprecated old name) were both given; "
            "pass q_positions only"
        )
    warnings.warn(
        "positions= is renamed q_positions=; positions= will be removed in the next release",
        DeprecationWarning,
        stacklevel=stacklevel,
    )
    return positions
