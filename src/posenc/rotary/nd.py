"""N-D rotary embeddings: M-RoPE (Qwen2-VL) and axial RoPE for image patches and video.

Both give each frequency one axis of an N-D position, so ``q . k`` depends only on the
N-D offset between two tokens (each frequency contributes a rotation by its axis'
coordinate difference). They differ in which frequencies each axis gets:

- **M-RoPE** (Wang et al., 2024, Qwen2-VL): ``RotaryEmbedding(head_dim, sections=...)``,
  the 1-D RoPE frequencies of the whole rotary dim, cut into ``sections``: the first
  ``sections[0]`` (highest) frequencies follow axis 0 (time), the next ``sections[1]`` axis
  1 (height), and so on. Text tokens carry the same position on every axis and then get
  exactly 1-D RoPE. Matches transformers' ``Qwen2VLRotaryEmbedding`` +
  ``apply_multimodal_rotary_pos_emb`` (``mrope_section``). :class:`MultimodalRotaryEmbedding`
  (``"mrope"``) is its deprecated second spelling.
- **Axial RoPE** (Heo et al., 2024; EVA-02, FLUX, Qwen2-VL's vision tower): each axis gets
  its own share of the channels, ``axis_dims[a]``, with the full 1-D frequency range
  ``1 / base^(2i / axis_dims[a])`` over that share, so every axis sees both fine and coarse
  wavelengths. ``AxialRotaryEmbedding(d, 2)`` is Qwen2-VL's vision RoPE.

Positions are coordinates ``[s, n_axes]`` or ``[b, s, n_axes]``, e.g. from
:func:`posenc.positions.grid` flattened to a token sequence.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch

from posenc._errors import PosEncError, check_alloc, check_float, check_int
from posenc.rotary.frequencies import Scaling, rope_frequencies
from posenc.rotary.layout import Layout, check_rotary_dims
from posenc.rotary.module import RotaryEmbedding

__all__ = ["AxialRotaryEmbedding", "MultimodalRotaryEmbedding", "axial_frequencies"]


def axial_frequencies(axis_dims: Sequence[int], *, base: float = 10000.0) -> torch.Tensor:
    """The 1-D RoPE frequencies of each axis' ``axis_dims[a]`` channels, axis 0 first.

    Args:
        axis_dims: rotated channels per axis (each even, ``>= 2``).
        base: the wavelength base shared by the axes.

    Shape:
        ``[sum(axis_dims) / 2]`` float64 on the CPU.

    Examples:
        >>> import posenc
        >>> posenc.rotary.nd.axial_frequencies((4, 4), base=100.0)
        tensor([1.0000, 0.1000, 1.0000, 0.1000], dtype=torch.float64)
    """
    base = check_float("base", base, min=1.0, min_exclusive=True)
    if not isinstance(axis_dims, (list, tuple)):
        raise PosEncError(f"axis_dims must be a list or tuple of even integers, got {axis_dims!r}")
    if not len(axis_dims):
        raise PosEncError("axis_dims must name at least one axis, got an empty sequence")
    blocks = []
    for a, dim in enumerate(axis_dims):
        dim = check_int(f"axis_dims[{a}]", dim, min=2)
        if dim % 2:
            raise PosEncError(f"axis_dims[{a}] must be even (RoPE rotates pairs), got {dim}")
        check_alloc(f"axis_dims[{a}]", dim, (dim,), torch.float64)
        blocks.append(rope_frequencies(dim, base=base)[0])
    return torch.cat(blocks)


def check_head_dim(head_dim: Any) -> int:
    """``head_dim`` of a rotary module: an integer >= 2 whose frequency tables fit in memory
    (checked before any is built, so the error names ``head_dim``)."""
    head_dim = check_int("head_dim", head_dim, min=2)
    check_alloc("head_dim", head_dim, (4, head_dim), torch.float64)
    return head_dim


class MultimodalRotaryEmbedding(RotaryEmbedding):
    """Deprecated: M-RoPE is ``RotaryEmbedding(head_dim, sections=sections, ...)`` (registry
    name ``"rope"`` with ``sections=``), which also takes ``section_layout`` (Qwen3-VL)
    and is what :func:`posenc.integrations.transformers.rotary_from_config` returns.

    Constructing this class (or ``build("mrope", ...)``) warns (a
    :class:`DeprecationWarning`) and builds the same rotation; it goes in the next release.
    A saved ``"mrope"`` config loads, without a warning, as the ``"rope"`` config with the
    same sections (:meth:`upgrade_config`).

    Args:
        head_dim, sections, base, rotary_dim, layout, scaling: as in
            :class:`posenc.RotaryEmbedding`.
    """

    name: ClassVar[str] = "mrope"

    @classmethod
    def upgrade_config(cls, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """A saved ``"mrope"`` config (it holds ``sections``) is the ``"rope"`` config of the
        same arguments: the one spelling of M-RoPE."""
        if args.get("sections") is None:  # no sections: this class refuses it, by name
            return cls.name, args
        return RotaryEmbedding.name, dict(args)

    def __init__(
        self,
        head_dim: int,
        sections: Sequence[int],
        *,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        layout: Layout = "half",
        scaling: Scaling | Mapping[str, Any] | None = None,
    ) -> None:
        warnings.warn(
            "MultimodalRotaryEmbedding (registry name 'mrope') is deprecated: M-RoPE is "
            "RotaryEmbedding(head_dim, sections=...) (registry name 'rope' with sections=); "
            "the old spelling will be removed in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        if sections is None:
            raise PosEncError("sections must be given for M-RoPE (e.g. (16, 24, 24)), got None")
        check_head_dim(head_dim)
        super().__init__(
            head_dim,
            base=base,
            rotary_dim=rotary_dim,
            layout=layout,
            scaling=scaling,
            sections=sections,
        )
        self._set_config(
            head_dim=self.head_dim,
            sections=self.sections,
            base=self.base,
            rotary_dim=rotary_dim,
            layout=layout,
            scaling=self.scaling,
        )


def _axis_dims(head_dim: int, n_axes: Any, rotary_dim: Any, axis_dims: Any) -> tuple[int, ...]:
    """Channels per axis: ``axis_dims`` checked, or ``rotary_dim`` split evenly."""
    if axis_dims is not None:
        if isinstance(axis_dims, (str, bytes, torch.Tensor)) or not hasattr(axis_dims, "__len__"):
            raise PosEncError(f"axis_dims must be a sequence of even integers, got {axis_dims!r}")
        dims = tuple(check_int(f"axis_dims[{a}]", d, min=2) for a, d in enumerate(axis_dims))
        if len(dims) != n_axes:
            raise PosEncError(f"axis_dims must have n_axes = {n_axes} entries, got {list(dims)}")
        for a, d in enumerate(dims):
            if d % 2:
                raise PosEncError(f"axis_dims[{a}] must be even (RoPE rotates pairs), got {d}")
        total = head_dim if rotary_dim is None else rotary_dim
        if rotary_dim is not None and sum(dims) != total:
            raise PosEncError(
                f"axis_dims must sum to rotary_dim = {total}, got {list(dims)} (sum {sum(dims)})"
            )
        if rotary_dim is None and sum(dims) > head_dim:
            raise PosEncError(
                f"axis_dims must sum to <= head_dim = {head_dim}, got {list(dims)} (sum {sum(dims)})"
            )
        return dims
    _, total = check_rotary_dims(head_dim, rotary_dim)
    if total % (2 * n_axes):
        raise PosEncError(
            f"rotary_dim must be divisible by 2 * n_axes = {2 * n_axes} to split it evenly "
            f"across the axes (or pass axis_dims), got {total}"
        )
    return (total // n_axes,) * n_axes


class AxialRotaryEmbedding(RotaryEmbedding):
    """Axial N-D RoPE: each axis rotates its own share of the channels with the full 1-D
    RoPE frequency range, so ``q . k`` depends only on the N-D offset of two tokens.

    The first ``axis_dims[0] / 2`` frequencies follow axis 0, the next ``axis_dims[1] / 2``
    axis 1, and so on; the channel pairs they rotate are set by ``layout`` (interleaved:
    channels ``[0, axis_dims[0])`` follow axis 0, then the next ``axis_dims[1]``; half:
    channels ``i`` and ``i + r/2`` for each frequency ``i`` of the axis). With ``n_axes=2``,
    the default even split and ``layout="half"`` this is Qwen2-VL's vision RoPE; FLUX is
    ``AxialRotaryEmbedding(128, 3, axis_dims=(16, 56, 56), layout="interleaved")``.

    Args:
        head_dim: channels per head (even).
        n_axes: number of position axes (2 for images, 3 for video).
        base: the wavelength base of every axis.
        rotary_dim: channels that rotate (default all, or ``sum(axis_dims)``); split evenly
            across the axes when ``axis_dims`` is not given (then divisible by ``2 * n_axes``).
        layout: ``"half"`` or ``"interleaved"``, as in :func:`posenc.apply_rotary`.
        axis_dims: channels per axis (each even), summing to ``rotary_dim``.

    Attributes:
        axis_dims: channels per axis; ``sections`` is ``axis_dims / 2`` (frequencies per axis).

    Shape:
        ``q: [b, hq, sq, d]``, ``k: [b, hk, sk, d]``; positions ``[s, n_axes]`` or
        ``[b, s, n_axes]`` (e.g. ``posenc.positions.grid((H, W)).reshape(-1, 2)``) -> ``(q, k)``.

    Examples:
        >>> import torch, posenc
        >>> rope = posenc.AxialRotaryEmbedding(16, n_axes=2)
        >>> patches = posenc.positions.grid((3, 4)).reshape(-1, 2)  # [12, 2] (row, column)
        >>> q = k = torch.randn(1, 2, 12, 16)
        >>> rope(q, k, patches)[0].shape
        torch.Size([1, 2, 12, 16])
    """

    name: ClassVar[str] = "axial_rope"

    def __init__(
        self,
        head_dim: int,
        n_axes: int = 2,
        *,
        base: float = 10000.0,
        rotary_dim: int | None = None,
        layout: Layout = "half",
        axis_dims: Sequence[int] | None = None,
    ) -> None:
        n_axes = check_int("n_axes", n_axes, min=1)
        head_dim = check_rotary_dims(check_head_dim(head_dim), None)[0]
        if rotary_dim is not None:  # an integer, even, <= head_dim, whatever axis_dims says
            rotary_dim = check_rotary_dims(head_dim, rotary_dim)[1]
        dims = _axis_dims(head_dim, n_axes, rotary_dim, axis_dims)
        # Read by _frequencies() inside RotaryEmbedding.__init__ (a plain attribute).
        self._axis_dims = dims
        super().__init__(
            head_dim,
            base=base,
            rotary_dim=sum(dims),
            layout=layout,
            sections=tuple(d // 2 for d in dims),
        )
        self._set_config(
            head_dim=head_dim,
            n_axes=n_axes,
            base=self.base,
            rotary_dim=rotary_dim,
            layout=layout,
            axis_dims=None if axis_dims is None else dims,
        )

    @property
    def axis_dims(self) -> tuple[int, ...]:
        return self._axis_dims

    def _frequencies(self, seq_len: float | None) -> tuple[torch.Tensor, float]:
        return axial_frequencies(self._axis_dims, base=self._base), 1.0
