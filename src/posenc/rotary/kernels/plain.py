"""The plain torch rotation: the twin every fast path is proven equal to, bit for bit.

It lives beside the Triton and CPU kernels (as flash-attention's ``ops`` do) so that the
kernels never import the code that calls them: :mod:`posenc.rotary.apply` and
:class:`posenc.RotaryEmbedding` call :func:`posenc.rotary.kernels.dispatch_rotary`, which
picks a fused path or :func:`apply_rotary_torch`.

Shapes: ``x`` is ``[b, h, s, d]`` (``seq_dim=-2``) or ``[b, s, h, d]`` (``seq_dim=-3``);
``cos``/``sin`` are ``[s, r/2]`` or ``[b, s, r/2]``, broadcast over heads through views.

The checks every path shares live here too, all from metadata (no device sync):
:func:`check_cos_sin` (shapes and device of cos/sin), :func:`check_devices` (q, k,
cos and sin on one device) and :func:`check_inplace_memory` (in place needs q and k
in memory of their own: no expanded or overlapping views, ``k`` not sharing ``q``'s).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from posenc._errors import PosEncError, check_choice, check_int, check_tensor
from posenc.rotary.layout import LAYOUTS, SEQ_DIMS

try:  # torch's own, behind Function.apply (torch.autograd.function); absent: Function.apply
    from torch._functorch.utils import unwrap_dead_wrappers

    _DIRECT_APPLY = hasattr(torch._C, "_are_functorch_transforms_active")
except ImportError:  # pragma: no cover - an older or newer torch without them
    _DIRECT_APPLY = False

__all__ = [
    "apply_rotary_torch",
    "check_cos_sin",
    "check_devices",
    "check_inplace_memory",
    "check_rotary_dim",
    "check_rotary_input",
    "memory_range",
    "rotate_torch",
]


def check_rotary_input(name: str, x: Any, layout: Any, seq_dim: Any) -> None:
    """The tensor a public rotation takes (``x`` of :func:`posenc.apply_rotary`, ``q`` of
    :func:`posenc.rotary.kernels.fused_rotary`) and its options: floating, 4-D, a known
    ``layout`` and ``seq_dim``."""
    check_tensor(name, x, floating=True)
    check_choice("layout", layout, LAYOUTS)
    check_choice("seq_dim", seq_dim, SEQ_DIMS)
    if x.ndim != 4:
        raise PosEncError(
            f"{name} must be [b, h, s, d] (seq_dim=-2) or [b, s, h, d] (seq_dim=-3), "
            f"got shape {tuple(x.shape)}"
        )


def check_rotary_dim(name: str, x: torch.Tensor, cos: torch.Tensor, rotary_dim: Any) -> None:
    """``rotary_dim`` (``None``: not given) equals ``2 * cos.shape[-1]``, which is at most
    the last dimension of ``x`` (called ``name`` in messages)."""
    half = cos.shape[-1]
    if rotary_dim is not None:
        rotary_dim = check_int("rotary_dim", rotary_dim, min=2)
        if rotary_dim != 2 * half:
            raise PosEncError(
                f"rotary_dim must equal 2 * cos.shape[-1] = {2 * half}, got {rotary_dim}"
            )
    if 2 * half > x.shape[-1]:
        raise PosEncError(
            f"rotary_dim must be <= {name}'s last dimension {x.shape[-1]}, got {2 * half}"
        )


def check_cos_sin(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, seq_dim: int, *, name: str = "x"
) -> None:
    """Validate ``cos``/``sin`` for ``x`` (called ``name`` in messages): floating, the same
    shape, ``[s, r/2]`` or ``[b, s, r/2]`` with ``s`` x's sequence length and ``b`` its
    batch size (or 1), on x's device."""
    check_tensor("cos", cos, floating=True)
    check_tensor("sin", sin, floating=True)
    if cos.shape != sin.shape:
        raise PosEncError(
            f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    seq_len, batch = x.shape[seq_dim], x.shape[0]
    if cos.ndim not in (2, 3) or cos.shape[-2] != seq_len:
        raise PosEncError(
            f"cos must be [s, r/2] or [b, s, r/2] with s == {seq_len} ({name}'s sequence length), "
            f"got shape {tuple(cos.shape)}"
        )
    if cos.ndim == 3 and cos.shape[0] not in (1, batch):
        raise PosEncError(
            f"cos of shape [b, s, r/2] must have b == {batch} ({name}'s batch size) or 1, "
            f"got shape {tuple(cos.shape)}"
        )
    device = x.device
    if cos.device != device or sin.device != device:
        other = cos.device if cos.device != device else sin.device
        raise PosEncError(f"cos and sin must be on {name}'s device {device}, got {other}")


def check_devices(
    q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor
) -> None:
    """q, k (when given), cos and sin on one device (metadata only: no device sync)."""
    device = q.device
    if k is not None and k.device != device:
        raise PosEncError(f"k must be on q's device {device}, got {k.device}")
    if cos.device != device or sin.device != device:
        other = cos.device if cos.device != device else sin.device
        raise PosEncError(f"cos and sin must be on q's device {device}, got {other}")


def memory_range(t: torch.Tensor) -> tuple[int, int]:
    """The bytes ``[start, end)`` from a tensor's first element to past its last (empty
    for an empty tensor); metadata only."""
    start = t.data_ptr()
    if t.is_contiguous():
        count = t.numel()
    else:
        count = 0 if 0 in t.shape else 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    return start, start + count * t.element_size()


def _injective(sizes: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether no two elements of a strided view share memory (a sufficient test: sorted
    by stride, each dimension steps past everything the smaller ones reach)."""
    if 0 in sizes:
        return True
    reach = 0
    for n, st in sorted(((n, st) for n, st in zip(sizes, strides) if n > 1), key=lambda d: d[1]):
        if st <= reach:
            return False
        reach += (n - 1) * st
    return True


def _disjoint(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` share no element of memory: their address ranges are
    apart, or (slices of one fused buffer, e.g. q and k of a qkv tensor) ``b`` is ``a``'s
    layout moved along one dimension past ``a``'s end, in a layout with no overlap.
    Anything else that shares a range counts as overlapping."""
    (a0, a_end), (b0, b_end) = memory_range(a), memory_range(b)
    if a_end <= b0 or b_end <= a0 or a0 == a_end or b0 == b_end:
        return True
    size = a.element_size()
    if a.stride() != b.stride() or b.element_size() != size or a0 == b0:
        return False
    if b0 < a0:
        a, b, a0, b0 = b, a, b0, a0
    delta, rest = divmod(b0 - a0, size)
    if rest:
        return False
    strides = a.stride()
    for i, st in enumerate(strides):
        if st <= 0 or delta % st or delta // st < a.shape[i]:
            continue
        # b is a's box shifted by delta // st along i: both sit in one larger view.
        sizes = [max(m, n) for m, n in zip(a.shape, b.shape)]
        sizes[i] = delta // st + b.shape[i]
        if _injective(sizes, strides):
            return True
    return False


def check_inplace_memory(xs: Sequence[torch.Tensor]) -> None:
    """In place, each of q (and k) must own its memory: no two elements of one tensor in
    the same place (``expand()`` and other stride-0 or overlapping views), and k sharing
    none of q's (``k is q`` would be rotated twice). Metadata only."""
    if len(xs) == 2 and xs[1] is xs[0]:  # first: the one check that reads no strides
        raise PosEncError(
            "inplace=True needs k and q in separate memory (each would be rotated twice), "
            "got k is q; use inplace=False or pass k=None"
        )
    for name, x in zip(("q", "k"), xs):
        if not x.is_contiguous() and not _injective(x.shape, x.stride()):
            raise PosEncError(
                f"inplace=True needs {name} with every element in memory of its own (not an "
                f"expand()ed or overlapping view), got {name} of shape {tuple(x.shape)} with "
                f"strides {x.stride()}; use inplace=False or {name}.contiguous()"
            )
    if len(xs) == 2 and not _disjoint(xs[0], xs[1]):
        raise PosEncError(
            "inplace=True needs k and q in separate memory (shared elements would be "
            "rotated twice), got k overlapping q's memory; use inplace=False"
        )


def apply_rotary_torch(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    layout: str = "half",
    seq_dim: int = -2,
) -> torch.Tensor:
    """Plain torch rotation (no validation): the reference the fast paths are tested against.

    ``x: [b, h, s, d]`` or ``[b, s, h, d]``; ``cos, sin: [s, r/2]`` or ``[b, s, r/2]``.

    Every element is ``x[a] * cos + x[b] * (-sin)`` / ``x[b] * cos + x[a] * sin`` with each
    product rounded in float32 (float64 for float64) and one rounding to x's dtype, which
    are exactly the bits of ``x[a] * cos - x[b] * sin`` / ``x[b] * cos + x[a] * sin`` the
    fused kernels compute. :func:`rotate_torch` of ``[x]``: see there for the passes.
    """
    return rotate_torch([x], cos, sin, layout=layout, seq_dim=seq_dim)[0]


def rotate_torch(
    xs: Sequence[torch.Tensor],
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    layout: str = "half",
    seq_dim: int = -2,
) -> list[torch.Tensor]:
    """:func:`apply_rotary_torch` of each of ``xs`` (q and k, of one dtype), the tables
    shaped once for all of them. As few passes and torch calls as exactness allows:

    - outside autograd (:func:`_rotate_untracked`), x widened to float32 (exact; none
      for float32), its products by cos and by its partners' signed sin (tables of the
      rotary dim's width, shared by q and k: contiguous rows), each product plus its
      partner's in place (two half-width additions: no swapped copy of x) and the one
      rounding; large CPU tensors go slab by slab through reused float32 buffers
      (:func:`_rotate_in_slabs`), the temporaries in cache instead of tensors of x's size.
      At a decoding step every torch call counts (6-15 µs each), so this is eight calls
      a tensor where transformers makes seven;
    - with autograd (x needs a gradient, cos and sin do not), the same forward for every
      x that needs one in one :class:`_Rotation`, whose backward is the same rotation by
      minus the angles (a rotation's Jacobian is its transpose), each gradient element
      rounded once as autograd through the float32 operations would;
    - where cos or sin need gradients, or under ``torch.compile`` / tracing, the
      operations themselves (:func:`_rotate`), x widened once so that autograd sums each
      gradient in float32 before its one rounding.
    """
    tracing_now = torch.compiler.is_compiling() or torch.jit.is_tracing()
    grad = torch.is_grad_enabled()
    if tracing_now or (grad and (cos.requires_grad or sin.requires_grad)):
        return [_rotate(x, cos, sin, layout, seq_dim) for x in xs]
    compute = torch.promote_types(xs[0].dtype, torch.float32)
    tables = _pair_tables(cos, sin, layout, seq_dim, compute)
    if not (grad and any(x.requires_grad for x in xs)):
        return [_rotate_untracked(x, tables, layout) for x in xs]
    tracked = [x for x in xs if x.requires_grad]
    rotated = iter(_Rotation.apply(tables[0], tables[1], layout, *tracked))
    return [next(rotated) if x.requires_grad else _rotate_untracked(x, tables, layout) for x in xs]


def _pair_tables(
    cos: torch.Tensor, sin: torch.Tensor, layout: str, seq_dim: int, compute: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and the partners' signed sin per channel of the rotary dim, in ``compute``,
    shaped to broadcast against x (``[s, r]`` or ``[b, 1, s, r]`` for ``seq_dim=-2``,
    ``[s, 1, r]`` or ``[b, s, 1, r]`` for ``seq_dim=-3``): the channel's cos, and the sin
    its partner's product needs (``sin`` at the first of a pair, whose product is the
    second's term ``+x[a] sin``; ``-sin`` at the second, the first's term ``-x[b] sin``).
    Full rows, so that the products run over contiguous memory."""
    c = cos if cos.dtype == compute else cos.to(compute)
    s = sin if sin.dtype == compute else sin.to(compute)
    if layout == "half":
        cc, ss = torch.cat([c, c], dim=-1), torch.cat([s, -s], dim=-1)
    else:
        cc, ss = torch.stack([c, c], dim=-1).flatten(-2), torch.stack([s, -s], dim=-1).flatten(-2)
    if seq_dim == -3:
        return cc.unsqueeze(-2), ss.unsqueeze(-2)
    if cc.ndim == 3:
        return cc.unsqueeze(1), ss.unsqueeze(1)
    return cc, ss


def _add_partners(a: torch.Tensor, t: torch.Tensor, layout: str) -> None:
    """``a += swap(t)`` over the pairs, in place: each channel's product by cos plus its
    partner's product by the signed sin, one rounding each."""
    if layout == "half":
        a0, a1 = a.chunk(2, -1)
        t0, t1 = t.chunk(2, -1)
    else:
        a0, a1 = a.unflatten(-1, (-1, 2)).unbind(-1)
        t0, t1 = t.unflatten(-1, (-1, 2)).unbind(-1)
    a0.add_(t1)
    a1.add_(t0)


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
    sin)`` over the rotary channels with :func:`_pair_tables`' tables, rounded once to x's
    dtype, the channels past them copied."""
    compute = torch.promote_types(x.dtype, torch.float32)  # float32 math for bf16/fp16
    cc, ss = _pair_tables(cos, sin, layout, seq_dim, compute)
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
    ``_Rotation``: twice differentiable). Takes the shaped tables of :func:`_pair_tables`;
    minus the angles is the signed sin negated."""

    generate_vmap_rule = True

    @classmethod
    def apply(cls, *args: Any) -> Any:  # type: ignore[override]
        """``Function.apply`` less its per-call ``inspect.signature`` binding (35 of the 50
        µs a call costs it here; every argument is positional and none has a default, so
        the binding changes nothing); under a functorch transform (vmap, grad, jvp)
        ``Function.apply`` itself."""
        if not _DIRECT_APPLY or torch._C._are_functorch_transforms_active():
            return super().apply(*args)
        base = super(torch.autograd.Function, cls)  # torch._C._FunctionBase: the C++ apply
        return base.apply(*unwrap_dead_wrappers(args))  # type: ignore[attr-defined]

    @staticmethod
    def forward(c, signed_sin, layout, *xs):  # type: ignore[override]
        return tuple(_rotate_untracked(x, (c, signed_sin), layout) for x in xs)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:  # type: ignore[override]
        c, signed_sin, layout = inputs[:3]
        ctx.save_for_backward(c, signed_sin)
        ctx.layout = layout
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        c, signed_sin = ctx.saved_tensors
        given = [g for g in grads if g is not None]
        back = (c, -signed_sin)  # minus the angles
        if not torch.is_grad_enabled():  # no double backward asked: no node to record
            rotated = iter([_rotate_untracked(g, back, ctx.layout) for g in given])
        else:
            rotated = iter(_Rotation.apply(*back, ctx.layout, *given) if given else ())
        return (None, None, None, *(None if g is None else next(rotated) for g in grads))


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
    elementwise mixed-dtype loop (ten times slower on the CPU at these sizes)."""
    c, signed_sin = tables
    while c.ndim < 4:  # [b|1, 1, s, r] or [b|1, s, 1, r]: one row of tables per batch entry
        c, signed_sin = c[None], signed_sin[None]
    rotary_dim, compute = c.shape[-1], c.dtype
    out = torch.empty_like(x)
    if rotary_dim < x.shape[-1]:
        out[..., rotary_dim:] = x[..., rotary_dim:]
    b, n1, n2, _ = x.shape
    step = max(1, min(n1, _SLAB_ELEMENTS // max(1, n2 * rotary_dim)))  # of dim 1 per slab
    buf_a = torch.empty((step, n2, rotary_dim), dtype=compute)
    buf_t = torch.empty_like(buf_a)
    buf_x = None if x.dtype == compute else torch.empty((step, n2, rotary_dim), dtype=compute)
    for i in range(b):
        ci = c[i if c.shape[0] > 1 else 0]
        si = signed_sin[i if signed_sin.shape[0] > 1 else 0]
        for j in range(0, n1, step):
            m = min(step, n1 - j)
            xs, ys = x[i, j : j + m, :, :rotary_dim], out[i, j : j + m, :, :rotary_dim]
            if buf_x is not None:
                xs = buf_x[:m].copy_(xs)  # exact: every 16-bit value is a float32 one
            cj = ci if ci.shape[0] == 1 else ci[j : j + m]  # over heads, or a run of tokens
            sj = si if si.shape[0] == 1 else si[j : j + m]
            a, t = buf_a[:m], buf_t[:m]
            torch.mul(xs, cj, out=a)
            torch.mul(xs, sj, out=t)
            _add_partners(a, t, layout)
            ys.copy_(a)  # rounded once to x's dtype
    return out
