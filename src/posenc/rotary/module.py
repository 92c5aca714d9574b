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
from typing import Any, ClassVar

import torch

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

__all__ = ["RotaryEmbedding"]

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
        (decoding); ``k_positions`` ``None``: the query positions (``sq == sk`` needed).

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
            head_dim=self._head_dim, base=self._base, rotary_dim=rotary_dim, layout=layout,
            scaling=self._scaling, sections=self._sections, xpos_scale_base=self._xpos_scale_base,
        )  # fmt: skip

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
            return self._on_device("inv_freq", device, lambda: self._inv_freq64), self._attention_scale
        maxima = [p.max().to(torch.float64) for p in positions if p.numel()]
        if not maxima:
            return self._on_device("inv_freq", device, lambda: self._inv_freq64), self._attention_scale
        largest = torch.stack(maxima).max()  # a device scalar
        if isinstance(scaling, LongRopeScaling):  # choose short / long on the device: no sync
            short = self._on_device("inv_freq", device, lambda: self._inv_freq64)
            long = self._on_device("long_inv_freq", device, lambda: self._long_inv_freq)
            return torch.where(largest + 1 > scaling.original_max_position, long, short), \
                self._attention_scale  # fmt: skip
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
            raise PosEncError(f"{name} must be {layout} (seq_dim={seq_dim}), got shape "
                              f"{tuple(x.shape)}")  # fmt: skip
        check_last_dim(name, x, self._head_dim)
        return x

    def _check_positions(self, name: str, p: Any, seq_len: int, batch: int) -> torch.Tensor:
        if self._sections is None:
            return check_positions(name, p, seq_len=seq_len, batch=batch)
        n_axes = len(self._sections)
        check_positions(name, p, ndims=None)  # a tensor of finite numbers; the shape below
        if p.ndim not in (2, 3) or p.shape[-1] != n_axes or p.shape[-2] != seq_len:
            raise PosEncError(
                f"{name} must be [s, {n_axes}] or [b, s, {n_axes}] (one coordinate per section) "
                f"with s == {seq_len}, got shape {tuple(p.shape)}"
            )
        if p.ndim == 3 and p.shape[0] not in (1, batch):
            raise PosEncError(f"{name} of shape [b, s, {n_axes}] must have b == {batch} (the batch "
                              f"size) or 1, got shape {tuple(p.shape)}")  # fmt: skip
        return p

    def _default_positions(self, seq_len: int, device: torch.device) -> torch.Tensor:
        p = torch.arange(seq_len, device=device)  # [s]
        if self._sections is not None:
            p = p[:, None].expand(seq_len, len(self._sections))  # text tokens: all axes equal
        return p

    def _resolve(
        self,
        positions: Any,
        k_positions: Any,
        sq: int,
        sk: int,
        batch: int,
        device: torch.device,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q_positions, k_positions)`` on ``device`` (the same object when shared)."""
        seq_axis = -1 if self._sections is None else -2
        if k_positions is not None:
            k_pos = self._check_positions("k_positions", k_positions, sk, batch).to(device)
        if positions is not None:
            q_pos = self._check_positions("positions", positions, sq, batch).to(device)
            if k_positions is None:
                if sq != sk:
                    raise PosEncError(
                        f"k_positions must be given when q and k lengths differ and positions "
                        f"is given, got q length {sq} and k length {sk}"
                    )
                k_pos = q_pos
            return q_pos, k_pos
        if sq > sk:
            raise PosEncError(
                f"positions must be given when q is longer than k (queries default to the last "
                f"positions of the keys), got q length {sq} and k length {sk}"
            )
        if k_positions is None:
            k_pos = self._default_positions(sk, device)
        q_pos = k_pos if sq == sk else k_pos.narrow(seq_axis, sk - sq, sq)
        return q_pos, k_pos

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
            raise PosEncError(f"q and k must have the same batch size, got shapes "
                              f"{tuple(q.shape)} and {tuple(k.shape)}")  # fmt: skip
        sq, sk, batch, device = q.shape[seq_dim], k.shape[seq_dim], q.shape[0], q.device
        q_pos, k_pos = self._resolve(positions, k_positions, sq, sk, batch, device)
        shared = q_pos is k_pos
        inv_freq, scale = self._call_frequencies([q_pos] if shared else [q_pos, k_pos], device)
        dtype = torch.float64 if torch.float64 in (q.dtype, k.dtype) else torch.float32
        if self._xpos_scale_base is None:
            cos_q, sin_q = _cos_sin(q_pos, inv_freq, scale, self._sections, dtype)  # [.., s, r/2]
            cos_k, sin_k = (cos_q, sin_q) if shared else _cos_sin(
                k_pos, inv_freq, scale, self._sections, dtype
            )  # fmt: skip
        else:  # xPos: q gets zeta^(n / base), k zeta^(-n / base); one rounding, after the product
            cos, sin = _cos_sin(q_pos, inv_freq, scale, None, torch.float64)
            zq = xpos_scale(q_pos, self._rotary_dim, self._xpos_scale_base)
            cos_q, sin_q = (cos * zq).to(dtype), (sin * zq).to(dtype)
            if not shared:
                cos, sin = _cos_sin(k_pos, inv_freq, scale, None, torch.float64)
            zk = xpos_scale(k_pos, self._rotary_dim, -self._xpos_scale_base)
            cos_k, sin_k = (cos * zk).to(dtype), (sin * zk).to(dtype)
        if cos_k is cos_q:  # the same tokens: q and k in one fused pass (posenc.rotary.kernels)
            q_out, k_out = dispatch_rotary(q, k, cos_q, sin_q, layout=self._layout, seq_dim=seq_dim)
            return q_out, k_out
        q_out = _rotate(q, cos_q, sin_q, self._layout, seq_dim)
        k_out = _rotate(k, cos_k, sin_k, self._layout, seq_dim)
        return q_out, k_out
