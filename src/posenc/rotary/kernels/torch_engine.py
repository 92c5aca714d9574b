"""The optimised torch rotation: what ``backend="torch"`` runs, proven against the twin.

The same function as :func:`posenc.rotary.kernels.plain.apply_rotary_torch`, bit for bit
(``tests/rotary/test_engines.py`` holds it to the twin as the C and Triton paths are), in
fewer passes and temporaries: outside autograd the tables are paired once for q and k
(:func:`paired`), x is widened to float32 once, and each product is added to its partner's
in place; large CPU tensors go slab by slab through reused buffers
(:func:`_rotate_in_slabs`); a small 16-bit q and k are rotated as one tensor
(:func:`_rotate_joined`). With autograd (x needs a gradient, cos and sin do not) one
:class:`_Rotation` node rotates the gradients by minus the angles. Where cos or sin need
gradients, or under ``torch.compile`` / tracing, the operations themselves are recorded
(:func:`_rotate`). No validation: :mod:`posenc.rotary.kernels.dispatch` calls it.

Shapes: ``x`` is ``[b, h, s, d]`` (``seq_dim=-2``) or ``[b, s, h, d]`` (``seq_dim=-3``);
``cos``/``sin`` are ``[s, r/2]`` or ``[b, s, r/2]``, broadcast over heads through views.
Measurements of each choice: ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from posenc._errors import transformed

#: The torch releases (major.minor) on which ``tests/rotary/test_engines.py`` has checked
#: :meth:`_Rotation.apply`'s bypass of ``Function.apply`` (a private torch API); any other
#: release takes ``Function.apply``.
DIRECT_APPLY_TESTED = ("2.13",)

try:  # torch's own, behind Function.apply (torch.autograd.function); absent: Function.apply
    from torch._functorch.utils import unwrap_dead_wrappers

    _DIRECT_APPLY = hasattr(torch._C, "_are_functorch_transforms_active") and (
        ".".join(torch.__version__.split(".")[:2]) in DIRECT_APPLY_TESTED
    )
except ImportError:  # pragma: no cover - an older or newer torch without them
    _DIRECT_APPLY = False

__all__ = ["paired", "rotate_paired", "rotate_torch"]


def rotate_torch(
    xs: Sequence[torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    layout: str = "half",
    seq_dim: int = -2,
) -> list[torch.Tensor]:
    """The rotation of each of ``xs`` (q and k, of one dtype) by ``cos``/``sin``, the tables
    paired once for all of them: :func:`posenc.rotary.kernels.plain.apply_rotary_torch`'s
    bits, through the routes the module docstring lists."""
    if (
        torch.compiler.is_compiling()
        or torch.jit.is_tracing()
        or (torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad))
    ):
        return [_rotate(x, cos, sin, layout, seq_dim) for x in xs]
    compute = torch.promote_types(xs[0].dtype, torch.float32)
    c = cos if cos.dtype == compute else cos.to(compute)
    s = sin if sin.dtype == compute else sin.to(compute)
    return rotate_paired(xs, *paired(c, s, layout), layout=layout, seq_dim=seq_dim)


def paired(cos: torch.Tensor, sin: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and the partners' signed sin per channel of the rotary dim (``[..., r]`` of
    ``[..., r / 2]``): the channel's cos, and the sin its partner's product needs (``sin``
    at the first of a pair, whose product is the second's term ``+x[a] sin``; ``-sin`` at
    the second, the first's term ``-x[b] sin``). Full rows, so that the products run over
    contiguous memory; what :func:`rotate_paired` takes."""
    if layout == "half":
        return torch.cat([cos, cos], dim=-1), torch.cat([sin, -sin], dim=-1)
    return torch.stack([cos, cos], dim=-1).flatten(-2), torch.stack([sin, -sin], dim=-1).flatten(-2)


