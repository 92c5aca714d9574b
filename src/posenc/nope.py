"""NoPE: no positional encoding at all.

Attention alone is permutation-equivariant; with a causal mask it still carries
some order (Kazemnejad et al., 2023), which makes "none" a real baseline.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from posenc._base import Encoding, Kind
from posenc._errors import PosEncError, check_int, check_positions, check_tensor, describe

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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # NoPE has no parameters; any argument (a dim, as the other kinds take) is refused
        # here by name, where Python's own TypeError would name none.
        if args or kwargs:
            given = [f"positional argument {describe(a)}" for a in args]
            given += [f"{k}={describe(v)}" for k, v in kwargs.items()]
            raise PosEncError(
                "NoPositionalEncoding takes no arguments (it has no dim, head_dim or num_heads: "
                f"it returns x unchanged), got {', '.join(given)}"
            )
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
