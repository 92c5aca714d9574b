"""``posenc.attention(..., position_map=...)``: a rotary encoding's attention with its
positions remapped per (query, key) pair (Self-Extend, STRING; :mod:`posenc.remap`).

The call's checks are :func:`posenc.attention`'s, plus what a map needs: a rotary encoding
with one number per position, ``causal=True`` (a key is visible when its position is not
after the query's), no dropout, no gates, 1-D integer positions shared by the batch, and a
backend of :data:`posenc.remap.BACKENDS`. The encoding's rotation is handed to
:func:`posenc.remap.remapped_attention_at` as its ``rotate``: queries rotated as queries,
keys as keys (xPos scales them apart).
"""

from __future__ import annotations

from typing import Any

import torch

from posenc._base import PositionMap, RotaryEncoding
from posenc._errors import PosEncError, describe
from posenc.remap import BACKENDS, remapped_attention_at
from posenc.remap.flex import refusal
from posenc.remap.maps import coerce

__all__ = ["check_position_map", "remapped"]


def check_position_map(
    position_map: Any, enc: Any, *, causal: bool, dropout_p: float, gates: Any, backend: str
) -> PositionMap:
    """``position_map`` as a map, once the call can take one (raises naming what cannot)."""
    pmap = coerce(position_map, "position_map")
    if not isinstance(enc, RotaryEncoding) or enc.position_coords is not None:
        what = "no encoding" if enc is None else f"encoding {enc.name!r}"
        raise PosEncError(
            "position_map remaps the positions of a rotary encoding with one number per "
            f"position (RoPE): pass encoding='rope' or a RotaryEmbedding, got {what}"
        )
    if causal is not True:
        raise PosEncError(
            f"position_map needs causal=True (a map of offsets i - j >= 0), got {causal!r}"
        )
    if dropout_p:
        raise PosEncError(f"position_map takes no dropout: pass dropout_p=0, got {dropout_p}")
    if gates is not None:
        raise PosEncError("gates are read by gated encodings; position_map takes none")
    if backend not in BACKENDS:
        raise PosEncError(f"backend must be one of {BACKENDS} with position_map, got {backend!r}")
    return pmap


def _positions(name: str, p: torch.Tensor) -> torch.Tensor:
    if p.ndim != 1 or p.is_floating_point():
        raise PosEncError(
            f"{name} must be integer positions [s] shared by the batch with position_map, "
            f"got {describe(p)}"
        )
    return p.long()


def _rotation(enc: RotaryEncoding, dtype: torch.dtype, part: int):
    """``rotate(x, positions)``: ``x`` rotated by ``enc`` at ``positions`` as queries
    (``part=0``) or keys (1); cos/sin in float32 (float64 for float64 ``x``)."""

    def rotate(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        rotation = enc.rotation_at(positions, positions, dtype=dtype)
        return enc.rotate_at(x, x, rotation)[part]

    return rotate


def remapped(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    prep: Any,
    keep: torch.Tensor | None,
    scale: float,
    position_map: Any,
    causal: bool,
    dropout_p: float,
    gates: Any,
    backend: str,
) -> torch.Tensor:
    """The attention of a :func:`posenc.attention` call with a ``position_map`` (the call's
    own arguments checked; ``prep``: its prepared encoding, ``keep``: its checked mask),
    through :func:`posenc.remap.remapped_attention_at`."""
    enc: Any = None if prep is None else prep.encoding
    position_map = check_position_map(
        position_map, enc, causal=causal, dropout_p=dropout_p, gates=gates, backend=backend
    )
    # keys first: default query positions are the last keys'
    k_positions = _positions("k_positions", prep.k_positions.to(q.device))
    q_positions = _positions("q_positions", prep.q_positions.to(q.device))
    if backend == "flex" and (why := refusal(q, k, v)) is not None:
        raise PosEncError(f"backend='flex' cannot run here: {why}")
    dtype = torch.promote_types(q.dtype, torch.float32)
    return remapped_attention_at(
        q,
        k,
        v,
        rotate=_rotation(enc, dtype, 0),
        rotate_keys=_rotation(enc, dtype, 1),
        position_map=position_map,
        q_positions=q_positions,
        k_positions=k_positions,
        scale=scale,
        keep=keep,
        backend=backend,
    )