def rotate_paired(
    xs: Sequence[torch.Tensor],
    cc: torch.Tensor,
    signed_sin: torch.Tensor,
    *,
    layout: str = "half",
    seq_dim: int = -2,
) -> list[torch.Tensor]:
    """:func:`rotate_torch` with the tables already :func:`paired` (``[s, r]`` or ``[b, s,
    r]``, in float32, float64 for float64 ``xs``; no gradient of their own): outside
    autograd (:func:`_rotate_all`) or through one :class:`_Rotation`. Not for tracing
    (:func:`rotate_torch` decides)."""
    tables = _shaped(cc, signed_sin, seq_dim)
    heads = 1 if seq_dim == -2 else 2
    if not (torch.is_grad_enabled() and any(x.requires_grad for x in xs)):
        return _rotate_all(xs, tables, layout, heads)
    tracked = [x for x in xs if x.requires_grad]
    rotated = iter(_Rotation.apply(tables[0], tables[1], layout, heads, *tracked))
    return [next(rotated) if x.requires_grad else _rotate_untracked(x, tables, layout) for x in xs]


def _shaped(
    cc: torch.Tensor, signed_sin: torch.Tensor, seq_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`paired`'s tables shaped to broadcast against x: ``[s, r]`` or ``[b, 1, s,
    r]`` for ``seq_dim=-2``, ``[s, 1, r]`` or ``[b, s, 1, r]`` for ``seq_dim=-3``."""
    if seq_dim == -3:
        return cc.unsqueeze(-2), signed_sin.unsqueeze(-2)
    if cc.ndim == 3:
        return cc.unsqueeze(1), signed_sin.unsqueeze(1)
    return cc, signed_sin


def _add_partners(a: torch.Tensor, t: torch.Tensor, layout: str) -> None:
    """``a += swap(t)`` over the pairs, in place: each channel's product by cos plus its
    partner's product by the signed sin, one rounding each."""
    a0, a1, t0, t1 = _halves(a, t, layout)
    a0.add_(t1)
    a1.add_(t0)


def _rotate_all(
    xs: Sequence[torch.Tensor],
    tables: tuple[torch.Tensor, torch.Tensor],
    layout: str,
    heads: int,
) -> list[torch.Tensor]:
    """:func:`_rotate_untracked` of each of ``xs``; a small 16-bit q and k whose shapes differ
    in their head dimension ``heads`` at most go through its passes once, joined
    (:func:`_rotate_joined`)."""
    c = tables[0]
    if len(xs) == 2 and _joinable(xs[0], xs[1], c.dtype, c.shape[-1], heads):
        return _rotate_joined(xs[0], xs[1], tables, layout, heads)
    return [_rotate_untracked(x, tables, layout) for x in xs]


def _joinable(
    q: torch.Tensor, k: torch.Tensor, compute: torch.dtype, width: int, heads: int
) -> bool:
    """Whether q and k can be rotated joined along ``heads`` with tables of dtype
    ``compute`` and ``width`` channels: contiguous, of one 16-bit dtype (widened for the
    products), rotated over every channel, together below the slabs' size, of the same
    shape but for the head dimension (over which the tables broadcast), and not a
    ``torch.func`` transform's."""
    return (
        q.dtype != compute
        and k.dtype == q.dtype
        and q.numel() + k.numel() < _SLAB_MIN_ELEMENTS
        and q.shape[-1] == width
        and q.ndim == k.ndim
        and all(m == n or i == heads for i, (m, n) in enumerate(zip(q.shape, k.shape)))
        and q.is_contiguous()
        and k.is_contiguous()
        and not transformed(q, k)  # vmap's tensors: no copy into a buffer of our own
    )


def _rotate_joined(
    q: torch.Tensor,
    k: torch.Tensor,
    tables: tuple[torch.Tensor, torch.Tensor],
    layout: str,
    heads: int,
) -> list[torch.Tensor]:
    """:func:`_rotate_untracked` of q and of k (the same bits, each output contiguous in
    memory of its own) as one tensor: both widened into one float32 tensor along
    ``heads``, the products and sums once, each part rounded into its output
    (:func:`_joinable` says when)."""
    c, signed_sin = tables
    shape = list(q.shape)
    shape[heads] += k.shape[heads]
    x = torch.empty(shape, dtype=c.dtype, device=q.device)  # (a cat and a widening: slower)
    q_part, k_part = x.split([q.shape[heads], k.shape[heads]], dim=heads)
    q_part.copy_(q)  # widened: exact
    k_part.copy_(k)
    partners = x * signed_sin
    _add_partners(x.mul_(c), partners, layout)
    # the one rounding to their dtype, into tensors with the strides of q and k (as each
    # alone: `q_part.to` would keep the joined tensor's strides where a part is dense)
    return [torch.empty_like(q).copy_(q_part), torch.empty_like(k).copy_(k_part)]


