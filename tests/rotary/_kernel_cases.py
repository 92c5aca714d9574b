"""Cases and checks shared by the fused-kernel tests (CPU path, Triton interpreter, GPU).

A :class:`Case` names one input configuration; :func:`make_inputs` builds it
deterministically (so a second call gives fresh, equal inputs for in-place runs), and
the ``check_*`` functions compare a fused backend with the plain torch twin (bit for
bit) and with the float64 NumPy reference (within the dtype's rounding).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import posenc
from posenc import reference as ref
from posenc.rotary.kernels import fused_rotary, ops
from posenc.rotary.kernels.plain import apply_rotary_torch
from posenc.rotary.layout import LAYOUTS

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
# Against the float64 reference: the input is exact, cos/sin are float32 (float64 for
# float64 inputs; their angles p * w, with p up to 2^16, carry float64 rounding of ~1e-11)
# and the result is rounded once to the dtype.
TOL = {
    torch.float64: {"atol": 1e-10, "rtol": 1e-10},
    torch.float32: {"atol": 1e-6, "rtol": 1e-6},
    torch.bfloat16: {"atol": 1e-5, "rtol": 8e-3},
    torch.float16: {"atol": 1e-5, "rtol": 1e-3},
}
_SHORT = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16", torch.float64: "f64"}


@dataclasses.dataclass(frozen=True)
class Case:
    """One input configuration; ``id`` names it in test reports."""

    head_dim: int
    rotary_dim: int
    hq: int
    hk: int | None  # None: rotate q alone
    batch: int
    seq: int
    layout: str = "half"
    dtype: torch.dtype = torch.float32
    seq_dim: int = -2
    positions: str = "arange"  # arange | batched ([b, s]) | broadcast ([1, s]) | packed
    view: str = "contiguous"  # contiguous | transposed ([b, s, h, d] memory) | sliced

    @property
    def id(self) -> str:
        k = "q" if self.hk is None else f"k{self.hk}"
        return (
            f"{self.layout}-{_SHORT[self.dtype]}-d{self.head_dim}r{self.rotary_dim}"
            f"-q{self.hq}{k}-b{self.batch}s{self.seq}-sd{self.seq_dim}-{self.positions}"
            f"-{self.view}"
        )


def view_of(case: Case, base: torch.Tensor) -> torch.Tensor:
    """The case's view of a base buffer (no copy)."""
    if case.view == "contiguous":
        return base
    if case.view == "transposed":  # the other memory order, seen through transpose(1, 2)
        return base.transpose(1, 2)
    return base[1:, 1:-1, :-1, ::2]  # sliced: gaps between batches, heads, tokens; stride 2


def _tensor(
    case: Case, heads: int, gen: torch.Generator, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, base)``: x in the case's view of a random base buffer."""
    b, s, d = case.batch, case.seq, case.head_dim
    logical = (b, heads, s, d) if case.seq_dim == -2 else (b, s, heads, d)
    if case.view == "contiguous":
        shape = logical
    elif case.view == "transposed":
        shape = (logical[0], logical[2], logical[1], d)
    else:
        shape = (logical[0] + 1, logical[1] + 2, logical[2] + 1, 2 * d)
    base = torch.randn(*shape, generator=gen, dtype=torch.float64).to(case.dtype).to(device)
    return view_of(case, base), base


def make_inputs(case: Case, device="cpu", seed: int = 0):
    """q, k (or None), cos, sin, positions, and the base buffers of q and k."""
    gen = torch.Generator().manual_seed(seed)
    q, q_base = _tensor(case, case.hq, gen, device)
    k, k_base = (None, None) if case.hk is None else _tensor(case, case.hk, gen, device)
    s, b = case.seq, case.batch
    if case.positions == "arange":
        positions = torch.arange(s)
    elif case.positions == "batched":
        positions = torch.randint(0, 1 << 16, (b, s), generator=gen)
    elif case.positions == "broadcast":
        positions = torch.randint(0, 1 << 16, (1, s), generator=gen)
    else:  # packed: sequences laid end to end, positions restart at each boundary
        if b != 1:
            raise ValueError("packed cases have batch 1")
        cuts = torch.randperm(s - 1, generator=gen)[: min(3, s - 1)].add(1).sort().values
        cu_seqlens = torch.cat([torch.tensor([0]), cuts, torch.tensor([s])])
        positions = posenc.positions.from_cu_seqlens(cu_seqlens)
    inv_freq, _ = posenc.rope_frequencies(case.rotary_dim)
    table = torch.float64 if case.dtype == torch.float64 else torch.float32
    cos, sin = posenc.rotary_cos_sin(positions.to(device), inv_freq, dtype=table)
    return q, k, cos, sin, positions, (q_base, k_base)


