"""A cos/sin table for integer positions: two gathers instead of ten ops per call.

A rotary module's cos/sin are functions of the position alone (for a scaling that does not
depend on the call's positions), so :class:`CosSinTable` computes them once, for positions
``0 .. n - 1``, with the very arithmetic of :func:`posenc.rotary.apply._cos_sin` (float64
angles reduced to ``[-pi, pi)`` before rounding, times the attention scale, one rounding to
the dtype), and a call gathers its rows. The numbers are the ones the call would compute:
the same elementwise functions of the same float64 inputs.

When it serves a call (:meth:`CosSinTable.lookup`), and when the call computes instead:

- integer positions on the CPU, where reading their range is not a device synchronisation
  (one ``aminmax``); on accelerators the positions stay unread and the call computes on
  the device, as does any call under ``torch.compile`` / ``torch.export`` /
  ``torch.jit.trace`` (a graph must not capture the table);
- positions ``>= 0`` that fit: the table grows (to the next power of two, at least
  ``_MIN_ROWS``) when a call reaches past its end, up to ``max_bytes`` per dtype
  (default :data:`DEFAULT_MAX_BYTES`, 64 MiB: 131 072 positions of a 128-wide float32
  head); a call past that computes, and nothing grows.

With the fused CPU path off, the module's common call gathers cos and the partners' signed
sin per channel instead (:meth:`CosSinTable.lookup_paired`, what the torch engine rotates
with), from a float32 table of their own per layout, built from the same values. It holds the positions the float32 table
holds under ``max_bytes``, in twice the bytes (each row is twice as wide), so that the two
serve and step aside at the same positions.

The table is a plain attribute of its module, never a buffer: ``state_dict()`` stays
empty and ``module.to(torch.bfloat16)`` cannot round it.
"""

from __future__ import annotations

import threading

import torch

from posenc._angles import reduced_angles
from posenc._errors import check_int
from posenc.rotary.kernels.torch_engine import paired

__all__ = ["DEFAULT_MAX_BYTES", "CosSinTable"]

DEFAULT_MAX_BYTES = 64 << 20
_MIN_ROWS = 4096
_INDEX_DTYPES = (torch.int32, torch.int64)