def _rotate_untracked(
    x: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor], layout: str
) -> torch.Tensor:
    """The rotation outside autograd with the shaped tables: in slabs for large CPU
    tensors (:func:`_rotate_in_slabs`), else in five passes: x widened (none for
    float32), its products by cos and by the signed sin, each product plus its
    partner's in place, the one rounding to x's dtype."""
    if x.numel() >= _SLAB_MIN_ELEMENTS and x.is_cpu:
        return _rotate_in_slabs(x, tables, layout)
    c, signed_sin = tables
    rotary_dim = c.shape[-1]
    partial = rotary_dim < x.shape[-1]
    x_rot = x[..., :rotary_dim] if partial else x
    if x_rot.dtype == c.dtype:
        rotated = x_rot * c
        _add_partners(rotated, x_rot * signed_sin, layout)
    else:  # widened (exact: 16 bits fit in 32) into a tensor of our own, used in place
        rotated = x_rot.to(c.dtype)
        partners = rotated * signed_sin
        _add_partners(rotated.mul_(c), partners, layout)
    if not partial:
        return rotated.to(x.dtype)  # the one rounding to x's dtype
    out = torch.empty_like(x)
    out[..., :rotary_dim] = rotated
    out[..., rotary_dim:] = x[..., rotary_dim:]
    return out


def _rotate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str, seq_dim: int
) -> torch.Tensor:
    """The rotation as out-of-place operations that autograd or a trace records: x widened
    once (so that autograd sums each gradient in float32), ``x * cos + swap(x * signed
    sin)`` over the rotary channels with :func:`paired` tables, rounded once to x's
    dtype, the channels past them copied."""
    compute = torch.promote_types(x.dtype, torch.float32)  # float32 math for bf16/fp16
    cc, ss = _shaped(*paired(cos.to(compute), sin.to(compute), layout), seq_dim)
    rotary_dim, half = cc.shape[-1], cc.shape[-1] // 2
    x_rot = x[..., :rotary_dim] if rotary_dim < x.shape[-1] else x
    x_rot = x_rot.to(compute)  # exact; one vectorized pass (mixed-dtype products are not)
    partners = x_rot * ss
    if layout == "half":
        swapped = torch.cat([partners[..., half:], partners[..., :half]], dim=-1)
    else:
        swapped = partners.unflatten(-1, (half, 2)).flip(-1).flatten(-2)
    out = (x_rot * cc + swapped).to(x.dtype)  # the one rounding to x's dtype
    if rotary_dim < x.shape[-1]:
        out = torch.cat([out, x[..., rotary_dim:]], dim=-1)
    return out


class _Rotation(torch.autograd.Function):
    """The plain rotation of one or more tensors with autograd: forward as outside
    autograd, backward the rotation of each gradient by minus the angles (itself a
    ``_Rotation``: twice differentiable). Takes the shaped tables of :func:`_shaped`;
    minus the angles is the signed sin negated."""

    generate_vmap_rule = True

    @classmethod
    def apply(cls, *args: Any) -> Any:  # type: ignore[override]
        """``Function.apply`` less its per-call ``inspect.signature`` binding (every argument
        is positional and none has a default, so the binding changes nothing), on the torch
        releases the suite has run it on (:data:`DIRECT_APPLY_TESTED`); under a functorch
        transform (vmap, grad, jvp), or on another release, ``Function.apply`` itself."""
        if not _DIRECT_APPLY or torch._C._are_functorch_transforms_active():
            return super().apply(*args)
        base = super(torch.autograd.Function, cls)  # torch._C._FunctionBase: the C++ apply
        return base.apply(*unwrap_dead_wrappers(args))  # type: ignore[attr-defined]

    @staticmethod
    def forward(c, signed_sin, layout, heads, *xs):  # type: ignore[override]
        return tuple(_rotate_all(xs, (c, signed_sin), layout, heads))

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # type: ignore[override]
        c, signed_sin, layout, heads = inputs[:4]
        ctx.save_for_backward(c, signed_sin)
        ctx.layout, ctx.heads = layout, heads
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        c, signed_sin = ctx.saved_tensors
        given = [g for g in grads if g is not None]
        back = (c, -signed_sin)  # minus the angles
        if not torch.is_grad_enabled():  # no double backward asked: no node to record
            rotated = iter(_rotate_all(given, back, ctx.layout, ctx.heads))
        else:
            rotated = iter(_Rotation.apply(*back, ctx.layout, ctx.heads, *given) if given else ())
        return (None, None, None, None, *(None if g is None else next(rotated) for g in grads))


