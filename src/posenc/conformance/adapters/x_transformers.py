"""x-transformers' positional encodings, run for real (CPU).

Checked against x-transformers 2.31.10 with torch 2.13. What they do, read from
``x_transformers/x_transformers.py``: ``RotaryEmbedding`` pairs adjacent channels ``(2i,
2i + 1)``, forms float32 angles from the positions it is given (``interpolation_factor``
divides them, ``base_rescale_factor`` raises the base to ``base * factor^(d / (d - 2))``),
and its xPos scale is ``zeta^((n - (max + 1) // 2) / scale_base)``, centred;
``ScaledSinusoidalEmbedding`` is ``[sin | cos]`` at ``base^(-2i / d)`` times a learned
scale (initialised to ``d^-0.5``; the adapter sets it to 1); ``AlibiPositionalBias`` is
``-m |j - i|`` with the paper's slopes; ``RelativePositionBias`` is T5's bucketed bias.
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
    torch_library,
)

__all__ = [
    "x_transformers_alibi",
    "x_transformers_rope",
    "x_transformers_sinusoidal",
    "x_transformers_t5",
    "x_transformers_xpos",
]

_WHO = "x-transformers"
#: posenc's scaling type -> the ``RotaryEmbedding`` keyword its factor goes to.
_FACTORS = {"linear": "interpolation_factor", "ntk": "base_rescale_factor"}


def _rotate(torch: Any, xt: Any, torch_dtype: Any, xpos: bool) -> Any:
    """The rotation through ``RotaryEmbedding.forward(positions)`` and
    ``apply_rotary_pos_emb``, q and k as ``[1, heads, seq, dim]``."""

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
        options: dict[str, Any] = {}
        if xpos:
            options.update(use_xpos=True, scale_base=extra.pop("xpos_scale_base"))
        no_extra(extra, f"{_WHO} RotaryEmbedding")
        options.update(factor_options(scaling, _FACTORS, f"{_WHO} RotaryEmbedding"))
        rope = xt.RotaryEmbedding(rotary_dim, base=base, **options)
        with torch.no_grad():
            freqs, scale = rope(torch.from_numpy(np.asarray(positions, dtype=np.int64)))
            out = []
            for x, power in ((q, 1.0), (k, -1.0)):
                t = torch.from_numpy(np.ascontiguousarray(x)).to(torch_dtype)
                t = t.permute(1, 0, 2)[None]  # [1, heads, seq, dim]
                s = scale**power if torch.is_tensor(scale) else scale
                rotated = xt.apply_rotary_pos_emb(t, freqs, s)
                out.append(rotated[0].permute(1, 0, 2).double().numpy())
        return out[0], out[1]

    return rotate


def x_transformers_rope(dtype: str = "float32", *, layout: str | None = "interleaved") -> Adapter:
    """x-transformers' ``RotaryEmbedding`` and ``apply_rotary_pos_emb`` as a rotation
    adapter (the positions given to ``forward``; partial ``rotary_dim`` as the library does
    it: the first ``rotary_dim`` channels). Scalings: default, linear
    (``interpolation_factor``), ntk (``base_rescale_factor``).

    Args:
        dtype: q and k's dtype.
        layout: the layout it claims (``"interleaved"``, the library's); ``None`` claims none.

    Returns: an :class:`Adapter` (``rotate``, family ``rope``).

    Raises:
        PosEncError: x-transformers (or torch) is not installed, a bad ``dtype``, or a
            ``layout`` other than None and ``"interleaved"`` (the only one it offers).
    """
    dtype = check_dtype(dtype)
    layout = check_layout(layout, ("interleaved",), f"{_WHO} RotaryEmbedding")
    torch, xt, source = torch_library(_WHO, "x_transformers.x_transformers")
    return Adapter(
        f"{_WHO} RotaryEmbedding [{dtype}]" + ("" if layout else " (no layout claimed)"),
        "rotate",
        "rope",
        _rotate(torch, xt, getattr(torch, dtype), xpos=False),
        convention={} if layout is None else {"layout": layout},
        dtype=dtype,
        source=source,
    )


def x_transformers_xpos(dtype: str = "float32") -> Adapter:
    """x-transformers' ``RotaryEmbedding(use_xpos=True)`` as an xPos rotation adapter
    (queries times its scale, keys times its inverse, as its attention does). It claims no
    layout: it pairs adjacent channels, the xPos cases pair halves.

    Args:
        dtype: q and k's dtype.

    Returns: an :class:`Adapter` (``rotate``, family ``xpos``).

    Raises:
        PosEncError: x-transformers (or torch) is not installed, or a bad ``dtype``.
    """
    dtype = check_dtype(dtype)
    torch, xt, source = torch_library(_WHO, "x_transformers.x_transformers")
    return Adapter(
        f"{_WHO} xPos [{dtype}]",
        "rotate",
        "xpos",
        _rotate(torch, xt, getattr(torch, dtype), xpos=True),
        dtype=dtype,
        source=source,
    )


def x_transformers_sinusoidal() -> Adapter:
    """``ScaledSinusoidalEmbedding(dim, theta=base)`` as a sinusoidal-table adapter, its
    learned scale set to 1 (it starts at ``dim^-0.5``), positions given as ``pos``.

    Returns: an :class:`Adapter` (``table``, family ``sinusoidal``, layout half, float32).

    Raises:
        PosEncError: x-transformers (or torch) is not installed.
    """
    torch, xt, source = torch_library(_WHO, "x_transformers.x_transformers")

    def table(positions: np.ndarray, dim: int, *, base: float) -> np.ndarray:
        if dim % 2:
            raise Unsupported(f"{_WHO} ScaledSinusoidalEmbedding needs an even dim")
        module = xt.ScaledSinusoidalEmbedding(dim, theta=base)
        with torch.no_grad():
            module.scale.fill_(1.0)
            pos = torch.from_numpy(np.asarray(positions, dtype=np.int64))
            out = module(torch.zeros(1, len(pos), dim), pos=pos)
        return out.double().numpy()

    return Adapter(
        f"{_WHO} ScaledSinusoidalEmbedding",
        "table",
        "sinusoidal",
        table,
        convention={"layout": "half", "order": "sin_cos"},
        dtype="float32",
        source=source,
    )


def x_transformers_alibi() -> Adapter:
    """``AlibiPositionalBias(heads).forward_custom_pos(query_positions, key_positions)`` as
    an ALiBi adapter. It claims ``causal=False``: its bias is ``-m |j - i|`` whatever the
    attention's mask.

    Returns: an :class:`Adapter` (``bias``, family ``alibi``, float32).

    Raises:
        PosEncError: x-transformers (or torch) is not installed.
    """
    torch, xt, source = torch_library(_WHO, "x_transformers.x_transformers")

    def bias(
        query_positions: np.ndarray, key_positions: np.ndarray, *, heads: int, **parameters: Any
    ) -> np.ndarray:
        module = xt.AlibiPositionalBias(heads)
        with torch.no_grad():
            out = module.forward_custom_pos(
                torch.from_numpy(np.asarray(query_positions, dtype=np.int64)),
                torch.from_numpy(np.asarray(key_positions, dtype=np.int64)),
            )
        return out.double().numpy()

    return Adapter(
        f"{_WHO} AlibiPositionalBias",
        "bias",
        "alibi",
        bias,
        convention={"causal": False},
        dtype="float32",
        source=source,
    )


def x_transformers_t5() -> Adapter:
    """``RelativePositionBias(scale=1, causal, num_buckets, max_distance, heads)`` as a T5
    adapter: its embedding set to the case's weights ``[num_buckets, heads]``, then the three
    steps of its ``forward`` (``_relative_position_bucket(key - query)``, the embedding,
    ``[h, i, j]``) at the case's positions (``forward`` itself takes lengths only).

    Returns: an :class:`Adapter` (``bias``, family ``t5``, float32).

    Raises:
        PosEncError: x-transformers (or torch) is not installed.
    """
    torch, xt, source = torch_library(_WHO, "x_transformers.x_transformers")

    def bias(
        query_positions: np.ndarray,
        key_positions: np.ndarray,
        *,
        heads: int,
        weights: np.ndarray,
        causal: bool,
        num_buckets: int,
        max_distance: int,
        **parameters: Any,
    ) -> np.ndarray:
        no_extra(parameters, f"{_WHO} RelativePositionBias")
        module = xt.RelativePositionBias(
            scale=1.0,
            causal=causal,
            num_buckets=num_buckets,
            max_distance=max_distance,
            heads=heads,
        )
        with torch.no_grad():
            module.relative_attention_bias.weight.copy_(torch.from_numpy(np.asarray(weights)))
            q_pos = torch.from_numpy(np.asarray(query_positions, dtype=np.int64))
            k_pos = torch.from_numpy(np.asarray(key_positions, dtype=np.int64))
            rel_pos = k_pos[None, :] - q_pos[:, None]  # [i, j]
            buckets = module._relative_position_bucket(
                rel_pos, causal=causal, num_buckets=num_buckets, max_distance=max_distance
            )
            values = module.relative_attention_bias(buckets)  # [i, j, h]
            out = values.permute(2, 0, 1) * module.scale
        return out.double().numpy()

    return Adapter(
        f"{_WHO} RelativePositionBias (T5)",
        "bias",
        "t5",
        bias,
        dtype="float32",
        source=source,
    )
