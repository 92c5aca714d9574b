"""The naive baseline: add the position index itself to every channel.

It is what one tries first, and it is kept to show why the real encodings look the
way they do:

- **Unbounded.** ``p`` grows with the sequence: at position 1000 the encoding is 1000
  in every channel while token embeddings are of order 1, so the position drowns the
  token, and positions never seen in training give inputs of a magnitude the model has
  never seen.
- **One direction.** Every position adds a multiple of the same vector ``(1, ..., 1)``,
  so the whole encoding is rank one: after a linear layer, position is a single
  number per head, and ``q . k`` cannot depend on the offset ``p - p'`` alone.
- **``normalize="length"`` (``p / L``)** bounds the values to ``[0, 1)`` but breaks
  uniqueness across lengths: position 5 of a 10-token sequence gets the encoding of
  position 10 of a 20-token one, the step between neighbours (``1 / L``) shrinks as
  sequences grow, and a token's encoding changes as the sequence it is in grows.

Shapes: positions ``[*P]`` -> table ``[*P, dim]``; the module takes ``x: [b, s, dim]``
and positions ``[s]`` or ``[b, s]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal

import torch

from posenc import positions as _positions
from posenc._base import AdditiveEncoding
from posenc._errors import (
    PosEncError,
    check_alloc,
    check_choice,
    check_dtype,
    check_int,
    check_traced,
    tracing,
)

__all__ = ["NORMALIZE", "IndexEmbedding", "index_table"]

Normalize = Literal["length"] | None
NORMALIZE = (None, "length")


def index_table(
    positions: torch.Tensor | Sequence[float],
    dim: int,
    *,
    normalize: Normalize = None,
    length: int | None = None,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The naive index table: ``PE[p, c] = p`` (or ``p / length``) for every channel ``c``.

    Args:
        positions: int or float positions of any shape.
        dim: number of channels, ``>= 1``.
        normalize: ``None`` (add ``p``) or ``"length"`` (add ``p / length``).
        length: the sequence length ``L``; required with ``normalize="length"`` and
            rejected otherwise.
        dtype: output dtype (default: torch's default dtype); values are formed in
            float64 and rounded once.
        device: output device (default: that of ``positions``).

    Shape:
        positions ``[*P]`` -> ``[*P, dim]``.

    Examples:
        >>> import torch
        >>> from posenc.index import index_table
        >>> index_table(torch.arange(3), 2)
        tensor([[0., 0.],
                [1., 1.],
                [2., 2.]])
        >>> index_table(torch.arange(4), 1, normalize="length", length=4).flatten()
        tensor([0.0000, 0.2500, 0.5000, 0.7500])
    """
    dim = check_int("dim", dim, min=1)
    check_choice("normalize", normalize, NORMALIZE)
    if normalize == "length":
        if length is None:
            raise PosEncError("length must be given with normalize='length', got None")
        length = check_int("length", length, min=1)
    elif length is not None:
        raise PosEncError(f"length applies only with normalize='length', got length={length!r}")
    dtype = torch.get_default_dtype() if dtype is None else check_dtype("dtype", dtype)
    pos = _positions.as_tensor(positions, device=device)
    check_alloc("dim", dim, (2, pos.numel(), dim), torch.float64, pos.device)
    _check_fits(pos, length, dtype)
    return _table(pos, dim, length, dtype)


def _check_fits(pos: torch.Tensor, length: int | None, dtype: torch.dtype) -> None:
    """Refuse positions whose value (``p``, or ``p / length``) rounds past ``dtype``'s range:
    the table would hold inf. Checked only where it can happen (float64 positions into a
    narrower dtype, any positions into float16): no reduction, no sync in the common case."""
    if not pos.is_floating_point() and dtype != torch.float16:
        return  # any int64 fits in float32 and bfloat16 (their max is ~3.4e38)
    if pos.is_floating_point() and torch.finfo(pos.dtype).max <= torch.finfo(dtype).max:
        return
    if pos.device.type == "meta" or pos.numel() == 0:
        return
    p = pos.to(torch.float64).abs()
    p = p if length is None else p / length
    what = "positions" if length is None else "positions / length"
    if tracing():  # torch.compile / export: the rule as a graph assertion
        check_traced(p.to(dtype).isfinite(), f"{what} must fit in {dtype}")
        return
    largest = p.max()
    if not bool(largest.to(dtype).isfinite()):
        raise PosEncError(
            f"{what} must fit in {dtype} (at most {torch.finfo(dtype).max:.6g} in magnitude, "
            f"or the encoding is inf), got {float(largest):.6g}"
        )


def _table(pos: torch.Tensor, dim: int, length: int | None, dtype: torch.dtype) -> torch.Tensor:
    """:func:`index_table` of validated arguments."""
    p = pos.to(torch.float64)
    if length is not None:
        p = p / length
    return p.unsqueeze(-1).expand(*p.shape, dim).to(dtype)


class IndexEmbedding(AdditiveEncoding):
    """Adds the position index to every channel: ``x + p`` (or ``x + p / L``).

    The naive baseline, kept to show why it fails (see the module docstring): the values
    are unbounded and all positions share one direction; ``normalize="length"`` bounds
    them but gives the same encoding to different positions of different lengths.

    ``L`` is the length of the sequence up to and including this call: ``offset + s``
    (so while decoding with a cache the encoding of every token keeps changing — one of
    the flaws on show).

    Args:
        dim: embedding size.
        normalize: ``None`` or ``"length"``.

    Shape:
        ``x: [b, s, dim]``, ``positions: [s]`` or ``[b, s]`` (``None``: ``arange(s) + offset``)
        -> ``[b, s, dim]``.

    Examples:
        >>> import torch, posenc
        >>> posenc.IndexEmbedding(2)(torch.zeros(1, 3, 2))
        tensor([[[0., 0.],
                 [1., 1.],
                 [2., 2.]]])
    """

    name: ClassVar[str] = "index"

    def __init__(self, dim: int, *, normalize: Normalize = None) -> None:
        super().__init__()
        self.dim = check_int("dim", dim, min=1)
        self.normalize = check_choice("normalize", normalize, NORMALIZE)
        self._set_config(dim=self.dim, normalize=normalize)

    def table(
        self, positions: torch.Tensor, length: int | None = None, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """The table at ``positions`` (``[*P]`` -> ``[*P, dim]``); ``length`` for ``normalize``."""
        return index_table(
            positions, self.dim, normalize=self.normalize, length=length, dtype=dtype
        )

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor | None = None, *, offset: int = 0
    ) -> torch.Tensor:
        pos = self._embeddings_positions(x, positions, offset)
        # L counts the tokens so far; max(.., 1) only matters for an empty first chunk
        length = max(offset + x.shape[1], 1) if self.normalize == "length" else None
        _check_fits(pos, length, x.dtype)
        pe = _table(pos, self.dim, length, torch.float64)  # [s, dim] or [b, s, dim]
        return (x.double() + pe).to(x.dtype)  # formed in float64, rounded once to x's dtype
