"""Attention that takes any encoding: ``posenc.attention(q, k, v, encoding=...)``.

The encoding's protocol (:mod:`posenc._base`) decides where it acts: a rotary encoding
rotates ``q`` and ``k``; a bias encoding adds its ``[h, q, k]`` term of positions to the
scaled logits ``q k^T * scale``; a contextual one a term it computes from those logits, ``q``
and ``k``; a gated one a term of the per-token ``gates`` it is passed; ``None`` (or
``"none"``) adds nothing. Additive encodings belong at the token embeddings and are refused
here.

Three paths compute the same function, ``softmax(q k^T * scale + bias + mask) v``:

- ``"sdpa"``: ``torch.nn.functional.scaled_dot_product_attention`` with the bias, the causal
  mask and ``attn_mask`` merged into one float mask (or ``is_causal`` / a bool mask when there
  is no bias, so the fused kernels stay available);
- ``"flex"``: compiled FlexAttention with the encoding's ``score_mod`` (the bias is computed
  from indices, no ``[h, q, k]`` tensor) and a block mask for causal / padding masks. On CPU
  torch has no FlexAttention backward, so this path is for inference there;
- ``"eager"``: plain matrix products and ``softmax``, in float32 or wider: the readable twin
  the others are tested against (and the only path for value-dependent encodings).

The encoding and its positions are first turned into a
:class:`~posenc.attend.PreparedEncoding` (see :mod:`posenc.attend.prepared`): rotary cos/sin,
the bias and its merged SDPA mask are computed once there. A model prepares one per forward
pass with :func:`prepare_encoding` and passes it as ``encoding=`` to every layer.

``backend="auto"`` takes eager for value-dependent encodings, Flex when the encoding has a
``score_mod``, the bias it would otherwise materialise reaches :data:`FLEX_MIN_BIAS_BYTES`,
and Flex can run here (CUDA, or CPU without gradients, no dropout), and SDPA otherwise.
Contextual encodings take eager, or ``"chunked"`` (the eager path per block of query rows)
once the scores reach that size; gated ones SDPA (a separable term such as forgetting
attention's folded into the keys, :mod:`posenc.attend.folded`, but eager for a short call
whose gates would cut the fold into blocks, :func:`~posenc.attend.folded.eager_is_cheaper`;
otherwise the term as its mask, or Flex, or chunked where Flex cannot run, once large).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

import posenc.attend.flex as _flexattn
from posenc._base import (
    BiasEncoding,
    ContextualEncoding,
    Encoding,
    GatedEncoding,
    RotaryEncoding,
)
from posenc._errors import (
    PosEncError,
    check_choice,
    check_float,
    check_qkv,
    check_scale,
    check_tensor,
)
from posenc.attend import folded
from posenc.attend.paths import Call, chunked, eager, sdpa
from posenc.attend.prepared import PreparedEncoding, check_heads, prepare_at
from posenc.attend.remapped import remapped

__all__ = ["BACKENDS", "FLEX_MIN_BIAS_BYTES", "attention"]

BACKENDS = ("auto", "sdpa", "flex", "eager", "chunked")

#: ``backend="auto"`` moves to FlexAttention when the bias SDPA would materialise
#: (``b * h * q * k`` float32 values) reaches this many bytes, and a contextual encoding
#: from the eager path to the chunked one.
FLEX_MIN_BIAS_BYTES = 64 * 2**20

# --- validation ----------------------------------------------------------------


def _check_qkv(q: Any, k: Any, v: Any) -> tuple[int, int, int, int, int]:
    """Validate ``q [b, h, q, d]``, ``k [b, h_kv, k, d]``, ``v [b, h_kv, k, d_v]``."""
    check_qkv(q, k, v)
    b, hq, q_len, d = q.shape
    if k.shape[0] != b or v.shape[0] != b:
        raise PosEncError(
            f"q, k and v must have the same batch size, got shapes {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    if k.shape[-1] != d:
        raise PosEncError(f"k must have head dim {d} (that of q), got shape {tuple(k.shape)}")
    if k.shape[:3] != v.shape[:3]:
        raise PosEncError(
            "k and v must have the same batch, heads and length, got shapes "
            f"{tuple(k.shape)} and {tuple(v.shape)}"
        )
    hkv, k_len = k.shape[1], k.shape[2]
    for name, t in (("q", q), ("k", k)):
        if t.shape[1] < 1:
            raise PosEncError(
                f"{name} must have >= 1 heads (dim 1 of [b, h, s, d]), got shape {tuple(t.shape)}"
            )
    if hq % hkv:
        raise PosEncError(
            f"the number of key/value heads must divide the number of query heads ({hq}), got {hkv}"
        )
    if b < 1 or q_len < 1 or k_len < 1 or d < 1:
        raise PosEncError(
            f"q and k must be non-empty (a batch, a length and a head dim >= 1 each), got "
            f"shapes {tuple(q.shape)}, {tuple(k.shape)}"
        )
    return b, hq, hkv, q_len, k_len


def _check_scale(scale: Any, d: int, dtype: torch.dtype) -> float:
    """``scale > 0`` with ``scale * d`` finite in ``dtype``: the logits ``q k^T * scale`` of
    entries of magnitude up to 1 stay finite (a larger scale made them inf, the output NaN)."""
    why = ": the logits q k^T * scale of entries up to 1 stay finite"
    return check_scale(scale, d, dtype, why=why)


def _check_mask(
    attn_mask: Any, *, b: int, h: int, q_len: int, k_len: int, device: torch.device
) -> torch.Tensor | None:
    """``attn_mask`` as a bool tensor ``[b|1, h|1, q|1, k]`` (True = may attend), or None."""
    if attn_mask is None:
        return None
    check_tensor("attn_mask", attn_mask)
    if attn_mask.dtype != torch.bool:
        raise PosEncError(
            "attn_mask must be a bool tensor (True = may attend), got dtype "
            f"{attn_mask.dtype}; convert a 0/1 padding mask with mask.bool()"
        )
    if attn_mask.device != device:
        raise PosEncError(f"attn_mask must be on {device} (that of q), got {attn_mask.device}")
    shape = tuple(attn_mask.shape)
    if attn_mask.ndim == 2:
        if shape != (b, k_len):
            raise PosEncError(
                f"attn_mask of 2 dims is a key padding mask and must be [b, k] = "
                f"[{b}, {k_len}], got shape {shape}"
            )
        return attn_mask[:, None, None, :]  # [b, 1, 1, k]
    if attn_mask.ndim == 4:
        ok = (
            shape[0] in (1, b)
            and shape[1] in (1, h)
            and shape[2] in (1, q_len)
            and shape[3] == k_len
        )
        if not ok:
            raise PosEncError(
                f"attn_mask of 4 dims must be [b|1, h|1, q|1, k] = [{b}|1, {h}|1, {q_len}|1, "
                f"{k_len}], got shape {shape}"
            )
        return attn_mask
    raise PosEncError(
        f"attn_mask must be [b, k] (key padding) or [b|1, h|1, q|1, k], got shape {shape}"
    )


def _check_gates(gates: Any, enc: Any, b: int, k_len: int, causal: bool, device) -> None:
    """``gates`` are given exactly when the encoding is gated, and fit it."""
    gated = isinstance(enc, GatedEncoding)
    if gates is None:
        if gated:
            raise PosEncError(
                f"encoding {enc.name!r} is gated: pass gates=[b, h, k] (its log forget gates)"
            )
        return
    if not gated:
        name = "no encoding" if enc is None else f"encoding {enc.name!r}"
        raise PosEncError(f"gates are read by gated encodings ('fox'); {name} takes none")
    if not causal:
        raise PosEncError(f"encoding {enc.name!r} is causal only: pass causal=True")
    enc.check_gates(gates, b, k_len, device)


def _flex(q, k, v, call: Call) -> torch.Tensor:
    """FlexAttention with the encoding's score_mod (or, without one, its materialised bias)."""
    prep = call.prep
    score_mod: Callable[..., torch.Tensor] | None = None
    if prep is not None and isinstance(prep.encoding, GatedEncoding):
        score_mod = prep.encoding.gate_score_mod_at(call.checked_gates(), q.shape[2])
    elif prep is not None:
        score_mod = prep.score_mod(q, call.scale)
    return _flexattn.run(
        q, k, v, score_mod=score_mod, keep=call.keep, causal=call.causal, scale=call.scale
    )


