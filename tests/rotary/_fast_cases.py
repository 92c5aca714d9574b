"""What tests/rotary/test_fast.py uses: the general path of a call, whether the fast path
serves it, the q and k of a call, and the matrix of calls the fast path must serve with
the general path's bits."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.rotary import module as rotary_module
from posenc.rotary.kernels import planned as fast


def general(rope, *args, **kwargs):
    """The call through the general path (the fast one switched off)."""
    saved = rotary_module.fast_forward
    rotary_module.fast_forward = lambda *a, **kw: None
    try:
        return rope(*args, **kwargs)
    finally:
        rotary_module.fast_forward = saved


def served(rope, q, k, positions=None, seq_dim=-2):
    """Whether the fast path serves the call: the module hands it a FastRotation (none for
    xPos, M-RoPE and position-dependent scalings), and it accepts the call."""
    plan = rope._fast
    return plan is not None and fast.fast_forward(plan, q, k, positions, seq_dim) is not None


def tensors(dtype, seq_dim, b=3, hq=4, hk=2, s=5, d=16, view="contiguous"):
    """q ``[b, hq, s, d]`` and k ``[b, hk, s, d]`` (``seq_dim=-3``: ``[b, s, h, d]``);
    ``view="transposed"``: the same logical shapes in the other memory order."""
    gen = torch.Generator().manual_seed(s + d)
    shape_q = (b, hq, s, d) if seq_dim == -2 else (b, s, hq, d)
    shape_k = (b, hk, s, d) if seq_dim == -2 else (b, s, hk, d)
    q = torch.randn(*shape_q, generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(*shape_k, generator=gen, dtype=torch.float64).to(dtype)
    if view == "transposed":
        q = q.transpose(1, 2).contiguous().transpose(1, 2)
        k = k.transpose(1, 2).contiguous().transpose(1, 2)
    return q, k


POSITIONS = {
    "none": lambda: None,
    "s": lambda: torch.tensor([4, 0, 9, 70000, 3]),
    "bs": lambda: torch.randint(0, 5000, (3, 5), generator=torch.Generator().manual_seed(1)),
    "1s": lambda: torch.tensor([[1, 2, 3, 4, 5]]),
    "int32": lambda: torch.tensor([7, 8, 9, 10, 11], dtype=torch.int32),
    "expanded-batch": lambda: torch.arange(5).expand(3, 5),
}

# Every dtype, layout, sequence layout, kind of positions, full and partial rotary and
# memory order: the calls a fast route serves.
SERVED_CALLS = pytest.mark.parametrize(
    "dtype,layout,seq_dim,pos,rotary_dim,view",
    [
        (dtype, layout, seq_dim, pos, rotary_dim, view)
        for dtype in (torch.float32, torch.bfloat16, torch.float16)
        for layout in ("half", "interleaved")
        for seq_dim in (-2, -3)
        for pos in POSITIONS
        for rotary_dim in (16, 10)
        for view in ("contiguous", "transposed")
    ],
    ids=lambda v: str(v).removeprefix("torch."),
)


def check_served_call(dtype, layout, seq_dim, pos, rotary_dim, view):
    """The call is served and gives the general path's dtypes, shapes and bits; returns
    the module."""
    rope = posenc.RotaryEmbedding(16, layout=layout, rotary_dim=rotary_dim)
    q, k = tensors(dtype, seq_dim, view=view)
    positions = POSITIONS[pos]()
    with torch.no_grad():
        assert served(rope, q, k, positions, seq_dim)
        out = rope(q, k, positions, seq_dim=seq_dim)
        want = general(rope, q, k, positions, seq_dim=seq_dim)
    for a, b in zip(out, want):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return rope