# Elements of x per slab (its float32 temporaries: 1 MiB each), and the size from which
# slabs pay for their extra calls.
_SLAB_ELEMENTS = 1 << 18
_SLAB_MIN_ELEMENTS = 1 << 17


def _rotate_in_slabs(
    x: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor], layout: str
) -> torch.Tensor:
    """:func:`_rotate_untracked`'s passes cut along x's two outer dimensions into slabs of about
    ``_SLAB_ELEMENTS``: each slab's products go into two float32 buffers reused for every
    slab (in cache, where tensors of x's size would not be), and its sums are rounded
    straight into the output. A 16-bit slab is widened into a third buffer first: one
    vectorized conversion, where products of a bf16 and a float32 tensor take torch's
    slower elementwise mixed-dtype loop. The slabs' views come from one ``split`` per batch
    entry and the buffers' halves are cut once (:class:`_Buffers`)."""
    c, signed_sin = tables
    while c.ndim < 4:  # [b|1, 1, s, r] or [b|1, s, 1, r]: one row of tables per batch entry
        c, signed_sin = c[None], signed_sin[None]
    rotary_dim = c.shape[-1]
    out = torch.empty_like(x)
    x_rot, y_rot = x, out
    if rotary_dim < x.shape[-1]:
        out[..., rotary_dim:] = x[..., rotary_dim:]
        x_rot, y_rot = x[..., :rotary_dim], out[..., :rotary_dim]
    _, n1, n2, _ = x.shape
    step = max(1, min(n1, _SLAB_ELEMENTS // max(1, n2 * rotary_dim)))  # of dim 1 per slab
    buffers = _Buffers((step, n2, rotary_dim), c.dtype, x.dtype != c.dtype, layout)
    for i in range(x.shape[0]):
        ci = c[i if c.shape[0] > 1 else 0]  # [1 | n1, n2 | 1, r]: over heads or tokens
        si = signed_sin[i if signed_sin.shape[0] > 1 else 0]
        c_rows = ci.split(step) if ci.shape[0] > 1 else None
        s_rows = si.split(step) if si.shape[0] > 1 else None
        for n, (xs, ys) in enumerate(zip(x_rot[i].split(step), y_rot[i].split(step))):
            a, t, wide, (a0, a1, t0, t1) = buffers.rows(xs.shape[0])
            if wide is not None:
                xs = wide.copy_(xs)  # exact: every 16-bit value is a float32 one
            torch.mul(xs, ci if c_rows is None else c_rows[n], out=a)
            torch.mul(xs, si if s_rows is None else s_rows[n], out=t)
            a0.add_(t1)  # each product plus its partner's (_add_partners)
            a1.add_(t0)
            ys.copy_(a)  # rounded once to x's dtype
    return out


class _Buffers:
    """:func:`_rotate_in_slabs`' float32 buffers (the two products and, for 16-bit x, the
    widened slab) and the products' halves that :func:`_add_partners` sums, cut once for
    the full slab's rows and again only for a last, shorter slab."""

    def __init__(self, shape: tuple[int, int, int], dtype: torch.dtype, widen: bool, layout: str):
        self.a = torch.empty(shape, dtype=dtype)
        self.t = torch.empty_like(self.a)
        self.wide = torch.empty_like(self.a) if widen else None
        self.layout = layout
        self.full = (self.a, self.t, self.wide, _halves(self.a, self.t, layout))

    def rows(self, m: int) -> tuple:
        """The buffers' first ``m`` rows and their halves ``(a0, a1, t0, t1)``."""
        if m == self.a.shape[0]:
            return self.full
        a, t = self.a[:m], self.t[:m]
        return a, t, None if self.wide is None else self.wide[:m], _halves(a, t, self.layout)


def _halves(a: torch.Tensor, t: torch.Tensor, layout: str) -> tuple[torch.Tensor, ...]:
    """The first and second channels of every pair of ``a`` and of ``t``."""
    if layout == "half":
        return (*a.chunk(2, -1), *t.chunk(2, -1))
    return (*a.unflatten(-1, (-1, 2)).unbind(-1), *t.unflatten(-1, (-1, 2)).unbind(-1))
