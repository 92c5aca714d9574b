"""``RotaryEmbedding``: RoPE as a module that rotates queries and keys.

The module holds no tensor state: its float64 frequencies are a plain attribute (with a
small per-device copy cache), not a buffer, so ``state_dict()`` is empty, construction
on the meta device works, and ``module.to(torch.bfloat16)`` cannot lower their precision.
cos/sin are functions of the positions of each call (float64 angles, reduced before
rounding); integer positions on the CPU gather them from a table of exactly those numbers
(:mod:`posenc.rotary.cache`), which grows with the positions and never goes stale (the
frequencies are read-only).

Shapes: ``q: [b, hq, sq, d]``, ``k: [b, hk, sk, d]`` (``seq_dim=-2``), or
``[b, s, h, d]`` with ``seq_dim=-3``; positions ``[s]`` or ``[b, s]`` (M-RoPE and axial:
``[s, n_axes]`` or ``[b, s, n_axes]``).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch

import posenc.positions as _positions
from posenc._base import RotaryEncoding
from posenc._errors import (
    PosEncError,
    check_alloc,
    check_choice,
    check_device,
    check_dtype,
    check_float,
    check_int,
    check_last_dim,
    check_positions,
)
from posenc.rotary.apply import (
    DIRECTIONS,
    PARTIALS,
    Direction,
    Partial,
    SectionLayout,
    _cos_sin,
    check_placement,
    place_frequencies,
)
from posenc.rotary.cache import CosSinTable
from posenc.rotary.call_frequencies import CallFrequencies
from posenc.rotary.frequencies import Scaling, parse_scaling, rotated_frequencies
from posenc.rotary.kernels.planned import FastRotation, fast_forward, rotate_planned
from posenc.rotary.layout import LAYOUTS, SEQ_DIMS, Layout, check_rotary_dims
from posenc.rotary.rotation import (
    Rotation,
    check_cos_sin_dtype,
    check_qk,
    check_rotation,
    rotate_qk,
)
from posenc.rotary.scalings.foreign import Given, read_foreign

__all__ = ["PARTIALS", "Partial", "RotaryEmbedding", "Rotation"]


class RotaryEmbedding(RotaryEncoding):
    """Rotary position embedding (RoPE, Su et al., 2021) of queries and keys.

    ``forward(q, k, q_positions)`` rotates the first ``rotary_dim`` channels of every head
    of ``q`` and ``k`` by ``position * inv_freq`` (see :func:`posenc.apply_rotary` for the
    two pairing layouts), so that ``q_m . k_n`` depends on ``m - n`` only. Each option's
    families, and when a call synchronises with the host: ``docs/rotary.md``.

    Args:
        head_dim: channels per head ``d`` (even).
        base: the wavelength base (transformers' ``rope_theta``).
        rotary_dim: channels that rotate (even, ``<= head_dim``; default all).
        layout: ``"half"`` (GPT-NeoX, Llama in transformers) or ``"interleaved"`` (GPT-J).
        scaling: ``None``, a dict in posenc's spelling (``{"type": "yarn", "factor": 4, ...}``,
            :func:`~posenc.rotary.frequencies.parse_scaling`), a scaling dataclass, or
            transformers' ``rope_scaling`` / ``rope_parameters``.
        sections: M-RoPE (Qwen2-VL): sizes summing to ``rotary_dim / 2``, one per axis.
        partial: where the rotating channels sit: ``"leading"``, ``"whole_head"``, ``"trailing"``.
        section_layout: M-RoPE's frequency order: ``"contiguous"``, ``"interleaved"``
            (Qwen3-VL) or ``"spatial_interleaved"`` (ERNIE 4.5-VL).
        direction: ``"positive"`` rotates by ``+p * w_i``, ``"negative"`` by ``-p * w_i``.

    Attributes:
        inv_freq: float64 ``[rotary_dim / 2]`` (CPU), as transformers holds them at build.
        attention_scale: the factor on cos and sin (YaRN, LongRoPE; else 1.0).

    Raises:
        PosEncError: a bad argument (at construction or call), naming it.

    Shape:
        ``q: [b, hq, sq, d]``, ``k: [b, hk, sk, d]`` (or ``[b, s, h, d]``, ``seq_dim=-3``),
        positions ``[s]`` or ``[b, s]`` (``[..., len(sections)]`` with sections) -> ``(q,
        k)`` rotated. Positions ``None``: as :func:`posenc.positions.resolve_pair`;
        ``q_positions`` alone are the keys' too. ``positions=``: deprecated ``q_positions=``.

    Examples:
        >>> import torch, posenc
        >>> q, k = torch.randn(2, 8, 16, 64), torch.randn(2, 2, 16, 64)  # GQA: 8 and 2 heads
        >>> [tuple(t.shape) for t in posenc.RotaryEmbedding(64)(q, k)]  # positions arange(16)
        [(2, 8, 16, 64), (2, 2, 16, 64)]
    """

    name: ClassVar[str] = "rope"

    @classmethod
    def upgrade_config(cls, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """0.1.0 wrote ``xpos_scale_base`` into every ``"rope"`` config: ``None`` is dropped;
        a number makes it the ``"xpos"`` config of the same module (``scale_base``)."""
        if "xpos_scale_base" not in args:
            return cls.name, args
        args = dict(args)
        scale_base = args.pop("xpos_scale_base")
        if scale_base is None:
            return cls.name, args
        if args.get("sections", ()) is None:  # 0.1.0 never combined xPos with sections
            del args["sections"]
        return "xpos", {"scale_base": scale_base, **args}

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        layout: Layout = "half",
        scaling: Scaling | Mapping[str, Any] | None = None,
        sections: Sequence[int] | None = None,
        partial: Partial = "leading",
        section_layout: SectionLayout = "contiguous",
        direction: Direction = "positive",
    ) -> None:
        super().__init__()
        self._head_dim, self._rotary_dim = check_rotary_dims(head_dim, rotary_dim)
        check_alloc("head_dim", head_dim, (4, head_dim), torch.float64)
        self._layout = check_choice("layout", layout, LAYOUTS)
        self._partial, self._kernel_dim, self._sections, self._section_map = check_placement(
            self._head_dim, self._rotary_dim, layout, partial, sections, section_layout
        )  # _kernel_dim: the channels cos/sin span (the whole head for partial="whole_head")
        self._section_layout = section_layout
        self._direction = check_choice("direction", direction, DIRECTIONS)
        self._base = check_float("base", base, min=1.0, min_exclusive=True)
        # another library's spelling (read in posenc.integrations), checked against these
        given = Given(
            type(self).__name__,
            self._base,
            self._head_dim,
            self._rotary_dim,
            self._sections,
            section_layout,
        )
        translated = read_foreign(scaling, given)
        self._scaling = parse_scaling(scaling if translated is None else translated)
        self._freqs = CallFrequencies(self._frequencies, self._scaling)
        self._inv_freq = self._freqs.inv_freq.abs()  # negated for direction="negative"
        tabled = self._freqs.fixed and self._sections is None
        self._table = (
            CosSinTable(self._freqs.inv_freq, self._freqs.attention_scale) if tabled else None
        )
        # forward's fast path serves rotations computed here (not a subclass's own, xPos')
        self._plans: dict = {}  # rotate_at's call shapes (rotate_planned)
        own = type(self).rotation_at is RotaryEmbedding.rotation_at
        self._fast = (
            FastRotation(self._table, self._head_dim, layout == "interleaved", {})
            if own and self._table is not None
            else None
        )
        self._set_config(
            head_dim=self._head_dim,
            base=self._base,
            rotary_dim=rotary_dim,
            layout=layout,
            scaling=self._scaling,
            sections=self._sections,
            **({} if partial == "leading" else {"partial": partial}),
            **({} if section_layout == "contiguous" else {"section_layout": section_layout}),
            **({} if direction == "positive" else {"direction": direction}),
        )

    # --- read-only attributes (the frequency cache depends on them) -------------------------

    @property
    def head_dim(self) -> int:
        return self._head_dim

    @property
    def rotary_dim(self) -> int:
        return self._rotary_dim

    @property
    def layout(self) -> str:
        return self._layout

    @property
    def base(self) -> float:
        return self._base

    @property
    def scaling(self) -> Scaling | None:
        return self._scaling

    partial = property(lambda self: self._partial)  # where partial rotary channels sit
    section_layout = property(lambda self: self._section_layout)  # M-RoPE's frequency order
    direction = property(lambda self: self._direction)  # the sense of the rotation

    @property
    def sections(self) -> tuple[int, ...] | None:
        return self._sections

    @property
    def position_coords(self) -> int | None:
        """Coordinates per position: ``len(sections)`` for M-RoPE / axial, else ``None``."""
        return None if self._sections is None else len(self._sections)

    @property
    def inv_freq(self) -> torch.Tensor:
        """The float64 frequencies at construction (CPU): ``[rotary_dim / 2]``, or
        ``[head_dim / 2]`` with zeros for ``partial="whole_head"`` (layout ``"half"``)."""
        return self._inv_freq

    @property
    def attention_scale(self) -> float:
        return self._freqs.attention_scale

    @property
    def cos_sin_table(self) -> CosSinTable | None:
        """The cos/sin table of integer positions on the CPU (see
        :mod:`posenc.rotary.cache`), or ``None`` where cos/sin are always computed
        (position-dependent scalings, sections). ``rope.cos_sin_table.max_bytes = 0``
        turns it off."""
        return self._table

    # --- frequencies --------------------------------------------------------------------------

    def _frequencies(self, seq_len: float | None) -> tuple[torch.Tensor, float]:
        """``(inv_freq float64 [r/2] on the CPU, attention_scale)`` for a call whose largest
        position is ``seq_len - 1`` (``None``: the state at construction). Subclasses with
        other frequencies (axial RoPE) override this."""
        inv_freq, scale = rotated_frequencies(
            self._head_dim,
            self._rotary_dim,
            base=self._base,
            scaling=self._scaling,
            seq_len=seq_len,
        )
        placed = place_frequencies(inv_freq, self._kernel_dim, self._partial)
        return (-placed if self._direction == "negative" else placed), scale

    def _call_frequencies(
        self, positions: Sequence[torch.Tensor], device: torch.device
    ) -> tuple[torch.Tensor, float]:
        """The frequencies (on ``device``) and cos/sin scale for a call with these positions
        (:meth:`posenc.rotary.call_frequencies.CallFrequencies.of_call`)."""
        return self._freqs.of_call(positions, device)

    # --- forward ------------------------------------------------------------------------------

    def _resolve(
        self,
        q_positions: Any,
        k_positions: Any,
        sq: int,
        sk: int,
        batch: int | None,
        device: torch.device,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q_positions, k_positions)`` on ``device`` (the same object when shared):
        :func:`posenc.positions.resolve_pair`, except that ``q_positions`` alone are those
        of the keys too (``forward(q, k, q_positions)`` rotates the same tokens)."""
        if q_positions is not None and k_positions is None:
            if sq != sk:
                raise PosEncError(
                    f"k_positions must be given when q and k lengths differ and q_positions "
                    f"is given, got q length {sq} and k length {sk}"
                )
            k_positions = q_positions
        coords = self.position_coords
        return _positions.resolve_pair(
            sq,
            sk,
            q_positions,
            k_positions,
            batch=batch,
            device=device,
            coords=coords,
            names=("q_positions", "k_positions"),
        )

    def cos_sin(
        self, positions: torch.Tensor, *, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (times ``attention_scale``) at ``positions``, as :func:`apply_rotary`
        takes them. Position-dependent scalings follow the largest of ``positions``; xPos'
        scales are not included.

        Shape: ``[*P]`` (with sections ``[*P, n_axes]``) -> ``[*P, rotary_dim / 2]`` each.
        """
        check_positions("positions", positions, ndims=None)
        n = self.position_coords
        if n is not None and (positions.ndim == 0 or positions.shape[-1] != n):
            raise PosEncError(
                f"positions must be [*P, {n}] (one coordinate per axis), got shape "
                f"{tuple(positions.shape)}"
            )
        check_dtype("dtype", dtype)  # any floating dtype (rotation() takes float32/64 only)
        hit = None if self._table is None else self._table.lookup(positions, dtype)
        if hit is not None:
            return hit
        inv_freq, scale = self._call_frequencies([positions], positions.device)
        return _cos_sin(positions, inv_freq, scale, self._section_map, dtype)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        q_positions: torch.Tensor | None = None,
        *,
        k_positions: torch.Tensor | None = None,
        seq_dim: int = -2,
        positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self._fast is not None and k_positions is None and positions is None:
            fast = fast_forward(self._fast, q, k, q_positions, seq_dim)  # the common call
            if fast is not None:
                return fast
        # the caller, past nn.Module.__call__ -> _wrapped_call_impl -> _call_impl -> forward
        q_positions = _renamed_positions(q_positions, positions, stacklevel=5)
        check_choice("seq_dim", seq_dim, SEQ_DIMS)
        check_qk(q, k, seq_dim, self._head_dim)
        if q.shape[0] != k.shape[0]:
            raise PosEncError(
                f"q and k must have the same batch size, got shapes "
                f"{tuple(q.shape)} and {tuple(k.shape)}"
            )
        if k.device != q.device:
            raise PosEncError(f"k must be on q's device {q.device}, got {k.device}")
        sq, sk, batch, device = q.shape[seq_dim], k.shape[seq_dim], q.shape[0], q.device
        q_pos, k_pos = self._resolve(q_positions, k_positions, sq, sk, batch, device)
        dtype = torch.float64 if torch.float64 in (q.dtype, k.dtype) else torch.float32
        return rotate_qk(q, k, self.rotation_at(q_pos, k_pos, dtype=dtype), self._layout, seq_dim)

    def rotation(
        self,
        q_len: int,
        k_len: int | None = None,
        *,
        q_positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
        batch: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
        positions: torch.Tensor | None = None,
    ) -> Rotation:
        """cos/sin of the query and key positions (xPos scales included), computed once to
        rotate many ``(q, k)`` pairs with :meth:`rotate`, e.g. in every layer of a model.

        ``rotate(q, k, rotation(sq, sk, q_positions=p, k_positions=kp))`` equals
        ``forward(q, k, p, k_positions=kp)``: positions and their defaults as in
        :meth:`forward`, for ``q_len`` queries and ``k_len`` keys (default ``q_len``).

        Args:
            q_len, k_len: numbers of queries and keys.
            q_positions, k_positions: as in :meth:`forward` (``positions=``: the deprecated
                name of ``q_positions=``).
            batch: the batch size ``[b, s]`` positions must fit (or 1); None: any.
            device: where the cos/sin live (default: that of the positions, else the CPU).
            dtype: of the cos/sin: float32, or float64 for float64 queries/keys (what
                :meth:`forward` uses).

        Shape:
            ``q_positions [sq]`` or ``[b, sq]``, ``k_positions [sk]`` or ``[b, sk]`` -> a
            :class:`Rotation` of ``[.., s, rotary_dim / 2]`` tensors.

        Examples:
            >>> import torch, posenc
            >>> rope = posenc.RotaryEmbedding(8)
            >>> q, k = torch.randn(2, 1, 2, 5, 8).unbind(0)
            >>> rot = rope.rotation(5)  # positions 0..4
            >>> [torch.equal(a, b) for a, b in zip(rope.rotate(q, k, rot), rope(q, k))]
            [True, True]
        """
        q_positions = _renamed_positions(q_positions, positions, stacklevel=3)
        sq = check_int("q_len", q_len, min=1)
        sk = sq if k_len is None else check_int("k_len", k_len, min=1)
        check_cos_sin_dtype(dtype)
        device = check_device("device", device)
        if device is None:
            given = [p for p in (q_positions, k_positions) if isinstance(p, torch.Tensor)]
            device = given[0].device if given else torch.device("cpu")
        q_pos, k_pos = self._resolve(q_positions, k_positions, sq, sk, batch, device)
        return self.rotation_at(q_pos, k_pos, dtype=dtype)

    def rotation_at(
        self, q_positions: torch.Tensor, k_positions: torch.Tensor, *, dtype: torch.dtype
    ) -> Rotation:
        """:meth:`rotation` of resolved positions (``k_positions is q_positions`` when the
        queries and keys are the same tokens: then ``cos_k is cos_q``)."""
        shared = q_positions is k_positions
        table = self._table
        if table is not None:  # integer CPU positions: gathered from the table
            hit_q = table.lookup(q_positions, dtype)
            hit_k = hit_q if shared or hit_q is None else table.lookup(k_positions, dtype)
            if hit_q is not None and hit_k is not None:
                return Rotation(hit_q[0], hit_q[1], hit_k[0], hit_k[1])
        inv_freq, scale = self._call_frequencies(
            [q_positions] if shared else [q_positions, k_positions], q_positions.device
        )
        cos_q, sin_q = _cos_sin(
            q_positions, inv_freq, scale, self._section_map, dtype
        )  # [.., s, r/2]
        cos_k, sin_k = (
            (cos_q, sin_q)
            if shared
            else _cos_sin(k_positions, inv_freq, scale, self._section_map, dtype)
        )
        return Rotation(cos_q, sin_q, cos_k, sin_k)

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, rotation: Rotation, *, seq_dim: int = -2
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``q`` and ``k`` by a precomputed :meth:`rotation` (no position work).

        Shape: ``q: [b, hq, sq, d]``, ``k: [b, hk, sk, d]`` (or ``[b, s, h, d]`` with
        ``seq_dim=-3``) -> ``(q, k)`` rotated, same shapes and dtypes.
        """
        check_choice("seq_dim", seq_dim, SEQ_DIMS)
        check_qk(q, k, seq_dim, self._head_dim)
        check_rotation(q, k, rotation, seq_dim, self._freqs.inv_freq.shape[0])
        return rotate_qk(q, k, rotation, self._layout, seq_dim)

    def rotate_at(
        self, q: torch.Tensor, k: torch.Tensor, rotation: Rotation, *, seq_dim: int = -2
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`rotate` of a rotation this module's :meth:`rotation_at` made for ``q`` and
        ``k``, which the caller has checked (:meth:`~posenc._base.RotaryEncoding.rotate_at`):
        only their head dim is checked against the module's."""
        check_last_dim("q", q, self._head_dim)
        if rotation.cos_k is rotation.cos_q:  # the same tokens: a call shape planned once
            done = rotate_planned(
                q, k, rotation.cos_q, rotation.sin_q, layout=self._layout, seq_dim=seq_dim,
                plans=self._plans,
            )  # fmt: skip
            if done is not None:
                return done
        return rotate_qk(q, k, rotation, self._layout, seq_dim)


def _renamed_positions(q_positions: Any, positions: Any, stacklevel: int) -> Any:
    """``q_positions``, or the deprecated keyword ``positions`` (its old name) if given;
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