class CosSinTable:
    """cos and sin of ``positions * inv_freq`` (times ``scale``) for positions ``0 .. n - 1``,
    one table ``[n, r]`` per dtype whose first ``r / 2`` columns are cos and last ``r / 2``
    sin, so one gather serves both.

    Args:
        inv_freq: the float64 frequencies ``[r / 2]`` (CPU).
        scale: the factor cos and sin are multiplied by (YaRN's attention scale, else 1).
        max_bytes: the most one dtype's table may hold; 0 turns the table off.
    """

    def __init__(
        self, inv_freq: torch.Tensor, scale: float, *, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self._inv_freq = inv_freq.detach().to("cpu", torch.float64)
        self._scale = float(scale)
        self.max_bytes = max_bytes
        self._tables: dict[torch.dtype | str, torch.Tensor] = {}  # a dtype's; a layout's paired
        self._grow_lock = threading.Lock()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_tables"] = {}  # rebuilt on use: a pickled module carries no table
        del state["_grow_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._grow_lock = threading.Lock()

    def __deepcopy__(self, memo: dict) -> CosSinTable:
        return CosSinTable(self._inv_freq, self._scale, max_bytes=self._max_bytes)

    @property
    def max_bytes(self) -> int:
        """The most one dtype's table may hold, in bytes (0: the table is off; a paired
        table holds as many positions as the float32 one, in twice the bytes). Lowering it
        drops tables that no longer fit."""
        return self._max_bytes

    @max_bytes.setter
    def max_bytes(self, value: int) -> None:
        self._max_bytes = check_int("max_bytes", value, min=0)
        tables = getattr(self, "_tables", {})
        for key in [d for d, t in tables.items() if t.shape[0] * self._row_bytes(d) > value]:
            del tables[key]

    @property
    def rows(self) -> dict[torch.dtype, int]:
        """Positions held per dtype (for tests and curious users); the paired tables are in
        :attr:`paired_rows`."""
        return {key: t.shape[0] for key, t in self._tables.items() if isinstance(key, torch.dtype)}

    @property
    def paired_rows(self) -> dict[str, int]:
        """Positions held per layout by the paired tables of :meth:`lookup_paired`."""
        return {key: t.shape[0] for key, t in self._tables.items() if isinstance(key, str)}

    def lookup(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(cos, sin)`` ``[*P, r / 2]`` in ``dtype`` gathered for integer ``positions``
        ``[*P]``, or ``None`` where the call must compute them (see the module docstring)."""
        return self._gather(positions, dtype)

    def lookup_paired(
        self, positions: torch.Tensor, layout: str
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``lookup(positions, torch.float32)`` as
        :func:`posenc.rotary.kernels.torch_engine.paired` makes it for ``layout``: cos and
        the partners' signed sin per channel, ``[*P, r]`` each, from one gather of a table of
        its own (twice as wide, as many positions); what the module's common call rotates
        with on the torch engine (:mod:`posenc.rotary.kernels.planned`)."""
        return self._gather(positions, layout)

    def _gather(
        self, positions: torch.Tensor, key: torch.dtype | str
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Both halves of the rows of ``key``'s table at ``positions`` (see :meth:`lookup`)."""
        if (
            not positions.is_cpu
            or positions.dtype not in _INDEX_DTYPES
            or positions.numel() == 0
            or torch.compiler.is_compiling()
            or torch.jit.is_tracing()
        ):
            return None
        table = self._tables.get(key)
        if table is not None:  # embedding checks every index is a row: no pass of our own
            try:
                first, second = torch.nn.functional.embedding(positions, table).chunk(2, dim=-1)
                return first, second
            except IndexError:  # negative, or past the table: decided below
                pass
        lo, hi = torch.aminmax(positions)
        low, high = int(lo), int(hi)
        if low < 0:
            return None
        if table is None or high >= table.shape[0]:
            table = self._grow(key, high + 1)
            if table is None:
                return None
        first, second = torch.nn.functional.embedding(positions, table).chunk(2, dim=-1)
        return first, second

    def leading(self, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(cos, sin)`` ``[n, r / 2]`` of positions ``0 .. n - 1`` (views of the table, no
        gather), or ``None`` past ``max_bytes`` or while tracing."""
        return self._first(n, dtype)

    def leading_paired(self, n: int, layout: str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """:meth:`leading` as :meth:`lookup_paired` gives it: ``[n, r]`` each."""
        return self._first(n, layout)

    def _first(self, n: int, key: torch.dtype | str) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Both halves of the first ``n`` rows of ``key``'s table (see :meth:`leading`)."""
        if n < 1 or torch.compiler.is_compiling() or torch.jit.is_tracing():
            return None
        table = self._tables.get(key)
        if table is None or n > table.shape[0]:
            table = self._grow(key, n)
            if table is None:
                return None
        first, second = table[:n].chunk(2, dim=-1)
        return first, second

    def current(self, dtype: torch.dtype) -> torch.Tensor | None:
        """The table ``[rows, r]`` of ``dtype`` as it stands (contiguous; cos the first
        ``r / 2`` columns, sin the rest), or ``None`` if none is held: what a caller that
        reads its rows itself (:mod:`posenc.rotary.kernels.planned`) holds on to during the read."""
        return self._tables.get(dtype)

    def _row_bytes(self, key: torch.dtype | str) -> int:
        """The bytes a position of ``key``'s table counts against ``max_bytes``: its cos and
        sin in the dtype (float32 for a paired table, which so holds the float32 table's
        positions in twice its bytes)."""
        dtype = key if isinstance(key, torch.dtype) else torch.float32
        return 2 * self._inv_freq.numel() * torch.empty((), dtype=dtype).element_size()

    def _grow(self, key: torch.dtype | str, needed: int) -> torch.Tensor | None:
        """The table for ``key`` (a dtype: ``[cos | sin]`` in it; a layout: the paired
        float32 ``[cos per channel | signed sin]``) with at least ``needed`` rows, or
        ``None`` past ``max_bytes``."""
        dtype = key if isinstance(key, torch.dtype) else torch.float32
        row_bytes = self._row_bytes(key)
        rows = max(_MIN_ROWS, 1 << (needed - 1).bit_length())
        if rows * row_bytes > self._max_bytes:
            rows = self._max_bytes // row_bytes
            if rows < needed:
                return None
        with self._grow_lock:
            table = self._tables.get(key)
            if table is not None and table.shape[0] >= needed:
                return table  # another thread grew it
            with torch.device("cpu"), torch.no_grad():
                theta = reduced_angles(torch.arange(rows, dtype=torch.int64), self._inv_freq)
                cos, sin = torch.cos(theta), torch.sin(theta)
                if self._scale != 1.0:
                    cos, sin = cos * self._scale, sin * self._scale
                if isinstance(key, str):  # the same float32 values, paired for the layout
                    cos, sin = paired(cos.to(dtype), sin.to(dtype), key)
                table = torch.cat([cos.to(dtype), sin.to(dtype)], dim=-1)  # [rows, width]
            self._tables[key] = table
            return table
