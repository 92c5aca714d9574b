"""NoPE: no positional encoding at all.

Attention alone is permutation-equivariant; with a causal mask it still carries
some order (Kazemnejad et al., 2023), which makes "none" a real baseline.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from posenc._base import Encoding, Kind
from posenc._errors import PosEncError, check_int, check_positions, check_tensor

__all__ = ["NoPositionalEncoding"]


class NoPositionalEncoding(Encoding):
    """The identity: ``forward(x)`` returns ``x`` unchanged (any shape).

    Accepts and ignores the positions arguments of the other kinds (checked like theirs: a
    real ``x`` of any shape, a position tensor, an integer ``offset``), so it can stand wherever an
    encoding is expected.

    Shape:
        ``x: [*]`` -> ``[*]`` (the same tensor).

    Examples:
        >>> import torch, posenc
        >>> x = torch.randn(2, 3, 4)
        >>> torch.equal(posenc.build("none")(x), x)
        True
    """

    name: ClassVar[str] = "none"
    kind: ClassVar[Kind] = "none"

    def __init__(self) -> None:
        super().__init__()
        self._set_config()

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None, *, offset: int = 0):
        check_tensor("x", x)
        if x.dtype == torch.bool or x.is_complex():
            raise PosEncError(f"x must be a real (floating or integer) tensor, got {x.dtype}")
        if positions is not None:
            check_positions("positions", positions, ndims=None)
        check_int("offset", offset)
        return x
