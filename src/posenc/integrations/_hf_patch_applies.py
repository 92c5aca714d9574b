"""posenc's stand-ins for transformers' apply functions, for :func:`~._hf_patch.patch`.

A family's attention rotates q and k by calling a function of its modeling module; the copy
of its ``forward`` that :func:`~._hf_patch.patch` gives each attention layer finds, under
the same name, the stand-in :func:`make_apply` builds: posenc's fused rotation
(:func:`posenc.rotary.kernels.fused_rotary`) of the channels cos/sin span, with the
signature the family's function has (checked by ``patch`` before anything changes):

- ``(q, k, cos, sin, unsqueeze_dim=1)`` (:data:`STANDARD`): Llama and most families, half or
  interleaved pairs, ``[b, h, s, d]`` (``unsqueeze_dim=2``: ``[b, s, h, d]``); the first
  ``2 * cos.shape[-1]`` channels rotate, the rest pass through (GPT-NeoX, Phi-3, GLM-4);
- ``(q, k, cos, sin, position_ids=None, unsqueeze_dim=1)`` (:data:`WITH_POSITION_IDS`):
  DeepSeek-V3's ``apply_rotary_pos_emb_interleave``, interleaved pairs rotated in the half
  layout and left de-interleaved, as its attention expects;
- ``(tensor, sin, cos)`` (:data:`ONE_TENSOR`): GPT-J's, one ``[b, s, h, rotary_dim]`` tensor
  (its attention slices the rotary channels off and concatenates them back), interleaved;
- ``(xq, xk, freqs_cis)`` (:data:`COMPLEX`): Llama 4's ``apply_rotary_emb``, ``[b, s, h, d]``,
  interleaved; ``freqs_cis`` is ``cos + i sin`` (from the patched rotary module).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, cast

import torch

from posenc._errors import PosEncError
from posenc.rotary.kernels import fused_rotary
from posenc.rotary.kernels.planned import rotate_planned
from posenc.rotary.layout import Layout

__all__ = ["COMPLEX", "ONE_TENSOR", "STANDARD", "WITH_POSITION_IDS", "Pairing", "make_apply"]

# The pairing of an apply function: a layout, or DeepSeek-V3's de-interleaving (interleaved
# pairs rotated in the half layout, the output left de-interleaved).
Pairing = Layout | Literal["deinterleave"]
STANDARD = ("q", "k", "cos", "sin", "unsqueeze_dim")
WITH_POSITION_IDS = ("q", "k", "cos", "sin", "position_ids", "unsqueeze_dim")
ONE_TENSOR = ("tensor", "sin", "cos")
COMPLEX = ("xq", "xk", "freqs_cis")
_SEQ_DIMS = {1: -2, 2: -3}  # transformers' unsqueeze_dim -> posenc's seq_dim


def _rotate_pair(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    layout: Layout,
    seq_dim: int,
    plans: dict[tuple, Any],
) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k rotated in one fused pass (one each where their dtypes differ); a call shape
    seen before on the CPU in one foreign call (:func:`rotate_planned`, ``plans`` this
    apply function's shapes)."""
    done = rotate_planned(q, k, cos, sin, layout=layout, seq_dim=seq_dim, plans=plans)
    if done is not None:
        return done
    if q.dtype != k.dtype:  # the fused pass takes one dtype
        q_out = fused_rotary(q, None, cos, sin, layout=layout, seq_dim=seq_dim)[0]
        k_out = fused_rotary(k, None, cos, sin, layout=layout, seq_dim=seq_dim)[0]
        return q_out, k_out
    q_out, k_both = fused_rotary(q, k, cos, sin, layout=layout, seq_dim=seq_dim)
    return q_out, cast(torch.Tensor, k_both)  # k was given, so k_both is a tensor


def _standard(pairing: Pairing) -> Callable[..., Any]:
    layout: Layout = "half" if pairing == "deinterleave" else pairing
    plans: dict[tuple, Any] = {}

    def rotate(
        q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        seq_dim = _SEQ_DIMS.get(unsqueeze_dim)
        if seq_dim is None:
            raise PosEncError(f"unsqueeze_dim must be 1 or 2, got {unsqueeze_dim!r}")
        if pairing == "deinterleave":  # (x0, x1), (x2, x3), ... -> x0, x2, ..., x1, x3, ...
            q = q.unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2)
            k = k.unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2)
        return _rotate_pair(q, k, cos, sin, layout, seq_dim, plans)

    return rotate


def make_apply(pairing: Pairing, params: tuple[str, ...]) -> Callable[..., Any]:
    """posenc's stand-in for an apply function of parameters ``params`` (one of
    :data:`STANDARD`, :data:`WITH_POSITION_IDS`, :data:`ONE_TENSOR`, :data:`COMPLEX`),
    pairing channels as ``pairing`` says; cos/sin are those of
    :class:`~._hf_patch_rotary.PatchedRotaryEmbedding` (``[b, s, rotary_dim / 2]``).

    Raises:
        PosEncError: ``params`` is none of them.
    """
    if params == ONE_TENSOR:
        return _one_tensor(cast(Layout, pairing))
    if params == COMPLEX:
        return _complex(cast(Layout, pairing))
    rotate = _standard(pairing)
    if params == WITH_POSITION_IDS:

        def apply_with_position_ids(
            q: torch.Tensor,
            k: torch.Tensor,
            cos: torch.Tensor,
            sin: torch.Tensor,
            position_ids: Any = None,
            unsqueeze_dim: int = 1,
        ) -> tuple[torch.Tensor, torch.Tensor]:
            return rotate(q, k, cos, sin, unsqueeze_dim)

        return apply_with_position_ids
    if params != STANDARD:
        raise PosEncError(f"patch has no stand-in for an apply function taking {params}")

    def apply(
        q: torch.Tensor,
        k: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        unsqueeze_dim: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return rotate(q, k, cos, sin, unsqueeze_dim)

    return apply


def _one_tensor(layout: Layout) -> Callable[..., Any]:
    """GPT-J's ``apply_rotary_pos_emb(tensor, sin, cos)``: ``tensor [b, s, h, r]`` (the
    rotary channels its attention sliced off), ``sin, cos [b, s, r / 2]``."""

    def apply_one(tensor: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
        return fused_rotary(tensor, None, cos, sin, layout=layout, seq_dim=-3)[0]

    return apply_one


def _complex(layout: Layout) -> Callable[..., Any]:
    """Llama 4's ``apply_rotary_emb(xq, xk, freqs_cis)``: ``xq [b, s, hq, d]``, ``xk [b, s,
    hk, d]``, ``freqs_cis = cos + i sin`` ``[b, s, d / 2]``; the result in the dtype of each."""
    plans: dict[tuple, Any] = {}

    def apply_complex(
        xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not freqs_cis.is_complex():
            raise PosEncError(
                f"freqs_cis must be a complex tensor (cos + i sin), got {freqs_cis.dtype}"
            )
        cos, sin = freqs_cis.real.contiguous(), freqs_cis.imag.contiguous()
        return _rotate_pair(xq, xk, cos, sin, layout, -3, plans)

    return apply_complex