def reference(case: Case, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The float64 NumPy rotation of ``x`` (from its rounded values)."""
    inv_freq, _ = posenc.rope_frequencies(case.rotary_dim)
    angles = ref.rotary_angles(positions.numpy(), inv_freq.numpy())
    x64 = x.detach().cpu().double()
    if case.seq_dim == -3:
        x64 = x64.transpose(1, 2)
    out = torch.from_numpy(
        ref.apply_rotary(np.ascontiguousarray(x64.numpy()), angles, layout=case.layout)
    )
    return out.transpose(1, 2) if case.seq_dim == -3 else out


def plain(case: Case, x: torch.Tensor | None, cos, sin) -> torch.Tensor | None:
    if x is None:
        return None
    return apply_rotary_torch(x, cos, sin, layout=case.layout, seq_dim=case.seq_dim)


@contextlib.contextmanager
def poisoned_outputs() -> Iterator[None]:
    """Every output the kernels allocate starts as NaN: an element left unwritten shows."""
    original = ops._empty_like

    def poisoned(x: torch.Tensor) -> torch.Tensor:
        return original(x).fill_(float("nan"))

    ops._empty_like = poisoned
    try:
        yield
    finally:
        ops._empty_like = original


def _assert_equal(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, what
    assert not torch.isnan(actual).any(), f"{what}: unwritten (NaN) elements"
    torch.testing.assert_close(actual, expected, atol=0, rtol=0, msg=lambda m: f"{what}: {m}")


def check_forward(case: Case, backend: str, device="cpu") -> None:
    """Fused output == plain twin (bit for bit) and close to the float64 reference;
    outputs are poisoned before the run."""
    q, k, cos, sin, positions, _ = make_inputs(case, device)
    with poisoned_outputs():
        q_out, k_out = fused_rotary(
            q,
            k,
            cos,
            sin,
            layout=case.layout,
            rotary_dim=case.rotary_dim,
            seq_dim=case.seq_dim,
            backend=backend,
        )
    _assert_equal(q_out, plain(case, q, cos, sin), "q vs plain")
    torch.testing.assert_close(
        q_out.cpu().double(), reference(case, q, positions), **TOL[case.dtype]
    )
    if k is None:
        assert k_out is None
        return
    _assert_equal(k_out, plain(case, k, cos, sin), "k vs plain")
    torch.testing.assert_close(
        k_out.cpu().double(), reference(case, k, positions), **TOL[case.dtype]
    )


def check_inplace(case: Case, backend: str, device="cpu") -> None:
    """In place: q and k hold the plain result; nothing else in their buffers changes
    (channels past rotary_dim, gaps of sliced views)."""
    q, k, cos, sin, _, _ = make_inputs(case, device)
    expected = [plain(case, q, cos, sin), plain(case, k, cos, sin)]
    q2, k2, _, _, _, bases = make_inputs(case, device)
    before = [None if t is None else t.clone() for t in bases]
    q_out, k_out = fused_rotary(
        q2, k2, cos, sin, layout=case.layout, seq_dim=case.seq_dim, inplace=True, backend=backend
    )
    assert q_out is q2 and k_out is k2
    for x, exp, base, old in zip((q2, k2), expected, bases, before):
        if x is None:
            continue
        _assert_equal(x, exp, "in place")
        # Everything in the buffer outside the rotated channels is untouched.
        mark = torch.zeros(base.shape, dtype=torch.bool, device=base.device)
        view = mark.as_strided(x.shape, x.stride(), x.storage_offset() - base.storage_offset())
        view[..., : case.rotary_dim] = True
        torch.testing.assert_close(base[~mark], old[~mark], atol=0, rtol=0)


def check_backward(case: Case, backend: str, device="cpu") -> None:
    """Gradients through the fused op == autograd of the plain twin, bit for bit."""
    grads = []
    for run in ("fused", "plain"):
        _, _, cos, sin, _, bases = make_inputs(case, device)
        leaves = [t.requires_grad_() for t in bases if t is not None]
        q, k = (None if t is None else view_of(case, t) for t in bases)
        if run == "fused":
            q_out, k_out = fused_rotary(
                q, k, cos, sin, layout=case.layout, seq_dim=case.seq_dim, backend=backend
            )
        else:
            q_out, k_out = plain(case, q, cos, sin), plain(case, k, cos, sin)
        gen = torch.Generator().manual_seed(1)
        loss = sum(
            (
                out.double() * torch.randn(out.shape, generator=gen, dtype=torch.float64).to(device)
            ).sum()
            for out in (q_out, k_out)
            if out is not None
        )
        loss.backward()
        grads.append([leaf.grad for leaf in leaves])
    for g_fused, g_plain in zip(*grads):
        _assert_equal(g_fused, g_plain, "grad vs plain autograd")


def case_param(case: Case):
    return pytest.param(case, id=case.id)


def matrix(rows) -> list[Case]:
    """Cases of ``(head_dim, rotary_dim, hq, hk, batch, seq, seq_dim, positions, view)`` rows,
    each in both layouts and every dtype."""
    return [
        Case(d, r, hq, hk, b, s, layout, dtype, seq_dim, pos, view)
        for (d, r, hq, hk, b, s, seq_dim, pos, view) in rows
        for layout in LAYOUTS
        for dtype in DTYPES
    ]


# The correctness matrix: odd head dims (2..256, powers of two and not), partial rotary,
# GQA, q alone, both sequence layouts, strided views, per-token and packed positions,
# every dtype and both layouts.
SMALL_CASES = matrix(
    [
        (2, 2, 1, 1, 1, 3, -2, "arange", "contiguous"),
        (6, 6, 3, 1, 2, 5, -2, "batched", "contiguous"),
        (10, 4, 2, 2, 2, 3, -3, "broadcast", "transposed"),
        (34, 34, 4, 2, 1, 7, -3, "packed", "contiguous"),
        (64, 32, 3, None, 2, 2, -2, "batched", "sliced"),
        (96, 64, 2, 1, 2, 3, -3, "batched", "sliced"),
        (130, 126, 1, 3, 1, 2, -2, "arange", "transposed"),
        (256, 256, 2, 1, 1, 2, -3, "packed", "transposed"),
    ]
)


def matrix_tests(backend: str, cases: list[Case], step: int, device="cpu"):
    """The three tests a fused backend runs over a case matrix: forward (every case),
    in place (every ``step``-th) and backward (every ``step``-th, from the second); a test
    file binds them to its own names."""

    @pytest.mark.parametrize("case", [case_param(c) for c in cases])
    def forward(case):
        check_forward(case, backend, device)

    @pytest.mark.parametrize("case", [case_param(c) for c in cases[::step]])
    def inplace(case):
        check_inplace(case, backend, device)

    @pytest.mark.parametrize("case", [case_param(c) for c in cases[1::step]])
    def backward(case):
        check_backward(case, backend, device)

    return forward, inplace, backward


def check_compile_grads(f, q: torch.Tensor, k: torch.Tensor, **compile_options) -> None:
    """``torch.compile(f, fullgraph=True)`` gives the gradients of ``f(q, k)`` (a scalar)
    eager gives, bit for bit."""
    compiled = torch.compile(f, fullgraph=True, **compile_options)
    q1, k1 = q.clone().requires_grad_(), k.clone().requires_grad_()
    q2, k2 = q.clone().requires_grad_(), k.clone().requires_grad_()
    compiled(q1, k1).backward()
    f(q2, k2).backward()
    torch.testing.assert_close(q1.grad, q2.grad, atol=0, rtol=0)
    torch.testing.assert_close(k1.grad, k2.grad, atol=0, rtol=0)


def check_rounding_ties(backend: str, dtype: torch.dtype, device="cpu") -> None:
    """Results exactly halfway between two bf16/fp16 values round to even, as torch does:
    cos = 1 and sin = -2^-k make ``a - b * sin`` land on ties often."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(1, 2, 64, 16, generator=gen).to(dtype).to(device)  # [b, h, s, d]
    k = torch.randint(6, 14, (64, 8), generator=gen).double()
    cos = torch.ones(64, 8, dtype=torch.float32, device=device)
    sin = (-(2.0**-k)).float().to(device)
    expected = apply_rotary_torch(x, cos, sin)
    out, _ = fused_rotary(x, None, cos, sin, backend=backend)
    _assert_equal(out, expected, f"{dtype} ties")
    # the float32 results do hold ties (truncation or rounding half up would differ)
    exact = apply_rotary_torch(x.float(), cos, sin)
    bits = exact.view(torch.int32) & (0xFFFF if dtype == torch.bfloat16 else 0x1FFF)
    assert (bits == (0x8000 if dtype == torch.bfloat16 else 0x1000)).sum() > 10
