"""rotary-embedding-torch's ``RotaryEmbedding``, run for real (CPU).

Checked against rotary-embedding-torch 0.9.1 with torch 2.13. What it does, read from
``rotary_embedding_torch.py``: it pairs adjacent channels ``(2i, 2i + 1)`` (its
``rotate_half`` splits ``(d r)`` with ``r = 2``; no other layout), forms the positions in
the dtype of the tensor it rotates (``get_seq_pos``) and its float32 frequencies times
them; ``interpolate_factor`` divides the positions (linear scaling) and
``theta_rescale_factor`` raises the base to ``base * factor^(d / (d - 2))`` (NTK). Its xPos
scale is ``zeta^((n - len // 2) / scale_base)``: centred on the middle of the sequence.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from posenc.conformance._api import Adapter, Unsupported
from posenc.conformance.adapters._common import (
    check_dtype,
    check_layout,
    factor_options,
    no_extra,
    scaling_kind,
    torch_library,
)

__all__ = ["rotary_embedding_torch_rope", "rotary_embedding_torch_xpos"]

_WHO = "rotary-embedding-torch"
#: posenc's scaling type -> the ``RotaryEmbedding`` keyword its factor goes to.
_FACTORS = {"linear": "interpolate_factor", "ntk": "theta_rescale_factor"}


def rotary_embedding_torch_rope(
    dtype: str = "float32", *, layout: str | None = "interleaved"
) -> Adapter:
    """``RotaryEmbedding(dim=rotary_dim, theta=base).rotate_queries_or_keys`` as a rotation
    adapter: each position ``p`` one call with ``offset=p`` (the library's own position
    path), q and k as ``[heads, 1, dim]``. Scalings: default, linear
    (``interpolate_factor``), ntk (``theta_rescale_factor``); others raise
    :class:`~posenc.conformance.Unsupported`.

    Args:
        dtype: q and k's dtype, ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        layout: the layout the adapter claims (``"interleaved"``, the library's); ``None``
            claims none, so it is run on every layout's cases (to see the others named).

    Returns: an :class:`Adapter` (``rotate``, family ``rope``).

    Raises:
        PosEncError: rotary-embedding-torch (or torch) is not installed, a bad ``dtype``, or a
            ``layout`` other than None and ``"interleaved"`` (the only one it offers).
    """
    dtype = check_dtype(dtype)
    layout = check_layout(layout, ("interleaved",), f"{_WHO} RotaryEmbedding")
    torch, ret, source = torch_library(_WHO, "rotary_embedding_torch")
    torch_dtype = getattr(torch, dtype)

    def rotate(
        q: np.ndarray,
        k: np.ndarray,
        positions: np.ndarray,
        *,
        base: float,
        scaling: Mapping[str, Any] | None,
        rotary_dim: int,
        **extra: Any,
    ) -> tuple[np.ndarray, np.ndarray]:
        no_extra(extra, f"{_WHO} RotaryEmbedding")
        options = factor_options(scaling, _FACTORS, f"{_WHO} RotaryEmbedding")
        rope = ret.RotaryEmbedding(dim=rotary_dim, theta=base, cache_if_possible=False, **options)
        out = []
        with torch.no_grad():
            for x in (q, k):
                t = torch.from_numpy(np.ascontiguousarray(x)).to(torch_dtype)  # [seq, heads, dim]
                rows = [
                    rope.rotate_queries_or_keys(t[s][:, None, :], offset=int(p))[:, 0, :]
                    for s, p in enumerate(np.asarray(positions).reshape(-1))
                ]
                out.append(torch.stack(rows).double().numpy())
        return out[0], out[1]

    return Adapter(
        f"{_WHO} RotaryEmbedding [{dtype}]" + ("" if layout else " (no layout claimed)"),
        "rotate",
        "rope",
        rotate,
        convention={} if layout is None else {"layout": layout},
        dtype=dtype,
        source=source,
    )


def rotary_embedding_torch_xpos(dtype: str = "float32") -> Adapter:
    """``RotaryEmbedding(dim, use_xpos=True, xpos_scale_base=...).rotate_queries_and_keys`` as
    an xPos rotation adapter. The library rotates a whole sequence ``0..n-1`` (no offset for
    xPos): q and k rows are placed at their positions in a sequence of ``max + 1`` rows,
    rotated, and read back. It claims no layout (it pairs adjacent channels; the xPos cases
    pair halves), so the check names how it differs.

    Args:
        dtype: q and k's dtype.

    Returns: an :class:`Adapter` (``rotate``, family ``xpos``).

    Raises:
        PosEncError: rotary-embedding-torch (or torch) is not installed, or a bad ``dtype``.
    """
    dtype = check_dtype(dtype)
    torch, ret, source = torch_library(_WHO, "rotary_embedding_torch")
    torch_dtype = getattr(torch, dtype)

    def rotate(
        q: np.ndarray,
        k: np.ndarray,
        positions: np.ndarray,
        *,
        base: float,
        scaling: Mapping[str, Any] | None,
        rotary_dim: int,
        xpos_scale_base: float,
        **extra: Any,
    ) -> tuple[np.ndarray, np.ndarray]:
        no_extra(extra, f"{_WHO} xPos")
        scaling_kind(scaling, ("default",), f"{_WHO} xPos")
        if rotary_dim != q.shape[-1]:
            raise Unsupported(f"{_WHO} xPos rotates the whole head")
        rope = ret.RotaryEmbedding(
            dim=rotary_dim,
            theta=base,
            use_xpos=True,
            xpos_scale_base=xpos_scale_base,
            cache_if_possible=False,
        )
        pos = torch.from_numpy(np.asarray(positions, dtype=np.int64))
        length = int(pos.max()) + 1
        seq = []
        for x in (q, k):
            t = torch.zeros(length, *q.shape[1:], dtype=torch_dtype)
            t[pos] = torch.from_numpy(np.ascontiguousarray(x)).to(torch_dtype)
            seq.append(t.transpose(0, 1))  # [heads, length, dim]
        with torch.no_grad():
            q_rot, k_rot = rope.rotate_queries_and_keys(seq[0], seq[1])
        return tuple(x.transpose(0, 1)[pos].double().numpy() for x in (q_rot, k_rot))  # type: ignore[return-value]

    return Adapter(
        f"{_WHO} xPos [{dtype}]",
        "rotate",
        "xpos",
        rotate,
        dtype=dtype,
        source=source,
    )