def _large(q, b: int, k_len: int) -> bool:
    """Whether the ``[b, h, q, k]`` float32 scores (or bias) reach ``FLEX_MIN_BIAS_BYTES``."""
    return 4 * b * q.shape[1] * q.shape[2] * k_len >= FLEX_MIN_BIAS_BYTES


def _choose_contextual(
    backend: str, enc: ContextualEncoding, large: bool, q, dropout_p: float
) -> str:
    """A contextual term is computed from the logits: fused on the CPU where it can be
    (the member's own kernel, :meth:`~posenc._base.ContextualEncoding.fused_attention_at`:
    CoPE's), else eager, or chunked when large."""
    if backend in ("sdpa", "flex"):
        raise PosEncError(
            f"encoding {enc.name!r} is contextual (its bias is computed from the logits): "
            "use backend='eager', 'chunked' or 'auto'"
        )
    if backend != "auto":
        return backend
    if enc.fused_attention_at(q, dropout_p) is not None:  # the member's own kernel
        return "fused"
    return "chunked" if large else "eager"


def _choose_bias(backend: str, enc: BiasEncoding, flex_why: str | None, large: bool) -> str:
    """A bias of positions: eager when value-dependent, Flex when large with an index
    formula, SDPA otherwise."""
    if backend == "chunked" and (enc.query_dependent or enc.value_dependent):
        raise PosEncError(
            f"encoding {enc.name!r} depends on the queries or values as a whole: use "
            "backend='eager', 'sdpa' or 'auto', not 'chunked'"
        )
    if enc.value_dependent:
        if backend == "flex":
            flex_why = f"encoding {enc.name!r} is value-dependent and needs backend='eager'"
        elif backend == "sdpa":
            raise PosEncError(
                f"encoding {enc.name!r} is value-dependent (it adds to probs @ v): use "
                "backend='eager' or 'auto'"
            )
        else:
            return "eager"
    if backend == "flex" and flex_why is not None:
        raise PosEncError(f"backend='flex' cannot run here: {flex_why}")
    if backend != "auto":
        return backend
    if not enc.query_dependent and large and flex_why is None and enc.has_score_mod:
        return "flex"  # it has an index formula
    return "sdpa"


