"""``RotaryEmbedding``: RoPE as a module that rotates queries and keys.

The module holds no tensor state: its float64 frequencies are a plain attribute (with a
small per-device copy cache), not a buffer, so ``state_dict()`` is empty, construction
on the meta device works, and ``module.to(torch.bfloat16)`` cannot lower their precision.
cos/sin are computed from the positions of each call (float64 angles, reduced before
rounding), so there is no table to grow or go stale.

Shapes: ``q: [b, hq, sq, d]``, ``k: [b, hk, sk, d]`` (``seq_dim=-2``), or
``[b, s, h, d]`` with ``seq_dim=-3``; positions ``[s]`` or ``[b, s]`` (M-RoPE and axial:
``[s, n_axes]`` or ``[b, s, n_axes]``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, NamedTuple

import torch

from posenc import positions as _positions
from posenc._base import RotaryEncoding
from posenc._errors import (
    PosEncError,
    check_choice,
    check_float,
    check_int,
    check_last_dim,
    check_positions,
    check_tensor,
)
from posenc.rotary.apply import (
    LAYOUTS,
    SEQ_DIMS,
    Layout,
    _check_cos_sin,
    _cos_sin,
    _rotate,
    check_sections,
    xpos_scale,
)
from posenc.rotary.frequencies import (
    DynamicScaling,
    LongRopeScaling,
    Scaling,
    parse_scaling,
    rope_frequencies,
)
from posenc.rotary.kernels import dispatch_rotary

__all__ = ["RotaryEmbedding", "Rotation"]


class Rotation(NamedTuple):
    """cos/sin of the queries' and the keys' positions, one value per frequency
    (``[.., s, rotary_dim / 2]``), xPos scales included; ``cos_k is cos_q`` when the
    queries and keys are the same tokens (then rotated in one fused pass)."""

    cos_q: torch.Tensor
    sin_q: torch.Tensor
    cos_k: torch.Tensor
    sin_k: torch.Tensor


_CACHE_SIZE = 16  # (device, seq_len) frequency copies kept for dynamic scaling


def check_rotary_dims(head_dim: Any, rotary_dim: Any) -> tuple[int, int]:
    """Validate ``head_dim`` and ``rotary_dim`` (``None``: the whole head): both even,
    ``rotary_dim <= head_dim``."""
    head_dim = check_int("head_dim", head_dim, min=2)
    if head_dim % 2:
        raise PosEncError(f"head_dim must be even (RoPE rotates pairs of channels), got {head_dim}")
    rotary_dim = head_dim if rotary_dim is None else check_int("rotary_dim", rotary_dim, min=2)
    if rotary_dim % 2:
        raise PosEncError(
            f"rotary_dim must be even (RoPE rotates pairs of channels), got {rotary_dim}"
        )
    if rotary_dim > head_dim:
        raise PosEncError(f"rotary_dim must be <= head_dim ({head_dim}), got {rotary_dim}")
    return head_dim, rotary_dim


class RotaryEmbedding(RotaryEncoding):
    """Rotary position embedding (RoPE, Su et al., 2021) of queries and keys.

    ``forward(q, k, positions)`` rotates the first ``rotary_dim`` channels of every head
    of ``q`` and ``k`` by ``position * inv_freq`` (see :func:`posenc.apply_rotary` for the
    two pairing layouts), so that ``q_m . k_n`` depends on ``m - n`` only.

    Args:
        head_dim: channels per head ``d`` (even).
        base: the wavelength base (transformers' ``rope_theta``).
        rotary_dim: channels that rotate (even, ``<= head_dim``; default all); the rest pass
            through (GPT-NeoX's ``rotary_pct``, transformers' ``partial_rotary_factor``).
        layout: ``"half"`` (GPT-NeoX, Llama in transformers) or ``"interleaved"`` (RoFormer,
            GPT-J, Meta checkpoints, rotary-embedding-torch).
        scaling: a context-extension scaling: ``None``, a dict such as
            ``{"type": "yarn", "factor": 4, "original_max_position": 4096}`` (transformers'
            spellings accepted) or a dataclass from :mod:`posenc.rotary.frequencies`.
        sections: M-RoPE (Qwen2-VL): sizes summing to ``rotary_dim / 2``; positions are then
            ``[..., s, len(sections)]`` and frequency ``j`` takes the coordinate of the axis
            whose section holds ``j`` (see :class:`posenc.MultimodalRotaryEmbedding`).
        xpos_scale_base: turn on xPos (see :class:`posenc.XPosEmbedding`): queries are
            scaled by ``zeta^(n / xpos_scale_base)``, keys by ``zeta^(-n / xpos_scale_base)``.

    Attributes:
        inv_freq: the float64 frequencies ``[rotary_dim / 2]`` (on the CPU) as transformers'
            rotary module holds them at construction: for ``dynamic`` the unscaled ones, for
            ``longrope`` those of the short factors.
        attention_scale: the factor cos and sin are multiplied by (YaRN, LongRoPE; else 1.0).
            q and k are both multiplied, as transformers does, so logits carry its square.
        head_dim, rotary_dim, layout, base, scaling, sections, xpos_scale_base: read-only.

    Position-dependent scalings read the largest position of each call (of ``positions``
    and ``k_positions``): ``dynamic`` recomputes its frequencies from it, which needs one
    host synchronisation per call (``.item()``) on CUDA; ``longrope`` switches to its long
    factors once the largest position reaches ``original_max_position``, selected on the
    device without synchronising. All other cases never synchronise for integer
    positions (floating positions are checked for NaN, which synchronises once).

    Shape:
        ``q: [b, hq, sq, d]``, ``k: [b, hk, sk, d]`` (or ``[b, s, h, d]`` with
        ``seq_dim=-3``; ``hq != hk`` for GQA); ``positions: [sq]`` or ``[b, sq]``,
        ``k_positions: [sk]`` or ``[b, sk]`` -> ``(q, k)`` rotated, same shapes and dtypes.
        Positions ``None``: ``arange(sk)`` for keys and the last ``sq`` of them for queries
        (decoding; ``arange(sq)`` when ``sq > sk``), as :func:`posenc.positions.resolve_pair`;
        ``k_positions`` ``None`` with ``positions`` given: the query positions (``sq == sk``
        needed). :meth:`rotation` and :meth:`rotate` split this call in two, to compute the
        cos/sin once for many layers.

    Examples:
        >>> import torch, posenc
        >>> rope = posenc.RotaryEmbedding(64, base=10000.0)
        >>> q, k = torch.randn(2, 8, 16, 64), torch.randn(2, 2, 16, 64)  # GQA: 8 and 2 heads
        >>> q_rot, k_rot = rope(q, k)
        >>> q_rot.shape, k_rot.shape
        (torch.Size([2, 8, 16, 64]), torch.Size([2, 2, 16, 64]))
        >>> q_last, _ = rope(q[:, :, -1:], k)  # decoding: the query is the last position
        >>> torch.allclose(q_last, q_rot[:, :, -1:], atol=1e-6)
        True
        >>> rope.state_dict()
        OrderedDict()
    """

    name: ClassVar[str] = "rope"

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        layout: Layout = "half",
        scaling: Scaling | Mapping[str, Any] | None = None,
        sections: Sequence[int] | None = None,
        xpos_scale_base: float | None = None,
    ) -> None:
        super().__init__()
        self._head_dim, self._rotary_dim = check_rotary_dims(head_dim, rotary_dim)
        self._layout = check_choice("layout", layout, LAYOUTS)
        self._base = check_float("base", base, min=1.0, min_exclusive=True)
        self._scaling = parse_scaling(scaling)
        self._sections = (
            None if sections is None else check_sections(sections, self._rotary_dim // 2)
        )
        self._xpos_scale_base = (
            None
            if xpos_scale_base is None
            else check_float("xpos_scale_base", xpos_scale_base, min=0.0, min_exclusive=True)
        )
        if self._sections is not None and self._xpos_scale_base is not None:
            raise PosEncError(
                "xpos_scale_base cannot be combined with sections (xPos is defined for 1-D "
                f"positions), got sections={list(self._sections)}"
            )
        # Frequencies are computed on the CPU in float64 even under `with torch.device("meta")`.
        with torch.device("cpu"):
            inv_freq, scale = self._frequencies(None)
            self._long_inv_freq: torch.Tensor | None = None
            if isinstance(self._scaling, LongRopeScaling):
                self._long_inv_freq = self._frequencies(self._scaling.original_max_position + 1)[0]
        self._inv_freq64 = inv_freq  # a plain attribute: .to(dtype) never casts it
        self._attention_scale = scale
        self._device_cache: dict[Any, torch.Tensor] = {}
        self._set_config(
            head_dim=self._head_dim,
            base=self._base,
            rotary_dim=rotary_dim,
            layout=layout,
            scaling=self._scaling,
            sections=self._sections,
            xpos_scale_base=self._xpos_scale_base,
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

    @property
    def sections(self) -> tuple[int, ...] | None:
        return self._sections

    @property
    def xpos_scale_base(self) -> float | None:
        return self._xpos_scale_base

    @property
    def position_coords(self) -> int | None:
        """Coordinates per position: ``len(sections)`` for M-RoPE / axial, else ``None``."""
        return None if self._sections is None else len(self._sections)

    @property
    def inv_freq(self) -> torch.Tensor:
        """The float64 frequencies ``[rotary_dim / 2]`` at construction (CPU)."""
        return self._inv_freq64

    @property
    def attention_scale(self) -> float:
        return self._attention_scale

    # --- frequencies --------------------------------------------------------------------------

    def _frequencies(self, seq_len: float | None) -> tuple[torch.Tensor, float]:
        """``(inv_freq float64 [r/2] on the CPU, attention_scale)`` for a call whose largest
        position is ``seq_len - 1`` (``None``: the state at construction). Subclasses with
        other frequencies (axial RoPE) override this."""
        return rope_frequencies(
            self._rotary_dim, base=self._base, scaling=self._scaling, seq_len=seq_len
        )

    def _on_device(self, key: Any, device: torch.device, make) -> torch.Tensor:
        """A copy of a float64 CPU tensor on ``device``, kept per ``(key, device)``."""
        slot = (key, device)
        if slot not in self._device_cache:
            if len(self._device_cache) >= _CACHE_SIZE:
                self._device_cache.clear()
            self._device_cache[slot] = make().to(device)
        return self._device_cache[slot]

    def _call_frequencies(
        self, positions: Sequence[torch.Tensor], device: torch.device
    ) -> tuple[torch.Tensor, float]:
        """The frequencies (on ``device``) and cos/sin scale for a call with these positions."""
        scaling = self._scaling
        if scaling is None or not scaling.position_dependent:
            return self._on_device(
                "inv_freq", device, lambda: self._inv_freq64
            ), self._attention_scale
        maxima = [p.max().to(torch.float64) for p in positions if p.numel()]
        if not maxima:
            return self._on_device(
                "inv_freq", device, lambda: self._inv_freq64
            ), self._attention_scale
        largest = torch.stack(maxima).max()  # a device scalar
        if isinstance(scaling, LongRopeScaling):  # choose short / long on the device: no sync
            short = self._on_device("inv_freq", device, lambda: self._inv_freq64)
            long = self._on_device("long_inv_freq", device, lambda: self._long_inv_freq)
            return torch.where(
                largest + 1 > scaling.original_max_position, long, short
            ), self._attention_scale
        # dynamic: the frequencies depend on the value, so it must come to the host.
        seq_len = float(largest.item()) + 1.0
        if isinstance(scaling, DynamicScaling):  # below max_position: the unscaled ones
            seq_len = max(seq_len, float(scaling.max_position))
        with torch.device("cpu"):
            inv_freq, scale = self._frequencies(seq_len)
        return self._on_device(("seq_len", seq_len), device, lambda: inv_freq), scale

    # --- forward ------------------------------------------------------------------------------

    def _check_qk(self, name: str, x: Any, seq_dim: int) -> torch.Tensor:
        check_tensor(name, x, floating=True)
        if x.ndim != 4:
            layout = "[b, h, s, d]" if seq_dim == -2 else "[b, s, h, d]"
            raise PosEncError(
                f"{name} must be {layout} (seq_dim={seq_dim}), got shape {tuple(x.shape)}"
            )
        check_last_dim(name, x, self._head_dim)
        return x

    def _resolve(
        self,
        positions: Any,
        k_positions: Any,
        sq: int,
        sk: int,
        batch: int | None,
        device: torch.device,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q_positions, k_positions)`` on ``device`` (the same object when shared):
        :func:`posenc.positions.resolve_pair`, except that ``positions`` alone are those of
        the keys too (``forward(q, k, positions)`` rotates the same tokens)."""
        if positions is not None and k_positions is None:
            if sq != sk:
                raise PosEncError(
                    f"k_positions must be given when q and k lengths differ and positions "
                    f"is given, got q length {sq} and k length {sk}"
                )
            k_positions = positions
        coords = self.position_coords
        return _positions.resolve_pair(
            sq,
            sk,
            positions,
            k_positions,
            batch=batch,
            device=device,
            coords=coords,
            names=("positions", "k_positions"),
        )

    def cos_sin(
        self, positions: torch.Tensor, *, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (times ``attention_scale``) at ``positions``, as :func:`apply_rotary`
        takes them. Position-dependent scalings follow the largest of ``positions``; the
        xPos scales are not included.

        Shape: ``[*P]`` (with sections ``[*P, n_axes]``) -> ``[*P, rotary_dim / 2]`` each.
        """
        check_positions("positions", positions, ndims=None)
        inv_freq, scale = self._call_frequencies([positions], positions.device)
        return _cos_sin(positions, inv_freq, scale, self._sections, dtype)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor | None = None,
        *,
        k_positions: torch.Tensor | None = None,
        seq_dim: int = -2,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        check_choice("seq_dim", seq_dim, SEQ_DIMS)
        self._check_qk("q", q, seq_dim)
        self._check_qk("k", k, seq_dim)
        if q.shape[0] != k.shape[0]:
            raise PosEncError(
                f"q and k must have the same batch size, got shapes "
                f"{tuple(q.shape)} and {tuple(k.shape)}"
            )
        sq, sk, batch, device = q.shape[seq_dim], k.shape[seq_dim], q.shape[0], q.device
        q_pos, k_pos = self._resolve(positions, k_positions, sq, sk, batch, device)
        dtype = torch.float64 if torch.float64 in (q.dtype, k.dtype) else torch.float32
        return self._rotate_qk(q, k, self.rotation_at(q_pos, k_pos, dtype=dtype), seq_dim)

    def rotation(
        self,
        q_len: int,
        k_len: int | None = None,
        *,
        positions: torch.Tensor | None = None,
        k_positions: torch.Tensor | None = None,
        batch: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> Rotation:
        """cos/sin of the query and key positions (xPos scales included), computed once to
        rotate many ``(q, k)`` pairs with :meth:`rotate`, e.g. in every layer of a model.

        ``rotate(q, k, rotation(sq, sk, positions=p, k_positions=kp))`` equals
        ``forward(q, k, p, k_positions=kp)``: positions and their defaults as in
        :meth:`forward`, for ``q_len`` queries and ``k_len`` keys (default ``q_len``).

        Args:
            q_len, k_len: numbers of queries and keys.
            positions, k_positions: as in :meth:`forward`.
            batch: the batch size ``[b, s]`` positions must fit (or 1); None: any.
            device: where the cos/sin live (default: that of the positions, else the CPU).
            dtype: of the cos/sin: float32, or float64 for float64 queries/keys (what
                :meth:`forward` uses).

        Shape:
            ``positions [sq]`` or ``[b, sq]``, ``k_positions [sk]`` or ``[b, sk]`` -> a
            :class:`Rotation` of ``[.., s, rotary_dim / 2]`` tensors.

        Examples:
            >>> import torch, posenc
            >>> rope = posenc.RotaryEmbedding(8)
            >>> q, k = torch.randn(2, 1, 2, 5, 8).unbind(0)
            >>> rot = rope.rotation(5)  # positions 0..4
            >>> [torch.equal(a, b) for a, b in zip(rope.rotate(q, k, rot), rope(q, k))]
            [True, True]
        """
        sq = check_int("q_len", q_len, min=1)
        sk = sq if k_len is None else check_int("k_len", k_len, min=1)
        if dtype not in (torch.float32, torch.float64):
            raise PosEncError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        if device is None:
            given = [p for p in (positions, k_positions) if isinstance(p, torch.Tensor)]
            device = given[0].device if given else torch.device("cpu")
        q_pos, k_pos = self._resolve(positions, k_positions, sq, sk, batch, torch.device(device))
        return self.rotation_at(q_pos, k_pos, dtype=dtype)

    def rotation_at(
        self, q_pos: torch.Tensor, k_pos: torch.Tensor, *, dtype: torch.dtype
    ) -> Rotation:
        """:meth:`rotation` of resolved positions (``k_pos is q_pos`` when shared)."""
        shared = q_pos is k_pos
        inv_freq, scale = self._call_frequencies(
            [q_pos] if shared else [q_pos, k_pos], q_pos.device
        )
        if self._xpos_scale_base is None:
            cos_q, sin_q = _cos_sin(q_pos, inv_freq, scale, self._sections, dtype)  # [.., s, r/2]
            cos_k, sin_k = (
                (cos_q, sin_q)
                if shared
                else _cos_sin(k_pos, inv_freq, scale, self._sections, dtype)
            )
        else:  # xPos: q gets zeta^(n / base), k zeta^(-n / base); one rounding, after the product
            cos, sin = _cos_sin(q_pos, inv_freq, scale, None, torch.float64)
            zq = xpos_scale(q_pos, self._rotary_dim, self._xpos_scale_base)
            cos_q, sin_q = (cos * zq).to(dtype), (sin * zq).to(dtype)
            if not shared:
                cos, sin = _cos_sin(k_pos, inv_freq, scale, None, torch.float64)
            zk = xpos_scale(k_pos, self._rotary_dim, -self._xpos_scale_base)
            cos_k, sin_k = (cos * zk).to(dtype), (sin * zk).to(dtype)
        return Rotation(cos_q, sin_q, cos_k, sin_k)

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, rotation: Rotation, *, seq_dim: int = -2
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``q`` and ``k`` by a precomputed :meth:`rotation` (no position work).

        Shape: ``q: [b, hq, sq, d]``, ``k: [b, hk, sk, d]`` (or ``[b, s, h, d]`` with
        ``seq_dim=-3``) -> ``(q, k)`` rotated, same shapes and dtypes.
        """
        check_choice("seq_dim", seq_dim, SEQ_DIMS)
        self._check_qk("q", q, seq_dim)
        self._check_qk("k", k, seq_dim)
        if not isinstance(rotation, Rotation):
            raise PosEncError(
                f"rotation must be a Rotation from RotaryEmbedding.rotation, got "
                f"{type(rotation).__name__}"
            )
        _check_cos_sin(q, rotation.cos_q, rotation.sin_q, seq_dim)
        _check_cos_sin(k, rotation.cos_k, rotation.sin_k, seq_dim)
        for name, t in (("cos_q", rotation.cos_q), ("cos_k", rotation.cos_k)):
            if t.shape[-1] != self._rotary_dim // 2:
                raise PosEncError(
                    f"rotation.{name} must have {self._rotary_dim // 2} frequencies "
                    f"(rotary_dim / 2), got shape {tuple(t.shape)}"
                )
        return self._rotate_qk(q, k, rotation, seq_dim)

    def _rotate_qk(
        self, q: torch.Tensor, k: torch.Tensor, rotation: Rotation, seq_dim: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`rotate` on validated arguments."""
        layout = self._layout
        if rotation.cos_k is rotation.cos_q:  # the same tokens: q and k in one fused pass
            q_out, k_out = dispatch_rotary(
                q, k, rotation.cos_q, rotation.sin_q, layout=layout, seq_dim=seq_dim
            )
            return q_out, k_out
        q_out = _rotate(q, rotation.cos_q, rotation.sin_q, layout, seq_dim)
        k_out = _rotate(k, rotation.cos_k, rotation.sin_k, layout, seq_dim)
        return q_out, k_out
