"""Learned absolute position embeddings (BERT, GPT-2, ViT): one trained vector per position.

The table ``[max_len, dim]`` is an ``nn.Parameter`` — the one table in posenc that is
trained, so it is in ``state_dict`` as ``weight``. Positions outside ``[0, max_len)``
have no row: they raise instead of silently clamping or wrapping.

A trained table is tied to its length (or image grid). :func:`resample_table` and
:meth:`LearnedEmbedding.resample` interpolate it to a new length (1-D, linear) or a
new grid (2-D, bicubic with antialiasing as timm's ``resample_abs_pos_embed`` does
when a ViT is fine-tuned at another image size), keeping leading prefix tokens such
as ``[CLS]`` as they are.

Shapes: table ``[n, d]``; the module takes ``x: [b, s, dim]`` and positions ``[s]`` or
``[b, s]``. For a grid ``(H, W)`` the row of patch ``(i, j)`` is
``num_prefix_tokens + i * W + j`` (row-major, as patch embeddings are flattened).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from posenc import positions as _positions
from posenc._base import AdditiveEncoding
from posenc._errors import (
    PosEncError,
    check_alloc,
    check_choice,
    check_embeddings,
    check_factory,
    check_float,
    check_int,
    check_positions,
    check_tensor,
    check_traced,
    tracing,
)

__all__ = ["MODES_1D", "MODES_2D", "LearnedEmbedding", "resample_table"]

Mode = Literal["linear", "bicubic", "bilinear"]
MODES_1D = ("linear",)
MODES_2D = ("bicubic", "bilinear")


def _check_grid(name: str, grid: Any) -> tuple[int, int]:
    if isinstance(grid, (str, bytes)) or not isinstance(grid, (Sequence, torch.Size)):
        raise PosEncError(f"{name} must be a pair of sizes (H, W), got {grid!r}")
    if len(grid) != 2:
        raise PosEncError(f"{name} must be a pair of sizes (H, W), got {len(grid)} sizes: {grid!r}")
    h, w = (check_int(f"{name}[{i}]", n, min=1) for i, n in enumerate(grid))
    return h, w


def _check_layout(n: int, grid: Any, num_prefix_tokens: Any) -> tuple[tuple[int, int] | None, int]:
    """Validate how the ``n`` rows split into prefix tokens and a 1-D or 2-D body."""
    prefix = check_int("num_prefix_tokens", num_prefix_tokens, min=0)
    if prefix >= n:
        raise PosEncError(
            f"num_prefix_tokens must be < the number of rows ({n}) so that some rows "
            f"are positions, got {prefix}"
        )
    if grid is None:
        return None, prefix
    hw = _check_grid("grid", grid)
    if prefix + hw[0] * hw[1] != n:
        raise PosEncError(
            f"grid {hw} with num_prefix_tokens={prefix} needs {prefix + hw[0] * hw[1]} rows, "
            f"got {n}"
        )
    return hw, prefix


def resample_table(
    table: torch.Tensor,
    size: int | Sequence[int],
    *,
    grid: Sequence[int] | None = None,
    num_prefix_tokens: int = 0,
    mode: Mode | None = None,
    align_corners: bool = False,
    antialias: bool | None = None,
) -> torch.Tensor:
    """Interpolate a learned position table to a new length or grid.

    The first ``num_prefix_tokens`` rows (``[CLS]``, register tokens) are copied as they
    are; the rest are resampled: 1-D (``grid=None``) linearly to ``size`` rows in all, 2-D
    from the row-major ``grid = (H, W)`` to ``size = (H', W')``, bicubic with antialiasing
    by default, exactly timm's ``resample_abs_pos_embed`` (the modes and the corner rule
    compared with timm's and Hugging Face ViT's: ``docs/additive.md``). Interpolation runs
    in float32 (float64 for a float64 table); the result has the table's dtype.

    Args:
        table: ``[n, dim]`` floating tensor, ``n >= 1`` and ``dim >= 1``.
        size: new total length (1-D) or new grid ``(H', W')`` (2-D).
        grid: the current grid ``(H, W)``; ``None`` for a 1-D table.
        num_prefix_tokens: leading rows kept as they are.
        mode: ``"linear"`` (1-D), ``"bicubic"`` (2-D default) or ``"bilinear"`` (2-D).
        align_corners: ``F.interpolate``'s: ``False`` (default, timm's and Hugging Face's)
            matches cell centres; ``True`` maps the end rows onto the new end rows.
        antialias: filter when shrinking a 2-D grid (default ``True`` for 2-D; ``False``:
            Hugging Face ViT's ``interpolate_pos_encoding``); not for 1-D.

    Shape:
        ``[n, dim]`` -> ``[size, dim]`` (1-D) or ``[num_prefix_tokens + H' * W', dim]`` (2-D).

    Examples:
        >>> import torch
        >>> from posenc.learned import resample_table
        >>> resample_table(torch.tensor([[0.0], [2.0], [4.0]]), 5, align_corners=True).flatten()
        tensor([0., 1., 2., 3., 4.])
        >>> resample_table(torch.zeros(1 + 4 * 4, 8), (6, 6), grid=(4, 4), num_prefix_tokens=1).shape
        torch.Size([37, 8])
    """
    return _resample(table, size, "size", grid, num_prefix_tokens, mode, align_corners, antialias)


def _resample(
    table: torch.Tensor,
    size: Any,
    size_name: str,
    grid: Any,
    num_prefix_tokens: Any,
    mode: Any,
    align_corners: Any,
    antialias: Any,
) -> torch.Tensor:
    """:func:`resample_table`, with errors about ``size`` naming ``size_name``."""
    check_tensor("table", table, floating=True)
    if table.ndim != 2:
        raise PosEncError(f"table must be [n, dim], got shape {tuple(table.shape)}")
    if table.shape[0] == 0 or table.shape[1] == 0:
        raise PosEncError(
            f"table must have at least one row and one column (dim >= 1), got shape "
            f"{tuple(table.shape)}"
        )
    hw, prefix = _check_layout(table.shape[0], grid, num_prefix_tokens)
    if not isinstance(align_corners, bool):
        raise PosEncError(f"align_corners must be True or False, got {align_corners!r}")
    if antialias is not None and not isinstance(antialias, bool):
        raise PosEncError(f"antialias must be True, False or None, got {antialias!r}")
    compute = torch.promote_types(table.dtype, torch.float32)
    body = table[prefix:].to(compute)  # [n - prefix, dim]
    if hw is None:
        out = _resample_1d(body, size, size_name, prefix, mode, align_corners, antialias)
    else:
        out = _resample_2d(body, hw, size, size_name, mode, align_corners, antialias)
    return torch.cat([table[:prefix], out.to(table.dtype)], dim=0)


def _resample_1d(
    body: torch.Tensor,
    size: Any,
    size_name: str,
    prefix: int,
    mode: Any,
    align_corners: bool,
    antialias: bool | None,
) -> torch.Tensor:
    """The rows after the prefix, ``body [n - prefix, dim]``, interpolated to ``size - prefix``
    rows (a length)."""
    if isinstance(size, Sequence) and not isinstance(size, str):
        raise PosEncError(
            f"{size_name} must be a length (an int) for a 1-D table, got {size!r}; "
            "give the table a grid=(H, W) to resample it in 2-D"
        )
    new_len = check_int(size_name, size, min=prefix + 1)
    check_alloc(size_name, size, (2, new_len, body.shape[1]), body.dtype, body.device)
    mode = check_choice("mode", "linear" if mode is None else mode, MODES_1D)
    if antialias:
        raise PosEncError("antialias applies to 2-D grids only, got antialias=True for a 1-D table")
    out = F.interpolate(
        body.T[None], size=new_len - prefix, mode=mode, align_corners=align_corners
    )  # [1, dim, new_len - prefix]
    return out[0].T  # [new_len - prefix, dim]


def _resample_2d(
    body: torch.Tensor,
    hw: tuple[int, int],
    size: Any,
    size_name: str,
    mode: Any,
    align_corners: bool,
    antialias: bool | None,
) -> torch.Tensor:
    """The grid rows after the prefix, ``body [H * W, dim]``, interpolated to the grid
    ``size = (H', W')``: ``[H' * W', dim]``."""
    dim = body.shape[1]
    if isinstance(size, (str, bytes)) or not isinstance(size, (Sequence, torch.Size)):
        raise PosEncError(
            f"{size_name} must be a grid (H', W') for a table with grid={hw}, got {size!r}"
        )
    new_hw = _check_grid(size_name, size)
    check_alloc(size_name, size, (2, new_hw[0] * new_hw[1], dim), body.dtype, body.device)
    mode = check_choice("mode", "bicubic" if mode is None else mode, MODES_2D)
    grid = body.reshape(1, *hw, dim).permute(0, 3, 1, 2)  # [1, dim, H, W]
    out = F.interpolate(
        grid,
        size=new_hw,
        mode=mode,
        align_corners=align_corners,
        antialias=True if antialias is None else antialias,
    )  # [1, dim, H', W']
    return out.permute(0, 2, 3, 1).reshape(new_hw[0] * new_hw[1], dim)  # [H' * W', dim]


class LearnedEmbedding(AdditiveEncoding):
    """Adds a trained table row per position: ``dropout(x + weight[positions])``.

    Positions must be integers (integral-valued floats are accepted) in ``[0, max_len)``;
    anything else raises :class:`posenc.PosEncError` naming ``max_len``. The addition is
    done in at least float32 and rounded once to ``x``'s dtype.

    Args:
        max_len: number of rows (positions ``0 .. max_len - 1``), prefix tokens included.
        dim: embedding size.
        grid: ``(H, W)`` when the rows after the prefix tokens are an image grid
            (row-major); lets :meth:`resample` interpolate in 2-D. ``max_len`` must equal
            ``num_prefix_tokens + H * W``.
        num_prefix_tokens: leading rows (``[CLS]``, registers) that resampling keeps.
        dropout: dropout probability applied after the addition.
        init_std: standard deviation of the normal initialisation (0.02 as in BERT,
            GPT-2 and ViT).
        device, dtype: of the weight (not part of the config).

    Shape:
        ``x: [b, s, dim]``, ``positions: [s]`` or ``[b, s]`` (``None``: ``arange(s) + offset``)
        -> ``[b, s, dim]``; ``weight: [max_len, dim]``.

    Examples:
        >>> import torch, posenc
        >>> pe = posenc.LearnedEmbedding(16, 8)
        >>> pe(torch.zeros(2, 5, 8)).shape
        torch.Size([2, 5, 8])
        >>> list(pe.state_dict())
        ['weight']
        >>> vit = posenc.LearnedEmbedding(1 + 14 * 14, 8, grid=(14, 14), num_prefix_tokens=1)
        >>> vit.resample((16, 16)).max_len
        257
    """

    name: ClassVar[str] = "learned"

    def __init__(
        self,
        max_len: int,
        dim: int,
        *,
        grid: Sequence[int] | None = None,
        num_prefix_tokens: int = 0,
        dropout: float = 0.0,
        init_std: float = 0.02,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        device, dtype = check_factory(device, dtype)
        self.max_len = check_int("max_len", max_len, min=1)
        self.dim = check_int("dim", dim, min=1)
        self.grid, self.num_prefix_tokens = _check_layout(self.max_len, grid, num_prefix_tokens)
        dropout = check_float("dropout", dropout, min=0.0, max=1.0)
        # samples of N(0, init_std) stay finite in the weight's dtype (draws reach ~6 std)
        finite = float(torch.finfo(dtype or torch.get_default_dtype()).max) / 1e3
        self.init_std = check_float("init_std", init_std, min=0.0, max=finite)
        name = "max_len" if self.max_len >= self.dim else "dim"
        value = max(self.max_len, self.dim)
        check_alloc(name, value, (self.max_len, self.dim), dtype or torch.float32, device)
        self.dropout = nn.Dropout(dropout)
        self.weight = nn.Parameter(torch.empty(self.max_len, self.dim, device=device, dtype=dtype))
        self.reset_parameters()
        self._set_config(
            max_len=self.max_len,
            dim=self.dim,
            grid=self.grid,
            num_prefix_tokens=self.num_prefix_tokens,
            dropout=dropout,
            init_std=self.init_std,
        )

    def reset_parameters(self) -> None:
        """Draw the weight from ``N(0, init_std^2)``."""
        nn.init.normal_(self.weight, std=self.init_std)

    @classmethod
    def from_table(
        cls,
        table: torch.Tensor,
        *,
        grid: Sequence[int] | None = None,
        num_prefix_tokens: int = 0,
        dropout: float = 0.0,
        init_std: float = 0.02,
    ) -> LearnedEmbedding:
        """A module holding a copy of ``table [max_len, dim]`` (e.g. a checkpoint's ``wpe``).

        The weight keeps the table's dtype and device; the other arguments are the
        constructor's (``init_std`` is used only by :meth:`reset_parameters`).

        Examples:
            >>> import torch, posenc
            >>> pe = posenc.LearnedEmbedding.from_table(torch.eye(4))
            >>> pe(torch.zeros(1, 2, 4))
            tensor([[[1., 0., 0., 0.],
                     [0., 1., 0., 0.]]], grad_fn=<AddBackward0>)
        """
        check_tensor("table", table, floating=True)
        if table.ndim != 2 or 0 in table.shape:
            raise PosEncError(
                f"table must be [max_len, dim] with max_len, dim >= 1, got shape "
                f"{tuple(table.shape)}"
            )
        module = cls(
            table.shape[0],
            table.shape[1],
            grid=grid,
            num_prefix_tokens=num_prefix_tokens,
            dropout=dropout,
            init_std=init_std,
            device="meta",
            dtype=table.dtype,
        )
        module.weight = nn.Parameter(table.detach().clone())
        return module

    def _indices(self, positions: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """Validated long indices into ``weight`` (one host sync, like nn.Embedding's check)."""
        if positions.dtype == torch.bool or positions.is_complex():
            raise PosEncError(
                f"positions must be an integer or floating tensor, got {positions.dtype}"
            )
        if tracing():  # torch.compile / export: the same rules as assertions in the graph
            in_range = (positions >= 0) & (positions < self.max_len)
            if positions.is_floating_point():
                in_range = in_range & (positions == torch.round(positions))
            check_traced(
                in_range,
                f"positions must be integers in [0, max_len) with max_len={self.max_len}",
            )
        elif positions.numel():
            # min, max and "any fractional" come to the host together: one synchronisation
            stats = [positions.min(), positions.max()]
            if positions.is_floating_point():
                stats.append((positions != torch.round(positions)).any())
            lo, hi, *fractional = torch.stack([t.to(torch.float64) for t in stats]).tolist()
            if fractional and fractional[0]:
                bad = positions[positions != torch.round(positions)].flatten()[0].item()
                raise PosEncError(
                    f"positions must be integers for a learned table (integral-valued floats "
                    f"are accepted), got {bad}"
                )
            if lo < 0 or hi >= self.max_len:
                shifted = f" (after offset={offset})" if offset else ""
                raise PosEncError(
                    f"positions must be in [0, max_len) with max_len={self.max_len}, "
                    f"got values from {lo:g} to {hi:g}{shifted}"
                )
        return positions.long()

    def _check_weight(self) -> None:
        if self.weight.is_meta:
            raise PosEncError(
                "the module's weight is on the meta device (no values); move it with "
                "to_empty(device=...) and initialise it first, got device meta"
            )

    def table(self, positions: torch.Tensor) -> torch.Tensor:
        """The weight rows at ``positions`` (``[*P]`` -> ``[*P, dim]``), validated."""
        check_positions("positions", positions, ndims=None)
        self._check_weight()
        return F.embedding(self._indices(positions.to(self.weight.device)), self.weight)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor | None = None, *, offset: int = 0
    ) -> torch.Tensor:
        check_embeddings(x, self.dim)
        self._check_weight()
        pos = _positions.resolve(
            positions, x.shape[1], offset=offset, batch=x.shape[0], device=self.weight.device
        )
        pe = F.embedding(self._indices(pos, offset), self.weight)  # [s, dim] or [b, s, dim]
        compute = torch.promote_types(torch.promote_types(x.dtype, pe.dtype), torch.float32)
        out = (x.to(compute) + pe.to(device=x.device, dtype=compute)).to(x.dtype)
        return self.dropout(out)

    def resample(
        self,
        new_len_or_grid: int | Sequence[int],
        *,
        mode: Mode | None = None,
        align_corners: bool = False,
        antialias: bool | None = None,
    ) -> LearnedEmbedding:
        """A new module whose table is this one interpolated to a new length or grid.

        ``new_len_or_grid`` is the new ``max_len`` (prefix tokens included) for a 1-D
        table, or the new grid ``(H', W')`` for a module built with ``grid``. Prefix
        tokens are kept as they are; ``mode``, ``align_corners`` and ``antialias`` are
        those of :func:`resample_table` (2-D defaults: bicubic with antialiasing, as
        timm). The new weight has this one's dtype, device and ``requires_grad``; this
        module is unchanged.

        Shape:
            ``weight [max_len, dim]`` -> ``[new_len, dim]`` or
            ``[num_prefix_tokens + H' * W', dim]``.
        """
        with torch.no_grad():
            table = _resample(
                self.weight,
                new_len_or_grid,
                "new_len_or_grid",
                self.grid,
                self.num_prefix_tokens,
                mode,
                align_corners,
                antialias,
            )
        new_grid = None if self.grid is None else _check_grid("new_len_or_grid", new_len_or_grid)
        module = LearnedEmbedding.from_table(
            table,
            grid=new_grid,
            num_prefix_tokens=self.num_prefix_tokens,
            dropout=self.dropout.p,
            init_std=self.init_std,
        )
        module.weight.requires_grad_(self.weight.requires_grad)
        return module
