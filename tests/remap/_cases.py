"""What the position-map tests share: random q/k/v, the RoPE rotation as ``rotate``, and the
float64 reference of a map's attention."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import posenc
from posenc import reference as ref
from posenc.remap import SelfExtend, String

D = 8


def qkv(sq: int, sk: int, *, h: int = 4, hk: int = 2, dtype=torch.float64, b: int = 2, dv: int = D):
    q = torch.randn(b, h, sq, D, dtype=dtype)
    k = torch.randn(b, hk, sk, D, dtype=dtype)
    v = torch.randn(b, hk, sk, dv, dtype=dtype)
    return q, k, v


def rope_rotate(layout: str = "half", d: int = D):
    """``rotate(x, positions)`` by posenc's RoPE (cos/sin in float64 for float64 ``x``)."""
    enc = posenc.RotaryEmbedding(d, layout=layout)

    def rotate(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        dtype = torch.promote_types(x.dtype, torch.float32)
        return enc.rotate_at(x, x, enc.rotation_at(positions, positions, dtype=dtype))[0]

    return rotate


def map_params(*maps: SelfExtend | String) -> list[Any]:
    """``maps`` as pytest params, each named by its parameters (``SE-G2W4``, ``STR-S4W1``)."""
    return [
        pytest.param(m, id=f"SE-G{m.group_size}W{m.neighbor_window}")
        if isinstance(m, SelfExtend)
        else pytest.param(m, id=f"STR-S{m.shift}W{m.local_window}")
        for m in maps
    ]


def pair_positions(pmap: Any, q_pos, k_pos):
    """The reference's per-pair positions of a map."""
    if isinstance(pmap, SelfExtend):
        return ref.self_extend_positions(q_pos, k_pos, pmap.group_size, pmap.neighbor_window)
    assert isinstance(pmap, String)
    return ref.string_positions(q_pos, k_pos, pmap.shift, pmap.local_window)


def reference(q, k, v, pmap, q_pos, k_pos, *, layout="half", **kw) -> torch.Tensor:
    qp, kp = pair_positions(pmap, q_pos.numpy(), k_pos.numpy())
    inv_freq, _ = ref.rope_frequencies(D)
    keep = kw.pop("keep", None)
    out = ref.remapped_attention_reference(
        *(t.double().numpy() for t in (q, k, v)),
        inv_freq,
        qp,
        kp,
        q_positions=q_pos.numpy(),
        k_positions=k_pos.numpy(),
        layout=layout,
        keep=None if keep is None else keep.numpy(),
        **kw,
    )
    return torch.from_numpy(np.ascontiguousarray(out))