def _choose(backend, q, enc, needs_grad: bool, dropout_p: float, b: int, k_len: int) -> str:
    """The path of one call, by the encoding's protocol and the call's size."""
    large = _large(q, b, k_len)
    if isinstance(enc, ContextualEncoding):
        return _choose_contextual(backend, enc, large, q, dropout_p)
    flex_why = _flexattn.refusal(q, needs_grad, dropout_p)
    if isinstance(enc, BiasEncoding):
        return _choose_bias(backend, enc, flex_why, large)
    if backend == "flex" and flex_why is not None:
        raise PosEncError(f"backend='flex' cannot run here: {flex_why}")
    if backend != "auto":
        return backend
    if isinstance(enc, GatedEncoding) and large and not folded.applies(q, enc):
        return "flex" if flex_why is None else "chunked"  # a separable term folds into SDPA
    return "sdpa"


# --- public ---------------------------------------------------------------------


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    encoding: str | Mapping[str, Any] | Encoding | PreparedEncoding | None = None,
    causal: bool = False,
    q_positions: torch.Tensor | None = None,
    k_positions: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    backend: str = "auto",
    gates: torch.Tensor | None = None,
    position_map: Any = None,
) -> torch.Tensor:
    """Scaled dot-product attention with a positional encoding applied where it belongs.

    Computes ``softmax(q k^T * scale + bias + mask) v`` where a rotary encoding first
    rotates ``q`` and ``k`` and a bias encoding supplies ``bias`` (how each kind enters, and
    the backends: ``docs/attention.md``).

    Args:
        q, k, v: ``h_kv`` must divide ``h`` (grouped-query attention).
        encoding: ``None``, a registry name, a config dict (built with ``num_heads=h`` and
            ``head_dim=d``: pass an instance for learned biases), an
            :class:`~posenc._base.Encoding`, or a :class:`PreparedEncoding` from
            :func:`prepare_encoding` (then no positions: they are in it). Not additive.
        causal: query ``i`` sees key ``j`` iff ``j <= i + (k - q)``; needs ``q <= k``.
        q_positions, k_positions: ``[s]`` or ``[b, s]``, or None (the defaults of
            :func:`posenc.positions.resolve_pair`: the queries are the last keys).
        attn_mask: bool, True where a query may attend: ``[b, k]`` (key padding) or
            ``[b|1, h|1, q|1, k]``; combined with ``causal``. A row seeing no key returns 0.
        scale: logits multiplier, default ``1 / sqrt(d)``; ``> 0``, ``scale * d`` finite.
        dropout_p: dropout on the probabilities, whenever ``> 0`` (pass 0 at evaluation).
        backend: ``"auto"``, ``"sdpa"``, ``"flex"``, ``"eager"`` or ``"chunked"``.
        gates: a gated encoding's ``[b, h, k]`` gates (``"fox"``: log forget gates ``<= 0``,
            with ``causal=True``); refused for other encodings.
        position_map: :mod:`posenc.remap`'s Self-Extend or STRING (or its dict); RoPE, causal.

    Shape:
        ``q [b, h, q, d]``, ``k [b, h_kv, k, d]``, ``v [b, h_kv, k, d_v]`` -> ``[b, h, q, d_v]``
        in the dtype of ``q``.

    Raises:
        PosEncError: a bad argument (shapes, mask, encoding, options), naming it.

    Examples:
        >>> import torch, posenc
        >>> q, k, v = torch.randn(3, 1, 2, 5, 8).unbind(0)
        >>> posenc.attention(q, k, v, causal=True).shape
        torch.Size([1, 2, 5, 8])
        >>> out = posenc.attention(q, k, v, causal=True, backend="eager")
        >>> torch.allclose(out, posenc.attention(q, k, v, causal=True, backend="sdpa"), atol=1e-6)
        True
    """
    b, hq, _hkv, q_len, k_len = _check_qkv(q, k, v)
    d = q.shape[-1]
    check_choice("backend", backend, BACKENDS)
    if not isinstance(causal, bool):
        raise PosEncError(f"causal must be a bool, got {causal!r}")
    if causal and q_len > k_len:
        raise PosEncError(
            f"causal attention needs q_len <= k_len (queries are the last keys), got "
            f"q_len={q_len}, k_len={k_len}"
        )
    scale = 1.0 / math.sqrt(d) if scale is None else _check_scale(scale, d, q.dtype)
    dropout_p = check_float("dropout_p", dropout_p, min=0.0, max=1.0)
    if dropout_p == 1.0:
        raise PosEncError("dropout_p must be < 1, got 1.0")
    if isinstance(encoding, PreparedEncoding):
        if q_positions is not None or k_positions is not None:
            raise PosEncError(
                "q_positions and k_positions must be None with a PreparedEncoding (its "
                "positions are part of it)"
            )
        prep: PreparedEncoding | None = encoding
        encoding.check(b, q_len, k_len)
        check_heads(encoding.encoding, hq)
    else:
        prep = prepare_at(
            encoding,
            q_len=q_len,
            k_len=k_len,
            num_heads=hq,
            head_dim=d,
            batch=b,
            q_positions=q_positions,
            k_positions=k_positions,
            device=q.device,
        )
    keep = _check_mask(attn_mask, b=b, h=hq, q_len=q_len, k_len=k_len, device=q.device)

    if position_map is not None:  # Self-Extend, STRING: attend/remapped.py
        return remapped(q, k, v, prep, keep, scale, position_map, causal, dropout_p, gates, backend)
    if prep is not None and isinstance(prep.encoding, RotaryEncoding):
        q, k = prep.rotate_at(q, k)  # [b, h, q, d], [b, h_kv, k, d]
        prep = None
    enc = None if prep is None else prep.encoding
    if gates is not None or isinstance(enc, GatedEncoding):
        _check_gates(gates, enc, b, k_len, causal, q.device)
    params_need_grad = enc is not None and any(p.requires_grad for p in enc.parameters())
    needs_grad = torch.is_grad_enabled() and (
        q.requires_grad or k.requires_grad or v.requires_grad or params_need_grad
    )
    path = _choose(backend, q, enc, needs_grad, dropout_p, b, k_len)
    call = Call(prep, keep, causal, scale, dropout_p, gates, attn_mask)
    if path == "flex":
        return _flex(q, k, v, call)
    if path == "sdpa" and isinstance(enc, GatedEncoding) and folded.applies(q, enc):
        # a separable term (c_i - c_j): two more channels of q and k, no [b, h, q, k] bias;
        # under "auto" a short call that would be cut into blocks is cheaper eager
        c = enc.gate_cumulative(call.checked_gates())
        if backend != "auto" or not folded.eager_is_cheaper(c, q_len, k_len):
            return folded.folded(q, k, v, call, c)
        path = "eager"
    if path == "sdpa":
        return sdpa(q, k, v, call)
    if path == "fused":
        run = call.prep.encoding.fused_attention_at(q, call.dropout_p)
        return run(q, k, v, call.keep, causal=call.causal, scale=call.scale)
    return chunked(q, k, v, call) if path == "chunked" else eager(q, k, v, call)
